//! How the coordinator runs a transaction at its owners (`docs/transactions.md`, "the
//! phases"), pure: the requests sent and what each reply leads to, driven through the
//! `Fleet` trait (the glue sends over the module's connections, `exec`; the tests use a fake
//! fleet, `phases_tests`).
//!
//! - one owner: `SHARD.TXN APPLY` (its commands as one atomic block; `LOCKED` is tried again
//!   like a prepare's, the watches kept by the refused `APPLY`). Not `MULTI`/`EXEC`: on Redis
//!   7.0 the owner can refuse a command of a locked key only when `EXEC` runs it, alone, and
//!   the block's other commands would apply; `APPLY` checks every key first. Without watched
//!   keys its txid is `-` (none);
//! - several owners: refused before anything is sent when this node may not coordinate
//!   (`Fleet::refuses_to_coordinate`: it could record no decision now, as no current ring
//!   names it, Sentinel names another server its primary or it has no replica linked while
//!   one is expected; the watches dropped). Else `PREPARE` at each, at once. Any `WATCHED`:
//!   `ABORT` everywhere, nil. Any `LOCKED`: `ABORT` everywhere, a short random pause, again,
//!   for at most `lock_ms`, then `TRYAGAIN`. Any other failure (an error, no answer): `ABORT`
//!   everywhere (a `PREPARE` that timed out may have locked), the error. All `PREPARED`:
//!   the decision is recorded durably (`Fleet::decide`), then `COMMIT` with its part at each
//!   owner (again, a few times, for an owner that does not answer), the replies merged; the
//!   decision is forgotten once every owner confirmed, else kept for the coordinator to send
//!   again later.
//!
//! A lock met by a transaction with watched keys ends in nil, never `TRYAGAIN` (a client
//! library's optimistic loop, redis-py's `transaction()`, retries only on a nil `EXEC`): with
//! several owners at once, since the `ABORT` dropped its watches at every owner (tried again,
//! it could only fail as watched); with one owner once `lock_ms` has passed, its watches
//! dropped first (`UNWATCH`). Either way the watches are gone, so a watched key may have
//! changed: exactly what nil tells the client (read again and retry). `TRYAGAIN` stays for a
//! transaction without watches that waited out `lock_ms`.

use std::future::Future;

use futures_util::future::join_all;

use crate::net::endpoint::{Endpoint, StepError};
use crate::net::resp::Resp;
use crate::txn::coord::plan::{Part, Txn};
use crate::txn::coord::wire::{self, Prepared};

/// How often a `COMMIT` is sent to an owner that does not answer before the client is told.
pub const COMMIT_TRIES: u32 = 4;

/// What runs the phases.
pub trait Fleet {
    /// A `SHARD.TXN` request at `at` (on a connection that never waits behind a lock).
    fn control(
        &self,
        at: &Endpoint,
        args: Vec<Vec<u8>>,
    ) -> impl Future<Output = Result<Resp, StepError>>;
    /// Records durably that `txn` commits (with every part), acknowledged by a replica when
    /// the coordinator has one.
    fn decide(&self, txn: &Txn) -> impl Future<Output = Decided>;
    /// Forgets the decision of `txid` (durably): every owner applied its part.
    fn forget(&self, txid: &str) -> impl Future<Output = ()>;
    /// `txid` is being prepared until `deadline_ms` (`SHARD.TXN STATUS` answers `pending`
    /// until then).
    fn preparing(&self, txid: &str, deadline_ms: u64);
    fn pause(&self, ms: u64) -> impl Future<Output = ()>;
    fn now_ms(&self) -> u64;
    /// A random number below `n` (at least 1).
    fn random(&self, n: u64) -> u64;
    /// This coordinator's address, given with each `PREPARE` (`FROM`): an owner in doubt asks
    /// it there once no ring it holds names this node (a shrink removed it).
    fn own_address(&self) -> Option<String> {
        None
    }
    /// Why this node may not coordinate a transaction across nodes (the error line), checked
    /// before anything is prepared: it could record no decision now (no current ring names it,
    /// Sentinel names another server its primary, or it has no replica linked while one is
    /// expected).
    fn refuses_to_coordinate(&self) -> Option<String> {
        None
    }
}

/// What recording the decision came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Recorded: the transaction commits.
    Commit,
    /// Not recorded, for sure (an abort was recorded first: an owner in doubt asked): abort.
    Refused(String),
    /// Not known to be recorded or acknowledged: nothing more is sent; the owners ask.
    Unsure(String),
}

/// How a transaction ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Applied: each queued command's reply in queue order, or the error line when not every
    /// owner's replies came back (the decision is kept and carried out later).
    Committed(Result<Vec<Resp>, String>),
    /// A watched key was written: nil, nothing applied.
    Watched,
    /// Keys stayed locked by other transactions for `lock_ms` (no key watched): the
    /// `TRYAGAIN` line.
    Locked(String),
    /// A transaction with watched keys met another's lock, and its watches were dropped: nil
    /// (a watched key may have changed), nothing applied. The reason (which node) is kept.
    LockedWatched(String),
    /// Nothing applied (or, for `Unsure`, not known): the error line.
    Failed(String),
}

/// One attempt's result, before retries.
enum Attempt {
    Done(Outcome),
    Locked(String),
}

/// Runs `txn`; `lock_ms` bounds the retries of a lock conflict.
pub async fn run<F: Fleet>(txn: &Txn, fleet: &F, lock_ms: u64) -> Outcome {
    let start = fleet.now_ms();
    let mut tries: u64 = 0;
    loop {
        let attempt = match txn.parts.as_slice() {
            [] => Attempt::Done(Outcome::Committed(Ok(Vec::new()))),
            [one] if one.watched.is_empty() && one.commands.is_empty() => {
                Attempt::Done(Outcome::Committed(Ok(Vec::new())))
            }
            [one] => apply(txn, one, fleet).await,
            _ => two_phase(txn, fleet, lock_ms).await,
        };
        let reason = match attempt {
            Attempt::Done(outcome) => return outcome,
            Attempt::Locked(reason) => reason,
        };
        let spent = fleet.now_ms().saturating_sub(start);
        let watched = txn.parts.iter().any(|p| !p.watched.is_empty());
        // Several owners: the ABORT dropped the watches at every owner; tried again, the
        // transaction could only fail as watched. Nil: the client reads again and retries.
        if watched && txn.parts.len() > 1 {
            return Outcome::LockedWatched(reason);
        }
        if spent >= lock_ms {
            if let (true, [one]) = (watched, txn.parts.as_slice()) {
                // One owner: a refused APPLY kept the watches; dropped now, as an ABORT drops
                // a two-phase's (an owner that does not answer drops them after their ttl).
                let _ = fleet.control(&one.owner, wire::unwatch(&txn.txid)).await;
                return Outcome::LockedWatched(reason);
            }
            return Outcome::Locked(format!(
                "TRYAGAIN keys of the transaction stayed locked by other transactions for {lock_ms} ms ({reason}): retry"
            ));
        }
        tries += 1;
        let most = (5 * tries).min(50).min(lock_ms - spent).max(1);
        fleet.pause(1 + fleet.random(most)).await;
    }
}

/// The error line of a failed request, naming the node.
fn failed(e: &StepError) -> String {
    format!("ERR shard.txn: {e}")
}

async fn apply<F: Fleet>(txn: &Txn, part: &Part, fleet: &F) -> Attempt {
    let txid = if txn.txid.is_empty() { "-" } else { &txn.txid };
    let request = wire::apply(txid, &part.watched, &part.commands);
    match fleet.control(&part.owner, request).await {
        // Applied at the owner, at no replica of it (`txn::owner::acked::single`): committed,
        // the error relayed.
        Ok(Resp::Error(line)) if wire::unconfirmed(&line) => Attempt::Done(Outcome::Committed(
            Err(String::from_utf8_lossy(&line).into_owned()),
        )),
        Ok(Resp::Error(line)) => match wire::refusal(&line) {
            Prepared::Locked => Attempt::Locked(String::from_utf8_lossy(&line).into_owned()),
            Prepared::Watched => Attempt::Done(Outcome::Watched),
            _ => Attempt::Done(Outcome::Failed(String::from_utf8_lossy(&line).into_owned())),
        },
        Ok(reply) => Attempt::Done(replied(txn, reply)),
        Err(e) => Attempt::Done(Outcome::Failed(failed(&e))),
    }
}

/// One owner's `APPLY` reply as the transaction's outcome.
pub fn replied(txn: &Txn, reply: Resp) -> Outcome {
    match reply {
        Resp::Null | Resp::NullArray => Outcome::Watched,
        Resp::Array(replies) => Outcome::Committed(txn.merge(vec![replies])),
        Resp::Error(line) => Outcome::Failed(String::from_utf8_lossy(&line).into_owned()),
        other => Outcome::Failed(format!(
            "ERR the owner replied {other:?} to the transaction"
        )),
    }
}

async fn abort_all<F: Fleet>(txn: &Txn, fleet: &F) {
    let aborts = txn
        .parts
        .iter()
        .map(|p| fleet.control(&p.owner, wire::abort(&txn.txid)));
    // An owner that does not answer drops its part itself: it asks the coordinator, which
    // has no commit for it.
    let _ = join_all(aborts).await;
}

async fn two_phase<F: Fleet>(txn: &Txn, fleet: &F, lock_ms: u64) -> Attempt {
    if let Some(line) = fleet.refuses_to_coordinate() {
        // Nothing prepared (before, its PREPAREs locked the owners' keys, then it aborted, or
        // was killed first and left them in doubt): only the watches are dropped, as an
        // ABORT would drop them.
        let unwatches = txn
            .parts
            .iter()
            .filter(|p| !p.watched.is_empty())
            .map(|p| fleet.control(&p.owner, wire::unwatch(&txn.txid)));
        let _ = join_all(unwatches).await;
        return Attempt::Done(Outcome::Failed(line));
    }
    fleet.preparing(&txn.txid, fleet.now_ms() + lock_ms);
    let from = fleet.own_address();
    let prepares = txn.parts.iter().map(|p| {
        let request = wire::prepare(&txn.txid, lock_ms, &p.watched, &p.commands, from.as_deref());
        fleet.control(&p.owner, request)
    });
    let replies = join_all(prepares).await;
    let mut watched = false;
    let mut locked = None;
    let mut error = None;
    for (part, reply) in txn.parts.iter().zip(&replies) {
        match reply.as_ref().map(wire::prepared) {
            Ok(Prepared::Prepared) => {}
            Ok(Prepared::Watched) => watched = true,
            Ok(Prepared::Locked) => {
                locked.get_or_insert_with(|| format!("at node {}", part.owner.name));
            }
            Ok(Prepared::Failed(line)) => {
                error.get_or_insert(line);
            }
            Err(e) => {
                error.get_or_insert_with(|| failed(e));
            }
        }
    }
    if watched || locked.is_some() || error.is_some() {
        abort_all(txn, fleet).await;
        return match (watched, error, locked) {
            (true, _, _) => Attempt::Done(Outcome::Watched),
            (_, Some(line), _) => Attempt::Done(Outcome::Failed(line)),
            (_, None, reason) => Attempt::Locked(reason.unwrap_or_default()),
        };
    }
    match fleet.decide(txn).await {
        Decided::Commit => {}
        Decided::Refused(line) => {
            abort_all(txn, fleet).await;
            return Attempt::Done(Outcome::Failed(line));
        }
        Decided::Unsure(line) => return Attempt::Done(Outcome::Failed(line)),
    }
    Attempt::Done(Outcome::Committed(commit_all(txn, fleet).await))
}

/// `COMMIT` at every owner (each sent again up to `COMMIT_TRIES` times); the merged replies,
/// and the decision forgotten, once every owner confirmed.
pub async fn commit_all<F: Fleet>(txn: &Txn, fleet: &F) -> Result<Vec<Resp>, String> {
    let commits = txn.parts.iter().map(|p| commit_one(txn, p, fleet));
    let outcomes = join_all(commits).await;
    if outcomes.iter().all(|o| !matches!(o, Committed::Unknown(_))) {
        fleet.forget(&txn.txid).await;
    }
    let mut replies = Vec::with_capacity(outcomes.len());
    for (part, outcome) in txn.parts.iter().zip(outcomes) {
        match outcome {
            Committed::Replies(r) => replies.push(r),
            Committed::Done => {
                return Err(format!(
                    "ERR the transaction committed, but the replies of node {} were lost (it had applied its part already)",
                    part.owner.name
                ))
            }
            Committed::Unknown(line) => {
                return Err(format!(
                    "ERR the transaction committed, but node {} has not confirmed its part yet; the coordinator sends it again until it does ({line})",
                    part.owner.name
                ))
            }
        }
    }
    txn.merge(replies)
}

enum Committed {
    Replies(Vec<Resp>),
    /// The owner had applied it already (a `COMMIT` sent again).
    Done,
    Unknown(String),
}

async fn commit_one<F: Fleet>(txn: &Txn, part: &Part, fleet: &F) -> Committed {
    let mut last = String::new();
    for attempt in 0..COMMIT_TRIES {
        if attempt > 0 {
            fleet.pause(50 * u64::from(attempt)).await;
        }
        match fleet
            .control(&part.owner, wire::commit(&txn.txid, &part.commands))
            .await
        {
            Ok(Resp::Array(replies)) => return Committed::Replies(replies),
            Ok(Resp::Simple(s)) if s.eq_ignore_ascii_case(b"DONE") => return Committed::Done,
            // Applied at the owner, but not at a replica of it yet (its replica cut off,
            // stopped, or none linked while Sentinel lists one): not confirmed. A failover
            // of the owner now would lose the part, so the decision is kept and the COMMIT
            // (with the part) sent again later, to whichever server is the owner's primary
            // then, until it answers `DONE` (docs/transactions.md, "Durable at the owners").
            // Not at once: the owner has waited for its replica already.
            Ok(Resp::Error(line)) if wire::applied(&line) => {
                return Committed::Unknown(String::from_utf8_lossy(&line).into_owned())
            }
            Ok(other) => last = format!("COMMIT replied {other:?}"),
            Err(e) => last = e.to_string(),
        }
    }
    Committed::Unknown(last)
}

#[cfg(test)]
#[path = "phases_tests.rs"]
mod tests;
