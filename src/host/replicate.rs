//! Replication and the AOF: a command of the module's own, propagated with typed arguments.

use std::os::raw::c_longlong;

use redis_module::{raw, Context};

/// Propagates `command ms` (one integer argument) to replicas and the AOF, as
/// `RedisModule_Replicate` does from a command callback.
pub fn replicate_with_int(ctx: &Context, command: &std::ffi::CStr, value: i64) {
    // SAFETY: `ctx` is a command callback's live context; "l" takes one long long.
    unsafe {
        if let Some(replicate) = raw::RedisModule_Replicate {
            replicate(
                ctx.ctx,
                command.as_ptr(),
                c"l".as_ptr(),
                value as c_longlong,
            );
        }
    }
}
