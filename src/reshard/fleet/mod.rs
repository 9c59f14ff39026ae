//! Fleet operations (`SHARD.RESHARD START`): the plan and the coordinator that drives it.

pub mod coordinator;
pub mod plan;
