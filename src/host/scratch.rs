//! Commands run in another database than the context's, unreplicated, for one main-thread
//! step: a gathered command (`txn::coord::gather`) restores copies of its keys in a scratch
//! database, runs there as the calling user, reads back what it wrote and deletes the copies,
//! all before the event loop turns again. Nothing run here is replicated or written to the AOF
//! (no `!` flag), passes the command filter (the module's own calls: `NOSELF`), or is told to
//! the hook of the module's own writes (`host::writes`): the copies are not the data, and the
//! data's owners are written by the transaction that follows.

use std::ffi::CStr;
use std::ptr;

use redis_module::{raw, Context};

use crate::host::error::CmdError;

/// `RedisModule_Call`'s flags for the module's own steps in the scratch database: argv given,
/// errors as replies; not replicated.
const OWN: &CStr = c"vE";
/// As the user set on the context (`C`), refused under `maxmemory` as a client's write is
/// (`M`); RESP2 or RESP3 as the client speaks.
const AS_USER: &CStr = c"vCEM";
const AS_USER_RESP3: &CStr = c"vCEM3";

/// A context switched to another database (and, when named, to a user) until dropped.
pub struct Scratch<'a> {
    ctx: &'a Context,
    back: i32,
    user: *mut raw::RedisModuleUser,
}

impl<'a> Scratch<'a> {
    /// Switches `ctx` (a timer's: no client of its own) to database `db` and to the user
    /// named `user` (none: no user, for the module's own steps only). Refused when the
    /// database does not exist or the user is gone.
    pub fn enter(ctx: &'a Context, db: i32, user: Option<&[u8]>) -> Result<Scratch<'a>, CmdError> {
        let missing = || CmdError::err("a Redis module API function is missing");
        // SAFETY: a live context of the main thread; the user is freed on drop.
        unsafe {
            let get_db = raw::RedisModule_GetSelectedDb.ok_or_else(missing)?;
            let select = raw::RedisModule_SelectDb.ok_or_else(missing)?;
            let back = get_db(ctx.ctx);
            let mut user_ptr = ptr::null_mut();
            if let Some(name) = user {
                let (Some(create), Some(from_name), Some(free_string), Some(set_user)) = (
                    raw::RedisModule_CreateString,
                    raw::RedisModule_GetModuleUserFromUserName,
                    raw::RedisModule_FreeString,
                    raw::RedisModule_SetContextUser,
                ) else {
                    return Err(CmdError::err(
                        "this server cannot run a command as a named user (RedisModule_SetContextUser)",
                    ));
                };
                let s = create(ctx.ctx, name.as_ptr().cast(), name.len());
                user_ptr = from_name(s);
                free_string(ctx.ctx, s);
                if user_ptr.is_null() {
                    return Err(CmdError::code(
                        "NOPERM",
                        "the calling user no longer exists",
                    ));
                }
                set_user(ctx.ctx, user_ptr);
            }
            let scratch = Scratch {
                ctx,
                back,
                user: user_ptr,
            };
            if select(ctx.ctx, db) != raw::REDISMODULE_OK as i32 {
                return Err(CmdError::err(format!(
                    "database {db} does not exist on this server"
                )));
            }
            Ok(scratch)
        }
    }

    /// Runs `args` (the command's name first) as the module itself: its reply in the wire
    /// format (RESP2).
    pub fn own(&self, args: &[&[u8]]) -> Result<Vec<u8>, CmdError> {
        self.call(args, OWN)
    }

    /// Runs `args` as the user given to `enter`, its reply in RESP3 when `resp3`.
    pub fn as_user(&self, args: &[&[u8]], resp3: bool) -> Result<Vec<u8>, CmdError> {
        if self.user.is_null() {
            return Err(CmdError::err(
                "internal error: no user to run the command as",
            ));
        }
        self.call(args, if resp3 { AS_USER_RESP3 } else { AS_USER })
    }

    fn call(&self, args: &[&[u8]], flags: &CStr) -> Result<Vec<u8>, CmdError> {
        crate::host::caller::call_reading(self.ctx.ctx, args, flags, |bytes| Ok(bytes.to_vec()))
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        // SAFETY: the context given to `enter`, still live; the user was taken there.
        unsafe {
            if let Some(select) = raw::RedisModule_SelectDb {
                select(self.ctx.ctx, self.back);
            }
            if !self.user.is_null() {
                if let Some(set_user) = raw::RedisModule_SetContextUser {
                    set_user(self.ctx.ctx, ptr::null());
                }
                if let Some(free_user) = raw::RedisModule_FreeModuleUser {
                    free_user(self.user);
                }
            }
        }
    }
}
