//! `Algo`: which peer's placement a ring reproduces, its wire names and its default hash-tag rule.

use super::error::{show, RingError};
use super::hashtag::HashTag;

/// The placement algorithms a ring can reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// libketama / twemproxy / uhashring / npm hashring (MD5 continuum, 160 points per node).
    Ketama,
    /// jedis `Sharded` with `Hashing.MD5`.
    Jedis,
    /// jedis `Sharded` with its default `Hashing.MURMUR_HASH` (MurmurHash64A, seed 0x1234ABCD).
    JedisMurmur,
    /// Python `redis-shard` 0.3.7 (zlib CRC-32, 128 points per node, no wrap).
    RedisShard,
    /// Redis Cluster hash slots split into contiguous ranges like `redis-cli --cluster create`.
    Slots,
    /// The live Redis Cluster slot map (not built here: the glue reads the cluster).
    Cluster,
}

impl Algo {
    /// All algorithms, in a fixed order.
    pub const ALL: [Algo; 6] = [
        Algo::Ketama,
        Algo::Jedis,
        Algo::JedisMurmur,
        Algo::RedisShard,
        Algo::Slots,
        Algo::Cluster,
    ];

    /// Parses a name (`ketama`, `jedis`, `jedis-murmur`, `redis-shard`, `slots`, `cluster`),
    /// ASCII case-insensitive.
    pub fn parse(name: &[u8]) -> Result<Algo, RingError> {
        for a in Algo::ALL {
            if name.eq_ignore_ascii_case(a.name().as_bytes()) {
                return Ok(a);
            }
        }
        Err(RingError::new(format!(
            "unknown algo '{}', expected one of ketama, jedis, jedis-murmur, redis-shard, slots, cluster",
            show(name)
        )))
    }

    /// The canonical lowercase name.
    pub fn name(&self) -> &'static str {
        match self {
            Algo::Ketama => "ketama",
            Algo::Jedis => "jedis",
            Algo::JedisMurmur => "jedis-murmur",
            Algo::RedisShard => "redis-shard",
            Algo::Slots => "slots",
            Algo::Cluster => "cluster",
        }
    }

    /// The hash-tag rule the peer uses unless told otherwise.
    pub fn default_hashtag(&self) -> HashTag {
        match self {
            Algo::Ketama => HashTag::None,
            Algo::Jedis | Algo::JedisMurmur => HashTag::Jedis,
            Algo::RedisShard => HashTag::Greedy,
            Algo::Slots | Algo::Cluster => HashTag::Cluster,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Algo::ALL {
            assert_eq!(Algo::parse(a.name().as_bytes()), Ok(a));
        }
        assert_eq!(Algo::parse(b"KETAMA"), Ok(Algo::Ketama));
        assert_eq!(Algo::parse(b"Jedis-Murmur"), Ok(Algo::JedisMurmur));
    }

    #[test]
    fn unknown_name() {
        let e = Algo::parse(b"md5").unwrap_err();
        assert!(e.message().starts_with("unknown algo 'md5'"), "{}", e);
        assert!(Algo::parse(b"").is_err());
        assert!(Algo::parse(b"ketama ").is_err());
    }

    #[test]
    fn defaults() {
        assert_eq!(Algo::Ketama.default_hashtag(), HashTag::None);
        assert_eq!(Algo::Jedis.default_hashtag(), HashTag::Jedis);
        assert_eq!(Algo::JedisMurmur.default_hashtag(), HashTag::Jedis);
        assert_eq!(Algo::RedisShard.default_hashtag(), HashTag::Greedy);
        assert_eq!(Algo::Slots.default_hashtag(), HashTag::Cluster);
        assert_eq!(Algo::Cluster.default_hashtag(), HashTag::Cluster);
    }
}
