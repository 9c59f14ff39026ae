//! The coordinator's decisions and forgets, recorded in this process at the end of the event
//! loop's turn (not sent to this node itself as `SHARD.TXN DECIDE` / `FORGET` over a
//! connection: each was a request written, read, run and answered twice in the same process).
//!
//! The rule a decision keeps: it is in the AOF (written to the kernel, fsynced when
//! `appendfsync always`) before any of its `COMMIT`s leaves, and acknowledged by a replica when
//! the node has one. Recorded here, it holds by the order of the server's `beforeSleep`, read in
//! the sources of Redis 7.0 (src/server.c at 7.0.15) and Valkey (src/server.c, 8.0; and the
//! Valkey 9.1.2 binary's `beforeSleep` disassembled: the same calls in the same order):
//!
//! 1. the module's `BEFORE_SLEEP` event fires (Redis 7.0: after `processClientsWaitingReplicas`,
//!    before `moduleHandleBlockedClients`; Valkey: after `blockedBeforeSleep`). Its handler
//!    (`lib.rs`) first flushes the pool (`net::pool::before_sleep`: what was queued in this
//!    turn is written), then calls `before_sleep` here, which records this turn's decisions in
//!    the book and replicates them with the event's context; the server propagates them (to the
//!    replication stream and the AOF buffer) when the event's context is freed, at the
//!    handler's return (`moduleFreeContext`, `propagatePendingCommands`). Only then are the
//!    transactions told their decision: their `COMMIT`s are queued after the pool's flush, so
//!    the pool asks for their sockets' writable event instead of writing them;
//! 2. `flushAppendOnlyFile` writes the AOF buffer (and fsyncs it when `appendfsync always`);
//! 3. the server sleeps; the sockets are writable at once, so it wakes, and the `COMMIT`s are
//!    written in the next turn's events (no wake-up is missing, none is added).
//!
//! So a `kill -9` between the decision and its `COMMIT`s leaves the decision in the AOF, as
//! the `DECIDE` sent over the connection did (its reply, too, was written after the AOF).
//! As with that reply, `appendfsync everysec` may postpone the AOF write while a background
//! fsync is slow (up to 2 s): the same loss window the server's own replies have.
//!
//! What still goes over the connection (`fleet`): a decision while this node has a replica
//! online (`DECIDE` then `WAIT 1` on a connection of their own: the replica's acknowledgement
//! is what that `WAIT` gives), and while writes are paused (a write replicated from outside a
//! command fails an assertion of Redis 7.0 then; the `DECIDE` command waits the pause out).
//! Both are checked again here, at the turn's end. A `FORGET` has no order to keep (one lost
//! only means a `COMMIT` sent again, answered `DONE`): this turn's are recorded together, and
//! kept for a later turn while writes are paused.

use std::cell::RefCell;

use redis_module::Context;

use crate::net::pool::{Outcome, Waiter};
use crate::net::resp::Resp;
use crate::txn::coord::book::{self, Record};
use crate::txn::coord::wire::{self, Decision};

/// A decision to record at the turn's end, and who waits for it.
struct Pending {
    txid: String,
    decision: Decision,
    waiter: Waiter,
}

#[derive(Default)]
struct Turn {
    decisions: Vec<Pending>,
    forgets: Vec<String>,
}

thread_local! {
    static TURN: RefCell<Turn> = RefCell::new(Turn::default());
}

/// Records `txid`'s decision to commit at the end of this turn; `waiter` is then given `OK`,
/// the refusal (`ABORTED ...`: an abort was recorded first; `READONLY`: this server is a replica
/// now), or nil: not recorded here, to be sent as `SHARD.TXN DECIDE` over the connection.
pub fn decide(txid: &str, decision: Decision, waiter: Waiter) {
    TURN.with(|t| {
        t.borrow_mut().decisions.push(Pending {
            txid: txid.to_string(),
            decision,
            waiter,
        })
    });
}

/// Forgets `txid`'s decision (every owner confirmed it) at the end of this turn, replicated.
pub fn forget(txid: &str) {
    TURN.with(|t| t.borrow_mut().forgets.push(txid.to_string()));
}

/// Whether a decision or a forget waits for the end of this turn.
pub fn waiting() -> bool {
    TURN.with(|t| {
        let t = t.borrow();
        !t.decisions.is_empty() || !t.forgets.is_empty()
    })
}

/// The turn's end: after the pool's flush, in the `BEFORE_SLEEP` event's handler (`lib.rs`),
/// with its context. Records and replicates this turn's decisions and forgets, then tells the
/// transactions waiting for their decision (their next requests leave at the next turn).
pub fn before_sleep(ctx: &Context) {
    if !waiting() {
        return;
    }
    let Turn { decisions, forgets } = TURN.with(|t| std::mem::take(&mut *t.borrow_mut()));
    let replica = crate::topology::nodes::is_replica();
    // (Replicating from outside a command while writes are paused fails an assertion of
    // Redis 7.0.)
    let paused = crate::host::context::writes_paused();
    let mut told: Vec<(Waiter, Outcome)> = Vec::with_capacity(decisions.len());
    for p in decisions {
        let outcome = if replica {
            Resp::Error(b"READONLY this server is a replica now: it records no decision".to_vec())
        } else if paused || crate::host::context::connected_replicas() > 0 {
            Resp::Null
        } else {
            let args = wire::decide_commit(&p.txid, &p.decision);
            match book::with(|b| b.decide(&p.txid, Record::Commit(p.decision))) {
                Err(line) => Resp::Error(line.into_bytes()),
                Ok(()) => {
                    replicate(ctx, &args);
                    Resp::Simple(b"OK".to_vec())
                }
            }
        };
        told.push((p.waiter, Ok(outcome)));
    }
    if paused && !replica {
        TURN.with(|t| t.borrow_mut().forgets.extend(forgets));
    } else if !replica {
        for txid in forgets {
            book::with(|b| b.forget(&txid));
            replicate(ctx, &wire::forget(&txid));
        }
    }
    crate::route::forward::deliver_all(told);
}

/// Propagates `SHARD.TXN ...` (`args` with its name first) to the replicas and the AOF.
fn replicate(ctx: &Context, args: &[Vec<u8>]) {
    let rest: Vec<&[u8]> = args.iter().skip(1).map(Vec::as_slice).collect();
    crate::host::replicate::replicate_args(ctx, c"SHARD.TXN", &rest);
}
