//! Replication and the AOF: a command of the module's own, propagated with typed arguments
//! (an integer, or byte strings).

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

/// Propagates `command args...` (byte strings) to replicas and the AOF, in the running
/// command's (or timer's) block, after what it propagated so far.
pub fn replicate_args(ctx: &Context, command: &std::ffi::CStr, args: &[&[u8]]) {
    // SAFETY: `ctx` is a live context; every string made here is freed after the call (the
    // server copies what it propagates); "v" takes a vector of strings and its length.
    unsafe {
        let (Some(replicate), Some(create), Some(free)) = (
            raw::RedisModule_Replicate,
            raw::RedisModule_CreateString,
            raw::RedisModule_FreeString,
        ) else {
            return;
        };
        let argv: Vec<*mut raw::RedisModuleString> = args
            .iter()
            .map(|a| create(ctx.ctx, a.as_ptr().cast(), a.len()))
            .collect();
        replicate(
            ctx.ctx,
            command.as_ptr(),
            c"v".as_ptr(),
            argv.as_ptr(),
            argv.len(),
        );
        for s in argv {
            free(ctx.ctx, s);
        }
    }
}
