//! The client that called one of the module's commands: the database it has selected, its
//! id, and running another command as it (`RedisModule_Call` as the calling user, replicated
//! like the command itself): the reply passed through as the call's own, or read back.

use std::ffi::CString;
use std::io;

use redis_module::raw;

use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};

/// `RedisModule_Call`'s flags: argv given, as the calling user (`C`), errors as replies (`E`),
/// replicated (`!`), script mode checks off (`0`), out-of-memory checks (`M`).
const AS_CALLER: &std::ffi::CStr = c"vCE!0M";

/// The database the calling client has selected.
pub fn selected_db(call: &Call) -> u32 {
    // SAFETY: the context of this call.
    let db = unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(call.ctx.ctx)) };
    u32::try_from(db).unwrap_or(0)
}

/// The calling client's id (0 when the server cannot tell).
pub fn client_id(call: &Call) -> u64 {
    // SAFETY: the context of this call.
    unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(call.ctx.ctx)) }
}

/// `RedisModule_Call`'s flags for a command the server must obey (its primary's replication
/// stream): argv given, errors as replies, replicated, no user (the stream's client has none:
/// it may run anything) and no out-of-memory refusal (a replica applies what its primary did).
const OBEYED: &std::ffi::CStr = c"vE!0";

/// Runs the command `name` with the call's own arguments from `from` on, here, as the calling
/// user; its reply becomes the call's reply as it is.
pub fn pass_through(call: &Call, name: &[u8], from: usize) -> CmdResult {
    run_passing(call, name, from, AS_CALLER)
}

/// As `pass_through`, for a command the server must obey whoever its client is (a replica's
/// primary's replication stream).
pub fn pass_through_obeyed(call: &Call, name: &[u8], from: usize) -> CmdResult {
    run_passing(call, name, from, OBEYED)
}

fn run_passing(call: &Call, name: &[u8], from: usize, flags: &std::ffi::CStr) -> CmdResult {
    let argv = call.args.raw().get(from..).unwrap_or_default();
    // SAFETY: the call's own context and live arguments.
    unsafe { pass_raw(call.ctx.ctx, name, argv, flags) }
}

/// Runs `name` with the arguments `argv` on `ctx` as the calling user; its reply becomes the
/// reply on `ctx` as it is (a blocked client's reply callback runs the command it waited for).
///
/// # Safety
/// `ctx` must be a live context with a client (a command's, or a blocked client's reply
/// callback's); `argv` its live argument strings.
pub(crate) unsafe fn pass_through_raw(
    ctx: *mut raw::RedisModuleCtx,
    name: &[u8],
    argv: &[*mut raw::RedisModuleString],
) -> CmdResult {
    // SAFETY: as the caller promises.
    unsafe { pass_raw(ctx, name, argv, AS_CALLER) }
}

/// # Safety
/// As [`pass_through_raw`].
unsafe fn pass_raw(
    ctx: *mut raw::RedisModuleCtx,
    name: &[u8],
    argv: &[*mut raw::RedisModuleString],
    flags: &std::ffi::CStr,
) -> CmdResult {
    crate::host::writes::tell_strings(ctx, name, argv);
    let name = CString::new(name).map_err(|_| CmdError::err("a command name with a NUL byte"))?;
    // SAFETY: the strings are live arguments; the reply is freed after use.
    unsafe {
        let (Some(rm_call), Some(reply_with), Some(free)) = (
            raw::RedisModule_Call,
            raw::RedisModule_ReplyWithCallReply,
            raw::RedisModule_FreeCallReply,
        ) else {
            return Err(CmdError::err("a Redis module API function is missing"));
        };
        let reply = rm_call(
            ctx,
            name.as_ptr(),
            flags.as_ptr(),
            argv.as_ptr().cast_mut(),
            argv.len(),
        );
        if reply.is_null() {
            return Err(CmdError::err(format!(
                "the command could not run: {}",
                io::Error::last_os_error()
            )));
        }
        reply_with(ctx, reply);
        free(reply);
    }
    Ok(())
}

/// Runs `args` (the command's name first) here, as the calling user, and gives its reply, in
/// the wire format, to `read` (an error reply is a reply).
pub fn run_as_caller<R>(
    call: &Call,
    args: &[Vec<u8>],
    read: impl FnOnce(&[u8]) -> Result<R, CmdError>,
) -> Result<R, CmdError> {
    run_reading(call.ctx.ctx, args, AS_CALLER, read)
}

/// `RedisModule_Call`'s flags for a caller with no user (`acl::Caller::Root`: a module's own
/// call), which no ACL rule restricts: argv given, errors as replies, the caller's protocol.
const AS_ROOT: &std::ffi::CStr = c"vE0";

/// As `run_as_caller`, for a caller with no user (`acl::Caller::Root`), where the server
/// refuses `C`: not replicated (for a command that writes nothing, such as `INFO`).
pub fn run_as_root<R>(
    call: &Call,
    args: &[Vec<u8>],
    read: impl FnOnce(&[u8]) -> Result<R, CmdError>,
) -> Result<R, CmdError> {
    run_reading(call.ctx.ctx, args, AS_ROOT, read)
}

/// `RedisModule_Call`'s flags for a command the module runs on its own, with no client (a
/// timer's): argv given, errors as replies, replicated.
const OWN: &std::ffi::CStr = c"vE!";

/// Runs `args` (the command's name first) on `ctx` (a timer's context: no client, no user),
/// replicated, and gives its reply, in the wire format, to `read`.
pub fn run_own<R>(
    ctx: &redis_module::Context,
    args: &[Vec<u8>],
    read: impl FnOnce(&[u8]) -> Result<R, CmdError>,
) -> Result<R, CmdError> {
    run_reading(ctx.ctx, args, OWN, read)
}

fn run_reading<R>(
    ctx: *mut raw::RedisModuleCtx,
    args: &[Vec<u8>],
    flags: &std::ffi::CStr,
    read: impl FnOnce(&[u8]) -> Result<R, CmdError>,
) -> Result<R, CmdError> {
    let as_bytes: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    crate::host::writes::tell(ctx, &as_bytes);
    call_reading(ctx, &as_bytes, flags, read)
}

/// Runs `args` (the command's name first) on `ctx` through `RedisModule_Call` with `flags`,
/// and hands its reply, in the wire format, to `read`; the module's writes are not told to the
/// transactions' marks (`run_reading` does that first; the gather's scratch database needs no
/// mark: `host::scratch`).
pub(crate) fn call_reading<R>(
    ctx: *mut raw::RedisModuleCtx,
    args: &[&[u8]],
    flags: &std::ffi::CStr,
    read: impl FnOnce(&[u8]) -> Result<R, CmdError>,
) -> Result<R, CmdError> {
    let missing = || CmdError::err("a Redis module API function is missing");
    let (name, rest) = args
        .split_first()
        .ok_or_else(|| CmdError::err("no command"))?;
    let name = CString::new(*name).map_err(|_| CmdError::err("a command name with a NUL byte"))?;
    // SAFETY: every string created is freed before returning; the reply is freed after use.
    unsafe {
        let rm_call = raw::RedisModule_Call.ok_or_else(missing)?;
        let create = raw::RedisModule_CreateString.ok_or_else(missing)?;
        let free_string = raw::RedisModule_FreeString.ok_or_else(missing)?;
        let proto = raw::RedisModule_CallReplyProto.ok_or_else(missing)?;
        let free_reply = raw::RedisModule_FreeCallReply.ok_or_else(missing)?;
        let mut argv: Vec<*mut raw::RedisModuleString> = rest
            .iter()
            .map(|a| create(ctx, a.as_ptr().cast(), a.len()))
            .collect();
        let reply = rm_call(
            ctx,
            name.as_ptr(),
            flags.as_ptr(),
            argv.as_mut_ptr(),
            argv.len(),
        );
        let result = if reply.is_null() {
            Err(CmdError::err(format!(
                "the command could not run: {}",
                io::Error::last_os_error()
            )))
        } else {
            let mut len = 0usize;
            let ptr = proto(reply, &mut len);
            let bytes = if ptr.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(ptr.cast::<u8>(), len)
            };
            let read = read(bytes);
            free_reply(reply);
            read
        };
        for s in argv {
            free_string(ctx, s);
        }
        result
    }
}
