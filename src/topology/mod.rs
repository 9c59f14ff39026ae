//! Where the ring's nodes are now: addresses from Sentinel and replicas (`nodes`), what
//! Sentinel and `ROLE` say (`sentinel`), and the thread that asks them (`watcher`).

pub mod nodes;
pub mod sentinel;
pub mod watcher;
