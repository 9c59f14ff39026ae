//! The phases' `Fleet` over the module's connections (`route::forward::NetSteps`): control
//! requests on each owner's control connection (`net::lanes::CONTROL`). The decision is
//! recorded in this process at the end of the event loop's turn (`turn`: in the AOF before any
//! `COMMIT` leaves, which go at the next turn); while this node has a replica connected (or
//! writes are paused) it is sent to this node itself as `SHARD.TXN DECIDE` (a command,
//! replicated and written to the AOF as it is) followed by `WAIT 1` on the same connection of
//! its own (as a fleet step is, `reshard/fleet/durable.rs`). A decision is forgotten at the end
//! of the turn too (`turn::forget`: not waited for; one lost leaves the decision to be carried
//! out again, which the owners answer `DONE`). Whether this node has a replica is
//! `host::context::connected_replicas`, kept from the server's replica events (not read from
//! `INFO` per decision). A node with no replica linked while Sentinel lists one it may promote
//! (`txn::owner::acked::replica_expected`) records no commit: the transaction is aborted
//! before any owner applies (a promoted replica would lack the decision, and answer the owners
//! still prepared abort). The phases run in the background, with no command's context: this
//! node's own parts of several owners go over the network too (`local` runs one owner's block
//! inside the client's `SHARD.EXEC`).

use std::cell::Cell;
use std::future::{ready, Future};
use std::time::Duration;

use crate::net::endpoint::{Endpoint, StepError};
use crate::net::resp::Resp;
use crate::route::forward::NetSteps;
use crate::route::wait::Wait;
use futures_util::future::Either;

use crate::txn::coord::book::{self, Record};
use crate::txn::coord::hold::{self, Step};
use crate::txn::coord::phases::{Decided, Fleet};
use crate::txn::coord::plan::Txn;
use crate::txn::coord::turn;
use crate::txn::coord::wire::{self, Decision};

/// How long the decision waits for this node's replica to acknowledge it (as long as an
/// owner's block waits for the owner's, `txn::owner::acked`).
pub const REPLICA_WAIT_MS: i64 = crate::txn::owner::acked::REPLICA_WAIT_MS;

/// The fleet of one transaction (or of a commit carried out again).
pub struct NetFleet {
    pub steps: NetSteps,
}

/// `txn`'s decision to commit in database `db`: every part.
pub fn decision(txn: &Txn, db: u32) -> Decision {
    Decision {
        db,
        parts: txn
            .parts
            .iter()
            .map(|p| (p.owner.name.clone(), p.commands.clone()))
            .collect(),
        addresses: txn.parts.iter().map(|p| p.owner.address.clone()).collect(),
    }
}

impl NetFleet {
    /// Waits while a test holds transactions at `step` (`SHARD.DEBUG TXN-HOLD`).
    pub(crate) async fn wait_at(&self, step: Step) {
        if !hold::holds(step) {
            return;
        }
        let _waiting = hold::Waiting::start();
        while hold::holds(step) {
            self.steps.sleep(Duration::from_millis(10)).await;
        }
    }

    async fn record(&self, txid: &str, decision: Decision) -> Result<Resp, String> {
        // Checked before the PREPAREs too (`refuses_to_coordinate`); again here, as the
        // prepares took a while: a failover or a replica's link lost meanwhile.
        let me = coordinator()?;
        let replicas = crate::host::context::connected_replicas();
        if replicas == 0 && !crate::host::context::writes_paused() {
            // At the end of this turn, in this process (`turn`); nil: over the connection.
            let (waiter, told) = self.steps.expect();
            turn::decide(txid, decision.clone(), waiter);
            match told.await {
                Ok(Resp::Null) => {}
                Ok(reply) => return Ok(reply),
                Err(e) => return Err(format!("ERR shard.txn: {e}")),
            }
        }
        let args = wire::decide_commit(txid, &decision);
        let replicas = crate::host::context::connected_replicas();
        if replicas == 0 {
            return self
                .steps
                .send_control(&me, &args)
                .await
                .map_err(|e| format!("ERR shard.txn: {e}"));
        }
        let wait = Wait {
            replicas: 1,
            timeout_ms: REPLICA_WAIT_MS,
        };
        let (command, waited) = self.steps.send_waited(&me, &args, wait);
        let reply = command.await.map_err(|e| format!("ERR shard.txn: {e}"))?;
        if reply.is_error() {
            return Ok(reply);
        }
        match waited.await {
            Ok(Resp::Int(n)) if n >= 1 => Ok(reply),
            other => Err(format!(
                "ERR shard.txn: the commit of transaction {txid} is recorded, but no replica of this node acknowledged it within {REPLICA_WAIT_MS} ms ({other:?}); it is carried out once one does (the owners wait meanwhile)"
            )),
        }
    }
}

/// This node as the coordinator that records a commit decision, or the error line that says
/// why it may not be one now. Checked before any owner is asked to prepare (`Fleet::
/// refuses_to_coordinate`: nothing locked, nothing left in doubt should this node die) and
/// again when the decision is recorded:
/// - a current ring names it (`queue::refuses_to_coordinate`: else it could record nothing);
/// - Sentinel names no other server its node's primary (this one will be demoted and lose
///   what only it holds);
/// - it has a replica linked, when Sentinel lists one it may promote: a decision only this
///   server holds would be lost to a promotion, and the owners still prepared would ask the
///   promoted one, which answers abort, after others applied their parts.
fn coordinator() -> Result<Endpoint, String> {
    if let Some(line) = crate::txn::coord::queue::refuses_to_coordinate() {
        return Err(line);
    }
    let me = crate::txn::coord::queue::this_node().ok_or_else(|| {
        "ERR shard.txn: this node is not in the ring: it cannot record a decision".to_string()
    })?;
    if !me.is_self {
        return Err(format!(
            "ERR shard.txn: this server is not node {}'s primary now: it makes no commit decision, nothing is applied; try again",
            me.name
        ));
    }
    if crate::host::context::connected_replicas() == 0
        && crate::txn::owner::acked::replica_expected(&me.name)
    {
        return Err(no_replica(&me.name));
    }
    Ok(me)
}

/// Why a decision is not recorded at a coordinator (`name`) with no replica linked while one
/// is expected (`txn::owner::acked::replica_expected`).
fn no_replica(name: &str) -> String {
    format!(
        "ERR shard.txn: node {name}, the transaction's coordinator, has no replica linked while Sentinel lists one it may promote: its commit decision would not survive a failover, so none is made and nothing is applied; try again"
    )
}

/// Whether a control request is a `COMMIT`.
fn is_commit(args: &[Vec<u8>]) -> bool {
    args.get(1)
        .is_some_and(|v| v.eq_ignore_ascii_case(b"COMMIT"))
}

/// How long beyond the call timeout a control request may take: an owner's reply to `COMMIT`
/// and `APPLY` waits for its replica (`txn::owner::acked`) up to `REPLICA_WAIT_MS`.
fn extra_for(args: &[Vec<u8>]) -> Duration {
    let block = args
        .get(1)
        .is_some_and(|v| v.eq_ignore_ascii_case(b"COMMIT") || v.eq_ignore_ascii_case(b"APPLY"));
    if block {
        Duration::from_millis(crate::txn::owner::acked::REPLICA_WAIT_MS.unsigned_abs())
    } else {
        Duration::ZERO
    }
}

thread_local! {
    static SEED: Cell<u64> = Cell::new(crate::clock::monotonic_ms() | 1);
}

impl Fleet for NetFleet {
    fn control(
        &self,
        at: &Endpoint,
        args: Vec<Vec<u8>>,
    ) -> impl Future<Output = Result<Resp, StepError>> {
        if is_commit(&args) {
            // To the owner's address now, not the one of its PREPARE: it may have failed over
            // since, and its promoted replica holds the part or gets it with the COMMIT.
            let (at, waits) = (at.clone(), hold::commit_waits(&args));
            return Either::Left(async move {
                if waits {
                    self.wait_at(Step::CommittedOne).await;
                }
                let now = crate::txn::coord::queue::node_named(&at.name).unwrap_or(at);
                if hold::holds(Step::KillAfterCommit) {
                    return self.steps.send_control_then_kill(&now, &args).await;
                }
                self.steps
                    .send_control_for(&now, &args, extra_for(&args))
                    .await
            });
        }
        Either::Right(self.steps.send_control_for(at, &args, extra_for(&args)))
    }

    fn decide(&self, txn: &Txn) -> impl Future<Output = Decided> {
        let decided = decision(txn, self.steps.link().db);
        let txid = txn.txid.clone();
        async move {
            self.wait_at(Step::Prepared).await;
            match self.record(&txid, decided).await {
                Ok(Resp::Error(line)) => {
                    Decided::Refused(String::from_utf8_lossy(&line).into_owned())
                }
                Ok(_) => {
                    self.wait_at(Step::Decided).await;
                    Decided::Commit
                }
                Err(line) => {
                    // Not known to have reached this node's book: an abort recorded now keeps
                    // a late one out (`SHARD.TXN DECIDE` refuses a second decision).
                    let aborted = book::with(|b| b.decide(&txid, Record::Abort)).is_ok();
                    if aborted {
                        Decided::Refused(line)
                    } else {
                        // A commit here, not known at a replica: held (`pending` to the
                        // owners, not carried out) until one has it.
                        crate::txn::coord::confirm::later(&txid);
                        Decided::Unsure(line)
                    }
                }
            }
        }
    }

    fn forget(&self, txid: &str) -> impl Future<Output = ()> {
        // At the end of this turn, in this process; not waited for.
        turn::forget(txid);
        ready(())
    }

    fn preparing(&self, txid: &str, deadline_ms: u64) {
        book::with(|b| b.preparing(txid, deadline_ms));
    }

    fn pause(&self, ms: u64) -> impl Future<Output = ()> {
        self.steps.sleep(Duration::from_millis(ms))
    }

    fn now_ms(&self) -> u64 {
        crate::clock::monotonic_ms()
    }

    fn random(&self, n: u64) -> u64 {
        SEED.with(|s| {
            // xorshift64
            let mut x = s.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.set(x);
            x % n.max(1)
        })
    }

    fn refuses_to_coordinate(&self) -> Option<String> {
        coordinator().err()
    }

    fn own_address(&self) -> Option<String> {
        // By the current ring (`refuses_to_coordinate` found this node there), Sentinel's
        // address for a `sentinel` node.
        let me = crate::txn::coord::queue::this_node()?;
        (me.port != 0).then_some(me.address)
    }
}
