//! Routed calls in flight: the client blocked on each, what it waits for, and its reply.
//!
//! A call whose command goes to one other node whole (the common case) waits for that one
//! reply, which becomes the client's reply as it is. A call with several steps (a resharding's
//! fallbacks and copies, or the parts of a split multi-key command) runs as a future over the
//! steps (`steps::execute`, `split`); each reply wakes it, on the main thread, and it sends its
//! next step or finishes. The client is unblocked the moment its reply is whole, and the reply
//! is written by the blocked client's reply callback (`host::blocked`), so no thread-safe
//! context is needed. The counters of INFO's routed calls are kept here too. The steps of a
//! call (`NetSteps`) send requests over the pool (a write and its `WAIT` together, on a
//! connection of their own: `net::lanes`); a copy-before-write's requests are `copy`'s. The
//! counters are `stats`'.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use rustc_hash::FxHashMap;

use crate::host::blocked::{self, BlockedReply};
use crate::host::command::Call as CommandCall;
use crate::host::reply::Reply;
use crate::net::endpoint::{Endpoint, StepError, StepErrorKind};
use crate::net::lanes::{self, Held};
use crate::net::pool::{Link, Outcome, Waiter};
use crate::net::resp::{ReplyResp, Resp};
use crate::route::copy;
use crate::route::stats::count;
use crate::route::steps::Step;
use crate::route::wait::Wait;

/// What the client gets.
pub enum CallReply {
    Reply(Resp),
    Error(String),
}

impl CallReply {
    /// A failed step as the client sees it: an error naming the node.
    pub fn failed(e: &StepError) -> CallReply {
        // A call that found every connection it could use taken was not sent: the client may
        // send it again (TRYAGAIN, as Redis says of a retry that can succeed).
        let code = if e.kind == StepErrorKind::Busy {
            "TRYAGAIN"
        } else {
            "ERR"
        };
        CallReply::Error(format!("{code} shard.call: {e}"))
    }
}

impl BlockedReply for CallReply {
    const LOST: &'static str = "ERR shard.call: the reply was lost";

    fn write(&self, out: &Reply) {
        match self {
            CallReply::Reply(resp) => out.resp(resp),
            CallReply::Error(message) => out.error(message),
        }
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

type Blocked = blocked::Blocked<CallReply>;

enum Waiting {
    /// The client's reply is this one reply; the ring epoch it was routed by.
    Direct(Blocked, u64),
    /// As `Direct`, for a blocking command waiting at its owner (`blocking_moves`).
    Blocking(Blocked, u64),
    /// The owner's id of the connection the blocking command of this waiter waits on.
    LaneClient(Waiter),
    /// A reply of no use to anyone.
    Ignored,
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

/// Blocks the client of `call` and sends `args` to `at`; its reply will be the client's reply.
pub fn forward(
    call: &CommandCall,
    at: &Endpoint,
    link: &Link,
    args: &[&[u8]],
) -> Result<(), String> {
    let client = blocked::block(call)?;
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

/// Forwards a blocking command (`BLPOP`, `XREAD ... BLOCK` ...) to `at` on a connection of its
/// own (`net::lanes`), given the call timeout plus `bound`, the command's own timeout
/// (`blocking::wait_bound`; none for one that waits for ever): the node replies at its
/// timeout, and a reply overdue past that (the link cut) fails the call naming the node. A
/// node that goes away fails the connection. If the client disconnects first, that connection
/// is closed, so that the node stops waiting and pops nothing for a client gone.
///
/// The connection's id at the owner is asked first, on the same connection, so that the wait
/// can be ended there if a ring change moves one of `keys` (owned by `owner`) away while it
/// lasts (`blocking_moves`).
pub fn forward_blocking(
    call: &CommandCall,
    at: &Endpoint,
    link: &Link,
    args: &[Vec<u8>],
    waits: crate::route::blocking_moves::Watched,
    bound: Option<std::time::Duration>,
) -> Result<(), String> {
    let client = blocked::block(call)?;
    let epoch = begin_call();
    let (waiter, asked) = CALLS.with(|c| {
        let mut calls = c.borrow_mut();
        let waiter = calls.id();
        let asked = calls.id();
        calls.waiting.insert(asked, Waiting::LaneClient(waiter));
        (waiter, asked)
    });
    client.on_disconnect(move || lanes::cancel(waiter, "the client disconnected"));
    CALLS.with(|c| {
        c.borrow_mut()
            .waiting
            .insert(waiter, Waiting::Blocking(client, epoch))
    });
    crate::route::blocking_moves::waits(waiter, at, link, waits);
    lanes::request_alone(
        at,
        link,
        &[
            Held {
                args: &[b"CLIENT".to_vec(), b"ID".to_vec()],
                waiter: asked,
                extra: Some(std::time::Duration::ZERO),
            },
            Held {
                args,
                waiter,
                extra: bound,
            },
        ],
    );
    Ok(())
}

/// Sends `args` to `at` on its control connection; the reply goes nowhere.
pub fn send_ignored(at: &Endpoint, link: &Link, args: &[Vec<u8>], extra: std::time::Duration) {
    let waiter = CALLS.with(|c| {
        let mut calls = c.borrow_mut();
        let id = calls.id();
        calls.waiting.insert(id, Waiting::Ignored);
        id
    });
    lanes::request_control(at, link, args, waiter, extra);
}

/// Blocks the client of `call` and runs the future `make` builds over the network steps; its
/// output is the client's reply.
pub fn run<F, Fut>(call: &CommandCall, link: Link, make: F) -> Result<(), String>
where
    F: FnOnce(NetSteps) -> Fut,
    Fut: Future<Output = CallReply> + 'static,
{
    let client = blocked::block(call)?;
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
            client.unblock(reply);
        }
        Waiting::Blocking(client, epoch) => {
            end_call(epoch);
            let moved = crate::route::blocking_moves::done(waiter);
            let reply = match outcome {
                // Its wait ended by the owner because its key moved (`blocking_moves`).
                Ok(Resp::Error(e)) if moved.is_some() && e.starts_with(b"UNBLOCKED") => {
                    CallReply::Error(moved.unwrap_or_default())
                }
                Ok(reply) => {
                    count(|s| s.forwarded += 1);
                    CallReply::Reply(reply)
                }
                Err(e) => CallReply::failed(&e),
            };
            client.unblock(reply);
        }
        Waiting::LaneClient(of) => {
            if let Ok(Resp::Int(id)) = outcome {
                crate::route::blocking_moves::lane_client(of, id);
            }
        }
        Waiting::Ignored => {}
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
        client.unblock(done);
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
    /// How this call's requests reach the nodes.
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// A future that resolves after `delay`, on a timer of the server's event loop.
    pub fn sleep(&self, delay: std::time::Duration) -> impl Future<Output = ()> {
        let waiter = self.waiter();
        let armed = crate::host::context::after(
            delay,
            |_ctx: &redis_module::Context, waiter: Waiter| deliver(waiter, Ok(Resp::Null)),
            waiter,
        );
        if !armed {
            deliver(waiter, Ok(Resp::Null));
        }
        let reply = self.reply(waiter);
        async move {
            let _ = reply.await;
        }
    }

    /// A waiter for a step of this call.
    fn waiter(&self) -> Waiter {
        CALLS.with(|c| {
            let mut calls = c.borrow_mut();
            let id = calls.id();
            calls.waiting.insert(id, Waiting::Step(self.call));
            id
        })
    }

    /// A step of this call that something other than a request answers: its waiter, which
    /// `deliver_all` is later given with the outcome, and the future that resolves with it.
    pub fn expect(&self) -> (Waiter, StepReply) {
        let waiter = self.waiter();
        (waiter, self.reply(waiter))
    }

    fn reply(&self, waiter: Waiter) -> StepReply {
        StepReply {
            waiter,
            slots: Rc::clone(&self.slots),
        }
    }

    /// Sends `args` to `at`; the future resolves with the reply.
    pub fn send(&self, at: &Endpoint, args: &[Vec<u8>]) -> StepReply {
        let waiter = self.waiter();
        crate::net::pool::request(at, &self.link, args, waiter);
        self.reply(waiter)
    }

    /// Sends a transaction's control request (`SHARD.TXN ...`) to `at` on the connection of
    /// such requests (`net::lanes::CONTROL`); the future resolves with the reply.
    pub fn send_control(&self, at: &Endpoint, args: &[Vec<u8>]) -> StepReply {
        self.send_control_for(at, args, std::time::Duration::ZERO)
    }

    /// `send_control`, the request given `extra` beyond the call timeout.
    pub fn send_control_for(
        &self,
        at: &Endpoint,
        args: &[Vec<u8>],
        extra: std::time::Duration,
    ) -> StepReply {
        let waiter = self.waiter();
        lanes::request_control(at, &self.link, args, waiter, extra);
        self.reply(waiter)
    }

    /// `send_control`, and this process kills itself once the request is written (a test's
    /// step, `net::pool::kill_after_writing`).
    pub fn send_control_then_kill(&self, at: &Endpoint, args: &[Vec<u8>]) -> StepReply {
        let waiter = self.waiter();
        crate::net::pool::kill_after_writing(waiter);
        lanes::request_control(at, &self.link, args, waiter, std::time::Duration::ZERO);
        self.reply(waiter)
    }

    /// Sends `args` and then `WAIT` to `at`, back to back on a connection of their own; the
    /// futures resolve with the command's reply and `WAIT`'s.
    pub fn send_waited(
        &self,
        at: &Endpoint,
        args: &[Vec<u8>],
        wait: Wait,
    ) -> (StepReply, StepReply) {
        let (command, waited) = (self.waiter(), self.waiter());
        let wait_args = wait.command();
        let requests = [
            Held {
                args,
                waiter: command,
                extra: Some(std::time::Duration::ZERO),
            },
            Held {
                args: &wait_args,
                waiter: waited,
                extra: wait.extra(),
            },
        ];
        lanes::request_alone(at, &self.link, &requests);
        (self.reply(command), self.reply(waited))
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

    fn run_acked(
        &self,
        at: &Endpoint,
        args: Vec<Vec<u8>>,
        wait: Wait,
    ) -> impl Future<Output = Result<(Resp, Option<i64>), StepError>> {
        let (command, waited) = self.send_waited(at, &args, wait);
        async move {
            let reply = command.await?;
            if reply.is_error() {
                // Nothing written to wait for; WAIT's reply, when it comes, goes nowhere.
                return Ok((reply, None));
            }
            match waited.await? {
                Resp::Int(n) => Ok((reply, Some(n))),
                Resp::Error(e) => Err(StepError::new(
                    at,
                    format!(
                        "the command ran, but WAIT failed: {}",
                        String::from_utf8_lossy(&e)
                    ),
                )),
                other => Err(StepError::new(
                    at,
                    format!("the command ran, but WAIT replied {other:?}"),
                )),
            }
        }
    }

    fn copy(
        &self,
        from: &Endpoint,
        to: &Endpoint,
        key: &[u8],
    ) -> impl Future<Output = Result<(), StepError>> {
        if crate::net::tls::current().is_some() {
            futures_util::future::Either::Left(copy::over_own_connections(self, from, to, key))
        } else {
            futures_util::future::Either::Right(copy::with_migrate(self, from, to, key))
        }
    }
}
