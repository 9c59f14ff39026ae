//! Routed commands (`SHARD.CALL`): which node runs what, and the network that gets it there.
//!
//! Pure parts: the RESP wire format (`resp`, `frame`), the plan of a call while a resharding
//! may be open (`plan`), the split of multi-key commands over owners (`split`), the key
//! positions of a command from the server's table (`command`), what Sentinel and `ROLE` say
//! (`sentinel`). Glue: the pipelined connections to other nodes (`conn`), the calls in flight
//! (`forward`), the command filter that turns a call whose keys are all here into the plain
//! command (`filter`), and where the nodes and their replicas are now (`topology`, learned by
//! the `watcher` thread).

pub mod command_table;
pub mod fields;
pub mod filter;
pub mod forward;
pub mod migrate;
pub mod split;
pub mod steps;

pub use crate::net::endpoint::{Endpoint, StepError, StepErrorKind};
pub use crate::net::resp::{encode_command, read_reply, Resp, RespError};
pub use steps::{execute, CommandKind, Plan, Routed, Step};

/// The event-loop turns of the connections (flush what was queued before the server sleeps,
/// expire late requests after it wakes) and of the topology watcher.
fn before_sleep() {
    crate::net::pool::before_sleep();
    crate::topology::watcher::tick();
}

/// Hooks routing into the server: the event-loop events that flush the connections' queued
/// requests and expire late ones, and the server's role; then starts the topology watcher.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn register(ctx: *mut redis_module::raw::RedisModuleCtx) -> Result<(), String> {
    // SAFETY: as the caller promises.
    unsafe {
        crate::host::events::on_event_loop(ctx, before_sleep, crate::net::pool::after_sleep)?;
        crate::host::events::on_role_change(ctx, crate::topology::nodes::set_replica);
    }
    crate::topology::watcher::start()
}
