//! The server's command filter: Redis runs it on every command a client sends, before it
//! looks the command up. The module registers one handler (`register`), which sees the command
//! through [`FilterArgs`]: its arguments, and the few rewrites the module makes (delete,
//! replace, insert). The handler runs on every command of every client, so nothing here
//! allocates unless it rewrites.

use std::os::raw::c_int;
use std::sync::OnceLock;

use redis_module::raw;

/// The command being filtered, valid for the length of one filter callback.
pub struct FilterArgs {
    fctx: *mut raw::RedisModuleCommandFilterCtx,
    argc: c_int,
}

impl FilterArgs {
    /// How many arguments the command has now (the name included).
    pub fn len(&self) -> usize {
        usize::try_from(self.argc).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.argc <= 0
    }

    fn string(&self, i: usize) -> Option<*mut raw::RedisModuleString> {
        let pos = c_int::try_from(i).ok().filter(|p| *p < self.argc)?;
        // SAFETY: the filter context is live for the callback that made `self`; pos < argc.
        let s = unsafe { raw::RedisModule_CommandFilterArgGet?(self.fctx, pos) };
        (!s.is_null()).then_some(s)
    }

    /// The bytes of argument `i` (0 is the command's name), borrowed from the arguments: no
    /// rewrite can run while they are held.
    pub fn arg(&self, i: usize) -> Option<&[u8]> {
        let s = self.string(i)?;
        let mut len = 0usize;
        // SAFETY: `s` is a live argument of the filtered command.
        unsafe {
            let p = raw::RedisModule_StringPtrLen?(s, &mut len);
            if p.is_null() {
                return None;
            }
            Some(std::slice::from_raw_parts(p.cast::<u8>(), len))
        }
    }

    /// Deletes argument `i`; true when the server did.
    pub fn delete(&mut self, i: usize) -> bool {
        let Ok(pos) = c_int::try_from(i) else {
            return false;
        };
        if pos >= self.argc {
            return false;
        }
        // SAFETY: the filter context is live; pos < argc.
        let done = unsafe {
            raw::RedisModule_CommandFilterArgDelete
                .is_some_and(|delete| delete(self.fctx, pos) == raw::REDISMODULE_OK as c_int)
        };
        if done {
            self.argc -= 1;
        }
        done
    }

    /// Replaces argument `i` with `bytes`.
    pub fn replace(&mut self, i: usize, bytes: &[u8]) {
        let Ok(pos) = c_int::try_from(i) else {
            return;
        };
        if pos >= self.argc {
            return;
        }
        // SAFETY: the filter context is live; pos < argc; the filter takes ownership of the
        // new string.
        unsafe {
            if let (Some(create), Some(replace)) = (
                raw::RedisModule_CreateString,
                raw::RedisModule_CommandFilterArgReplace,
            ) {
                replace(
                    self.fctx,
                    pos,
                    create(std::ptr::null_mut(), bytes.as_ptr().cast(), bytes.len()),
                );
            }
        }
    }

    /// Inserts `bytes` as argument `i`, moving the ones from `i` on.
    pub fn insert(&mut self, i: usize, bytes: &[u8]) {
        let Ok(pos) = c_int::try_from(i) else {
            return;
        };
        if pos > self.argc {
            return;
        }
        // SAFETY: the filter context is live; pos <= argc; the filter takes ownership of the
        // new string.
        let done = unsafe {
            match (
                raw::RedisModule_CreateString,
                raw::RedisModule_CommandFilterArgInsert,
            ) {
                (Some(create), Some(insert)) => {
                    let s = create(std::ptr::null_mut(), bytes.as_ptr().cast(), bytes.len());
                    insert(self.fctx, pos, s) == raw::REDISMODULE_OK as c_int
                }
                _ => false,
            }
        };
        if done {
            self.argc += 1;
        }
    }

    /// The key positions the server's command table and key specs give for the command these
    /// arguments carry from argument `from` on (0: the command itself), counted from that
    /// command's name; `None` when it finds none or refuses the arguments.
    pub fn command_keys(&self, from: usize) -> Option<Vec<usize>> {
        let argv = (from..self.len())
            .map(|i| self.string(i))
            .collect::<Option<Vec<_>>>()?;
        crate::host::command_keys::of(crate::host::context::detached_raw(), &argv)
    }

    /// Whether the key at argument `i` is in database 0 of this server.
    pub fn key_exists(&self, i: usize) -> bool {
        let ctx = crate::host::context::detached_raw();
        // SAFETY: the API table is filled at load and read-only after.
        let (Some(key), Some(exists)) = (self.string(i), unsafe { raw::RedisModule_KeyExists })
        else {
            return false;
        };
        // SAFETY: the filter runs on the main thread; the detached context reads database 0.
        !ctx.is_null() && unsafe { exists(ctx, key) } != 0
    }

    /// The id of the client that sent the command (`None` on Redis 7.0, whose command filters
    /// cannot tell which client sent a command).
    pub fn client_id(&self) -> Option<u64> {
        // SAFETY: the API table is filled at load and read-only after; the filter context is
        // live.
        unsafe { raw::RedisModule_CommandFilterGetClientId.map(|id_of| id_of(self.fctx)) }
    }

    /// The client that sent the command, as the server describes it: its database and
    /// whether it is inside `MULTI`. `None` on Redis 7.0, whose command filters cannot tell
    /// which client sent a command, and for a client the server does not list (a script's or
    /// a module's own client).
    pub fn client(&self) -> Option<FilterClient> {
        // SAFETY: the API table is filled at load and read-only after; the filter context is
        // live.
        unsafe {
            let (Some(id_of), Some(info_of)) = (
                raw::RedisModule_CommandFilterGetClientId,
                raw::RedisModule_GetClientInfoById,
            ) else {
                return None;
            };
            let id = id_of(self.fctx);
            let mut info: raw::RedisModuleClientInfo = std::mem::zeroed();
            info.version = 1;
            if info_of(std::ptr::addr_of_mut!(info).cast(), id) != raw::REDISMODULE_OK as c_int {
                return None;
            }
            Some(FilterClient {
                db: i32::from(info.db),
                in_multi: info.flags & u64::from(raw::REDISMODULE_CLIENTINFO_FLAG_MULTI) != 0,
            })
        }
    }

    /// Whether the client that sent the command is inside `MULTI` (always `false` on Redis
    /// 7.0, whose command filters cannot tell which client sent a command).
    pub fn client_in_multi(&self) -> bool {
        self.client().is_some_and(|c| c.in_multi)
    }
}

/// The client that sent a filtered command.
#[derive(Debug, Clone, Copy)]
pub struct FilterClient {
    /// Its selected database.
    pub db: i32,
    pub in_multi: bool,
}

/// The handler, set once at load.
type Handler = fn(&mut FilterArgs);

/// (A static, not a thread-local: a thread-local of a shared library costs each command a
/// `__tls_get_addr` call.)
static HANDLER: OnceLock<Handler> = OnceLock::new();

/// Registers `handler` as the module's command filter (not run for the module's own calls:
/// `NOSELF`).
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn register(ctx: *mut raw::RedisModuleCtx, handler: Handler) -> Result<(), String> {
    let _ = HANDLER.set(handler);
    // SAFETY: called from OnLoad with its context.
    let filter = unsafe {
        let register = raw::RedisModule_RegisterCommandFilter
            .ok_or("RedisModule_RegisterCommandFilter is missing")?;
        register(
            ctx,
            Some(on_command),
            raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
        )
    };
    if filter.is_null() {
        return Err("the command filter could not be registered".into());
    }
    Ok(())
}

extern "C" fn on_command(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // A panic here would reach Redis: on one, the command passes as the handler left it.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let Some(handler) = HANDLER.get() else {
            return;
        };
        // SAFETY: Redis passes a live filter context for the duration of this callback.
        let argc = unsafe { raw::RedisModule_CommandFilterArgsCount.map_or(0, |f| f(fctx)) };
        handler(&mut FilterArgs { fctx, argc });
    }));
}
