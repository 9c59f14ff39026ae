//! The command filter that makes a local routed call cost what the plain command costs.
//!
//! Redis runs command filters on every command a client sends, before it looks the command up.
//! `SHARD.CALL cmd key ...` whose keys this node owns, with no resharding step pending for any
//! of them, loses its first argument here and becomes `cmd key ...`: the server then runs the
//! plain command with its own dispatch, ACL check, keyspace notifications, replication, AOF
//! and `MULTI` queueing, and no module code runs at all. Everything else (other commands, a
//! call that goes elsewhere, a command whose key positions move with its arguments or that
//! `SHARD.CALL` has not met yet) passes untouched, to the `SHARD.CALL` command or to the
//! server. The filter does not see the commands the module itself runs (`NOSELF`); commands a
//! replica receives from its primary or a server loads from its AOF are plain commands already
//! (a rewritten call is replicated as the plain command), so nothing of theirs is rewritten.
//!
//! What it costs other commands: one length and one case-insensitive comparison of the first
//! argument (`bench/results.md`, "plain GET with the filter").

use std::cell::Cell;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw;

use super::cluster_glue::{self, Rewrite};
use super::command;
use crate::placement::Placement;
use crate::state;

/// Calls the filter turned into plain local commands.
pub static REWRITTEN: AtomicU64 = AtomicU64::new(0);

/// What the filter found for the first key of the `SHARD.CALL` it let through: the command
/// handler, which runs right after it for the same arguments, need not hash the key again.
#[derive(Clone, Copy)]
struct Verdict {
    /// The key's bytes (the argument object the handler gets too) and the ring they were
    /// placed on.
    key: *const u8,
    len: usize,
    ring: *const Placement,
    owner: usize,
}

thread_local! {
    /// Valid for the command just filtered only: every command through the filter resets it.
    static LAST: Cell<Option<Verdict>> = const { Cell::new(None) };
}

/// The owner (index in `ring`) the filter computed for `key`, if it just did, for this very
/// argument and ring.
pub fn owner_found(key: &[u8], ring: &Placement) -> Option<usize> {
    LAST.with(|last| {
        last.get()
            .filter(|v| v.key == key.as_ptr() && v.len == key.len() && std::ptr::eq(v.ring, ring))
    })
    .map(|v| v.owner)
}

/// Registers the filter.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
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
    // A panic here would reach Redis: on one, the command passes untouched.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        LAST.with(|last| last.set(None));
        if cluster_glue::enabled() {
            // SAFETY: Redis passes a live filter context for the duration of this callback.
            unsafe { cluster_rewrite(fctx) };
        }
        // SAFETY: Redis passes a live filter context for the duration of this callback.
        if unsafe { local_call(fctx) } {
            // SAFETY: as above; position 0 exists (local_call checked the count).
            unsafe {
                if let Some(delete) = raw::RedisModule_CommandFilterArgDelete {
                    if delete(fctx, 0) == raw::REDISMODULE_OK as c_int {
                        REWRITTEN.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }));
}

/// The cluster protocol's rewrites (`cluster_glue`): `CLUSTER ...` and the connection commands
/// to `SHARD.CLUSTER`, keyed commands for other slots to `SHARD.REDIRECT`.
unsafe fn cluster_rewrite(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // SAFETY: the filter context is live for this callback.
    let argc = unsafe { raw::RedisModule_CommandFilterArgsCount.map_or(0, |f| f(fctx)) };
    let Ok(count) = usize::try_from(argc) else {
        return;
    };
    let args = |i: usize| {
        let pos = c_int::try_from(i).ok().filter(|p| *p < argc)?;
        // SAFETY: pos < argc.
        unsafe { arg(fctx, pos) }
    };
    let insert: &[u8] = match cluster_glue::decide(count, args) {
        Rewrite::None => return,
        Rewrite::Cluster => {
            // SAFETY: position 0 exists; the filter owns the replacement string.
            unsafe {
                if let (Some(create), Some(replace)) = (
                    raw::RedisModule_CreateString,
                    raw::RedisModule_CommandFilterArgReplace,
                ) {
                    let s = create(std::ptr::null_mut(), c"shard.cluster".as_ptr(), 13);
                    replace(fctx, 0, s);
                }
            }
            return;
        }
        Rewrite::Connection => b"shard.cluster",
        Rewrite::Redirect => b"shard.redirect",
    };
    // SAFETY: inserting at 0 is always valid; the filter owns the new string.
    unsafe {
        if let (Some(create), Some(insert_at)) = (
            raw::RedisModule_CreateString,
            raw::RedisModule_CommandFilterArgInsert,
        ) {
            let s = create(std::ptr::null_mut(), insert.as_ptr().cast(), insert.len());
            insert_at(fctx, 0, s);
        }
    }
}

/// The bytes of argument `pos` of the filtered command.
unsafe fn arg<'a>(fctx: *mut raw::RedisModuleCommandFilterCtx, pos: c_int) -> Option<&'a [u8]> {
    // SAFETY: the filter context is live; the string outlives this callback.
    unsafe {
        let s = raw::RedisModule_CommandFilterArgGet?(fctx, pos);
        if s.is_null() {
            return None;
        }
        let mut len = 0usize;
        let p = raw::RedisModule_StringPtrLen?(s, &mut len);
        if p.is_null() {
            return None;
        }
        Some(std::slice::from_raw_parts(p.cast::<u8>(), len))
    }
}

/// Whether the command is `SHARD.CALL` of a known command with fixed key positions, every key
/// owned here now and before (no resharding step pending for it).
unsafe fn local_call(fctx: *mut raw::RedisModuleCommandFilterCtx) -> bool {
    // SAFETY: the filter context is live for this callback.
    let argc = match unsafe { raw::RedisModule_CommandFilterArgsCount.map(|f| f(fctx)) } {
        Some(n) if n >= 3 => n,
        _ => return false,
    };
    // SAFETY: position 0 exists.
    let Some(first) = (unsafe { arg(fctx, 0) }) else {
        return false;
    };
    if first.len() != 10 || !first.eq_ignore_ascii_case(b"shard.call") {
        return false;
    }
    // SAFETY: position 1 exists (argc >= 3).
    let Some(name) = (unsafe { arg(fctx, 1) }) else {
        return false;
    };
    let Some(meta) = command::known(name) else {
        return false;
    };
    // A hash command whose field names the dictionary translates: SHARD.CALL's own work.
    if super::fields::translates(name) {
        return false;
    }
    let inner_argc = usize::try_from(argc - 1).unwrap_or(0);
    if meta.blocking {
        return false;
    }
    let Some(positions) = meta.fixed_keys(inner_argc) else {
        return false;
    };
    let st = state::lock();
    let self_name = st.config.ring.self_name.as_str();
    if self_name.is_empty() {
        return false;
    }
    let Some(placement) = st.rings.current.as_ref() else {
        return false;
    };
    let Some(current) = placement.ring.as_ref() else {
        return false;
    };
    let previous = st.rings.previous.as_ref().map(|p| p.ring.as_ref());
    let mut any = false;
    for pos in positions {
        let Ok(pos) = c_int::try_from(pos + 1) else {
            return false;
        };
        // SAFETY: pos < argc.
        let Some(key) = (unsafe { arg(fctx, pos) }) else {
            return false;
        };
        let owner = current.owner(key);
        if current.spec().nodes.get(owner).map(|n| n.name.as_str()) != Some(self_name) {
            if !any {
                LAST.with(|last| {
                    last.set(Some(Verdict {
                        key: key.as_ptr(),
                        len: key.len(),
                        ring: std::sync::Arc::as_ptr(placement),
                        owner,
                    }))
                });
            }
            return false;
        }
        match previous {
            None => {}
            Some(Some(before)) if before.owner_spec(key).name == self_name => {}
            Some(_) => return false,
        }
        any = true;
    }
    any
}
