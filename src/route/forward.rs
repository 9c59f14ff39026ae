//! Routed calls in flight: the client blocked on each, what it waits for, and its reply.
//!
//! A call whose command goes to one other node whole (the common case) waits for that one
//! reply, which becomes the client's reply as it is. A call with several steps (a resharding's
//! fallbacks and copies, or the parts of a split multi-key command) runs as a future over the
//! steps (`plan::execute`, `split`); each reply wakes it, on the main thread, and it sends its
//! next step or finishes. The client is unblocked the moment its reply is whole, and the reply
//! is written by the blocked client's reply callback, so no thread-safe context is needed.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::os::raw::c_int;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use redis_module::raw;
use rustc_hash::FxHashMap;

use crate::host::reply::Reply;
use crate::net::endpoint::{Endpoint, StepError, StepErrorKind};
use crate::net::pool::{Link, Outcome, Waiter};
use crate::net::resp::ReplyResp;
use crate::net::resp::Resp;
use crate::route::migrate;
use crate::route::steps::Step;

/// Counters shown in `INFO shard`.
#[derive(Debug, Default, Clone)]
pub struct RouteStats {
    pub local: u64,
    pub forwarded: u64,
    pub fallbacks: u64,
    pub copies: u64,
    pub timeouts: u64,
    pub errors: u64,
    /// Reads a replica answered (`shard.read-from`), and reads that fell back to the primary.
    pub replica_reads: u64,
    pub replica_fallbacks: u64,
    /// Per node: (errors, timeouts).
    pub per_node: BTreeMap<String, (u64, u64)>,
}

static STATS: Mutex<Option<RouteStats>> = Mutex::new(None);

pub fn stats() -> RouteStats {
    let mut stats = STATS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .unwrap_or_default();
    stats.local += crate::route::filter::REWRITTEN.load(std::sync::atomic::Ordering::Relaxed);
    stats
}

pub fn count(update: impl FnOnce(&mut RouteStats)) {
    let mut guard = STATS.lock().unwrap_or_else(PoisonError::into_inner);
    update(guard.get_or_insert_with(RouteStats::default));
}

/// What the client gets.
pub enum CallReply {
    Reply(Resp),
    Error(String),
}

impl CallReply {
    /// A failed step as the client sees it: an error naming the node.
    pub fn failed(e: &StepError) -> CallReply {
        CallReply::Error(format!("ERR shard.call: {e}"))
    }
}

type CallFuture = Pin<Box<dyn Future<Output = CallReply>>>;

/// The steps of one call: the reply once it has come, else who to wake when it does (a join of
/// many parts polls only the parts that were woken).
#[derive(Default)]
struct Slot {
    outcome: Option<Outcome>,
    waker: Option<Waker>,
}

type Slots = RefCell<FxHashMap<Waiter, Slot>>;

struct Blocked(*mut raw::RedisModuleBlockedClient);

enum Waiting {
    /// The client's reply is this one reply; the ring epoch it was routed by.
    Direct(Blocked, u64),
    /// A step of the call with this id.
    Step(u64),
}

struct Call {
    /// The blocked client the output goes to, and the ring epoch the call was routed by; none
    /// for a background task (`spawn`).
    client: Option<(Blocked, u64)>,
    /// `None` while it is being polled.
    future: Option<CallFuture>,
    slots: Rc<Slots>,
}

#[derive(Default)]
struct Calls {
    next: u64,
    waiting: FxHashMap<Waiter, Waiting>,
    calls: FxHashMap<u64, Call>,
}

impl Calls {
    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

thread_local! {
    static CALLS: RefCell<Calls> = RefCell::new(Calls::default());
}

/// Blocks the client and sends `args` to `at`; its reply will be the client's reply.
///
/// # Safety
/// `ctx` must be the live context of the command being run.
pub unsafe fn forward(
    ctx: *mut raw::RedisModuleCtx,
    at: &Endpoint,
    link: &Link,
    args: &[&[u8]],
) -> Result<(), String> {
    // SAFETY: as the caller promises.
    let client = unsafe { block(ctx)? };
    let epoch = begin_call();
    let waiter = CALLS.with(|c| {
        let mut calls = c.borrow_mut();
        let id = calls.id();
        calls.waiting.insert(id, Waiting::Direct(client, epoch));
        id
    });
    crate::net::pool::request(at, link, args, waiter);
    Ok(())
}

/// Blocks the client and runs the future `make` builds over the network steps; its output is
/// the client's reply.
///
/// # Safety
/// `ctx` must be the live context of the command being run.
pub unsafe fn run<F, Fut>(ctx: *mut raw::RedisModuleCtx, link: Link, make: F) -> Result<(), String>
where
    F: FnOnce(NetSteps) -> Fut,
    Fut: Future<Output = CallReply> + 'static,
{
    // SAFETY: as the caller promises.
    let client = unsafe { block(ctx)? };
    start(Some((client, begin_call())), link, make);
    Ok(())
}

/// Registers a call (a blocked client's, or a background task's) and polls its future first.
fn start<F, Fut>(client: Option<(Blocked, u64)>, link: Link, make: F)
where
    F: FnOnce(NetSteps) -> Fut,
    Fut: Future<Output = CallReply> + 'static,
{
    let slots: Rc<Slots> = Rc::default();
    let id = CALLS.with(|c| {
        let mut calls = c.borrow_mut();
        let id = calls.id();
        calls.calls.insert(
            id,
            Call {
                client,
                future: None,
                slots: Rc::clone(&slots),
            },
        );
        id
    });
    let steps = NetSteps {
        call: id,
        slots,
        link,
    };
    poll_call(id, Some(Box::pin(make(steps))));
}

thread_local! {
    /// Client calls in flight, by the ring epoch they were routed by.
    static BY_EPOCH: RefCell<BTreeMap<u64, usize>> = const { RefCell::new(BTreeMap::new()) };
}

/// Counts a client call in flight under the current ring epoch; returns the epoch.
fn begin_call() -> u64 {
    let epoch = crate::state::lock().rings.epoch;
    BY_EPOCH.with(|m| *m.borrow_mut().entry(epoch).or_default() += 1);
    epoch
}

fn end_call(epoch: u64) {
    BY_EPOCH.with(|m| {
        let mut m = m.borrow_mut();
        if let Some(n) = m.get_mut(&epoch) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&epoch);
            }
        }
    });
}

/// Client calls still in flight that were routed by rings older than `epoch` (a fleet
/// operation waits for none to be left before it lets the new owners take writes).
pub fn calls_before(epoch: u64) -> usize {
    BY_EPOCH.with(|m| m.borrow().range(..epoch).map(|(_, n)| n).sum())
}

/// Runs the future `make` builds over the network steps in the background, with no client
/// waiting: the fleet coordinator (`reshard::coordinator`). Its output is dropped.
pub fn spawn<F, Fut>(link: Link, make: F)
where
    F: FnOnce(NetSteps) -> Fut,
    Fut: Future<Output = CallReply> + 'static,
{
    start(None, link, make);
}

/// Hands replies (or errors) to their waiters.
pub fn deliver_all(outcomes: Vec<(Waiter, Outcome)>) {
    for (waiter, outcome) in outcomes {
        deliver(waiter, outcome);
    }
}

fn deliver(waiter: Waiter, outcome: Outcome) {
    if let Err(e) = &outcome {
        count(|s| {
            let node = s.per_node.entry(e.node.clone()).or_default();
            if e.kind == StepErrorKind::Timeout {
                node.1 += 1;
                s.timeouts += 1;
            } else {
                node.0 += 1;
                s.errors += 1;
            }
        });
    }
    let Some(waiting) = CALLS.with(|c| c.borrow_mut().waiting.remove(&waiter)) else {
        return;
    };
    match waiting {
        Waiting::Direct(client, epoch) => {
            end_call(epoch);
            let reply = match outcome {
                Ok(reply) => {
                    count(|s| s.forwarded += 1);
                    CallReply::Reply(reply)
                }
                Err(e) => CallReply::failed(&e),
            };
            unblock(client, reply);
        }
        Waiting::Step(call) => {
            let slots = CALLS.with(|c| c.borrow().calls.get(&call).map(|c| Rc::clone(&c.slots)));
            if let Some(slots) = slots {
                let waker = {
                    let mut slots = slots.borrow_mut();
                    let slot = slots.entry(waiter).or_default();
                    slot.outcome = Some(outcome);
                    slot.waker.take()
                };
                if let Some(waker) = waker {
                    waker.wake();
                }
                poll_call(call, None);
            }
        }
    }
}

/// Polls a call's future (the one given, or the one it left); finishes the call when done.
/// A call being polled already (a step failed at once, while it sent it) is left alone: the
/// poll under way sees the reply.
fn poll_call(id: u64, first: Option<CallFuture>) {
    let future = first.or_else(|| {
        CALLS.with(|c| {
            c.borrow_mut()
                .calls
                .get_mut(&id)
                .and_then(|call| call.future.take())
        })
    });
    let Some(mut future) = future else {
        return;
    };
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
    }));
    let done = match polled {
        Ok(Poll::Pending) => {
            CALLS.with(|c| {
                if let Some(call) = c.borrow_mut().calls.get_mut(&id) {
                    call.future = Some(future);
                }
            });
            return;
        }
        Ok(Poll::Ready(reply)) => reply,
        Err(_) => CallReply::Error(
            "ERR shard.call: internal error; nothing more was sent for this call, see the Redis log"
                .into(),
        ),
    };
    let call = CALLS.with(|c| {
        let mut calls = c.borrow_mut();
        let call = calls.calls.remove(&id);
        calls
            .waiting
            .retain(|_, w| !matches!(w, Waiting::Step(c) if *c == id));
        call
    });
    if let Some((client, epoch)) = call.and_then(|c| c.client) {
        end_call(epoch);
        unblock(client, done);
    }
}

/// The steps of one call, sent over the module's connections.
#[derive(Clone)]
pub struct NetSteps {
    call: u64,
    slots: Rc<Slots>,
    link: Link,
}

/// The reply to one step, once it has come.
pub struct StepReply {
    waiter: Waiter,
    slots: Rc<Slots>,
}

impl Future for StepReply {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut slots = self.slots.borrow_mut();
        let slot = slots.entry(self.waiter).or_default();
        match slot.outcome.take() {
            Some(outcome) => {
                slots.remove(&self.waiter);
                Poll::Ready(outcome)
            }
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl NetSteps {
    /// A future that resolves after `delay`, on a timer of the server's event loop.
    pub fn sleep(&self, delay: std::time::Duration) -> impl Future<Output = ()> {
        let waiter = CALLS.with(|c| {
            let mut calls = c.borrow_mut();
            let id = calls.id();
            calls.waiting.insert(id, Waiting::Step(self.call));
            id
        });
        let armed = crate::host::context::after(
            delay,
            |_ctx: &redis_module::Context, waiter: Waiter| deliver(waiter, Ok(Resp::Null)),
            waiter,
        );
        if !armed {
            deliver(waiter, Ok(Resp::Null));
        }
        let reply = StepReply {
            waiter,
            slots: Rc::clone(&self.slots),
        };
        async move {
            let _ = reply.await;
        }
    }

    /// Sends `args` to `at`; the future resolves with the reply.
    pub fn send(&self, at: &Endpoint, args: &[Vec<u8>]) -> StepReply {
        let waiter = CALLS.with(|c| {
            let mut calls = c.borrow_mut();
            let id = calls.id();
            calls.waiting.insert(id, Waiting::Step(self.call));
            id
        });
        crate::net::pool::request(at, &self.link, args, waiter);
        StepReply {
            waiter,
            slots: Rc::clone(&self.slots),
        }
    }
}

impl Step for NetSteps {
    fn run(
        &self,
        at: &Endpoint,
        args: Vec<Vec<u8>>,
    ) -> impl Future<Output = Result<Resp, StepError>> {
        self.send(at, &args)
    }

    fn copy(
        &self,
        from: &Endpoint,
        to: &Endpoint,
        key: &[u8],
    ) -> impl Future<Output = Result<(), StepError>> {
        if crate::net::tls::current().is_some() {
            futures_util::future::Either::Left(self.copy_over_own_connections(from, to, key))
        } else {
            futures_util::future::Either::Right(self.copy_with_migrate(from, to, key))
        }
    }
}

impl NetSteps {
    /// Copy-before-write on a TLS fleet: `SHARD.DUMP` at the previous owner, `RESTORE` (never
    /// replacing) at the new one, both over the module's own verified TLS connections.
    /// `MIGRATE` would connect from the server itself: in clear unless it has `tls-cluster
    /// yes`, credentials included, and without checking the peer's name. (On a plain fleet
    /// `MIGRATE` stays: one round trip from here instead of two.)
    fn copy_over_own_connections(
        &self,
        from: &Endpoint,
        to: &Endpoint,
        key: &[u8],
    ) -> impl Future<Output = Result<(), StepError>> {
        let dump = self.send(from, &[b"SHARD.DUMP".to_vec(), key.to_vec()]);
        let (from, to) = (from.clone(), to.clone());
        let key = key.to_vec();
        let steps = self.clone();
        async move {
            let (payload, pttl) = match dump.await? {
                Resp::Array(items) => match items.as_slice() {
                    [Resp::Bulk(payload), Resp::Int(pttl)] => (payload.clone(), *pttl),
                    _ => return Err(StepError::new(&from, "SHARD.DUMP gave an unexpected reply")),
                },
                Resp::Null | Resp::NullArray => return Ok(()), // nothing to copy: the write makes it
                Resp::Error(e) => {
                    return Err(StepError::new(
                        &from,
                        format!(
                            "reading the key to copy it to {} failed: {}",
                            to.name,
                            String::from_utf8_lossy(&e)
                        ),
                    ))
                }
                _ => return Err(StepError::new(&from, "SHARD.DUMP gave an unexpected reply")),
            };
            let ttl = pttl.max(0).to_string().into_bytes();
            let restore = vec![b"RESTORE".to_vec(), key, ttl, payload];
            match steps.send(&to, &restore).await? {
                Resp::Error(e) if !e.starts_with(b"BUSYKEY") => Err(StepError::new(
                    &to,
                    format!(
                        "copying the key from {} failed: {}",
                        from.name,
                        String::from_utf8_lossy(&e)
                    ),
                )),
                _ => Ok(()),
            }
        }
    }

    /// Copy-before-write on a plain fleet: `MIGRATE ... COPY` run by the previous owner.
    fn copy_with_migrate(
        &self,
        from: &Endpoint,
        to: &Endpoint,
        key: &[u8],
    ) -> impl Future<Output = Result<(), StepError>> {
        let timeout_ms = u64::try_from(self.link.timeout.as_millis()).unwrap_or(u64::MAX);
        let unknown = (to.port == 0).then(|| {
            StepError::new(
                to,
                "its address is not known yet from Sentinel: retry in a moment",
            )
        });
        let mut args = vec![b"MIGRATE".to_vec()];
        // MIGRATE reads the key in its connection's database, the call's: the copy goes into
        // the same database at the new owner.
        args.extend(migrate::copy_args(
            &to.host,
            to.port,
            key,
            self.link.db,
            timeout_ms,
            false,
            self.link.auth.as_ref(),
        ));
        let reply = unknown.is_none().then(|| self.send(from, &args));
        let (from, to_name) = (from.clone(), to.name.clone());
        async move {
            let Some(reply) = reply else {
                return Err(unknown.unwrap_or_else(|| StepError::new(&from, "no address")));
            };
            match reply.await? {
                Resp::Error(e) if !e.windows(7).any(|w| w == b"BUSYKEY") => Err(StepError::new(
                    &from,
                    format!(
                        "copying the key to {to_name} failed: {}",
                        String::from_utf8_lossy(&e)
                    ),
                )),
                _ => Ok(()),
            }
        }
    }
}

/// Blocks the calling client; its reply callback writes the reply it is unblocked with.
unsafe fn block(ctx: *mut raw::RedisModuleCtx) -> Result<Blocked, String> {
    // SAFETY: ctx is the live context of a command.
    let bc = unsafe {
        let block = raw::RedisModule_BlockClient.ok_or("RedisModule_BlockClient is missing")?;
        block(ctx, Some(reply_callback), None, Some(free_reply), 0)
    };
    if bc.is_null() {
        return Err("the client cannot be blocked".into());
    }
    Ok(Blocked(bc))
}

fn unblock(client: Blocked, reply: CallReply) {
    let data = Box::into_raw(Box::new(reply));
    // SAFETY: the blocked client is live until unblocked, which happens once, here; the reply
    // callback reads `data` and `free_reply` frees it.
    unsafe {
        if let Some(unblock) = raw::RedisModule_UnblockClient {
            unblock(client.0, data.cast());
        } else {
            drop(Box::from_raw(data));
        }
    }
}

extern "C" fn reply_callback(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: the private data is the CallReply given to UnblockClient, alive until
    // `free_reply` runs after this callback.
    let reply = unsafe {
        raw::RedisModule_GetBlockedClientPrivateData
            .map(|get| get(ctx).cast::<CallReply>())
            .filter(|p| !p.is_null())
            .map(|p| &*p)
    };
    let out = Reply::new(ctx);
    // Writing a parsed reply does not panic; if it ever did, the server must go on (the
    // panic hook has logged it).
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match reply {
        Some(CallReply::Reply(resp)) => out.resp(resp),
        Some(CallReply::Error(message)) => out.error(message),
        None => out.error("ERR shard.call: the reply was lost"),
    }));
    raw::REDISMODULE_OK as c_int
}

extern "C" fn free_reply(_ctx: *mut raw::RedisModuleCtx, data: *mut std::os::raw::c_void) {
    if !data.is_null() {
        // SAFETY: made by Box::into_raw in `unblock`, freed once, here.
        drop(unsafe { Box::from_raw(data.cast::<CallReply>()) });
    }
}
