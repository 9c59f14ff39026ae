//! Resharding, as Tarantool's shard module did it: a previous and a current ring, a copy phase
//! that sends each key to its new owner without deleting it here, passes repeated until one
//! copies nothing, then, once the previous ring is dropped, a cleanup that deletes what this
//! node no longer owns. Pure Rust: the decisions and the job's bookkeeping; the glue runs it.

pub mod job;
pub mod migrate;
pub mod plan;

pub use job::{Job, JobKind, JobState, Outcome};
pub use plan::{cleanup_deletes, copy_target, is_member};
