//! `SHARD.DEBUG PANIC`: proves the panic guard on a live server. Refused unless redis-server
//! runs with `enable-debug-command yes` (or `local`, from a local connection), like Redis's
//! own DEBUG command.

use crate::command;
use crate::host::register::CommandSpec;
use redis_module::RedisValue;

use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::is;

pub fn debug(call: &Call) -> CmdResult {
    if call.args.len() != 2 || !is(call.args.get(1), "PANIC") {
        return Err(CmdError::err("usage: SHARD.DEBUG PANIC"));
    }
    let setting = call
        .ctx
        .call("CONFIG", &["GET", "enable-debug-command"])
        .map_err(|e| CmdError::err(format!("CONFIG GET failed: {e}")))?;
    let enabled = match setting {
        RedisValue::Array(v) => v.iter().any(|x| {
            matches!(x, RedisValue::BulkString(s) | RedisValue::SimpleString(s) if s == "yes" || s == "local")
        }),
        _ => false,
    };
    if !enabled {
        return Err(CmdError::err(
            "SHARD.DEBUG is disabled: start redis-server with enable-debug-command yes",
        ));
    }
    panic!("SHARD.DEBUG PANIC was called");
}

/// `SHARD.DEBUG`: how Redis registers and documents it.
pub static COMMAND: CommandSpec = command! {
    name: "shard.debug",
    handler: debug,
    flags: "admin",
    arity: 2,
    summary: "Debugging: PANIC proves the panic guard (needs enable-debug-command)",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};
