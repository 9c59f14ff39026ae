//! Server events the module follows, each handed to one Rust function registered at load:
//! the event loop's turns (before it sleeps, after it wakes), the server becoming a primary or
//! a replica, its link to its primary coming up or going down, a replica of its own coming
//! online or going (`context::connected_replicas` read again), a client leaving, and a `CONFIG
//! SET` (which settings changed). The handlers run on the main thread; a panic in one stops
//! there.

use std::cell::Cell;
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};

use redis_module::raw;

#[derive(Clone, Copy)]
struct Handlers {
    before_sleep: fn(&redis_module::Context),
    after_sleep: fn(),
    role: fn(bool),
    master_link: fn(bool),
    client_gone: fn(u64),
    config: fn(&[&[u8]]),
    keyspace: fn(KeyspaceChange),
}

fn nothing() {}
fn no_turn(_: &redis_module::Context) {}
fn no_role(_: bool) {}
fn no_client(_: u64) {}
fn no_config(_: &[&[u8]]) {}
fn no_change(_: KeyspaceChange) {}

thread_local! {
    static HANDLERS: Cell<Handlers> = const {
        Cell::new(Handlers {
            before_sleep: no_turn,
            after_sleep: nothing,
            role: no_role,
            master_link: no_role,
            client_gone: no_client,
            config: no_config,
            keyspace: no_change,
        })
    };
}

fn handlers() -> Handlers {
    HANDLERS.with(Cell::get)
}

fn set(change: impl FnOnce(&mut Handlers)) {
    HANDLERS.with(|h| {
        let mut all = h.get();
        change(&mut all);
        h.set(all);
    });
}

/// Calls `before_sleep` each time the event loop is about to sleep and `after_sleep` each
/// time it wakes. `before_sleep` gets the event's context: what it replicates goes to the
/// replicas and the AOF buffer when it returns (the server propagates at the end of an event's
/// context), before the server writes that buffer in the same `beforeSleep` (Redis 7.0 and
/// Valkey fire this event before `flushAppendOnlyFile`).
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn on_event_loop(
    ctx: *mut raw::RedisModuleCtx,
    before_sleep: fn(&redis_module::Context),
    after_sleep: fn(),
) -> Result<(), String> {
    set(|h| {
        h.before_sleep = before_sleep;
        h.after_sleep = after_sleep;
    });
    extern "C" fn callback(
        ctx: *mut raw::RedisModuleCtx,
        _event: raw::RedisModuleEvent,
        subevent: u64,
        _data: *mut c_void,
    ) {
        let _ = std::panic::catch_unwind(|| {
            crate::host::time::turn_over();
            if subevent == raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP {
                let _step = crate::host::latency::step_with_cpu(
                    c"shard-before-sleep",
                    c"shard-before-sleep-cpu",
                );
                (handlers().before_sleep)(&redis_module::Context::new(ctx));
            } else {
                let _step = crate::host::latency::step(c"shard-after-sleep");
                (handlers().after_sleep)();
            }
        });
    }
    // SAFETY: as the caller promises.
    if !unsafe { subscribe(ctx, raw::REDISMODULE_EVENT_EVENTLOOP, Some(callback)) } {
        return Err("cannot subscribe to the event loop events (Redis 7.0 or later needed)".into());
    }
    Ok(())
}

/// Calls `role(is_replica)` now and each time the server becomes a replica or a primary.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn on_role_change(ctx: *mut raw::RedisModuleCtx, role: fn(bool)) {
    set(|h| h.role = role);
    extern "C" fn callback(
        _ctx: *mut raw::RedisModuleCtx,
        _event: raw::RedisModuleEvent,
        subevent: u64,
        _data: *mut c_void,
    ) {
        crate::host::context::forget_replicas();
        let _step = crate::host::latency::step(c"shard-role-change");
        let _ = std::panic::catch_unwind(|| {
            (handlers().role)(subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA);
        });
    }
    // SAFETY: as the caller promises.
    unsafe {
        if let Some(flags) = raw::RedisModule_GetContextFlags {
            role(flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE as c_int != 0);
        }
        subscribe(
            ctx,
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            Some(callback),
        );
    }
}

/// Keeps `context::connected_replicas` true: it is read again after a replica came online or
/// went (and after a role change, `on_role_change`).
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn follow_replicas(ctx: *mut raw::RedisModuleCtx) {
    extern "C" fn callback(
        _ctx: *mut raw::RedisModuleCtx,
        _event: raw::RedisModuleEvent,
        _subevent: u64,
        _data: *mut c_void,
    ) {
        crate::host::context::forget_replicas();
    }
    // SAFETY: as the caller promises.
    unsafe { subscribe(ctx, raw::REDISMODULE_EVENT_REPLICA_CHANGE, Some(callback)) };
}

/// Calls `changed(up)` now and each time the server's link to its primary goes up or down.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn on_master_link_change(ctx: *mut raw::RedisModuleCtx, changed: fn(bool)) {
    set(|h| h.master_link = changed);
    extern "C" fn callback(
        _ctx: *mut raw::RedisModuleCtx,
        _event: raw::RedisModuleEvent,
        subevent: u64,
        _data: *mut c_void,
    ) {
        let up = subevent == raw::REDISMODULE_SUBEVENT_MASTER_LINK_UP;
        let _step = crate::host::latency::step(c"shard-role-change");
        let _ = std::panic::catch_unwind(|| (handlers().master_link)(up));
    }
    // SAFETY: as the caller promises.
    unsafe {
        // Now (a module loaded on a replica already linked hears of no change until it breaks).
        if let Some(flags) = raw::RedisModule_GetContextFlags {
            changed(flags(ctx) & raw::REDISMODULE_CTX_FLAGS_REPLICA_IS_ONLINE as c_int != 0);
        }
        subscribe(
            ctx,
            raw::REDISMODULE_EVENT_MASTER_LINK_CHANGE,
            Some(callback),
        )
    };
}

/// Calls `gone(client id)` each time a client disconnects.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn on_client_gone(ctx: *mut raw::RedisModuleCtx, gone: fn(u64)) {
    set(|h| h.client_gone = gone);
    extern "C" fn callback(
        _ctx: *mut raw::RedisModuleCtx,
        _event: raw::RedisModuleEvent,
        subevent: u64,
        data: *mut c_void,
    ) {
        let _ = std::panic::catch_unwind(|| {
            if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED || data.is_null() {
                return;
            }
            // SAFETY: Redis passes a RedisModuleClientInfo for this event, valid during the
            // callback.
            let info = unsafe { &*(data as *const raw::RedisModuleClientInfo) };
            let _step = crate::host::latency::step(c"shard-client-gone");
            (handlers().client_gone)(info.id);
        });
    }
    // SAFETY: as the caller promises.
    unsafe { subscribe(ctx, raw::REDISMODULE_EVENT_CLIENT_CHANGE, Some(callback)) };
}

/// Calls `config(names)` after each `CONFIG SET`, with the names of the settings it changed.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn on_config_change(ctx: *mut raw::RedisModuleCtx, config: fn(&[&[u8]])) {
    set(|h| h.config = config);
    extern "C" fn callback(
        _ctx: *mut raw::RedisModuleCtx,
        _event: raw::RedisModuleEvent,
        _subevent: u64,
        data: *mut c_void,
    ) {
        let _ = std::panic::catch_unwind(|| {
            if data.is_null() {
                return;
            }
            // SAFETY: Redis passes a RedisModuleConfigChange for this event, valid during the
            // callback.
            let change = unsafe { &*(data as *const raw::RedisModuleConfigChange) };
            let names: Vec<&[u8]> = (0..change.num_changes as usize)
                .filter_map(|i| {
                    // SAFETY: `config_names` holds `num_changes` C strings.
                    let name = unsafe { *change.config_names.add(i) };
                    (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) }.to_bytes())
                })
                .collect();
            if names.contains(&crate::host::latency::SETTING) {
                crate::host::latency::refresh_threshold();
            }
            let _step = crate::host::latency::step(c"shard-config-change");
            (handlers().config)(&names);
        });
    }
    // SAFETY: as the caller promises.
    unsafe { subscribe(ctx, raw::REDISMODULE_EVENT_CONFIG, Some(callback)) };
}

/// A change of the keyspace as a whole, which no keyspace event per key tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyspaceChange {
    /// A load begins: an RDB or AOF at start, `DEBUG RELOAD`, a replica's full sync (also
    /// one that loads into a side database and swaps it in).
    LoadStarted,
    /// The load ended (or failed: what is there is what is there).
    LoadEnded,
    /// A database was emptied (`FLUSHDB`, `FLUSHALL`: `None`, every database).
    Flushed(Option<i32>),
    /// `SWAPDB a b`.
    Swapped(i32, i32),
}

/// Calls `change(..)` on each `KeyspaceChange`.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn on_keyspace_change(ctx: *mut raw::RedisModuleCtx, change: fn(KeyspaceChange)) {
    set(|h| h.keyspace = change);
    extern "C" fn callback(
        _ctx: *mut raw::RedisModuleCtx,
        event: raw::RedisModuleEvent,
        subevent: u64,
        data: *mut c_void,
    ) {
        let _ = std::panic::catch_unwind(|| {
            let change = match event.id {
                raw::REDISMODULE_EVENT_LOADING => match subevent {
                    raw::REDISMODULE_SUBEVENT_LOADING_ENDED
                    | raw::REDISMODULE_SUBEVENT_LOADING_FAILED => KeyspaceChange::LoadEnded,
                    _ => KeyspaceChange::LoadStarted,
                },
                raw::REDISMODULE_EVENT_REPL_ASYNC_LOAD => match subevent {
                    raw::REDISMODULE_SUBEVENT_REPL_ASYNC_LOAD_STARTED => {
                        KeyspaceChange::LoadStarted
                    }
                    _ => KeyspaceChange::LoadEnded,
                },
                raw::REDISMODULE_EVENT_FLUSHDB => {
                    if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END || data.is_null() {
                        return;
                    }
                    // SAFETY: Redis passes a RedisModuleFlushInfo for this event, valid during
                    // the callback.
                    let info = unsafe { &*(data as *const raw::RedisModuleFlushInfo) };
                    KeyspaceChange::Flushed((info.dbnum >= 0).then_some(info.dbnum))
                }
                raw::REDISMODULE_EVENT_SWAPDB => {
                    if data.is_null() {
                        return;
                    }
                    // SAFETY: Redis passes a RedisModuleSwapDbInfo for this event, valid
                    // during the callback.
                    let info = unsafe { &*(data as *const raw::RedisModuleSwapDbInfo) };
                    KeyspaceChange::Swapped(info.dbnum_first, info.dbnum_second)
                }
                _ => return,
            };
            let _step = crate::host::latency::step(c"shard-keyspace-change");
            (handlers().keyspace)(change);
        });
    }
    // SAFETY: as the caller promises.
    unsafe {
        for id in [
            raw::REDISMODULE_EVENT_LOADING,
            raw::REDISMODULE_EVENT_REPL_ASYNC_LOAD,
            raw::REDISMODULE_EVENT_FLUSHDB,
            raw::REDISMODULE_EVENT_SWAPDB,
        ] {
            subscribe(ctx, id, Some(callback));
        }
    }
}

/// Subscribes `callback` to the server event `id` (data version 1); false when the server
/// refuses or lacks the API.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`; the callback lives as long
/// as the module.
unsafe fn subscribe(
    ctx: *mut raw::RedisModuleCtx,
    id: u64,
    callback: raw::RedisModuleEventCallback,
) -> bool {
    let event = raw::RedisModuleEvent { id, dataver: 1 };
    // SAFETY: as the caller promises.
    unsafe {
        raw::RedisModule_SubscribeToServerEvent
            .is_some_and(|sub| sub(ctx, event, callback) == raw::REDISMODULE_OK as c_int)
    }
}
