//! The keys written on this node (and their databases) while a copy's child runs: the child's
//! snapshot predates them, so the next pass copies them. Recorded from keyspace events (subscribed at the first
//! copy, so that a server that never reshards pays nothing; afterwards a write costs one call
//! that checks a flag while no copy runs).

use std::cell::RefCell;
use std::os::raw::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context, RedisString};
use rustc_hash::{FxHashMap, FxHashSet};

/// A database number and a key of it.
pub type DbKey = (i32, Vec<u8>);

/// The keys written, per database.
#[derive(Default)]
struct Written {
    by_db: FxHashMap<i32, FxHashSet<Vec<u8>>>,
    len: usize,
}

/// More keys than this written during one pass: the next pass walks the whole keyspace again
/// instead of holding them all.
const MAX_KEYS: usize = 1_000_000;

static SUBSCRIBED: AtomicBool = AtomicBool::new(false);
static TRACKING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The keys written, or `None` once more than `MAX_KEYS` were.
    static DIRTY: RefCell<Option<Written>> = RefCell::new(Some(Written::default()));
}

/// Subscribes to the keyspace events of writes, once.
pub fn subscribe(ctx: &Context) -> Result<(), String> {
    if SUBSCRIBED.load(Ordering::Relaxed) {
        return Ok(());
    }
    let types = raw::NotifyEvent::GENERIC
        | raw::NotifyEvent::STRING
        | raw::NotifyEvent::LIST
        | raw::NotifyEvent::SET
        | raw::NotifyEvent::HASH
        | raw::NotifyEvent::ZSET
        | raw::NotifyEvent::STREAM;
    // SAFETY: the API table is filled at load; the callback lives as long as the module.
    let done = unsafe {
        let subscribe = raw::RedisModule_SubscribeToKeyspaceEvents
            .ok_or("RedisModule_SubscribeToKeyspaceEvents is missing")?;
        subscribe(ctx.ctx, types.bits(), Some(on_event))
    };
    if done != raw::REDISMODULE_OK as c_int {
        return Err("cannot subscribe to keyspace events".into());
    }
    SUBSCRIBED.store(true, Ordering::Relaxed);
    Ok(())
}

/// Events after which the key is gone from this node: nothing of it is left to copy or delete.
/// (A cleanup's own `UNLINK`s are among them: recording them cost a cleanup a third of its
/// speed.)
const GONE: [&[u8]; 5] = [b"del", b"expired", b"evicted", b"rename_from", b"move_from"];

extern "C" fn on_event(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if !TRACKING.load(Ordering::Relaxed) {
        return 0;
    }
    let _ = std::panic::catch_unwind(|| {
        if !event.is_null() {
            // SAFETY: Redis passes a NUL-terminated event name, live for the callback.
            let name = unsafe { std::ffi::CStr::from_ptr(event) }.to_bytes();
            if GONE.contains(&name) {
                return;
            }
        }
        // Redis passes a live key name for the duration of the callback.
        let bytes = RedisString::string_as_slice(key);
        // SAFETY: the callback's context, selected on the event's database.
        let db = unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx)) };
        DIRTY.with(|d| {
            let mut d = d.borrow_mut();
            if let Some(written) = d.as_mut() {
                if written.len >= MAX_KEYS {
                    *d = None;
                    return;
                }
                let set = written.by_db.entry(db).or_default();
                if !set.contains(bytes) {
                    set.insert(bytes.to_vec());
                    written.len += 1;
                }
            }
        });
    });
    0
}

/// Starts recording, with nothing recorded (at a child's fork).
pub fn begin() {
    DIRTY.with(|d| *d.borrow_mut() = Some(Written::default()));
    TRACKING.store(true, Ordering::Relaxed);
}

/// The keys written since `begin`, by database, or `None` when there were too many to keep.
pub fn take() -> Option<Vec<DbKey>> {
    DIRTY.with(|d| {
        d.borrow_mut().replace(Written::default()).map(|w| {
            let mut keys: Vec<DbKey> = w
                .by_db
                .into_iter()
                .flat_map(|(db, set)| set.into_iter().map(move |k| (db, k)))
                .collect();
            keys.sort_unstable_by_key(|(db, _)| *db);
            keys
        })
    })
}

/// Puts back keys taken for a pass that could not start.
pub fn restore(keys: Vec<DbKey>) {
    DIRTY.with(|d| {
        let mut d = d.borrow_mut();
        if let Some(written) = d.as_mut() {
            for (db, key) in keys {
                if written.by_db.entry(db).or_default().insert(key) {
                    written.len += 1;
                }
            }
        }
    });
}

/// How many keys are recorded (`None`: too many).
pub fn count() -> Option<usize> {
    DIRTY.with(|d| d.borrow().as_ref().map(|w| w.len))
}

/// Stops recording and forgets what was recorded.
pub fn end() {
    TRACKING.store(false, Ordering::Relaxed);
    DIRTY.with(|d| *d.borrow_mut() = Some(Written::default()));
}
