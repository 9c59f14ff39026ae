//! Blocked clients: a command that waits for the network blocks its client, and later
//! unblocks it with a value its reply callback writes as the reply. The reply is written by
//! the server's call of that callback on the main thread, so no thread-safe context is needed.
//! One allocation per unblocking (the value handed over), as the server's API asks.

use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};

use redis_module::raw;

use crate::host::command::Call;
use crate::host::reply::Reply;

/// The check a command run by [`block_then_run`]'s reply callback passes first: given the
/// command (its arguments, the index of its name) and the client's database, a refusal to
/// reply instead of running it. Set once at load (`set_run_check`); none: always run. Why: a
/// client let go when what it waited for ended runs in a later callback (the server calls
/// reply callbacks before it sleeps, after the other commands it has read), and what it waited
/// for may have begun again in between, unless the caller kept it from beginning
/// ([`Verdict::Run`]'s guard).
pub type RunCheck = fn(&crate::host::args::Args, usize, i32) -> Option<String>;

static RUN_CHECK: std::sync::OnceLock<RunCheck> = std::sync::OnceLock::new();

/// Sets the check of [`RunCheck`] (at load; later calls are ignored).
pub fn set_run_check(check: RunCheck) {
    let _ = RUN_CHECK.set(check);
}

/// What a blocked client is unblocked with: it knows how to write itself as the reply.
pub trait BlockedReply: 'static {
    /// The reply when the value was lost (the server called back without it).
    const LOST: &'static str;

    fn write(&self, out: &Reply);
}

/// A client blocked by [`block`], to be unblocked once with a `T`.
pub struct Blocked<T: BlockedReply> {
    client: *mut raw::RedisModuleBlockedClient,
    reply: PhantomData<fn(T)>,
}

/// Blocks the client of `call`; its reply is the `T` it is unblocked with.
pub fn block<T: BlockedReply>(call: &Call) -> Result<Blocked<T>, String> {
    // SAFETY: the context of a command being run; the callbacks are made for `T`, the type
    // `unblock` hands over.
    let client = unsafe {
        let block = raw::RedisModule_BlockClient.ok_or("RedisModule_BlockClient is missing")?;
        block(
            call.ctx.ctx,
            Some(reply_callback::<T>),
            None,
            Some(free_reply::<T>),
            0,
        )
    };
    if client.is_null() {
        return Err("the client cannot be blocked".into());
    }
    Ok(Blocked {
        client,
        reply: PhantomData,
    })
}

thread_local! {
    /// What to do when a blocked client disconnects before it is unblocked (`on_disconnect`),
    /// by its blocked-client handle. The main thread's only.
    static ON_DISCONNECT: std::cell::RefCell<std::collections::HashMap<usize, Box<dyn FnOnce()>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

extern "C" fn disconnected(_ctx: *mut raw::RedisModuleCtx, bc: *mut raw::RedisModuleBlockedClient) {
    let action = ON_DISCONNECT.with(|m| m.borrow_mut().remove(&(bc as usize)));
    if let Some(action) = action {
        // The action must not panic into the server; if it ever did, the server goes on.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(action));
    }
}

impl<T: BlockedReply> Blocked<T> {
    /// Runs `action` on the main thread if the client disconnects while blocked (the handle
    /// must still be unblocked later, as always; its reply then goes nowhere).
    pub fn on_disconnect(&self, action: impl FnOnce() + 'static) {
        ON_DISCONNECT.with(|m| {
            m.borrow_mut()
                .insert(self.client as usize, Box::new(action))
        });
        // SAFETY: the blocked client is live until unblocked; the callback is a plain function.
        unsafe {
            if let Some(set) = raw::RedisModule_SetDisconnectCallback {
                set(self.client, Some(disconnected));
            }
        }
    }

    /// Unblocks the client with `reply` (once: this consumes the handle).
    pub fn unblock(self, reply: T) {
        ON_DISCONNECT.with(|m| m.borrow_mut().remove(&(self.client as usize)));
        let data = Box::into_raw(Box::new(reply));
        // SAFETY: the blocked client is live until unblocked, which happens once, here; the
        // reply callback reads `data` and `free_reply` frees it.
        unsafe {
            if let Some(unblock) = raw::RedisModule_UnblockClient {
                unblock(self.client, data.cast());
            } else {
                drop(Box::from_raw(data));
            }
        }
    }
}

extern "C" fn reply_callback<T: BlockedReply>(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: the private data is the `T` given to UnblockClient, alive until `free_reply`
    // runs after this callback.
    let reply = unsafe {
        raw::RedisModule_GetBlockedClientPrivateData
            .map(|get| get(ctx).cast::<T>())
            .filter(|p| !p.is_null())
            .map(|p| &*p)
    };
    let out = Reply::new(ctx);
    // Writing a reply does not panic; if it ever did, the server must go on (the panic hook
    // has logged it).
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match reply {
        Some(reply) => reply.write(&out),
        None => out.error(T::LOST),
    }));
    raw::REDISMODULE_OK as c_int
}

extern "C" fn free_reply<T: BlockedReply>(_ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    if !data.is_null() {
        // SAFETY: made by Box::into_raw in `unblock` for this `T`, freed once, here.
        drop(unsafe { Box::from_raw(data.cast::<T>()) });
    }
}

/// What a client blocked by [`block_then_run`] is unblocked with.
pub enum Verdict {
    /// Run the command it carries (its arguments from this index on) as it, now. The guard is
    /// kept until the reply callback ran, or, for a client gone meanwhile, until the server
    /// frees the verdict instead (`free_reply`, on the main thread, in the same turn of the
    /// event loop): what its `Drop` undoes lasts exactly until the command ran or never will.
    Run(usize, Box<dyn std::any::Any>),
    /// Reply this error instead.
    Refuse(String),
}

impl BlockedReply for Verdict {
    const LOST: &'static str = "ERR the blocked command's verdict was lost";

    fn write(&self, out: &Reply) {
        if let Verdict::Refuse(message) = self {
            out.error(message);
        }
    }
}

/// Blocks the client of `call`, which carries a command (`SHARD.LOCKED cmd arg ...`); once it
/// is unblocked with `Verdict::Run(from, guard)`, its reply callback runs the carried command (its
/// arguments from `from` on) as the client, in its database, replicated like the command
/// itself, and that command's reply is the client's; refused (`TRYAGAIN`, not run) if the
/// server's writes were paused in between.
pub fn block_then_run(call: &Call) -> Result<Blocked<Verdict>, String> {
    // SAFETY: the context of a command being run; the callbacks are made for `Verdict`.
    let client = unsafe {
        let block = raw::RedisModule_BlockClient.ok_or("RedisModule_BlockClient is missing")?;
        block(
            call.ctx.ctx,
            Some(run_callback),
            None,
            Some(free_reply::<Verdict>),
            0,
        )
    };
    if client.is_null() {
        return Err("the client cannot be blocked".into());
    }
    Ok(Blocked {
        client,
        reply: PhantomData,
    })
}

/// The refusal of a command let go while the server's writes are paused.
const PAUSED: &str = "TRYAGAIN the server's writes were paused (CLIENT PAUSE WRITE or a failover) as the command was let go: it did not run";

extern "C" fn run_callback(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    // SAFETY: the private data is the `Verdict` given to UnblockClient, alive until
    // `free_reply` runs after this callback.
    let verdict = unsafe {
        raw::RedisModule_GetBlockedClientPrivateData
            .map(|get| get(ctx).cast::<Verdict>())
            .filter(|p| !p.is_null())
            .map(|p| &*p)
    };
    let out = Reply::new(ctx);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let from = match verdict {
            Some(Verdict::Run(from, _)) => *from,
            Some(refused) => return refused.write(&out),
            None => return out.error(Verdict::LOST),
        };
        // SAFETY: Redis passes the blocked client's own argv (the command that blocked).
        let args = unsafe { crate::host::args::Args::from_raw(argv, argc) };
        let (name, rest) = (
            args.get(from),
            args.raw().get(from + 1..).unwrap_or_default(),
        );
        if name.is_empty() {
            return out.error("ERR no command to run");
        }
        // Writes paused since the client was let go (in the same turn of the event loop, as
        // `CLIENT PAUSE WRITE` or `FAILOVER` ran after what let it go): the server holds a
        // paused client's writes before they run, but this command was admitted before the
        // pause, and what it propagated now would fail the server's assertion (propagateNow)
        // and end the server. A reply callback cannot block its client again: it is refused.
        if crate::host::context::writes_paused() {
            return out.error(PAUSED);
        }
        if let Some(check) = RUN_CHECK.get() {
            // SAFETY: the reply callback's context has the blocked client.
            let db = unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx)) };
            if let Some(refusal) = check(&args, from, db) {
                return out.error(&refusal);
            }
        }
        // SAFETY: the reply callback's context has the blocked client; the strings are its
        // live arguments.
        if let Err(e) = unsafe { crate::host::caller::pass_through_raw(ctx, name, rest) } {
            out.error(e.message());
        }
    }));
    raw::REDISMODULE_OK as c_int
}
