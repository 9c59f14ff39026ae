//! Access control: whether the calling user may run a command, checked as if the client had
//! sent that command itself (its ACL rules for the command and its keys).

use std::os::raw::c_int;

use redis_module::raw;

use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};

/// Checks the calling user's ACL for the command the call carries in its arguments from
/// `from` on; `name` is that command's name as the refusal shows it.
pub fn check_caller(call: &Call, from: usize, name: &str) -> CmdResult {
    check_caller_in(call, from..call.args.len(), name)
}

/// As `check_caller`, for the command the call carries in its arguments `within` (`WAIT n t`
/// in front of another command).
pub fn check_caller_in(call: &Call, within: std::ops::Range<usize>, name: &str) -> CmdResult {
    let argv = call.args.raw().get(within).unwrap_or_default();
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

/// The calling user's name (`None` when the server cannot tell).
pub fn caller_name(call: &Call) -> Option<Vec<u8>> {
    // SAFETY: the name string is freed before returning.
    unsafe {
        let (Some(current_name), Some(free_string)) = (
            raw::RedisModule_GetCurrentUserName,
            raw::RedisModule_FreeString,
        ) else {
            return None;
        };
        let s = current_name(call.ctx.ctx);
        if s.is_null() {
            return None;
        }
        let mut len = 0;
        let p = raw::string_ptr_len(s, &mut len);
        let name = (!p.is_null()).then(|| std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec());
        free_string(call.ctx.ctx, s);
        name
    }
}
