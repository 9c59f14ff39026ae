//! ketama continuum as uhashring 2.5 builds it: node k gets `floor(40 * N * w_k / W)` hashes
//! `MD5("<name>-<i>")`, 4 points per hash; a key goes to the first point strictly greater
//! than the r = 0 point of `MD5(key)`, wrapping to the first point.

use std::sync::Mutex;

use md5::{Digest, Md5};

use super::error::RingError;
use super::points::{Points, MAX_POINTS};
use super::spec::RingSpec;

/// The ketama hash of bytes: the r = 0 point of their MD5. The hashes of the last short keys
/// are remembered (`Memo`): a key is looked up several times within a few microseconds (a
/// `SHARD.CALL`'s filter, then its handler; a transaction's `WATCH`, reads and queued writes;
/// the owner's checks), and MD5 was most of a lookup. Only the hash of the bytes is kept, never
/// an owner: each lookup still goes to the ring in force.
///
/// The memo is a static behind a mutex only tried, never waited for: no thread-local (which a
/// shared library reaches through a `__tls_get_addr` call on every access), and a thread that
/// finds it taken (another thread's lookup, at most) computes the hash without it.
pub fn ketama_hash(data: &[u8]) -> u32 {
    if data.len() > MEMO_KEY {
        return md5_point(data);
    }
    let Ok(mut memo) = MEMO.try_lock() else {
        return md5_point(data);
    };
    let slot = &mut memo[memo_slot(data)];
    if usize::from(slot.len) == data.len() && slot.used && slot.key[..data.len()] == *data {
        return slot.hash;
    }
    let hash = md5_point(data);
    slot.used = true;
    slot.len = data.len() as u8;
    slot.key[..data.len()].copy_from_slice(data);
    slot.hash = hash;
    hash
}

fn md5_point(data: &[u8]) -> u32 {
    let d = Md5::digest(data);
    u32::from_le_bytes([d[0], d[1], d[2], d[3]])
}

/// The longest key whose hash is remembered, and how many are (one per slot, the last in).
const MEMO_KEY: usize = 46;
const MEMO_SLOTS: usize = 512;

#[derive(Clone, Copy)]
struct MemoSlot {
    used: bool,
    len: u8,
    key: [u8; MEMO_KEY],
    hash: u32,
}

static MEMO: Mutex<[MemoSlot; MEMO_SLOTS]> = Mutex::new(
    [MemoSlot {
        used: false,
        len: 0,
        key: [0; MEMO_KEY],
        hash: 0,
    }; MEMO_SLOTS],
);

/// A key's slot: FNV-1a of its bytes.
fn memo_slot(data: &[u8]) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    ((h ^ (h >> 16)) as usize) % MEMO_SLOTS
}

/// Number of MD5 hashes (4 points each) node `k` gets.
fn hashes_for(spec: &RingSpec, k: usize, total: u64) -> u64 {
    let n = spec.nodes.len() as u64;
    match total {
        0 => 0,
        _ => 40 * n * u64::from(spec.nodes[k].weight) / total,
    }
}

pub(crate) fn build(spec: &RingSpec) -> Result<Points<u32>, RingError> {
    let total = spec.total_weight();
    let count: u64 = (0..spec.nodes.len())
        .map(|k| 4 * hashes_for(spec, k, total))
        .sum();
    if count > MAX_POINTS as u64 {
        return Err(RingError::new(format!(
            "ketama ring too large: {} nodes make {} points, the limit is {}",
            spec.nodes.len(),
            count,
            MAX_POINTS
        )));
    }
    let mut entries = Vec::with_capacity(count as usize);
    let mut buf = Vec::with_capacity(300);
    for (k, node) in spec.nodes.iter().enumerate() {
        for i in 0..hashes_for(spec, k, total) {
            buf.clear();
            buf.extend_from_slice(node.name.as_bytes());
            buf.push(b'-');
            push_decimal(&mut buf, i);
            let d = Md5::digest(&buf);
            for r in 0..4 {
                let p = u32::from_le_bytes([d[4 * r], d[4 * r + 1], d[4 * r + 2], d[4 * r + 3]]);
                entries.push((p, k as u32));
            }
        }
    }
    Points::build(entries)
}

/// Index of the point that owns hash `h`.
pub(crate) fn lookup(points: &Points<u32>, h: u32) -> usize {
    let i = points.first_greater(h);
    if i == points.len() {
        0
    } else {
        i
    }
}

/// Appends the decimal form of `n`.
pub(crate) fn push_decimal(buf: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal() {
        let mut b = Vec::new();
        push_decimal(&mut b, 0);
        b.push(b' ');
        push_decimal(&mut b, 1234567890123);
        b.push(b' ');
        push_decimal(&mut b, u64::MAX);
        assert_eq!(b, b"0 1234567890123 18446744073709551615");
    }

    #[test]
    fn the_memo_answers_what_md5_does() {
        // Many keys over few slots (each slot taken over and over), each length up to past the
        // longest one remembered, asked twice: always MD5's answer.
        for round in 0..2 {
            for i in 0..5000u32 {
                let key = format!("{i}:{}", "k".repeat(i as usize % (MEMO_KEY + 3)));
                assert_eq!(
                    ketama_hash(key.as_bytes()),
                    md5_point(key.as_bytes()),
                    "{round} {key}"
                );
            }
        }
    }

    #[test]
    fn hash_of_known_strings() {
        // md5("") = d41d8cd98f00b204e9800998ecf8427e: first 4 bytes little-endian.
        assert_eq!(ketama_hash(b""), 0xd98c1dd4);
    }
}
