//! A call of one of the module's commands: its context, arguments and reply channel, and
//! the entry point that runs a handler under a panic guard (`dispatch`, `command_fn!`).

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{raw, Context};

use crate::host::args::Args;
use crate::host::error::CmdResult;
use crate::host::reply::Reply;

/// What a handler gets: the context, the arguments and the reply channel.
pub struct Call<'a> {
    pub ctx: &'a Context,
    pub args: Args<'a>,
    pub reply: Reply,
}

/// A command handler.
pub type Handler = fn(&Call) -> CmdResult;

/// Runs `handler` for one call of command `name`, turning errors and panics into replies.
///
/// # Safety
/// `ctx`, `argv` and `argc` must be those Redis passed to the command callback.
pub unsafe fn dispatch(
    name: &str,
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let reply = Reply::new(ctx);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let context = Context::new(ctx);
        // SAFETY: Redis passes argc valid strings that outlive this call.
        let args = unsafe { Args::from_raw(argv, argc) };
        handler(&Call {
            ctx: &context,
            args,
            reply,
        })
    }));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => reply.error(e.message()),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            redis_module::logging::log_warning(format!(
                "shard: internal error in {name}, the command was stopped and the server goes on: {what}"
            ));
            reply.error(&format!(
                "ERR internal error in {name}; nothing was changed by this call, see the Redis log"
            ));
        }
    }
    raw::REDISMODULE_OK as c_int
}

/// An `extern "C"` entry point for a handler, as Redis's command table needs.
#[macro_export]
macro_rules! command_fn {
    ($name:expr, $handler:path) => {{
        extern "C" fn entry(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            let name: &str = $name;
            let handler: $crate::host::command::Handler = $handler;
            // SAFETY: these are the arguments Redis passed to this callback.
            unsafe { $crate::host::command::dispatch(name, ctx, argv, argc, handler) }
        }
        entry
            as extern "C" fn(
                *mut redis_module::raw::RedisModuleCtx,
                *mut *mut redis_module::raw::RedisModuleString,
                std::os::raw::c_int,
            ) -> std::os::raw::c_int
    }};
}
