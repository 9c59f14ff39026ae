//! jedis `Sharded` (2.10 and later): shard `name` gets points `H("<name>*<n>")` for n in
//! 0..160*weight, kept in a TreeMap (a later shard overwrites an equal point); a key goes to
//! the first point >= its hash, else the first point. `H` is `Hashing.MD5` (the first 4 digest
//! bytes little-endian, non-negative) or `Hashing.MURMUR_HASH` (MurmurHash64A, seed 0x1234ABCD,
//! ordered as signed 64-bit).

use md5::{Digest, Md5};

use super::error::RingError;
use super::ketama::push_decimal;
use super::points::{Points, MAX_POINTS};
use super::spec::RingSpec;

/// jedis's seed for `Hashing.MURMUR_HASH`.
pub const JEDIS_MURMUR_SEED: u32 = 0x1234ABCD;

/// Which of jedis's `Hashing` implementations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JedisHash {
    /// `Hashing.MD5`.
    Md5,
    /// `Hashing.MURMUR_HASH`.
    Murmur,
}

impl JedisHash {
    /// The hash of bytes, as jedis orders it.
    pub fn hash(self, data: &[u8]) -> i64 {
        match self {
            JedisHash::Md5 => {
                let d = Md5::digest(data);
                i64::from(u32::from_le_bytes([d[0], d[1], d[2], d[3]]))
            }
            JedisHash::Murmur => murmur_hash64a(data, JEDIS_MURMUR_SEED) as i64,
        }
    }
}

/// MurmurHash64A as jedis's `MurmurHash.hash64A` computes it: little-endian 8-byte reads, the
/// tail read little-endian as a zero-padded 8-byte word; `seed` is a java `int` (sign-extended).
pub fn murmur_hash64a(data: &[u8], seed: u32) -> u64 {
    const M: u64 = 0xc6a4a7935bd1e995;
    const R: u32 = 47;
    let seed = seed as i32 as i64 as u64;
    let mut h = seed ^ (data.len() as u64).wrapping_mul(M);
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut k = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let mut b = [0u8; 8];
        b[..tail.len()].copy_from_slice(tail);
        h ^= u64::from_le_bytes(b);
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}

pub(crate) fn build(spec: &RingSpec, hash: JedisHash) -> Result<Points<i64>, RingError> {
    let count = 160 * spec.total_weight();
    if count > MAX_POINTS as u64 {
        return Err(RingError::new(format!(
            "jedis ring too large: total weight {} makes {} points (160 per weight unit), the limit is {}",
            spec.total_weight(),
            count,
            MAX_POINTS
        )));
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut buf = Vec::with_capacity(300);
    for (k, node) in spec.nodes.iter().enumerate() {
        for n in 0..160 * u64::from(node.weight) {
            buf.clear();
            buf.extend_from_slice(node.name.as_bytes());
            buf.push(b'*');
            push_decimal(&mut buf, n);
            entries.push((hash.hash(&buf), k as u32));
        }
    }
    Points::build(entries)
}

/// Index of the point that owns hash `h`.
pub(crate) fn lookup(points: &Points<i64>, h: i64) -> usize {
    let i = points.first_at_least(h);
    if i == points.len() {
        0
    } else {
        i
    }
}
