//! Resharding, as Tarantool's shard module did it: a previous and a current ring, a copy phase
//! that sends each key to its new owner without deleting it here, passes repeated until one
//! copies nothing, then, once the previous ring is dropped, a cleanup that deletes what this
//! node no longer owns; and fleet operations (`fleet/`) that drive every node through those
//! steps from one `SHARD.RESHARD START`.
//!
//! What each file owns:
//! - `fate`: the pure per-key decision (copy to whom, keep, delete in a cleanup).
//! - `progress`: a job's bookkeeping (`Job`: state, counters, passes), pure.
//! - `current`: the job and the fleet plan of this node now (not in `crate::state`).
//! - `jobs`: the running job, what a copy and a cleanup share, and the calls the commands make
//!   (start, stop, throttle, pause); `copy_job` and `cleanup_job` drive each kind on the main
//!   thread with module timers.
//! - `copy_child`: one pass of a copy, in a forked child (the walk of the keyspace);
//!   `copy_steps`: one pass in steps on the main thread instead (no fork: `shard.copy-fork`),
//!   its commands shipped by `ship_thread`; `index_cursor`: a walk of the key index in steps
//!   (the copy's steps, a cleanup without a fork);
//!   `copy_serialize` serializes what it found and hands it to `ship`, which pipelines the
//!   `SET`s and `RESTORE`s to their owners; `pieces` copies big keys piece by piece;
//!   `copy_page` is the page the child and the main
//!   thread share (counts up, rate and pause down); `pace` keeps a job to its rate.
//! - `moved`: what a copy's walk found moving, for the cleanup on the same ring (one walk per
//!   resharding; a cleanup without it walks in a child, `host::walk`).
//! - `dirty`: the keys written while a child works on its snapshot (keyspace events).
//! - `failover`: a copy's destinations behind Sentinel followed through a failover: the keys
//!   lost with an old primary are sent again to the new one (pure bookkeeping).
//! - `fleet/`: the fleet operation's plan, its checks and byte form, the coordinator that
//!   drives it, and what the fleet commands ask of it (see its own doc).
//!
//! May import: the pure rooms (`clock`, `keys`, `ring`, `persist`), `host` (the server: fork,
//! keyspace walk, keyspace events, timers), `net` (connections, RESP), `state`, `topology` (the
//! nodes' addresses) and `route` (SHARD.CALL's network steps, which the fleet requests share).
//! Never `cluster` or `commands`: the commands call in here, not the other way.

pub mod cleanup_job;
pub mod copy_child;
pub mod copy_job;
pub mod copy_page;
pub mod copy_serialize;
pub mod copy_steps;
pub mod current;
pub mod dirty;
pub mod failover;
pub mod fate;
pub mod fleet;
pub mod index_cursor;
pub mod jobs;
pub mod moved;
pub mod pace;
pub mod pieces;
pub mod progress;
pub mod ship;
pub mod ship_queue;
pub mod ship_thread;

pub use fate::{cleanup_deletes, copy_target, is_member};
pub use progress::{Job, JobKind, JobState, Outcome};
