//! The table of commands and their registration with Redis.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::{raw, Context};

use crate::command_fn;

type Entry =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// One command: its name, entry point, flags and key positions.
struct CommandSpec {
    name: &'static CStr,
    entry: Entry,
    flags: &'static CStr,
    first_key: c_int,
    last_key: c_int,
    key_step: c_int,
}

fn table() -> Vec<CommandSpec> {
    vec![
        CommandSpec {
            name: c"shard.genkey",
            entry: command_fn!("shard.genkey", super::genkey::genkey),
            flags: c"write deny-oom fast",
            first_key: 0,
            last_key: 0,
            key_step: 0,
        },
        CommandSpec {
            name: c"shard.decode",
            entry: command_fn!("shard.decode", super::decode::decode),
            flags: c"readonly fast",
            first_key: 0,
            last_key: 0,
            key_step: 0,
        },
        CommandSpec {
            name: c"shard.encode",
            entry: command_fn!("shard.encode", super::encode::encode),
            flags: c"readonly fast",
            first_key: 0,
            last_key: 0,
            key_step: 0,
        },
    ]
}

/// Registers every command; an error names the command that failed.
pub fn register_all(ctx: &Context) -> Result<(), String> {
    // SAFETY: called from OnLoad with the module's context; the API was initialised by then.
    let create = unsafe { raw::RedisModule_CreateCommand }
        .ok_or("RedisModule_CreateCommand is not available")?;
    for spec in table() {
        // SAFETY: all pointers are valid NUL-terminated strings with 'static lifetime.
        let status = unsafe {
            create(
                ctx.ctx,
                spec.name.as_ptr(),
                Some(spec.entry),
                spec.flags.as_ptr(),
                spec.first_key,
                spec.last_key,
                spec.key_step,
            )
        };
        if status != raw::REDISMODULE_OK as c_int {
            return Err(format!(
                "failed to create command {}",
                spec.name.to_string_lossy()
            ));
        }
    }
    Ok(())
}
