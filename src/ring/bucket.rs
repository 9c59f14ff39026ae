//! Buckets: 16384 fixed ranges of a ring's hash, the unit of an index of keys (`keyindex`), so
//! that a ring change names the few buckets whose keys may change owner instead of every key.
//!
//! A bucket is, for a `slots` ring, the slot; for ketama and redis-shard, the top 14 bits of
//! the key's u32 hash (`MD5`'s first word, zlib CRC-32); for `jedis-murmur`, the top 14 bits of
//! the i64 hash taken in ring order (`(h ^ 1 << 63) >> 50`, the sign bit flipped so that the
//! most negative hash is bucket 0); for `jedis` (MD5), whose hash is a u32 held in an i64, the
//! top 14 bits of that u32. In every case a bucket is a contiguous range of the ring's order,
//! always after the ring's hash-tag rule, so the keys of a bucket are owned by the points in
//! that range and the first point after it (`bucket_owners`), and a ring change is compared
//! range by range (`changing_buckets`), exactly: a bucket is named when, and only when, some
//! hash in its range has another owner name under the new ring.

use super::jedis::{self, JedisHash};
use super::ketama::{self, ketama_hash};
use super::points::Points;
use super::redis_shard::{self, crc32};
use super::slots::{slot_of, SlotMap};
use super::{Inner, Ring};

/// Number of buckets of every ring (as many as Redis Cluster's slots).
pub const BUCKETS: usize = 16384;

/// The bits of a u32 hash below a bucket's 14.
const U32_SHIFT: u32 = 18;
/// The bits of an i64 hash below a bucket's 14.
const I64_SHIFT: u32 = 50;
/// The sign bit: flipping it maps i64 order onto u64 order.
const SIGN: u64 = 1 << 63;

impl Ring {
    /// The bucket of `key` (0..16384): the slot for `slots`, else the top 14 bits of the key's
    /// hash in ring order (the module doc). Allocates nothing; costs one hash of the key.
    #[inline]
    pub fn bucket(&self, key: &[u8]) -> u16 {
        let hashed = self.spec.hashtag.extract(key);
        match &self.inner {
            Inner::Ketama(_) => (ketama_hash(hashed) >> U32_SHIFT) as u16,
            Inner::RedisShard(_) => (crc32(hashed) >> U32_SHIFT) as u16,
            Inner::Jedis(_, h) => (jedis_coordinate(*h, h.hash(hashed)) >> jedis_shift(*h)) as u16,
            Inner::Slots(_) => slot_of(hashed),
        }
    }

    /// Whether `other` puts every key in the same bucket as this ring (same algo, same
    /// hash-tag rule): an index of keys by bucket built for one serves the other.
    pub fn same_buckets(&self, other: &Ring) -> bool {
        self.spec.algo == other.spec.algo && self.spec.hashtag == other.spec.hashtag
    }

    /// The nodes (indexes in `spec().nodes`, ascending) that own some hash of `bucket`: for
    /// `slots` the slot's owner; for a point ring the owners of the points inside the bucket's
    /// range and of the point that owns its first hash. Empty for a bucket >= 16384.
    pub fn bucket_owners(&self, bucket: u16) -> Vec<usize> {
        if usize::from(bucket) >= BUCKETS {
            return Vec::new();
        }
        let view = View::of(self);
        let mut starts = Vec::new();
        view.segment_starts(bucket, &mut starts);
        let mut out: Vec<usize> = starts.iter().map(|&c| view.owner_at(c)).collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// How much of a bucket a node owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// Every hash of the bucket.
    Whole,
    /// Some of its hashes, other nodes the rest (a ring point inside the bucket).
    Part,
    /// None of it.
    Nothing,
}

impl Ring {
    /// Per bucket, whether the ring gives it other than wholly to node `node` (every bucket
    /// when `node` is `None`, no node of the ring): the buckets a resharding's walk of the key
    /// index looks at (its copy, its cleanup), those of another node's keys, some or all.
    pub fn buckets_not_wholly_of(&self, node: Option<usize>) -> Vec<bool> {
        match node {
            Some(me) => self
                .bucket_shares(me)
                .into_iter()
                .map(|share| share != Share::Whole)
                .collect(),
            None => vec![true; BUCKETS],
        }
    }

    /// What node `node` (an index in `spec().nodes`) owns of each bucket, in bucket order: one
    /// sweep of the ring (as `changing_buckets`).
    pub fn bucket_shares(&self, node: usize) -> Vec<Share> {
        let view = View::of(self);
        let mut starts = Vec::new();
        (0..BUCKETS as u16)
            .map(|bucket| {
                starts.clear();
                view.segment_starts(bucket, &mut starts);
                let mine = starts.iter().filter(|&&c| view.owner_at(c) == node).count();
                match mine {
                    0 => Share::Nothing,
                    n if n == starts.len() => Share::Whole,
                    _ => Share::Part,
                }
            })
            .collect()
    }
}

/// A node's keys by what it owns of their buckets: the ranges of buckets it owns wholly, with
/// the keys in each (`(first, last, keys)`, ascending, maximal), the keys of buckets it owns in
/// part, and the keys of buckets it does not own at all (strays, or keys a resharding moves).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KeysByShare {
    pub ranges: Vec<(u16, u16, u64)>,
    pub in_part: u64,
    pub not_owned: u64,
}

/// Sums `keys` (a count per bucket) by `shares` (what a node owns of each bucket).
pub fn keys_by_share(shares: &[Share], keys: &[u64]) -> KeysByShare {
    let mut out = KeysByShare::default();
    let mut open: Option<(u16, u16, u64)> = None;
    for (bucket, (share, &n)) in shares.iter().zip(keys).enumerate() {
        let bucket = bucket as u16;
        match share {
            Share::Whole => match &mut open {
                Some((_, last, sum)) => {
                    *last = bucket;
                    *sum += n;
                }
                None => open = Some((bucket, bucket, n)),
            },
            other => {
                out.ranges.extend(open.take());
                if *other == Share::Part {
                    out.in_part += n;
                } else {
                    out.not_owned += n;
                }
            }
        }
    }
    out.ranges.extend(open);
    out
}

/// Every bucket (ascending) where some key has another owner name under `new` than under `old`
/// (names, not indexes: the node lists may differ). Exact: each bucket's range is cut at the
/// points of both rings, and each piece's owners compared. `None` when the rings do not bucket
/// keys alike (`Ring::same_buckets`): then every key must be looked at.
pub fn changing_buckets(old: &Ring, new: &Ring) -> Option<Vec<u16>> {
    if !old.same_buckets(new) {
        return None;
    }
    let (a, b) = (View::of(old), View::of(new));
    let mut out = Vec::new();
    let mut starts = Vec::new();
    for bucket in 0..BUCKETS as u16 {
        starts.clear();
        a.segment_starts(bucket, &mut starts);
        b.segment_starts(bucket, &mut starts);
        let moves = starts
            .iter()
            .any(|&c| name(old, a.owner_at(c)) != name(new, b.owner_at(c)));
        if moves {
            out.push(bucket);
        }
    }
    Some(out)
}

/// The coordinate of a jedis hash (MD5's is a non-negative u32, murmur's any i64).
#[inline]
fn jedis_coordinate(hash: JedisHash, h: i64) -> u64 {
    match hash {
        JedisHash::Md5 => h as u64,
        JedisHash::Murmur => (h as u64) ^ SIGN,
    }
}

/// The jedis hash of a coordinate.
fn jedis_hash(hash: JedisHash, c: u64) -> i64 {
    match hash {
        JedisHash::Md5 => c as i64,
        JedisHash::Murmur => (c ^ SIGN) as i64,
    }
}

/// The bits below a bucket's 14 in a jedis coordinate.
#[inline]
fn jedis_shift(hash: JedisHash) -> u32 {
    match hash {
        JedisHash::Md5 => U32_SHIFT,
        JedisHash::Murmur => I64_SHIFT,
    }
}

/// The name of node `i` of `ring`.
fn name(ring: &Ring, i: usize) -> Option<&str> {
    ring.spec.nodes.get(i).map(|n| n.name.as_str())
}

/// A ring seen in coordinates: u64 values in the ring's order (a u32 hash as is; an i64 murmur
/// hash with its sign bit flipped), where a bucket is `coordinate >> shift`.
enum View<'a> {
    /// First point strictly greater than the hash, wrapping.
    Ketama(&'a Points<u32>),
    /// First point strictly greater than the hash, else the last point.
    RedisShard(&'a Points<u32>),
    /// First point at least the hash, wrapping.
    Jedis(&'a Points<i64>, JedisHash),
    /// The slot's owner.
    Slots(&'a SlotMap),
}

impl<'a> View<'a> {
    fn of(ring: &'a Ring) -> View<'a> {
        match &ring.inner {
            Inner::Ketama(p) => View::Ketama(p),
            Inner::RedisShard(p) => View::RedisShard(p),
            Inner::Jedis(p, h) => View::Jedis(p, *h),
            Inner::Slots(m) => View::Slots(m),
        }
    }

    fn shift(&self) -> u32 {
        match self {
            View::Jedis(_, h) => jedis_shift(*h),
            _ => U32_SHIFT,
        }
    }

    /// The node owning coordinate `c` (the slot, for `slots`), as `Ring::locate` decides.
    fn owner_at(&self, c: u64) -> usize {
        let owner = match self {
            View::Ketama(p) => p.get(ketama::lookup(p, c as u32)).1,
            View::RedisShard(p) => p.get(redis_shard::lookup(p, c as u32)).1,
            View::Jedis(p, h) => p.get(jedis::lookup(p, jedis_hash(*h, c))).1,
            View::Slots(m) => return m.owner(c as u16),
        };
        owner as usize
    }

    /// Pushes the first coordinate of `bucket` and every coordinate inside it where the owner
    /// may change (a point, or the hash after a point for jedis). For `slots`: the slot.
    fn segment_starts(&self, bucket: u16, out: &mut Vec<u64>) {
        if let View::Slots(_) = self {
            out.push(u64::from(bucket));
            return;
        }
        let shift = self.shift();
        let lo = u64::from(bucket) << shift;
        let hi = lo + ((1u64 << shift) - 1);
        out.push(lo);
        match self {
            // A hash equal to a point goes to the next point: a piece starts at each point.
            View::Ketama(p) | View::RedisShard(p) => {
                let (l, h) = (lo as u32, hi as u32);
                let from = p.first_greater(l);
                let to = p.first_greater(h);
                out.extend(p.entries()[from..to].iter().map(|e| u64::from(e.0)));
            }
            // A hash equal to a point goes to that point: a piece starts after each point.
            View::Jedis(p, hash) => {
                let (l, h) = (jedis_hash(*hash, lo), jedis_hash(*hash, hi));
                let from = p.first_at_least(l);
                let to = p.first_at_least(h);
                let coordinate = |pt: i64| jedis_coordinate(*hash, pt);
                out.extend(p.entries()[from..to].iter().map(|e| coordinate(e.0) + 1));
            }
            View::Slots(_) => {}
        }
    }
}

#[cfg(test)]
#[path = "bucket_tests.rs"]
mod tests;
