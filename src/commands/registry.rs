//! The table of commands and their registration with Redis, container commands (`SHARD.RING`)
//! with real subcommands (`shard.ring|get`), so that ACL rules can name each one.

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::{raw, Context};

use crate::command_fn;
use crate::commands::docs;

type Entry = unsafe extern "C" fn(
    *mut raw::RedisModuleCtx,
    *mut *mut raw::RedisModuleString,
    c_int,
) -> c_int;

/// A command or subcommand: name, entry point and flags. No command of this module declares
/// key positions: none takes a key of this server's keyspace as such.
struct Spec {
    name: &'static CStr,
    entry: Option<Entry>,
    flags: &'static CStr,
    subcommands: Vec<Spec>,
}

fn command(name: &'static CStr, entry: Entry, flags: &'static CStr) -> Spec {
    Spec {
        name,
        entry: Some(entry),
        flags,
        subcommands: Vec::new(),
    }
}

fn container(name: &'static CStr, subcommands: Vec<Spec>) -> Spec {
    Spec {
        name,
        entry: None,
        flags: c"",
        subcommands,
    }
}

fn table() -> Vec<Spec> {
    use crate::commands::{decode, encode, genkey, reshard, ring, whereis};
    vec![
        command(
            c"shard.genkey",
            command_fn!("shard.genkey", genkey::genkey),
            c"write deny-oom fast",
        ),
        command(
            c"shard.decode",
            command_fn!("shard.decode", decode::decode),
            c"readonly fast",
        ),
        command(
            c"shard.encode",
            command_fn!("shard.encode", encode::encode),
            c"readonly fast",
        ),
        command(
            c"shard.specialkey",
            command_fn!("shard.specialkey", crate::commands::shardjs::special_key),
            c"readonly fast",
        ),
        command(
            c"shard.retype",
            command_fn!("shard.retype", crate::commands::shardjs::retype),
            c"readonly fast",
        ),
        command(
            c"shard.minify",
            command_fn!("shard.minify", crate::commands::shardjs::minify),
            c"readonly fast",
        ),
        command(
            c"shard.maxify",
            command_fn!("shard.maxify", crate::commands::shardjs::maxify),
            c"readonly fast",
        ),
        command(
            c"shard.whereis",
            command_fn!("shard.whereis", whereis::whereis),
            c"readonly fast",
        ),
        command(
            c"shard.locate",
            command_fn!("shard.locate", whereis::locate),
            c"readonly fast",
        ),
        command(
            c"shard.call",
            command_fn!("shard.call", crate::commands::call::call),
            c"may-replicate deny-script blocking",
        ),
        command(
            c"shard.cluster",
            command_fn!("shard.cluster", crate::cluster::protocol::cluster),
            c"fast allow-stale allow-loading",
        ),
        command(
            c"shard.redirect",
            command_fn!("shard.redirect", crate::cluster::protocol::redirect),
            c"may-replicate deny-script blocking",
        ),
        command(
            c"shard.debug",
            command_fn!("shard.debug", crate::commands::debug::debug),
            c"admin",
        ),
        command(
            c"shard.dump",
            command_fn!("shard.dump", crate::commands::dump::dump),
            c"readonly",
        ),
        command(
            c"shard.advance",
            command_fn!("shard.advance", crate::commands::advance::advance),
            c"write",
        ),
        container(
            c"shard.ring",
            vec![
                command(c"set", command_fn!("shard.ring|set", ring::set), c"admin"),
                command(
                    c"get",
                    command_fn!("shard.ring|get", ring::get),
                    c"readonly fast",
                ),
                command(
                    c"begin",
                    command_fn!("shard.ring|begin", ring::begin),
                    c"admin",
                ),
                command(
                    c"commit",
                    command_fn!("shard.ring|commit", ring::commit),
                    c"admin",
                ),
                command(
                    c"abort",
                    command_fn!("shard.ring|abort", ring::abort),
                    c"admin",
                ),
                command(
                    c"install",
                    command_fn!("shard.ring|install", ring::install),
                    c"admin",
                ),
                command(
                    c"state",
                    command_fn!("shard.ring|state", ring::node_state),
                    c"readonly",
                ),
                command(
                    c"push",
                    command_fn!("shard.ring|push", ring::push),
                    c"admin blocking deny-script",
                ),
                command(
                    c"check",
                    command_fn!("shard.ring|check", ring::check),
                    c"admin blocking deny-script",
                ),
            ],
        ),
        container(
            c"shard.reshard",
            vec![
                command(
                    c"copy",
                    command_fn!("shard.reshard|copy", reshard::copy),
                    c"admin",
                ),
                command(
                    c"cleanup",
                    command_fn!("shard.reshard|cleanup", reshard::cleanup),
                    c"admin write",
                ),
                command(
                    c"status",
                    command_fn!("shard.reshard|status", reshard::status),
                    c"readonly fast",
                ),
                command(
                    c"stop",
                    command_fn!("shard.reshard|stop", reshard::stop),
                    c"admin",
                ),
                command(
                    c"throttle",
                    command_fn!("shard.reshard|throttle", reshard::throttle),
                    c"admin",
                ),
                command(
                    c"pause",
                    command_fn!("shard.reshard|pause", reshard::pause),
                    c"admin",
                ),
                command(
                    c"resume",
                    command_fn!("shard.reshard|resume", reshard::resume),
                    c"admin",
                ),
                command(
                    c"start",
                    command_fn!("shard.reshard|start", reshard::start),
                    c"admin blocking deny-script",
                ),
                command(
                    c"cancel",
                    command_fn!("shard.reshard|cancel", reshard::cancel),
                    c"admin",
                ),
                command(
                    c"plan",
                    command_fn!("shard.reshard|plan", reshard::save_plan),
                    c"admin",
                ),
            ],
        ),
    ]
}

/// Registers every command and subcommand; an error names the one that failed.
pub fn register_all(ctx: &Context) -> Result<(), String> {
    // SAFETY: called from OnLoad, after the module API was initialised.
    let (create, get_command, create_sub) = unsafe {
        (
            raw::RedisModule_CreateCommand.ok_or("RedisModule_CreateCommand is missing")?,
            raw::RedisModule_GetCommand.ok_or("RedisModule_GetCommand is missing")?,
            raw::RedisModule_CreateSubcommand
                .ok_or("RedisModule_CreateSubcommand is missing: shard needs Redis 7.0 or later")?,
        )
    };
    let ok = raw::REDISMODULE_OK as c_int;
    for spec in table() {
        let name = spec.name.to_string_lossy();
        // SAFETY: every pointer is a 'static NUL-terminated string or a valid entry point.
        let status = unsafe {
            create(
                ctx.ctx,
                spec.name.as_ptr(),
                spec.entry,
                spec.flags.as_ptr(),
                0,
                0,
                0,
            )
        };
        if status != ok {
            return Err(format!("failed to create command {name}"));
        }
        // SAFETY: the command was just created under this name.
        let parent = unsafe { get_command(ctx.ctx, spec.name.as_ptr()) };
        if parent.is_null() {
            return Err(format!("failed to find command {name}"));
        }
        // SAFETY: parent is a command of this module.
        unsafe { docs::describe(parent, &name)? };
        for sub in spec.subcommands {
            // SAFETY: parent is a live command of this module; strings are 'static.
            let status = unsafe {
                create_sub(
                    parent,
                    sub.name.as_ptr(),
                    sub.entry,
                    sub.flags.as_ptr(),
                    0,
                    0,
                    0,
                )
            };
            let full = format!("{name}|{}", sub.name.to_string_lossy());
            if status != ok {
                return Err(format!("failed to create subcommand {full}"));
            }
            // SAFETY: the parent and the subcommand's name are live; the subcommand exists now.
            let sub_command = unsafe {
                let full_c = std::ffi::CString::new(full.clone()).map_err(|e| e.to_string())?;
                get_command(ctx.ctx, full_c.as_ptr())
            };
            if sub_command.is_null() {
                return Err(format!("failed to find subcommand {full}"));
            }
            // SAFETY: sub_command is a command of this module.
            unsafe { docs::describe(sub_command, &full)? };
        }
    }
    Ok(())
}
