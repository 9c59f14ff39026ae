//! The cluster protocol on a fleet of plain servers (`shard.cluster-protocol yes`), and the
//! live slot map of a real Redis Cluster (the `cluster` algo).
//!
//! - `protocol`: the switch, the rings the protocol can serve, the view of the current one and
//!   the address a redirect names.
//! - `filter`: the command filter's verdict on each command while the protocol is on
//!   (`CLUSTER ...`, `READONLY`, `READWRITE`, `ASKING` and `INFO` → `SHARD.EMULATE` or the
//!   checked `SHARD.CLUSTER`/`SHARD.INFO`, a keyed command that must leave → `SHARD.REDIRECT`,
//!   or refused at queue time inside `MULTI`), and that verdict applied.
//! - `auth`: who those emulated commands are authorised as (the plain command's ACL rules,
//!   once the client is known to have authenticated), and what the filter reads for it.
//! - `emulate`: `INFO`'s cluster section as a cluster node writes it, `CLUSTER HELP`, and the
//!   refusals of the `CLUSTER` subcommands that assign slots by hand (pure).
//! - `redirect`: `SHARD.REDIRECT`'s verdict (`MOVED`, `ASK`, `CROSSSLOT`, `TRYAGAIN`, run here,
//!   or route as SHARD.CALL).
//! - `replica`: on a replica, the verdict on what is not its primary's replication stream
//!   (`READONLY` reads of its shard's keys run there, the rest is `MOVED` to the primary).
//! - `clients`: the module's own connections, the clients that sent `ASKING` or `READONLY`,
//!   and a replica's replication stream.
//! - `replies`: `CLUSTER SLOTS/SHARDS/NODES/MYID/MYSHARDID/INFO/LINKS/REPLICAS` rendered from a
//!   `slots` ring and the replicas known of its nodes (pure).
//! - `slot_keys`: the keys of one slot (a `SCAN` walk); `live_slots`: a real cluster's slot
//!   map, read from `CLUSTER SLOTS`.
//!
//! The command handlers are `commands::cluster`. May import: `route`, `topology`, `state`,
//! `net`, `host` and the pure rooms; never `reshard` or `commands`. No raw module API here.

pub mod auth;
pub mod clients;
pub mod emulate;
pub mod filter;
pub mod live_slots;
pub mod protocol;
pub mod redirect;
pub mod replica;
pub mod replies;
pub mod slot_keys;
