//! `shard`: a Redis module that puts sharding inside Redis.
pub mod keys;
pub mod ring;
