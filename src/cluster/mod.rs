//! The cluster protocol on a fleet of plain servers (`shard.cluster-protocol yes`), and the
//! live slot map of a real Redis Cluster (the `cluster` algo).
//!
//! - `protocol`: the switch, the rings the protocol can serve, the view of the current one and
//!   the address a redirect names.
//! - `filter`: the command filter's verdict on each command while the protocol is on
//!   (`CLUSTER ...` → `SHARD.CLUSTER`, a keyed command that must leave → `SHARD.REDIRECT`, or
//!   refused at queue time inside `MULTI`), and that verdict applied.
//! - `redirect`: `SHARD.REDIRECT`'s verdict (`MOVED`, `ASK`, `CROSSSLOT`, `TRYAGAIN`, run here,
//!   or route as SHARD.CALL).
//! - `clients`: the module's own connections and the clients that sent `ASKING`.
//! - `replies`: `CLUSTER SLOTS/SHARDS/NODES/MYID/INFO` rendered from a `slots` ring (pure).
//! - `slot_keys`: the keys of one slot (a `SCAN` walk); `live_slots`: a real cluster's slot
//!   map, read from `CLUSTER SLOTS`.
//!
//! The command handlers are `commands::cluster`. May import: `route`, `topology`, `state`,
//! `net`, `host` and the pure rooms; never `reshard` or `commands`. No raw module API here.

pub mod clients;
pub mod filter;
pub mod live_slots;
pub mod protocol;
pub mod redirect;
pub mod replies;
pub mod slot_keys;
