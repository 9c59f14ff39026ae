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
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use redis_module::raw;

use crate::cluster::protocol::Rewrite;
use crate::ring::placement::Placement;
use crate::route::command_table;
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

/// A context of no client for what the filter asks the server (key specs, whether a key
/// exists, the server's role): made at load, used on the main thread only.
static DETACHED: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// The module's detached context (null before load): for what needs a context outside any
/// command or timer, such as arming a timer from an event-loop callback. Main thread only.
pub fn detached() -> *mut raw::RedisModuleCtx {
    DETACHED.load(Ordering::Relaxed)
}

/// Makes the module's detached context (once).
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn detach(ctx: *mut raw::RedisModuleCtx) {
    if !DETACHED.load(Ordering::Relaxed).is_null() {
        return;
    }
    // SAFETY: called from OnLoad with its context.
    unsafe {
        if let Some(detach) = raw::RedisModule_GetDetachedThreadSafeContext {
            DETACHED.store(detach(ctx), Ordering::Relaxed);
        }
    }
}

/// Registers the filter.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn register(ctx: *mut raw::RedisModuleCtx) -> Result<(), String> {
    // SAFETY: called from OnLoad with its context.
    unsafe { detach(ctx) };
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
        if crate::cluster::protocol::enabled() {
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

/// The filtered command, as the cluster protocol's decision sees it.
struct Filtered {
    fctx: *mut raw::RedisModuleCommandFilterCtx,
    argc: c_int,
}

impl Filtered {
    fn string(&self, i: usize) -> Option<*mut raw::RedisModuleString> {
        let pos = c_int::try_from(i).ok().filter(|p| *p < self.argc)?;
        // SAFETY: the filter context is live for the callback that made `self`; pos < argc.
        let s = unsafe { raw::RedisModule_CommandFilterArgGet?(self.fctx, pos) };
        (!s.is_null()).then_some(s)
    }
}

impl<'a> crate::cluster::protocol::FilterEnv<'a> for Filtered {
    fn arg(&self, i: usize) -> Option<&'a [u8]> {
        let pos = c_int::try_from(i).ok().filter(|p| *p < self.argc)?;
        // SAFETY: pos < argc; the argument outlives the callback.
        unsafe { arg(self.fctx, pos) }
    }

    fn movable_keys(&self) -> Option<Vec<usize>> {
        let ctx = DETACHED.load(Ordering::Relaxed);
        // SAFETY: the API table is filled at load and read-only after.
        let get = unsafe { raw::RedisModule_GetCommandKeysWithFlags }?;
        let count = usize::try_from(self.argc).ok()?;
        let argv = (0..count)
            .map(|i| self.string(i))
            .collect::<Option<Vec<_>>>()?;
        let mut num: c_int = 0;
        // SAFETY: argv are the live arguments of the filtered command; the result is freed
        // below with RedisModule_Free.
        unsafe {
            let p = get(
                ctx,
                argv.as_ptr().cast_mut(),
                self.argc,
                &mut num,
                std::ptr::null_mut(),
            );
            if p.is_null() {
                return None;
            }
            let n = usize::try_from(num).unwrap_or(0);
            let keys = std::slice::from_raw_parts(p, n)
                .iter()
                .filter_map(|&k| usize::try_from(k).ok())
                .collect();
            if let Some(free) = raw::RedisModule_Free {
                free(p.cast());
            }
            Some(keys)
        }
    }

    fn exists(&self, pos: usize) -> bool {
        let ctx = DETACHED.load(Ordering::Relaxed);
        // SAFETY: the API table is filled at load and read-only after.
        let (Some(key), Some(exists)) = (self.string(pos), unsafe { raw::RedisModule_KeyExists })
        else {
            return false;
        };
        // SAFETY: the filter runs on the main thread; the detached context reads database 0.
        !ctx.is_null() && unsafe { exists(ctx, key) } != 0
    }

    fn in_transaction(&self) -> bool {
        // SAFETY: the API table is filled at load and read-only after; the filter context is
        // live. Redis 7.0 has no CommandFilterGetClientId: the filter cannot tell.
        unsafe {
            let (Some(id_of), Some(info_of)) = (
                raw::RedisModule_CommandFilterGetClientId,
                raw::RedisModule_GetClientInfoById,
            ) else {
                return false;
            };
            let id = id_of(self.fctx);
            let mut info: raw::RedisModuleClientInfo = std::mem::zeroed();
            info.version = 1;
            info_of(std::ptr::addr_of_mut!(info).cast(), id) == raw::REDISMODULE_OK as c_int
                && info.flags & u64::from(raw::REDISMODULE_CLIENTINFO_FLAG_MULTI) != 0
        }
    }

    fn is_replica(&self) -> bool {
        let ctx = DETACHED.load(Ordering::Relaxed);
        // SAFETY: the API table is filled at load and read-only after.
        let Some(flags) = (unsafe { raw::RedisModule_GetContextFlags }) else {
            return false;
        };
        // SAFETY: the detached context lives as long as the module.
        !ctx.is_null() && unsafe { flags(ctx) } & raw::REDISMODULE_CTX_FLAGS_SLAVE as c_int != 0
    }
}

/// The cluster protocol's rewrites (`cluster_glue`): `CLUSTER ...` and the connection commands
/// to `SHARD.CLUSTER`, keyed commands for other slots to `SHARD.REDIRECT`.
unsafe fn cluster_rewrite(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    // SAFETY: the filter context is live for this callback.
    let argc = unsafe { raw::RedisModule_CommandFilterArgsCount.map_or(0, |f| f(fctx)) };
    let Ok(count) = usize::try_from(argc) else {
        return;
    };
    let filtered = Filtered { fctx, argc };
    let insert: &[u8] = match crate::cluster::protocol::decide(count, &filtered) {
        Rewrite::None => return,
        Rewrite::Redirect(leave)
            if crate::cluster::protocol::FilterEnv::in_transaction(&filtered) =>
        {
            // SAFETY: the filter context is live; the positions exist; the filter owns the
            // replacement string.
            unsafe { refuse(fctx, argc, &leave.refusal()) };
            return;
        }
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
        Rewrite::Redirect(_) => b"shard.redirect",
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

/// Makes the filtered command an unknown command named `text`, with no argument: the server
/// refuses it (`ERR unknown command 'text'`) and, inside `MULTI`, flags the transaction so that
/// `EXEC` aborts.
unsafe fn refuse(fctx: *mut raw::RedisModuleCommandFilterCtx, argc: c_int, text: &str) {
    // SAFETY: the filter context is live; positions 1..argc exist and are deleted from the
    // last; position 0 is replaced by a string the filter owns.
    unsafe {
        let (Some(create), Some(replace), Some(delete)) = (
            raw::RedisModule_CreateString,
            raw::RedisModule_CommandFilterArgReplace,
            raw::RedisModule_CommandFilterArgDelete,
        ) else {
            return;
        };
        for pos in (1..argc).rev() {
            delete(fctx, pos);
        }
        replace(
            fctx,
            0,
            create(std::ptr::null_mut(), text.as_ptr().cast(), text.len()),
        );
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
    let Some(meta) = command_table::known(name) else {
        return false;
    };
    // A hash command whose field names the dictionary translates: SHARD.CALL's own work.
    if crate::route::fields::translates(name) {
        return false;
    }
    let inner_argc = usize::try_from(argc - 1).unwrap_or(0);
    if meta.blocking {
        return false;
    }
    // A replica runs no routed call itself (its primary does), and reads that go to replicas
    // are SHARD.CALL's to send.
    if crate::topology::nodes::is_replica()
        || (meta.readonly
            && crate::topology::nodes::read_from() != crate::topology::nodes::ReadFrom::Primary)
    {
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
