//! The keyspace events of writes (`RedisModule_SubscribeToKeyspaceEvents`), handed to one Rust
//! function per subscription (writes, a key's lifecycle, the server's own expiries and
//! evictions): every command that changes a key tells it the event's name, the key and its
//! database. Subscribed once, for the life of the module (the server has no unsubscribe); the
//! subscriber keeps the cost low while it does not care (a flag it checks first: the event's
//! name, key and database are read only when asked for).

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::sync::OnceLock;

use redis_module::{raw, Context, RedisString};

/// One keyspace event, for the length of the subscriber's call.
pub struct KeyspaceEvent {
    ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
}

impl KeyspaceEvent {
    /// The event's name (`set`, `del`, `expired`, ...); empty if the server gave none.
    /// Whether the event ends the key in its database (`del`, `expired`, `evicted`,
    /// `rename_from`, `move_from`): nothing of it is left there.
    pub fn ends_key(&self) -> bool {
        const ENDS: [&[u8]; 5] = [b"del", b"expired", b"evicted", b"rename_from", b"move_from"];
        ENDS.contains(&self.name())
    }

    pub fn name(&self) -> &[u8] {
        if self.event.is_null() {
            return b"";
        }
        // SAFETY: the server passes a NUL-terminated event name, live for the callback.
        unsafe { CStr::from_ptr(self.event) }.to_bytes()
    }

    /// The key written.
    pub fn key(&self) -> &[u8] {
        // The server passes a live key name for the duration of the callback.
        RedisString::string_as_slice(self.key)
    }

    /// The database of the key.
    pub fn db(&self) -> i32 {
        // SAFETY: the callback's context, selected on the event's database.
        unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(self.ctx)) }
    }
}

/// The subscriber of each subscription, set once.
type Slot = OnceLock<fn(&KeyspaceEvent)>;

static WRITES: Slot = OnceLock::new();
static LIFECYCLE: Slot = OnceLock::new();
static EXPIRY: Slot = OnceLock::new();

/// Calls `subscriber` on each key the server ends by itself, from then on: the `expired` and
/// `evicted` classes only (a `SET` dispatches to no subscriber of these). Once per module.
pub fn subscribe_to_expiry(ctx: &Context, subscriber: fn(&KeyspaceEvent)) -> Result<(), String> {
    extern "C" fn callback(
        ctx: *mut raw::RedisModuleCtx,
        _type: c_int,
        event: *const c_char,
        key: *mut raw::RedisModuleString,
    ) -> c_int {
        deliver(&EXPIRY, ctx, event, key)
    }
    let types = raw::REDISMODULE_NOTIFY_EXPIRED | raw::REDISMODULE_NOTIFY_EVICTED;
    subscribe(
        ctx,
        &EXPIRY,
        subscriber,
        types,
        Some(callback),
        "expiry and eviction events",
    )
}

/// Calls `subscriber` on each event that makes a key or ends one, from then on: `new` (a key
/// added to a database, by any command, a `RESTORE`, a module), and the generic, expired and
/// evicted classes (`del`, `rename_from`, `move_from`, `expired`, `evicted`, and the others of
/// those classes, which the subscriber tells apart by name). Once per module.
pub fn subscribe_to_lifecycle(ctx: &Context, subscriber: fn(&KeyspaceEvent)) -> Result<(), String> {
    extern "C" fn callback(
        ctx: *mut raw::RedisModuleCtx,
        _type: c_int,
        event: *const c_char,
        key: *mut raw::RedisModuleString,
    ) -> c_int {
        deliver(&LIFECYCLE, ctx, event, key)
    }
    let types = raw::REDISMODULE_NOTIFY_NEW
        | raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED;
    subscribe(
        ctx,
        &LIFECYCLE,
        subscriber,
        types,
        Some(callback),
        "key lifecycle events",
    )
}

/// Calls `subscriber` on each keyspace event of a write (the generic, string, list, set, hash,
/// sorted set, stream and module classes, and `new`), from then on. Once per module: a second
/// subscription is refused.
pub fn subscribe_to_writes(ctx: &Context, subscriber: fn(&KeyspaceEvent)) -> Result<(), String> {
    extern "C" fn callback(
        ctx: *mut raw::RedisModuleCtx,
        _type: c_int,
        event: *const c_char,
        key: *mut raw::RedisModuleString,
    ) -> c_int {
        deliver(&WRITES, ctx, event, key)
    }
    // (And `new`: a key made by a module's own type, or by a module that tells no event of
    // its own, still says it was added.)
    let types = (raw::NotifyEvent::GENERIC
        | raw::NotifyEvent::STRING
        | raw::NotifyEvent::LIST
        | raw::NotifyEvent::SET
        | raw::NotifyEvent::HASH
        | raw::NotifyEvent::ZSET
        | raw::NotifyEvent::STREAM
        | raw::NotifyEvent::MODULE)
        .bits()
        | raw::REDISMODULE_NOTIFY_NEW;
    subscribe(
        ctx,
        &WRITES,
        subscriber,
        types,
        Some(callback),
        "keyspace events",
    )
}

/// Hands one event to the subscriber in `slot`; a panic in it stops there.
fn deliver(
    slot: &Slot,
    ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if let Some(subscriber) = slot.get() {
        let _ = std::panic::catch_unwind(|| subscriber(&KeyspaceEvent { ctx, event, key }));
    }
    0
}

/// Subscribes `callback` to the event classes `types` and puts `subscriber` in `slot` (which
/// `callback` delivers from); refused when `slot` is taken.
fn subscribe(
    ctx: &Context,
    slot: &Slot,
    subscriber: fn(&KeyspaceEvent),
    types: c_int,
    callback: raw::RedisModuleNotificationFunc,
    what: &str,
) -> Result<(), String> {
    if slot.get().is_some() {
        return Err(format!("{what} are subscribed already"));
    }
    // SAFETY: the API table is filled at load; the callback lives as long as the module.
    let done = unsafe {
        let subscribe = raw::RedisModule_SubscribeToKeyspaceEvents
            .ok_or("RedisModule_SubscribeToKeyspaceEvents is missing")?;
        subscribe(ctx.ctx, types, callback)
    };
    if done != raw::REDISMODULE_OK as c_int {
        return Err(format!("cannot subscribe to {what}"));
    }
    let _ = slot.set(subscriber);
    Ok(())
}
