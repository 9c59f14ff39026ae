//! Routed commands (`SHARD.CALL`): the RESP wire format spoken to other nodes, and the plan of
//! which node runs what while a resharding may be open. Pure Rust; the glue runs the plan.

pub mod plan;
pub mod resp;

pub use plan::{execute, CommandKind, Endpoint, Plan, Routed, Step, StepError, StepErrorKind};
pub use resp::{encode_command, read_reply, Resp, RespError};
