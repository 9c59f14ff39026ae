//! The keyspace events of writes (`RedisModule_SubscribeToKeyspaceEvents`), handed to one Rust
//! function per subscription (writes, a key's lifecycle): every command that changes a key
//! tells it the event's name, the key and its database. Subscribed once, for the life of the
//! module (the server has no unsubscribe), and only once needed: while any module subscribes,
//! every keyspace event of the server (a `SET`'s, a `GET`'s miss) walks the subscribers, about
//! 1.5% of a pipelined `GET` or `SET` (bench/findings.md). The subscriber keeps its own cost
//! low while it does not care (a flag it checks first: the event's name, key and database are
//! read only when asked for).

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
    /// Whether the event ends the key in its database (`del`, `expired`, `evicted`,
    /// `rename_from`, `move_from`): nothing of it is left there.
    pub fn ends_key(&self) -> bool {
        const ENDS: [&[u8]; 5] = [b"del", b"expired", b"evicted", b"rename_from", b"move_from"];
        ENDS.contains(&self.name())
    }

    /// The event's name (`set`, `del`, `expired`, ...); empty if the server gave none.
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

/// A subscription: the event classes it asks for, and what it is called in messages (one
/// callback and one subscriber slot each, from the one registration below).
#[derive(Clone, Copy)]
enum Subscription {
    Writes = 0,
    Lifecycle = 1,
}

impl Subscription {
    fn types(self) -> c_int {
        match self {
            // (And `new`: a key made by a module's own type, or by a module that tells no
            // event of its own, still says it was added.)
            Subscription::Writes => {
                (raw::NotifyEvent::GENERIC
                    | raw::NotifyEvent::STRING
                    | raw::NotifyEvent::LIST
                    | raw::NotifyEvent::SET
                    | raw::NotifyEvent::HASH
                    | raw::NotifyEvent::ZSET
                    | raw::NotifyEvent::STREAM
                    | raw::NotifyEvent::MODULE)
                    .bits()
                    | raw::REDISMODULE_NOTIFY_NEW
            }
            Subscription::Lifecycle => {
                raw::REDISMODULE_NOTIFY_NEW
                    | raw::REDISMODULE_NOTIFY_GENERIC
                    | raw::REDISMODULE_NOTIFY_EXPIRED
                    | raw::REDISMODULE_NOTIFY_EVICTED
            }
        }
    }

    fn what(self) -> &'static str {
        match self {
            Subscription::Writes => "keyspace events",
            Subscription::Lifecycle => "key lifecycle events",
        }
    }
}

/// The subscriptions, by index (`Subscription as usize`).
const SUBSCRIPTIONS: [Subscription; 2] = [Subscription::Writes, Subscription::Lifecycle];

/// The subscriber of each subscription (by the same index), set once.
static SUBSCRIBERS: [OnceLock<fn(&KeyspaceEvent)>; 2] = [OnceLock::new(), OnceLock::new()];

/// Calls `subscriber` on each event that makes a key or ends one, from then on: `new` (a key
/// added to a database, by any command, a `RESTORE`, a module), and the generic, expired and
/// evicted classes (`del`, `rename_from`, `move_from`, `expired`, `evicted`, and the others of
/// those classes, which the subscriber tells apart by name). Once per module.
pub fn subscribe_to_lifecycle(ctx: &Context, subscriber: fn(&KeyspaceEvent)) -> Result<(), String> {
    subscribe::<{ Subscription::Lifecycle as usize }>(ctx, subscriber)
}

/// Calls `subscriber` on each keyspace event of a write (the generic, string, list, set, hash,
/// sorted set, stream and module classes, and `new`), from then on. Once per module: a second
/// subscription is refused.
pub fn subscribe_to_writes(ctx: &Context, subscriber: fn(&KeyspaceEvent)) -> Result<(), String> {
    subscribe::<{ Subscription::Writes as usize }>(ctx, subscriber)
}

/// The server's callback of subscription `S`: hands the event to its subscriber; a panic in
/// it stops there.
extern "C" fn deliver<const S: usize>(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if let Some(subscriber) = SUBSCRIBERS[S].get() {
        let _step = crate::host::latency::step(c"shard-keyspace-event");
        let _ = std::panic::catch_unwind(|| subscriber(&KeyspaceEvent { ctx, event, key }));
    }
    0
}

/// Subscribes `deliver::<S>` to the event classes of subscription `S` and sets `subscriber` as
/// its subscriber; refused when it has one.
fn subscribe<const S: usize>(ctx: &Context, subscriber: fn(&KeyspaceEvent)) -> Result<(), String> {
    let which = SUBSCRIPTIONS[S];
    let slot = &SUBSCRIBERS[S];
    if slot.get().is_some() {
        return Err(format!("{} are subscribed already", which.what()));
    }
    // SAFETY: the API table is filled at load; the callback lives as long as the module.
    let done = unsafe {
        let subscribe = raw::RedisModule_SubscribeToKeyspaceEvents
            .ok_or("RedisModule_SubscribeToKeyspaceEvents is missing")?;
        subscribe(ctx.ctx, which.types(), Some(deliver::<S>))
    };
    if done != raw::REDISMODULE_OK as c_int {
        return Err(format!("cannot subscribe to {}", which.what()));
    }
    let _ = slot.set(subscriber);
    Ok(())
}
