//! Access control: whether the calling user may run a command, checked as if the client had
//! sent that command itself (its ACL rules for the command and its keys); whether a named user
//! may; who the caller is (its user, or none: `Caller`); the server's users, and whether its
//! `default` user lets a client in without a password.

use std::os::raw::c_int;

use redis_module::{raw, RedisValue};

use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};

/// Checks the calling user's ACL for the command the call carries in its arguments from
/// `from` on; `name` is that command's name as the refusal shows it.
pub fn check_caller(call: &Call, from: usize, name: &str) -> CmdResult {
    check_caller_in(call, from..call.args.len(), name)
}

/// As `check_caller`, for the command the call carries in its arguments `within` (`WAIT n t`
/// in front of another command). A caller with no user (`Caller::Root`) passes, as the server
/// lets it.
pub fn check_caller_in(call: &Call, within: std::ops::Range<usize>, name: &str) -> CmdResult {
    let argv = call.args.raw().get(within).unwrap_or_default();
    let user = match caller(call) {
        Caller::Root => return Ok(()),
        Caller::User(user) => user,
    };
    // SAFETY: the user name and module user made here are freed before returning.
    unsafe {
        let (Some(create), Some(from_name), Some(check), Some(free_user), Some(free_string)) = (
            raw::RedisModule_CreateString,
            raw::RedisModule_GetModuleUserFromUserName,
            raw::RedisModule_ACLCheckCommandPermissions,
            raw::RedisModule_FreeModuleUser,
            raw::RedisModule_FreeString,
        ) else {
            return Err(CmdError::err(
                "the ACL functions of the module API are missing",
            ));
        };
        let user_name = create(std::ptr::null_mut(), user.as_ptr().cast(), user.len());
        let user = from_name(user_name);
        free_string(std::ptr::null_mut(), user_name);
        if user.is_null() {
            return Err(CmdError::code(
                "NOPERM",
                "the calling user no longer exists",
            ));
        }
        let argc = c_int::try_from(argv.len()).unwrap_or(c_int::MAX);
        let allowed = check(user, argv.as_ptr().cast_mut(), argc) == raw::REDISMODULE_OK as c_int;
        if !allowed {
            log_denial(call, user, argv);
        }
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

/// Records a refusal of `argv` to `user` in the server's ACL log (`ACL LOG`), as the server
/// records its own: the command, when the user may not run it at all (its name alone is
/// refused), else the first argument the user may not access as a key.
///
/// # Safety
/// `user` is a live module user; `argv` the call's live arguments.
unsafe fn log_denial(
    call: &Call,
    user: *mut raw::RedisModuleUser,
    argv: &[*mut raw::RedisModuleString],
) {
    // SAFETY: as the caller promises; the API table is filled at load.
    unsafe {
        let (Some(check), Some(check_key), Some(add), Some(create), Some(free_string)) = (
            raw::RedisModule_ACLCheckCommandPermissions,
            raw::RedisModule_ACLCheckKeyPermissions,
            raw::RedisModule_ACLAddLogEntry,
            raw::RedisModule_CreateString,
            raw::RedisModule_FreeString,
        ) else {
            return;
        };
        let Some(&name) = argv.first() else {
            return;
        };
        let ctx = call.ctx.ctx;
        if check(user, argv.as_ptr().cast_mut(), 1) != raw::REDISMODULE_OK as c_int {
            let Some(text) = string_bytes(name) else {
                return;
            };
            let lower = text.to_ascii_lowercase();
            let object = create(ctx, lower.as_ptr().cast(), lower.len());
            add(
                ctx,
                user,
                object,
                raw::RedisModuleACLLogEntryReason_REDISMODULE_ACL_LOG_CMD,
            );
            free_string(ctx, object);
            return;
        }
        if let Some(&key) = argv[1..]
            .iter()
            .find(|&&key| check_key(user, key, 0) != raw::REDISMODULE_OK as c_int)
        {
            add(
                ctx,
                user,
                key,
                raw::RedisModuleACLLogEntryReason_REDISMODULE_ACL_LOG_KEY,
            );
        }
    }
}

/// The calling user's name (`None` for a client with no user: the replication stream, the
/// AOF, a module's own call), read as `caller` reads it.
pub fn caller_name(call: &Call) -> Option<Vec<u8>> {
    match caller(call) {
        Caller::User(name) => Some(name),
        Caller::Root => None,
    }
}

/// Who called a command, as ACL rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A client of this user (a script's caller, for a command a script runs).
    User(Vec<u8>),
    /// A client with no user, which no ACL rule restricts: a primary's replication stream,
    /// the AOF, a module's own call (`RedisModule_Call` without `C`).
    Root,
}

/// The calling client's user. Never reads a user the client does not have (the server's
/// `RedisModule_GetCurrentUserName` would, for a module's call): a listed client's user is read
/// by its id; a client the server does not list (a script's, a module's call) is first asked
/// whether it has one, by `RedisModule_Call` of `HELLO` as it (`C`), which the server refuses
/// with `ENOTSUP` for a client with none (and lets any user run: it is `no-auth`, so no ACL log
/// entry is written).
pub fn caller(call: &Call) -> Caller {
    let ctx = call.ctx.ctx;
    // SAFETY: the context of this call; every string and reply made is freed before returning.
    unsafe {
        let (Some(id_of), Some(user_of), Some(free_string)) = (
            raw::RedisModule_GetClientId,
            raw::RedisModule_GetClientUserNameById,
            raw::RedisModule_FreeString,
        ) else {
            return Caller::Root;
        };
        let name = user_of(ctx, id_of(ctx));
        if !name.is_null() {
            let bytes = string_bytes(name);
            free_string(ctx, name);
            return bytes.map_or(Caller::Root, Caller::User);
        }
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTSUP) {
            return Caller::Root;
        }
        let (Some(rm_call), Some(free_reply), Some(current_name)) = (
            raw::RedisModule_Call,
            raw::RedisModule_FreeCallReply,
            raw::RedisModule_GetCurrentUserName,
        ) else {
            return Caller::Root;
        };
        let mut no_args: [*mut raw::RedisModuleString; 0] = [];
        let probe = rm_call(
            ctx,
            c"HELLO".as_ptr(),
            c"vC".as_ptr(),
            no_args.as_mut_ptr(),
            0,
        );
        let errno = std::io::Error::last_os_error().raw_os_error();
        if probe.is_null() {
            if errno == Some(libc::ENOTSUP) {
                return Caller::Root;
            }
        } else {
            free_reply(probe);
        }
        // The client has a user (the probe got past the server's check for one).
        let name = current_name(ctx);
        if name.is_null() {
            return Caller::Root;
        }
        let bytes = string_bytes(name);
        free_string(ctx, name);
        bytes.map_or(Caller::Root, Caller::User)
    }
}

/// Whether a user may run a command, by its ACL rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    Allowed,
    Denied,
    /// The server has no such command or subcommand (or no such user, or no ACL API).
    Unknown,
}

/// Whether the user `user` may run `argv` (the command's name first) by its ACL rules, as the
/// server checks a command a client sends (the command, its subcommand, its keys).
pub fn permission(user: &[u8], argv: &[&[u8]]) -> Permission {
    // SAFETY: every string and the module user made here are freed before returning; strings
    // made with no context belong to nobody else.
    unsafe {
        let (Some(create), Some(free_string), Some(from_name), Some(check), Some(free_user)) = (
            raw::RedisModule_CreateString,
            raw::RedisModule_FreeString,
            raw::RedisModule_GetModuleUserFromUserName,
            raw::RedisModule_ACLCheckCommandPermissions,
            raw::RedisModule_FreeModuleUser,
        ) else {
            return Permission::Unknown;
        };
        let make = |b: &[u8]| create(std::ptr::null_mut(), b.as_ptr().cast(), b.len());
        let name = make(user);
        let module_user = from_name(name);
        free_string(std::ptr::null_mut(), name);
        if module_user.is_null() {
            return Permission::Unknown;
        }
        let mut strings: Vec<*mut raw::RedisModuleString> = argv.iter().map(|a| make(a)).collect();
        let argc = c_int::try_from(strings.len()).unwrap_or(c_int::MAX);
        let status = check(module_user, strings.as_mut_ptr(), argc);
        let errno = std::io::Error::last_os_error().raw_os_error();
        free_user(module_user);
        for s in strings {
            free_string(std::ptr::null_mut(), s);
        }
        if status == raw::REDISMODULE_OK as c_int {
            Permission::Allowed
        } else if errno == Some(libc::ENOENT) {
            Permission::Unknown
        } else {
            Permission::Denied
        }
    }
}

/// Whether the server's `default` user lets a client in without a password (`on` and
/// `nopass`): then no client is ever unauthenticated. `None` when the server cannot tell.
/// Main thread only.
pub fn default_user_open() -> Option<bool> {
    let ctx = crate::host::context::detached()?;
    let reply = ctx.call("ACL", &["GETUSER", "default"]).ok()?;
    let RedisValue::Array(fields) = reply else {
        return None;
    };
    let flags = fields
        .iter()
        .position(|f| text(f).as_deref() == Some("flags"))
        .and_then(|i| fields.get(i + 1))?;
    let RedisValue::Array(flags) = flags else {
        return None;
    };
    let flags: Vec<String> = flags.iter().filter_map(text).collect();
    Some(flags.iter().any(|f| f == "on") && flags.iter().any(|f| f == "nopass"))
}

/// The names of the server's users (`ACL USERS`); empty when it cannot tell. Main thread only.
pub fn users() -> Vec<Vec<u8>> {
    let Some(ctx) = crate::host::context::detached() else {
        return Vec::new();
    };
    match ctx.call("ACL", &["USERS"]) {
        Ok(RedisValue::Array(names)) => names
            .iter()
            .filter_map(text)
            .map(String::into_bytes)
            .collect(),
        _ => Vec::new(),
    }
}

fn text(v: &RedisValue) -> Option<String> {
    match v {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s.clone()),
        RedisValue::SimpleStringStatic(s) => Some((*s).to_string()),
        RedisValue::StringBuffer(b) => Some(String::from_utf8_lossy(b).into_owned()),
        RedisValue::BulkRedisString(s) => Some(s.to_string_lossy()),
        _ => None,
    }
}

/// # Safety
/// `s` must be a live string.
unsafe fn string_bytes(s: *mut raw::RedisModuleString) -> Option<Vec<u8>> {
    let mut len = 0usize;
    // SAFETY: as the caller promises.
    let p = unsafe { raw::RedisModule_StringPtrLen?(s, &mut len) };
    // SAFETY: ptr/len describe the live string's bytes.
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec())
}
