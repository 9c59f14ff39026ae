//! The module's detached context: what code outside any command callback (event-loop
//! callbacks, timers armed from them, reading the server's own settings) uses to reach the
//! server. Made once at load; main thread only.

use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::{raw, Context, RedisValue};

static DETACHED: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

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

/// The detached context, `None` before load (or in unit tests). Main thread only.
pub fn detached() -> Option<Context> {
    let ctx = DETACHED.load(Ordering::Relaxed);
    (!ctx.is_null()).then(|| Context::new(ctx))
}

/// The raw detached context, for the other files of `host` (null before load).
pub(crate) fn detached_raw() -> *mut raw::RedisModuleCtx {
    DETACHED.load(Ordering::Relaxed)
}

/// A server setting as `CONFIG GET name` gives it; empty when it is not set or unknown (or
/// before load). Main thread only.
pub fn server_config(name: &str) -> String {
    let Some(ctx) = detached() else {
        return String::new();
    };
    match ctx.call("CONFIG", &["GET", name]) {
        Ok(RedisValue::Array(v)) => match v.get(1) {
            Some(RedisValue::BulkString(s) | RedisValue::SimpleString(s)) => s.clone(),
            Some(RedisValue::StringBuffer(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(RedisValue::BulkRedisString(s)) => s.to_string_lossy(),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

/// This server's run id (`INFO server`'s `run_id`, a new one at every start); empty before load.
/// Main thread only.
pub fn run_id() -> String {
    static RUN_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(id) = RUN_ID.get() {
        return id.clone();
    }
    let Some(ctx) = detached() else {
        return String::new();
    };
    let text = match ctx.call("INFO", &["server"]) {
        Ok(RedisValue::SimpleString(t) | RedisValue::BulkString(t)) => t,
        Ok(RedisValue::BulkRedisString(t)) => t.to_string_lossy(),
        Ok(RedisValue::StringBuffer(b)) => String::from_utf8_lossy(&b).into_owned(),
        _ => String::new(),
    };
    let id = text
        .lines()
        .find_map(|l| l.strip_prefix("run_id:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_default();
    if id.is_empty() {
        return id;
    }
    RUN_ID.get_or_init(|| id).clone()
}

/// Whether writes are paused (`CLIENT PAUSE ... WRITE`, `FAILOVER`): a write the module
/// replicates from a timer meanwhile fails an assertion of Redis 7.0 (propagatePendingCommands)
/// and would add to a stream the failover wants still. Main thread only.
pub fn writes_paused() -> bool {
    // SAFETY: a function pointer the server filled at load (checked); it takes no argument.
    unsafe { redis_module::raw::RedisModule_AvoidReplicaTraffic.is_some_and(|avoid| avoid() != 0) }
}

thread_local! {
    /// The replicas online, as last read; `None`: to be read again.
    static REPLICAS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The replicas of this server that are online now (`INFO replication`'s replica lines in
/// state `online`: those a `WAIT` can count); 0 before load. Read once, then kept until the
/// server says a replica came online or went, or this server's role changed
/// (`forget_replicas`, from `host::events`). Main thread only.
pub fn connected_replicas() -> usize {
    if let Some(n) = REPLICAS.with(std::cell::Cell::get) {
        return n;
    }
    let Some(ctx) = detached() else {
        return 0;
    };
    let text = match ctx.call("INFO", &["replication"]) {
        Ok(RedisValue::SimpleString(t) | RedisValue::BulkString(t)) => t,
        Ok(RedisValue::BulkRedisString(t)) => t.to_string_lossy(),
        Ok(RedisValue::StringBuffer(b)) => String::from_utf8_lossy(&b).into_owned(),
        _ => String::new(),
    };
    let n = online_replicas(&text);
    REPLICAS.with(|r| r.set(Some(n)));
    n
}

/// The replicas in state `online` of an `INFO replication` text (`slave0:ip=...,state=online,...`;
/// a server that names them `replica0` is read too).
fn online_replicas(info: &str) -> usize {
    info.lines()
        .filter(|l| {
            let name = l.split(':').next().unwrap_or_default();
            let numbered = |prefix: &str| {
                name.strip_prefix(prefix)
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            };
            (numbered("slave") || numbered("replica")) && l.split(',').any(|f| f == "state=online")
        })
        .count()
}

/// The replicas are to be read again (a replica came online or went; the role changed).
pub fn forget_replicas() {
    REPLICAS.with(|r| r.set(None));
}

/// Runs `callback(data)` on the main thread after `delay`, on a timer of the server's event
/// loop armed on the detached context. False (and nothing armed) before load.
pub fn after<T: 'static>(delay: std::time::Duration, callback: fn(&Context, T), data: T) -> bool {
    let Some(ctx) = detached() else {
        return false;
    };
    // redis-module's timer entry point does not catch panics: the guard is here.
    ctx.create_timer(
        delay,
        move |ctx: &Context, data: T| {
            let _step = crate::host::latency::step_with_cpu(c"shard-timer", c"shard-timer-cpu");
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(ctx, data)));
        },
        data,
    );
    true
}

/// Whether this server is a replica now (its context flags). Main thread only.
pub fn server_is_replica() -> bool {
    server_flag(raw::REDISMODULE_CTX_FLAGS_SLAVE)
}

/// Whether a script is running now (a command filter sees the commands it calls). Main
/// thread only.
pub fn script_running() -> bool {
    server_flag(raw::REDISMODULE_CTX_FLAGS_LUA)
}

/// Whether the server's context flags (those of the server, not of a client) hold `flag`.
fn server_flag(flag: u32) -> bool {
    let ctx = detached_raw();
    // SAFETY: the API table is filled at load and read-only after.
    let Some(flags) = (unsafe { raw::RedisModule_GetContextFlags }) else {
        return false;
    };
    // SAFETY: the detached context lives as long as the module.
    !ctx.is_null() && unsafe { flags(ctx) } & flag as std::os::raw::c_int != 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_the_replicas_online() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
                    slave0:ip=127.0.0.1,port=7001,state=online,offset=10,lag=0\r\n\
                    slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\n\
                    replica2:ip=127.0.0.1,port=7003,state=online,offset=10,lag=1\r\n\
                    master_failover_state:no-failover\r\n";
        assert_eq!(super::online_replicas(info), 2);
        assert_eq!(
            super::online_replicas("role:master\r\nconnected_slaves:0\r\n"),
            0
        );
    }
}
