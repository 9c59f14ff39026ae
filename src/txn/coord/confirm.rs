//! A commit decision recorded at this node that no replica of it acknowledged within
//! `fleet::REPLICA_WAIT_MS` (the phases' `Decided::Unsure`): the book holds it `unsure`
//! (`book::Book::unsure`), answered `pending` to an owner in doubt and not carried out, for a
//! failover now would promote a replica without it, which answers the owners still prepared
//! abort while others applied their parts (applied in part). `later` asks for a replica once a
//! second (`SHARD.TXN SYNC`, then `WAIT 1`, to this server on a connection of its own, as the
//! decision's own wait) until one has everything replicated so far: then every commit recorded
//! here is known there, the book's `unsure` is cleared and the commits carried out
//! (`exec::resume`). A server with no replica linked and none expected
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
    /// Whether `later`'s loop runs (one at a time).
    static RUNNING: Cell<bool> = const { Cell::new(false) };
}

/// Marks the commit of `txid` not known at a replica, and waits for one in the background.
pub fn later(txid: &str) {
    book::with(|b| b.unsure(txid));
    if RUNNING.with(|r| r.replace(true)) {
        return;
    }
    forward::spawn(acked::link(), |steps| async move {
        loop {
            steps.sleep(Duration::from_millis(1000)).await;
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
        RUNNING.with(|r| r.set(false));
        CallReply::Reply(Resp::Null)
    });
}

/// Whether everything this server replicated so far is at a replica of it, or none is
/// expected.
async fn at_a_replica(steps: &NetSteps) -> bool {
    let Some(me) = queue::this_node() else {
        return false;
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
