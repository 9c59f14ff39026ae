//! Resharding, as Tarantool's shard module did it: a previous and a current ring, a copy phase
//! that sends each key to its new owner without deleting it here, passes repeated until one
//! copies nothing, then, once the previous ring is dropped, a cleanup that deletes what this
//! node no longer owns. The decisions and the job's bookkeeping are pure Rust (`plan`, `job`);
//! `jobs` runs them: a copy pass in a forked child (`fork_copy`, shipping with `ship`, the keys
//! written meanwhile recorded by `dirty`), a cleanup's walk in another (`fork_cleanup`) that
//! feeds the main thread's time-bounded deleting steps.

pub mod cleanup_child;
pub mod cleanup_job;
pub mod copy_child;
pub mod copy_job;
pub mod copy_page;
pub mod copy_serialize;
pub mod current;
pub mod dirty;
pub mod fate;
pub mod fleet;
pub mod jobs;
pub mod pace;
pub mod payload;
pub mod pieces;
pub mod progress;
pub mod ship;

pub use fate::{cleanup_deletes, copy_target, is_member};
pub use progress::{Job, JobKind, JobState, Outcome};
