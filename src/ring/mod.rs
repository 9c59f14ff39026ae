//! Rings: pure placement logic (no Redis context). A `RingSpec` (algo, hash-tag rule, nodes)
//! builds a `Ring` whose `locate` says which node owns a key, byte for byte as the peer the
//! algo names (uhashring/libketama, jedis, redis-shard, redis-cli cluster slots) would.
//!
//! The `slots` algo's files: `slots` (CRC16, the contiguous split of the weights, the built
//! slot table), `slot_map` (an explicit map: `SLOTS` range lists, the check that it covers
//! every slot once), `fewest` (the map that moves the fewest slots to new weights or nodes).
//!
//! `bucket`: every ring's 16384 buckets (fixed ranges of its hash, the slot for `slots`), the
//! nodes owning each, and the buckets a ring change moves: the unit of the index of keys.
//!
//! `lease`: which fleet coordinator may change this node's rings (the term it follows, a
//! fencing token, and the holder's lease).

mod algo;
mod bucket;
mod error;
mod fewest;
mod file;
mod hashtag;
mod jedis;
mod ketama;
pub mod lease;
pub mod placement;
mod points;
mod redis_shard;
mod share;
mod slot_map;
mod slots;
mod spec;

pub use algo::Algo;
pub use bucket::{changing_buckets, keys_by_share, KeysByShare, Share, BUCKETS};
pub use error::RingError;
pub use file::parse_ring_file;
pub use hashtag::HashTag;
pub use jedis::{murmur_hash64a, JedisHash, JEDIS_MURMUR_SEED};
pub use ketama::ketama_hash;
pub use points::MAX_POINTS;
pub use redis_shard::crc32;
pub use slot_map::{format_ranges, parse_ranges, Ranges};
pub use slots::{crc16, key_slot, slot_of, SLOTS};
pub use spec::{NodeSpec, RingSpec, MAX_NAME_LEN, MAX_WEIGHT};

use points::Points;
use slots::SlotMap;

/// Where a key lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location<'a> {
    /// Index of the owner in `spec().nodes`.
    pub node: usize,
    /// The part of the key that was hashed (after the hash-tag rule).
    pub hashed: &'a [u8],
    /// The ring point that decided (ketama/redis-shard: the u32 point; jedis: the i64 point),
    /// or the slot for `slots`.
    pub point: i64,
    /// The key's own hash (ketama/redis-shard: u32; jedis: i64), or the slot for `slots`.
    pub hash: i64,
}

#[derive(Debug, Clone)]
enum Inner {
    Ketama(Points<u32>),
    Jedis(Points<i64>, JedisHash),
    RedisShard(Points<u32>),
    Slots(SlotMap),
}

/// A built ring: immutable, cheap to share behind an `Arc`.
#[derive(Debug, Clone)]
pub struct Ring {
    spec: RingSpec,
    inner: Inner,
}

impl Ring {
    /// Builds the ring of a spec. The `cluster` algo has no ring here: it reads the live
    /// cluster's slot map, which the glue does.
    pub fn build(spec: &RingSpec) -> Result<Ring, RingError> {
        if spec.nodes.is_empty() && spec.algo != Algo::Cluster {
            return Err(RingError::new("a ring needs at least one node"));
        }
        let inner =
            match spec.algo {
                Algo::Ketama => Inner::Ketama(ketama::build(spec)?),
                Algo::Jedis => Inner::Jedis(jedis::build(spec, JedisHash::Md5)?, JedisHash::Md5),
                Algo::JedisMurmur => {
                    Inner::Jedis(jedis::build(spec, JedisHash::Murmur)?, JedisHash::Murmur)
                }
                Algo::RedisShard => Inner::RedisShard(redis_shard::build(spec)?),
                Algo::Slots => Inner::Slots(slots::build(spec)?),
                Algo::Cluster => return Err(RingError::new(
                    "the cluster algo reads the live cluster's slot map, it has no ring to build",
                )),
            };
        Ok(Ring {
            spec: spec.clone(),
            inner,
        })
    }

    /// The spec this ring was built from.
    pub fn spec(&self) -> &RingSpec {
        &self.spec
    }

    /// Where `key` lives. Allocates nothing.
    #[inline]
    pub fn locate<'a>(&self, key: &'a [u8]) -> Location<'a> {
        let hashed = self.spec.hashtag.extract(key);
        let (node, point, hash) = match &self.inner {
            Inner::Ketama(p) => {
                let h = ketama_hash(hashed);
                let (pt, owner) = p.get(ketama::lookup(p, h));
                (owner as usize, i64::from(pt), i64::from(h))
            }
            Inner::Jedis(p, algo) => {
                let h = algo.hash(hashed);
                let (pt, owner) = p.get(jedis::lookup(p, h));
                (owner as usize, pt, h)
            }
            Inner::RedisShard(p) => {
                let h = crc32(hashed);
                let (pt, owner) = p.get(redis_shard::lookup(p, h));
                (owner as usize, i64::from(pt), i64::from(h))
            }
            Inner::Slots(m) => {
                let s = slot_of(hashed);
                (m.owner(s), i64::from(s), i64::from(s))
            }
        };
        Location {
            node,
            hashed,
            point,
            hash,
        }
    }

    /// Index of the node that owns `key` (in `spec().nodes`).
    pub fn owner(&self, key: &[u8]) -> usize {
        // One node owns every key: no hash to compute (a fleet of one, or a node that routes
        // to itself).
        if self.spec.nodes.len() == 1 {
            return 0;
        }
        self.locate(key).node
    }

    /// The owner's spec.
    pub fn owner_spec(&self, key: &[u8]) -> &NodeSpec {
        // `owner` only returns indexes of existing nodes.
        &self.spec.nodes[self.owner(key)]
    }

    /// The owner's spec once `key` is settled: `Err` with the node it moves to when
    /// `previous` (the ring a resharding moves from) places it at another node. What runs at
    /// one settled owner (a blocking command, a transaction's part) refuses a moving key.
    pub fn settled_owner(
        &self,
        previous: Option<&Ring>,
        key: &[u8],
    ) -> Result<&NodeSpec, &NodeSpec> {
        let node = self.owner_spec(key);
        match previous {
            Some(p) if p.owner_spec(key).name != node.name => Err(node),
            _ => Ok(node),
        }
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.spec.nodes.len()
    }

    /// Number of distinct points on the ring (16384 for `slots`).
    pub fn point_count(&self) -> usize {
        match &self.inner {
            Inner::Ketama(p) | Inner::RedisShard(p) => p.len(),
            Inner::Jedis(p, _) => p.len(),
            Inner::Slots(_) => SLOTS,
        }
    }

    /// For `slots`: each node's inclusive slot ranges in slot order, in node order. `None` for
    /// other algos.
    pub fn slot_ranges(&self) -> Option<&[Ranges]> {
        match &self.inner {
            Inner::Slots(m) => Some(m.ranges()),
            _ => None,
        }
    }

    /// Number of ring points each node owns (slots for `slots`), in node order.
    pub fn points_per_node(&self) -> Vec<usize> {
        let mut out = vec![0usize; self.spec.nodes.len()];
        let owners: Vec<u32> = match &self.inner {
            Inner::Ketama(p) | Inner::RedisShard(p) => p.entries().iter().map(|e| e.1).collect(),
            Inner::Jedis(p, _) => p.entries().iter().map(|e| e.1).collect(),
            Inner::Slots(m) => {
                for (c, r) in out.iter_mut().zip(m.ranges()) {
                    *c = slot_map::count(r);
                }
                return out;
            }
        };
        for o in owners {
            if let Some(c) = out.get_mut(o as usize) {
                *c += 1;
            }
        }
        out
    }
}

/// A ketama ring spec of `names` at 127.0.0.1:7000, 7001, ... of weight 1, for unit tests.
#[cfg(test)]
pub(crate) fn test_spec(names: &[&str]) -> RingSpec {
    let fields: Vec<String> = names
        .iter()
        .enumerate()
        .flat_map(|(i, n)| [n.to_string(), format!("127.0.0.1:{}", 7000 + i), "1".into()])
        .collect();
    let refs: Vec<&[u8]> = fields.iter().map(|s| s.as_bytes()).collect();
    RingSpec::from_args(b"ketama", None, &refs).expect("a valid test ring")
}

#[cfg(test)]
mod tests;
