//! Where the ring's nodes are now, and their replicas.
//!
//! - `nodes`: the table of what is known (Sentinel addresses, replicas, this server's role)
//!   and the endpoint of a ring node now (`endpoint_of`); replicas picked in turn.
//! - `me`: this server as a replica: the shard it serves and its entry in that shard's replica
//!   list (for the cluster protocol's maps and `READONLY` reads).
//! - `sentinel`: what Sentinel's and `ROLE`'s replies say (pure).
//! - `watcher`: the watcher as the main thread sees it (what to watch, orders, what comes
//!   back); `watch_loop`: the watcher's thread, its subscription and queries.
//!
//! May import: `net`, `state`, `host` and the pure rooms (`ring`); never `route`, `cluster`,
//! `reshard` or `commands`. No raw module API here.

pub mod me;
pub mod nodes;
pub mod sentinel;
pub mod watch_loop;
pub mod watcher;
