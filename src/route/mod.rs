//! Routed commands (`SHARD.CALL`): which node runs what, and the network that gets it there.
//!
//! Pure parts: the RESP wire format (`resp`, `frame`), the plan of a call while a resharding
//! may be open (`plan`), the split of multi-key commands over owners (`split`), the key
//! positions of a command from the server's table (`command`), what Sentinel and `ROLE` say
//! (`sentinel`). Glue: the pipelined connections to other nodes (`conn`), the calls in flight
//! (`forward`), the command filter that turns a call whose keys are all here into the plain
//! command (`filter`), and where the nodes and their replicas are now (`topology`, learned by
//! the `watcher` thread).

pub mod command_table;
pub mod fields;
pub mod filter;
pub mod forward;
pub mod migrate;
pub mod split;
pub mod steps;

pub use crate::net::endpoint::{Endpoint, StepError, StepErrorKind};
pub use crate::net::resp::{encode_command, read_reply, Resp, RespError};
pub use steps::{execute, CommandKind, Plan, Routed, Step};

/// Hooks routing into the server: the command filter of local calls, and the event-loop events
/// that flush the connections' queued requests and expire late ones.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn register(ctx: *mut redis_module::raw::RedisModuleCtx) -> Result<(), String> {
    use redis_module::raw;
    extern "C" fn on_event_loop(
        _ctx: *mut raw::RedisModuleCtx,
        _event: raw::RedisModuleEvent,
        subevent: u64,
        _data: *mut std::os::raw::c_void,
    ) {
        let _ = std::panic::catch_unwind(|| {
            if subevent == raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP {
                crate::net::pool::before_sleep();
                crate::topology::watcher::tick();
            } else {
                crate::net::pool::after_sleep();
            }
        });
    }
    // SAFETY: OnLoad's context.
    if !unsafe { subscribe(ctx, raw::REDISMODULE_EVENT_EVENTLOOP, Some(on_event_loop)) } {
        return Err("cannot subscribe to the event loop events (Redis 7.0 or later needed)".into());
    }
    // Whether this server is a replica, now and after every change of role.
    extern "C" fn on_role_change(
        _ctx: *mut raw::RedisModuleCtx,
        _event: raw::RedisModuleEvent,
        subevent: u64,
        _data: *mut std::os::raw::c_void,
    ) {
        crate::topology::nodes::set_replica(
            subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA,
        );
    }
    // SAFETY: OnLoad's context.
    unsafe {
        if let Some(flags) = raw::RedisModule_GetContextFlags {
            crate::topology::nodes::set_replica(
                flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE as std::os::raw::c_int != 0,
            );
        }
        subscribe(
            ctx,
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            Some(on_role_change),
        );
    }
    // The TLS configuration is built again after a CONFIG SET of a TLS file, the module's or
    // the server's own (whose files the module's fall back to): files rewritten in place are
    // read again, and settings left waiting for the rest of the command are checked whole.
    extern "C" fn on_config_change(
        _ctx: *mut raw::RedisModuleCtx,
        _event: raw::RedisModuleEvent,
        _subevent: u64,
        data: *mut std::os::raw::c_void,
    ) {
        let _ = std::panic::catch_unwind(|| {
            if data.is_null() {
                return;
            }
            // SAFETY: Redis passes a RedisModuleConfigChange for this event, valid during the
            // callback.
            let change = unsafe { &*(data as *const raw::RedisModuleConfigChange) };
            let names = (0..change.num_changes as usize).filter_map(|i| {
                // SAFETY: `config_names` holds `num_changes` C strings.
                let name = unsafe { *change.config_names.add(i) };
                (!name.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(name) })
            });
            let tls = names
                .map(|n| n.to_bytes())
                .any(|n| n.starts_with(b"tls-") || n.starts_with(b"shard.tls"));
            if tls {
                crate::config::refresh_tls();
            }
        });
    }
    // SAFETY: OnLoad's context.
    unsafe { subscribe(ctx, raw::REDISMODULE_EVENT_CONFIG, Some(on_config_change)) };
    crate::topology::watcher::start()
}

/// Subscribes `callback` to the server event `id` (data version 1); false when the server
/// refuses or lacks the API.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`; the callback lives as long
/// as the module.
unsafe fn subscribe(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    id: u64,
    callback: redis_module::raw::RedisModuleEventCallback,
) -> bool {
    use redis_module::raw;
    let event = raw::RedisModuleEvent { id, dataver: 1 };
    // SAFETY: as the caller promises.
    unsafe {
        raw::RedisModule_SubscribeToServerEvent.is_some_and(|sub| {
            sub(ctx, event, callback) == raw::REDISMODULE_OK as std::os::raw::c_int
        })
    }
}
