//! The server's command filter: Redis runs it on every command a client sends, before it
//! looks the command up. The module registers one handler (`register`), which sees the command
//! through [`FilterArgs`]: its arguments, and the few rewrites the module makes (delete,
//! replace, insert). The handler runs on every command of every client, so nothing here
//! allocates unless it rewrites.

use std::os::raw::c_int;

use redis_module::raw;

use crate::host::argv;

/// The command being filtered, valid for the length of one filter callback.
pub struct FilterArgs {
    fctx: *mut raw::RedisModuleCommandFilterCtx,
    argc: usize,
    /// The server's argument array, where arguments are read from it directly (`host::argv`,
    /// read again after each rewrite, which may move it); null: through the API.
    array: *const *mut raw::RedisModuleString,
}

impl FilterArgs {
    /// How many arguments the command has now (the name included).
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.argc
    }

    pub fn is_empty(&self) -> bool {
        self.argc == 0
    }

    fn string(&self, i: usize) -> Option<*mut raw::RedisModuleString> {
        if i >= self.argc {
            return None;
        }
        let s = if self.array.is_null() {
            let pos = c_int::try_from(i).ok()?;
            // SAFETY: the filter context is live for the callback that made `self`; pos < argc.
            unsafe { raw::RedisModule_CommandFilterArgGet?(self.fctx, pos) }
        } else {
            // SAFETY: the array of the live context, as `host::argv` checked; i < argc.
            unsafe { *self.array.add(i) }
        };
        (!s.is_null()).then_some(s)
    }

    /// The bytes of argument `i` (0 is the command's name), borrowed from the arguments: no
    /// rewrite can run while they are held. (Inlined: the command filter reads the name and,
    /// while keys are watched, every argument's length, of every command.)
    #[inline(always)]
    pub fn arg(&self, i: usize) -> Option<&[u8]> {
        if i < self.argc && !self.array.is_null() {
            // SAFETY: the array of the live context and its arguments, of a server whose
            // layout `host::argv` checked; i < argc.
            unsafe {
                let s = *self.array.add(i);
                if !s.is_null() {
                    if let Some((p, len)) = argv::bytes(s) {
                        return Some(std::slice::from_raw_parts(p, len));
                    }
                }
            }
        }
        self.arg_through_api(i)
    }

    /// The bytes of argument `i` if they can be read without a call (`None`: not known). The
    /// handler's quick look (`Handler::retains`) reads with this only.
    #[inline(always)]
    pub fn quick_arg(&self, i: usize) -> Option<&[u8]> {
        if i >= self.argc || self.array.is_null() {
            return None;
        }
        // SAFETY: the array of the live context and its arguments, of a server whose layout
        // `host::argv` checked; i < argc.
        unsafe {
            let s = *self.array.add(i);
            if s.is_null() {
                return None;
            }
            let (p, len) = argv::bytes_quick(s)?;
            Some(std::slice::from_raw_parts(p, len))
        }
    }

    /// Whether an argument after the name may have a length whose bit (`min(len, 63)`) is set
    /// in `lengths` (true too for an argument whose length is not read without a call): the
    /// command filter's first look at every argument while keys are watched or locked.
    #[inline(always)]
    pub fn any_length_in(&self, lengths: u64) -> bool {
        if self.array.is_null() {
            return self.argc > 1;
        }
        let mut i = 1;
        while i < self.argc {
            // SAFETY: the array of the live context and its arguments, of a server whose
            // layout `host::argv` checked; i < argc.
            let len = unsafe {
                let s = *self.array.add(i);
                if s.is_null() {
                    return true;
                }
                argv::quick_len(s)
            };
            match len {
                Some(len) if lengths & (1 << len.min(63)) == 0 => {}
                _ => return true,
            }
            i += 1;
        }
        false
    }

    #[cold]
    #[inline(never)]
    fn arg_through_api(&self, i: usize) -> Option<&[u8]> {
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

    /// After a rewrite: the server may have moved the argument array.
    fn rewritten(&mut self) {
        if !self.array.is_null() {
            // SAFETY: the live filter context, of a server whose layout `host::argv` checked.
            self.array = unsafe { argv::array(self.fctx) };
        }
    }

    /// Deletes argument `i`; true when the server did.
    pub fn delete(&mut self, i: usize) -> bool {
        let Ok(pos) = c_int::try_from(i) else {
            return false;
        };
        if i >= self.argc {
            return false;
        }
        // SAFETY: the filter context is live; pos < argc.
        let done = unsafe {
            raw::RedisModule_CommandFilterArgDelete
                .is_some_and(|delete| delete(self.fctx, pos) == raw::REDISMODULE_OK as c_int)
        };
        if done {
            self.argc -= 1;
            self.rewritten();
        }
        done
    }

    /// Replaces argument `i` with `bytes`.
    pub fn replace(&mut self, i: usize, bytes: &[u8]) {
        let Ok(pos) = c_int::try_from(i) else {
            return;
        };
        if i >= self.argc {
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
        self.rewritten();
    }

    /// Inserts `bytes` as argument `i`, moving the ones from `i` on.
    pub fn insert(&mut self, i: usize, bytes: &[u8]) {
        let Ok(pos) = c_int::try_from(i) else {
            return;
        };
        if i > self.argc {
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
            self.rewritten();
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

    /// As `command_keys`, saying why there is no key (none in these arguments, an unknown
    /// command, a wrong number of arguments).
    pub fn command_key_positions(
        &self,
        from: usize,
    ) -> Result<Vec<usize>, crate::host::command_keys::NoKeys> {
        let argv = (from..self.len())
            .map(|i| self.string(i))
            .collect::<Option<Vec<_>>>()
            .ok_or(crate::host::command_keys::NoKeys::None)?;
        crate::host::command_keys::positions(crate::host::context::detached_raw(), &argv)
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

    /// The name of the user of the client that sent the command. `None` on Redis 7.0, whose
    /// command filters cannot tell which client sent a command, and for a client the server
    /// does not list (a script's or a module's own client).
    pub fn client_user(&self) -> Option<Vec<u8>> {
        let ctx = crate::host::context::detached_raw();
        if ctx.is_null() {
            return None;
        }
        // SAFETY: the API table is filled at load and read-only after; the filter context is
        // live; the string made is freed before returning.
        unsafe {
            let (Some(id_of), Some(user_of), Some(ptr_len), Some(free)) = (
                raw::RedisModule_CommandFilterGetClientId,
                raw::RedisModule_GetClientUserNameById,
                raw::RedisModule_StringPtrLen,
                raw::RedisModule_FreeString,
            ) else {
                return None;
            };
            let name = user_of(ctx, id_of(self.fctx));
            if name.is_null() {
                return None;
            }
            let mut len = 0usize;
            let p = ptr_len(name, &mut len);
            let bytes =
                (!p.is_null()).then(|| std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec());
            free(ctx, name);
            bytes
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

/// The module's command filter: one handler, called for every command (`register`).
pub trait Handler {
    /// The quick look at every command, where arguments are read directly (`host::argv`):
    /// whether `on_command` must see it. Reads arguments with `quick_arg` and `any_length_in`
    /// only, calls nothing (no register to save on the path of every command) and must not
    /// panic (it runs outside the callback's `catch_unwind`): true when it cannot tell.
    fn retains(args: &FilterArgs) -> bool;
    /// The command, in full (through the API where arguments are not read directly).
    fn on_command(args: &mut FilterArgs);
}

/// Registers `H` as the module's command filter (not run for the module's own calls:
/// `NOSELF`). The callback the server calls is made for `H`, so the handler is inlined into
/// it: no further indirect call on the path of every command.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn register<H: Handler>(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    // SAFETY: called from OnLoad with its context.
    unsafe { argv::enable(ctx) };
    // SAFETY: called from OnLoad with its context.
    let filter = unsafe {
        let register = raw::RedisModule_RegisterCommandFilter
            .ok_or("RedisModule_RegisterCommandFilter is missing")?;
        register(
            ctx,
            Some(on_command::<H>),
            raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
        )
    };
    if filter.is_null() {
        return Err("the command filter could not be registered".into());
    }
    Ok(())
}

extern "C" fn on_command<H: Handler>(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // The quick look calls nothing and cannot panic (no unwinding to catch on the path of
    // every command, which then needs no stack frame); the rest catches any panic, which would
    // reach Redis: on one, the command passes as the handler left it.
    if argv::on() {
        // SAFETY: Redis passes a live filter context for the duration of this callback;
        // arguments are read directly.
        let (argc, array) = unsafe { argv::read(fctx) };
        if H::retains(&FilterArgs { fctx, argc, array }) {
            retained::<H>(fctx, argc, array);
        }
    } else {
        not_direct::<H>(fctx);
    }
}

/// A command the quick look retained (its context's parts in registers: a tail call).
#[inline(never)]
fn retained<H: Handler>(
    fctx: *mut raw::RedisModuleCommandFilterCtx,
    argc: usize,
    array: *const *mut raw::RedisModuleString,
) {
    let mut args = FilterArgs { fctx, argc, array };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| H::on_command(&mut args)));
}

/// A command whose arguments are not read directly (yet: the first command checks the
/// context's layout).
#[inline(never)]
fn not_direct<H: Handler>(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the live filter context of this callback.
        let (argc, array) = match unsafe { argv::command(fctx) } {
            Some(read) => read,
            None => {
                // SAFETY: as above.
                let argc =
                    unsafe { raw::RedisModule_CommandFilterArgsCount.map_or(0, |f| f(fctx)) };
                (usize::try_from(argc).unwrap_or(0), std::ptr::null())
            }
        };
        H::on_command(&mut FilterArgs { fctx, argc, array });
    }));
}
