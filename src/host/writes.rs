//! The module's own writes, told upward: the commands the module runs itself through
//! `RedisModule_Call` (a routed call run here, a copy's big-key pieces, a cleanup's `UNLINK`)
//! pass no command filter (`NOSELF`), so a capability that follows writes (the transactions'
//! watch table) learns of them here: each is handed to one hook, set at load by the glue,
//! before it runs. While nothing follows (`set_following(false)`, the usual case), telling costs
//! one flag check.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::raw;

/// A command the module is about to run, for the length of the hook's call.
pub struct OwnCommand<'a> {
    ctx: *mut raw::RedisModuleCtx,
    /// The command's name, then its arguments.
    args: &'a [&'a [u8]],
}

impl OwnCommand<'_> {
    pub fn len(&self) -> usize {
        self.args.len()
    }

    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// Argument `i` (0 is the name).
    pub fn arg(&self, i: usize) -> Option<&[u8]> {
        self.args.get(i).copied()
    }

    /// The database the command runs in.
    pub fn db(&self) -> i32 {
        // SAFETY: the context the command runs on, live for the hook's call.
        unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(self.ctx)) }
    }

    /// The key positions the server gives for the command these arguments carry from argument
    /// `from` on (0: the command itself), counted from that command's name (`None`: none
    /// found).
    pub fn key_positions(&self, from: usize) -> Option<Vec<usize>> {
        crate::host::command_keys::of_bytes(self.args.get(from..)?)
    }
}

type Hook = fn(&OwnCommand);

static FOLLOWING: AtomicBool = AtomicBool::new(false);

thread_local! {
    static HOOK: Cell<Option<Hook>> = const { Cell::new(None) };
}

/// Sets the hook told of the module's own commands (once, at load).
pub fn set_hook(hook: Hook) {
    HOOK.with(|h| h.set(Some(hook)));
}

/// Whether the hook is told at all (true while something follows writes).
pub fn set_following(on: bool) {
    FOLLOWING.store(on, Ordering::Relaxed);
}

/// Whether the hook is told (a caller that must build the command first asks).
pub fn following() -> bool {
    FOLLOWING.load(Ordering::Relaxed)
}

/// Tells the hook of a command the module is about to run on `ctx`: `name`, then `argv`
/// (the running command's own argument strings).
pub(crate) fn tell_strings(
    ctx: *mut raw::RedisModuleCtx,
    name: &[u8],
    argv: &[*mut raw::RedisModuleString],
) {
    if !FOLLOWING.load(Ordering::Relaxed) {
        return;
    }
    let mut args: Vec<&[u8]> = Vec::with_capacity(argv.len() + 1);
    args.push(name);
    args.extend(argv.iter().map(|&s| {
        let mut len = 0;
        let p = raw::string_ptr_len(s, &mut len);
        if p.is_null() {
            &[][..]
        } else {
            // SAFETY: a live argument string of the running command.
            unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
        }
    }));
    tell_in(ctx, &args);
}

/// As [`tell_strings`], for a command given as bytes.
pub fn tell(ctx: *mut raw::RedisModuleCtx, args: &[&[u8]]) {
    if FOLLOWING.load(Ordering::Relaxed) {
        tell_in(ctx, args);
    }
}

fn tell_in(ctx: *mut raw::RedisModuleCtx, args: &[&[u8]]) {
    if let Some(hook) = HOOK.with(Cell::get) {
        hook(&OwnCommand { ctx, args });
    }
}
