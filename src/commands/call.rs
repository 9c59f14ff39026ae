//! `SHARD.CALL command key [arg ...]`: runs a single-key command on the key's owner. Locally
//! (as the calling user, replicated like the command itself) when this server owns the key;
//! otherwise the client is blocked and a worker forwards the command (see `forward`).

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::raw::c_int;
use std::sync::{Mutex, PoisonError};

use redis_module::{raw, ContextFlags, RedisValue};

use super::args::printable;
use super::{Call, CmdError, CmdResult};
use crate::forward::{self, Link};
use crate::placement::Placement;
use crate::route::{CommandKind, Endpoint, Plan};
use crate::state;

/// errno values RedisModule_GetCommandKeys sets (Linux).
const ENOENT: i32 = 2;
const EINVAL: i32 = 22;

pub fn call(call: &Call) -> CmdResult {
    let args = &call.args;
    if args.len() < 3 {
        return Err(CmdError::err(
            "SHARD.CALL needs a command and its key: SHARD.CALL command key [arg ...]",
        ));
    }
    let name = args.get(1);
    let name_text = printable(name).to_ascii_lowercase();
    check_single_key(call, &name_text)?;
    let key = args.get(2);

    let (plan, self_is_owner) = {
        let st = state::lock();
        let current = super::whereis::current_ring(&st)?;
        let self_name = st.config.ring.self_name.as_str();
        let owner = endpoint(current, key, self_name)?;
        let previous = match &st.rings.previous {
            Some(p) => Some(endpoint(p, key, self_name)?).filter(|e| e.name != owner.name),
            None => None,
        };
        let self_is_owner = owner.is_self && previous.is_none();
        let plan = Plan {
            args: Vec::new(),
            key: key.to_vec(),
            kind: CommandKind::Write,
            current: owner,
            previous,
        };
        (plan, self_is_owner)
    };

    // The user's ACL is checked here for every path, so a refusal reads the same (NOPERM)
    // whether the key is local or not.
    check_acl(call, &name_text)?;
    let command = command_flags(call, &name_text)?;
    if command.blocking {
        return Err(CmdError::err(format!(
            "'{name_text}' can block: SHARD.CALL does not route blocking commands"
        )));
    }
    if self_is_owner {
        forward::count(|s| s.local += 1);
        return call_here(call, name);
    }
    let flags = call.ctx.get_flags();
    if flags.contains(ContextFlags::DENY_BLOCKING) || flags.contains(ContextFlags::MULTI) {
        return Err(CmdError::err(format!(
            "SHARD.CALL cannot wait for node {} ({}) inside MULTI or a script",
            plan.current.name, plan.current.address
        )));
    }
    // SAFETY: the context of this call.
    let db = unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(call.ctx.ctx)) };
    if db != 0 {
        return Err(CmdError::err(
            "SHARD.CALL forwards to database 0 only: SELECT 0 first",
        ));
    }
    let plan = Plan {
        args: (1..args.len()).map(|i| args.get(i).to_vec()).collect(),
        kind: CommandKind::of(name, command.readonly),
        ..plan
    };
    let link = {
        let st = state::lock();
        Link {
            timeout: forward::link_timeout(st.config.call_timeout_ms),
            auth: st.config.auth(),
            resp3: flags.contains(ContextFlags::FLAGS_RESP3),
        }
    };
    // SAFETY: the context of this call.
    unsafe { forward::submit(call.ctx.ctx, plan, link) }.map_err(CmdError::err)
}

/// The node that owns `key` in `placement`, as a place to run commands.
fn endpoint(placement: &Placement, key: &[u8], self_name: &str) -> Result<Endpoint, CmdError> {
    let ring = placement.ring.as_ref().ok_or_else(|| {
        CmdError::err(
            "SHARD.CALL needs a ring of shard's own; with the cluster algo use a cluster client",
        )
    })?;
    let node = ring.owner_spec(key);
    Ok(Endpoint {
        name: node.name.clone(),
        host: node.host.clone(),
        port: node.port,
        address: node.address.clone(),
        is_self: !self_name.is_empty() && node.name == self_name,
    })
}

/// Refuses commands that do not have exactly one key, right after the command name.
fn check_single_key(call: &Call, name: &str) -> CmdResult {
    let argv = &call.args.raw()[1..];
    let argc = c_int::try_from(argv.len()).map_err(|_| CmdError::err("too many arguments"))?;
    let mut num_keys: c_int = 0;
    // SAFETY: argv are the live argument strings of this call; the result is freed below.
    let (positions, errno) = unsafe {
        let get = raw::RedisModule_GetCommandKeys
            .ok_or_else(|| CmdError::err("RedisModule_GetCommandKeys is missing"))?;
        let p = get(call.ctx.ctx, argv.as_ptr().cast_mut(), argc, &mut num_keys);
        (p, io::Error::last_os_error().raw_os_error())
    };
    if positions.is_null() {
        return Err(match errno {
            Some(ENOENT) => CmdError::err(format!("unknown command '{name}'")),
            Some(EINVAL) => CmdError::wrong_arity(name),
            _ => CmdError::err(format!(
                "'{name}' has no key: SHARD.CALL routes commands by their key"
            )),
        });
    }
    // SAFETY: Redis returned num_keys positions; RedisModule_Free releases the array.
    let keys: Vec<c_int> = unsafe {
        let v =
            std::slice::from_raw_parts(positions, usize::try_from(num_keys).unwrap_or(0)).to_vec();
        if let Some(free) = raw::RedisModule_Free {
            free(positions.cast());
        }
        v
    };
    match keys.as_slice() {
        [1] => Ok(()),
        [] => Err(CmdError::err(format!("'{name}' has no key: SHARD.CALL routes commands by their key"))),
        [_] => Err(CmdError::err(format!(
            "'{name}' takes its key at another position: SHARD.CALL routes commands whose key follows the command name"
        ))),
        many => Err(CmdError::err(format!(
            "'{name}' has {} keys here; SHARD.CALL routes commands with exactly one key, since several keys may live on different nodes",
            many.len()
        ))),
    }
}

/// Runs the command here, as the calling user, replicated like the command itself.
fn call_here(call: &Call, name: &[u8]) -> CmdResult {
    let name = CString::new(name).map_err(|_| CmdError::err("a command name with a NUL byte"))?;
    let argv = &call.args.raw()[2..];
    // SAFETY: the strings are the live arguments of this call; the reply is freed after use.
    unsafe {
        let (Some(rm_call), Some(reply_with), Some(free)) = (
            raw::RedisModule_Call,
            raw::RedisModule_ReplyWithCallReply,
            raw::RedisModule_FreeCallReply,
        ) else {
            return Err(CmdError::err("a Redis module API function is missing"));
        };
        let reply = rm_call(
            call.ctx.ctx,
            name.as_ptr(),
            c"vCE!0M".as_ptr(),
            argv.as_ptr().cast_mut(),
            argv.len(),
        );
        if reply.is_null() {
            return Err(CmdError::err(format!(
                "the command could not run: {}",
                io::Error::last_os_error()
            )));
        }
        reply_with(call.ctx.ctx, reply);
        free(reply);
    }
    Ok(())
}

/// Checks the calling user's ACL for the command as if the client had sent it itself.
fn check_acl(call: &Call, name: &str) -> CmdResult {
    let argv = &call.args.raw()[1..];
    // SAFETY: the user name and module user are freed before returning.
    unsafe {
        let (Some(current_name), Some(from_name), Some(check), Some(free_user), Some(free_string)) = (
            raw::RedisModule_GetCurrentUserName,
            raw::RedisModule_GetModuleUserFromUserName,
            raw::RedisModule_ACLCheckCommandPermissions,
            raw::RedisModule_FreeModuleUser,
            raw::RedisModule_FreeString,
        ) else {
            return Err(CmdError::err(
                "the ACL functions of the module API are missing",
            ));
        };
        let user_name = current_name(call.ctx.ctx);
        if user_name.is_null() {
            return Err(CmdError::err("cannot tell the calling user"));
        }
        let user = from_name(user_name);
        free_string(call.ctx.ctx, user_name);
        if user.is_null() {
            return Err(CmdError::code(
                "NOPERM",
                "the calling user no longer exists",
            ));
        }
        let argc = c_int::try_from(argv.len()).unwrap_or(c_int::MAX);
        let allowed = check(user, argv.as_ptr().cast_mut(), argc) == raw::REDISMODULE_OK as c_int;
        free_user(user);
        if !allowed {
            return Err(CmdError::code(
                "NOPERM",
                format!(
                    "this user has no permissions to run the '{name}' command or to access its key"
                ),
            ));
        }
    }
    Ok(())
}

/// What routing needs from a command's flags.
#[derive(Debug, Clone, Copy)]
struct Flags {
    readonly: bool,
    blocking: bool,
}

/// A command's flags, from COMMAND INFO (cached per command).
fn command_flags(call: &Call, name: &str) -> Result<Flags, CmdError> {
    static CACHE: Mutex<Option<HashMap<String, Flags>>> = Mutex::new(None);
    if let Some(&known) = CACHE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .get(name)
    {
        return Ok(known);
    }
    let info = call
        .ctx
        .call("COMMAND", &["INFO", name])
        .map_err(|e| CmdError::err(format!("COMMAND INFO {name} failed: {e}")))?;
    let names: Vec<String> = match info {
        RedisValue::Array(entries) => match entries.into_iter().next() {
            Some(RedisValue::Array(fields)) => match fields.into_iter().nth(2) {
                Some(RedisValue::Array(flags)) => flags
                    .into_iter()
                    .filter_map(|f| match f {
                        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s),
                        RedisValue::SimpleStringStatic(s) => Some(s.to_string()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    let flags = Flags {
        readonly: names.iter().any(|f| f == "readonly"),
        blocking: names.iter().any(|f| f == "blocking"),
    };
    CACHE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .insert(name.to_string(), flags);
    Ok(flags)
}
