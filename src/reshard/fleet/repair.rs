//! Rings that went back. A node restarted from an AOF older than its last ring change (one
//! killed before the AOF rewrite that follows a full sync had finished), or a replica promoted
//! before a fleet operation's last ring reached it, comes back holding rings older than its
//! peers'; nothing would ever send it the newer ones again (the operation that installed them
//! is over), and keys would be placed by two rings at once (the nemesis test found exactly this:
//! a joining node back on the old ring after a grow had ended).
//!
//! So a node checks itself after it loads and each time it becomes a primary: a moment later
//! (`DELAY`, once the watcher knows where Sentinel's nodes are) it asks every node of its rings
//! for its state (`SHARD.RING STATE`). When a node follows a newer fleet term than this one
//! (the term every step of a fleet operation carries, `ring::lease`) and holds other rings, the
//! fleet moved on without this node: it asks that node to push its rings to every node
//! (`SHARD.RING PUSH` there), and logs it. Nodes of the same term are left alone: their rings
//! are the running operation's, which its coordinator drives.
//!
//! Then, once the pushed rings hold no resharding open, it cleans up (`SHARD.RESHARD CLEANUP`;
//! a node the rings no longer name logs that `CLEANUP LEFT` empties it): the keys it holds of
//! buckets it does not own are copies the fleet moved away while this server was elsewhere (their owner holds them, and
//! newer), and nothing routes to them; left there, a later operation moving those buckets back
//! would skip the owner's newer copy as already here, then clean it up at its owner: the writes
//! made since were lost (the nemesis test found it, `NEMESIS_SEED=32`: a replica restarted from
//! an older AOF and promoted before it synced, then a shrink). With a resharding open, the
//! operation's own `cleanup` phase does it.

use std::time::Duration;

use futures_util::future::join_all;
use redis_module::Context;

use crate::net::resp::Resp;
use crate::reshard::fleet::node_state::NodeState;
use crate::reshard::fleet::reach::{fleet_nodes, link};
use crate::route::forward::{self, CallReply, NetSteps};
use crate::state;

/// How long after a load or a promotion the check runs.
const DELAY: Duration = Duration::from_secs(2);

/// Checks this node's rings against its peers' in a moment (after a load, or on becoming a
/// primary).
pub fn check_soon() {
    crate::host::context::after(DELAY, check, ());
}

fn check(_ctx: &Context, (): ()) {
    if crate::topology::nodes::is_replica() {
        return;
    }
    let (nodes, link, my_term, my_digest) = {
        let st = state::lock();
        let Some(current) = st.rings.current.clone() else {
            return;
        };
        let Ok(nodes) = fleet_nodes(&st, &current) else {
            return;
        };
        let nodes: Vec<_> = nodes
            .into_iter()
            .map(|n| n.0)
            .filter(|at| !at.is_self)
            .collect();
        (
            nodes,
            link(&st),
            st.lease.record.term,
            current.digest.clone(),
        )
    };
    if nodes.is_empty() {
        return;
    }
    forward::spawn(link, move |steps| async move {
        let state = [b"SHARD.RING".to_vec(), b"STATE".to_vec()];
        let replies = join_all(nodes.iter().map(|at| steps.send(at, &state))).await;
        let newer = nodes
            .iter()
            .zip(&replies)
            .filter_map(|(at, reply)| {
                let st = NodeState::from_resp(reply.as_ref().ok()?).ok()?;
                (st.term > my_term && st.digest != my_digest).then_some((at, st.term))
            })
            .max_by_key(|(_, term)| *term);
        if let Some((at, term)) = newer {
            redis_module::logging::log_notice(format!(
                "shard: this node's rings (fleet term {my_term}) are older than node {}'s (term \
                 {term}): asking it to push its rings",
                at.name
            ));
            let push = [b"SHARD.RING".to_vec(), b"PUSH".to_vec()];
            if steps.send(at, &push).await.is_ok() {
                clean_up(&steps).await;
            }
        }
        CallReply::Reply(Resp::Simple(b"OK".to_vec()))
    });
}

/// After a repair: this node's keys of buckets it does not own are removed (see the module's
/// doc), unless a resharding is open on the rings it was given.
async fn clean_up(steps: &NetSteps) {
    let me = {
        let st = state::lock();
        let Some(current) = st.rings.current.clone() else {
            return;
        };
        if st.rings.previous.is_some() {
            return;
        }
        let me = fleet_nodes(&st, &current)
            .ok()
            .and_then(|nodes| nodes.into_iter().map(|n| n.0).find(|at| at.is_self));
        let Some(me) = me else {
            // Not named by the rings (or not the primary Sentinel names for its node).
            if current.spec.node_index(&st.config.ring.self_name).is_none() {
                redis_module::logging::log_notice(
                    "shard: this node's rings were brought up to date and name it no more: SHARD.RESHARD CLEANUP LEFT empties it",
                );
            }
            return;
        };
        me
    };
    let cleanup = [b"SHARD.RESHARD".to_vec(), b"CLEANUP".to_vec()];
    let reply = steps.send(&me, &cleanup).await;
    redis_module::logging::log_notice(format!(
        "shard: the keys of buckets this node no longer owns, after its rings were brought up to \
         date: SHARD.RESHARD CLEANUP {}",
        match reply {
            Ok(Resp::Simple(_)) => "started".to_string(),
            Ok(Resp::Error(e)) => format!("refused: {}", String::from_utf8_lossy(&e)),
            Ok(other) => format!("refused: {other:?}"),
            Err(e) => format!("failed: {e}"),
        }
    ));
}
