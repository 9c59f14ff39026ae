//! Writing many string keys in one command (`SHARD.APPLY`, the copy's way in at its
//! destination): each key is opened, written and given its absolute expiry through the module
//! API, with the keyspace events `SET` fires, and the command is propagated to replicas and the AOF
//! with the keys it wrote (every node of a fleet loads the module, replicas included); the keys
//! written are told to the module's own-writes hook (`host::writes`: a watch of one fails).
//!
//! Why not `SET` through `RedisModule_Call`: that pays the server's dispatch for every key
//! (a fake client, its argument copies, `call()`, the reply parsed back), which is what a
//! command for many keys exists to spare. The values are the command's own argument objects,
//! kept by reference, as `SET` keeps its own.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::{raw, Context};

use crate::host::args::Args;

/// Strings written by `write_string_triples`, and those it skipped (there already, or
/// expired), since the server started: INFO's `applied_strings` and `applied_skipped`.
static WRITTEN: AtomicU64 = AtomicU64::new(0);
static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// (written, skipped) so far.
pub fn applied() -> (u64, u64) {
    (
        WRITTEN.load(Ordering::Relaxed),
        SKIPPED.load(Ordering::Relaxed),
    )
}

/// One string to write: its name, its value and the argument its expiry was read from (all
/// arguments of the running command), and that absolute expiry in Unix ms (0: none).
struct StringWrite {
    name: *mut raw::RedisModuleString,
    value: *mut raw::RedisModuleString,
    expires_at: i64,
    expires_at_arg: *mut raw::RedisModuleString,
}

/// Writes the strings the running command names as `name value expiry` triples from
/// argument `from` on (`expiries[i]` is the i-th triple's expiry, already read and checked),
/// as [`write_strings`] does; argument `from - 1` is the command's flag. How many were
/// written.
pub fn write_string_triples(
    ctx: &Context,
    args: &Args,
    from: usize,
    expiries: &[i64],
    replace: bool,
) -> u64 {
    let argv = args.raw();
    if from == 0 || argv.len() < from + 3 * expiries.len() {
        return 0;
    }
    let writes: Vec<StringWrite> = argv[from..]
        .chunks_exact(3)
        .zip(expiries)
        .map(|(t, &expires_at)| StringWrite {
            name: t[0],
            value: t[1],
            expires_at,
            expires_at_arg: t[2],
        })
        .collect();
    // SAFETY: every pointer is an argument of the running command.
    let written = unsafe { write_strings(ctx, argv[0], argv[from - 1], &writes, replace) };
    WRITTEN.fetch_add(written, Ordering::Relaxed);
    SKIPPED.fetch_add(writes.len() as u64 - written, Ordering::Relaxed);
    written
}

/// Writes `writes` in the selected database, each unless a key of that name is there
/// (`replace` false, as `SET NX`) or over it (`replace`); a key whose expiry has passed is not
/// written (as `SET ... PXAT` in the past leaves nothing), except while loading or applying
/// the primary's stream, where the primary decided. Then propagates the running command
/// (`command flag` and the writes) with the writes that were made: as it came when all were.
/// How many were written.
///
/// # Safety
/// Every pointer of `writes`, `command` and `flag` must be an argument of the command `ctx`
/// runs.
unsafe fn write_strings(
    ctx: &Context,
    command: *mut raw::RedisModuleString,
    flag: *mut raw::RedisModuleString,
    writes: &[StringWrite],
    replace: bool,
) -> u64 {
    // SAFETY: the API table is filled at load; keys are closed before returning; the strings
    // are the running command's arguments (the caller's promise).
    unsafe {
        let (Some(open), Some(close), Some(key_type), Some(set)) = (
            raw::RedisModule_OpenKey,
            raw::RedisModule_CloseKey,
            raw::RedisModule_KeyType,
            raw::RedisModule_StringSet,
        ) else {
            return 0;
        };
        let flags = raw::RedisModule_GetContextFlags.map_or(0, |f| f(ctx.ctx));
        let decided_elsewhere = flags
            & (raw::REDISMODULE_CTX_FLAGS_LOADING | raw::REDISMODULE_CTX_FLAGS_REPLICATED) as c_int
            != 0;
        let now = crate::clock::now_ms().unwrap_or(0);
        let notify = raw::RedisModule_NotifyKeyspaceEvent;
        let mut written = 0;
        let mut done = vec![false; writes.len()];
        for (w, done) in writes.iter().zip(done.iter_mut()) {
            if w.expires_at > 0 && w.expires_at <= now && !decided_elsewhere {
                continue;
            }
            let key = open(ctx.ctx, w.name, raw::REDISMODULE_WRITE as c_int)
                .cast::<raw::RedisModuleKey>();
            if key.is_null() {
                continue;
            }
            let there = key_type(key) != raw::REDISMODULE_KEYTYPE_EMPTY as c_int;
            if there && !replace {
                close(key);
                continue;
            }
            if set(key, w.value) != raw::REDISMODULE_OK as c_int {
                close(key);
                continue;
            }
            if w.expires_at > 0 {
                set_abs_expire(key, w.expires_at, now);
            }
            close(key);
            written += 1;
            *done = true;
            if let Some(notify) = notify {
                notify(
                    ctx.ctx,
                    raw::REDISMODULE_NOTIFY_STRING,
                    c"set".as_ptr(),
                    w.name,
                );
                if w.expires_at > 0 {
                    notify(
                        ctx.ctx,
                        raw::REDISMODULE_NOTIFY_GENERIC,
                        c"expire".as_ptr(),
                        w.name,
                    );
                }
            }
        }
        // Writes of the module's own, which no command filter sees: told as the `MSET` of the
        // keys written (a transaction's watch of one counts it written).
        if written > 0 && crate::host::writes::following() {
            let told: Vec<*mut raw::RedisModuleString> = writes
                .iter()
                .zip(&done)
                .filter(|(_, d)| **d)
                .flat_map(|(w, _)| [w.name, w.value])
                .collect();
            crate::host::writes::tell_strings(ctx.ctx, b"MSET", &told);
        }
        if written as usize == writes.len() {
            if let Some(verbatim) = raw::RedisModule_ReplicateVerbatim {
                verbatim(ctx.ctx);
            }
        } else if written > 0 {
            replicate_written(ctx, command, flag, writes, &done);
        }
        written
    }
}

/// Propagates `command flag` with only the writes that were made (`done`), so that a replica
/// or the AOF holds exactly what this server holds.
///
/// # Safety
/// The strings of `writes`, `command` and `flag` must be live for the call.
unsafe fn replicate_written(
    ctx: &Context,
    command: *mut raw::RedisModuleString,
    flag: *mut raw::RedisModuleString,
    writes: &[StringWrite],
    done: &[bool],
) {
    let mut argv: Vec<*mut raw::RedisModuleString> = vec![flag];
    for (w, _) in writes.iter().zip(done).filter(|(_, d)| **d) {
        argv.push(w.name);
        argv.push(w.value);
        argv.push(w.expires_at_arg);
    }
    // SAFETY: the caller's live strings; "v" takes a vector of strings and its length.
    unsafe {
        let (Some(replicate), Some(name)) =
            (raw::RedisModule_Replicate, raw::RedisModule_StringPtrLen)
        else {
            return;
        };
        let mut len = 0;
        let ptr = name(command, &mut len);
        let Ok(text) = std::str::from_utf8(std::slice::from_raw_parts(ptr.cast::<u8>(), len))
        else {
            return;
        };
        let Ok(command) = std::ffi::CString::new(text) else {
            return;
        };
        replicate(
            ctx.ctx,
            command.as_ptr(),
            c"v".as_ptr(),
            argv.as_ptr(),
            argv.len(),
        );
    }
}

/// Gives an open key its absolute expiry (`RedisModule_SetAbsExpire` where the server has it,
/// else the time left from `now`).
///
/// # Safety
/// `key` must be a key open for writing.
unsafe fn set_abs_expire(key: *mut raw::RedisModuleKey, at: i64, now: i64) {
    // SAFETY: the caller's open key; the API table is filled at load.
    unsafe {
        if let Some(abs) = raw::RedisModule_SetAbsExpire {
            abs(key, at);
        } else if let Some(rel) = raw::RedisModule_SetExpire {
            rel(key, (at - now).max(1));
        }
    }
}
