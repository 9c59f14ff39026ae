//! A commit decision recorded at this node that no replica of it acknowledged within
//! `fleet::REPLICA_WAIT_MS` (the phases' `Decided::Unsure`): the book holds it `unsure`
//! (`book::Book::unsure`), answered `pending` to an owner in doubt and not carried out, for a
//! failover now would promote a replica without it, which answers the owners still prepared
//! abort while others applied their parts (applied in part). `later` asks for a replica once a
//! second (`SHARD.TXN SYNC`, then `WAIT 1`, to this server on a connection of its own, as the
//! decision's own wait) until one has everything replicated so far: then every commit recorded
//! here is known there, the book's `unsure` is cleared and the commits carried out
//! (`exec::resume`). An owner's `STATUS` of a held commit starts the loop again should none
//! have gone round for 5 s (`kick`). A server with no replica linked and none expected
//! (`txn::owner::acked::replica_expected`) confirms at once; a demoted one stops (its book
//! follows its primary's).

use std::cell::Cell;
use std::time::Duration;

use crate::net::resp::Resp;
use crate::route::forward::{self, CallReply, NetSteps};
use crate::route::wait::Wait;
use crate::txn::coord::{book, exec, fleet::REPLICA_WAIT_MS, queue};
use crate::txn::owner::acked;

thread_local! {
    /// When `later`'s loop last went round (monotonic ms; 0: none runs). A loop not heard of
    /// for `STALE_MS` is taken for gone and started again (`kick`), so that no commit stays
    /// held for want of one.
    static BEAT: Cell<u64> = const { Cell::new(0) };
}

/// How long a loop may go unheard of before `kick` starts another.
const STALE_MS: u64 = 5000;

/// Marks the commit of `txid` not known at a replica, and waits for one in the background.
pub fn later(txid: &str) {
    book::with(|b| b.unsure(txid));
    kick();
}

/// Starts the loop that waits for a replica when commits are held for one and no loop runs
/// (an owner's `STATUS` of a held commit calls it too).
pub fn kick() {
    let now = crate::clock::monotonic_ms();
    let beat = BEAT.with(Cell::get);
    if beat != 0 && now.saturating_sub(beat) < STALE_MS {
        return;
    }
    if !book::with(|b| b.any_unsure()) {
        return;
    }
    BEAT.with(|b| b.set(now.max(1)));
    forward::spawn(acked::link(), |steps| async move {
        loop {
            steps.sleep(Duration::from_millis(1000)).await;
            BEAT.with(|b| b.set(crate::clock::monotonic_ms().max(1)));
            if crate::topology::nodes::is_replica() {
                book::with(|b| b.confirm_all());
                break;
            }
            if !book::with(|b| b.any_unsure()) {
                break;
            }
            if at_a_replica(&steps).await {
                book::with(|b| b.confirm_all());
                exec::resume();
                break;
            }
        }
        BEAT.with(|b| b.set(0));
        CallReply::Reply(Resp::Null)
    });
}

/// Whether everything this server replicated so far is at a replica of it, or none is
/// expected.
async fn at_a_replica(steps: &NetSteps) -> bool {
    let Some(me) = queue::this_node() else {
        // No ring names this node now (a shrink took it out): as a decision of such a node
        // was before, carried out.
        return true;
    };
    if !me.is_self {
        return false;
    }
    if crate::host::context::connected_replicas() == 0 {
        return !acked::replica_expected(&me.name);
    }
    let wait = Wait {
        replicas: 1,
        timeout_ms: REPLICA_WAIT_MS,
    };
    let sync = [b"SHARD.TXN".to_vec(), b"SYNC".to_vec()];
    let (synced, waited) = steps.send_waited(&me, &sync, wait);
    let _ = synced.await;
    matches!(waited.await, Ok(Resp::Int(n)) if n >= 1)
}
