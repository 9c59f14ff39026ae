//! Rings that went back. A node restarted from an AOF older than its last ring change (one
//! killed before the AOF rewrite that follows a full sync had finished), or a replica promoted
//! before a fleet operation's last ring reached it, comes back holding rings older than its
//! peers'; nothing would ever send it the newer ones again (the operation that installed them
//! is over), and keys would be placed by two rings at once (the nemesis test found exactly this:
//! a joining node back on the old ring after a grow had ended).
//!
//! So a node checks itself after it loads and each time it becomes a primary, at once: it asks
//! every other node of its rings for its state (`SHARD.RING STATE`; retried every `RETRY` while
//! the watcher does not yet know where Sentinel's nodes are). Until the check is over its
//! rings are unchecked and its writes refused (`route::gate`): it ends when every node
//! answered and the push asked for (below) is done, or at `bound` (twice the call timeout, at
//! most `MAX_BOUND`), with a notice. When a node follows a newer fleet term than this one
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::{join_all, select, Either};
use redis_module::Context;

use crate::net::resp::Resp;
use crate::reshard::fleet::node_state::NodeState;
use crate::reshard::fleet::reach::{fleet_nodes, link};
use crate::route::forward::{self, CallReply, NetSteps};
use crate::route::gate;
use crate::state;

/// How often the check is tried again while the nodes' addresses are not known yet.
const RETRY: Duration = Duration::from_millis(100);

/// The longest a check keeps this node's writes refused.
const MAX_BOUND: Duration = Duration::from_secs(3);

/// How long after its bound a check goes on trying (a peer's push may miss this node at
/// first: its connection to this server's previous process).
const GIVE_UP: Duration = Duration::from_secs(10);

/// How long a check waits before asking for a push again.
const PUSH_AGAIN: Duration = Duration::from_millis(500);

/// The check that logged its request for a push.
static LOGGED: AtomicU64 = AtomicU64::new(0);

/// The check that logged that Sentinel passed this server over (`passed_over`).
static PASSED_OVER: AtomicU64 = AtomicU64::new(0);

/// Each check's number: a check's end (or bound) lifts the gate only if no later check began.
static CHECK: AtomicU64 = AtomicU64::new(0);

/// The check that found a peer of a newer fleet term holding other rings: its bound does not
/// lift the gate (this node knows its rings are older than the fleet's), only their install.
static STALE: AtomicU64 = AtomicU64::new(0);

/// `SHARD.DEBUG RING-CHECK HOLD`: a check begun waits for `SHARD.DEBUG RING-CHECK GO` (the tests
/// act while the gate is closed); set at start by the environment variable
/// `SHARD_DEBUG_HOLD_RING_CHECK=yes`, as the check of a load at start begins before any command.
static HOLD: AtomicBool = AtomicBool::new(false);

/// How long a check may keep the gate closed: twice the call timeout, at most `MAX_BOUND`.
fn bound() -> Duration {
    let ms = state::lock().config.call_timeout_ms.max(1).unsigned_abs();
    Duration::from_millis(ms.saturating_mul(2)).min(MAX_BOUND)
}

/// Holds (`true`) the next checks, or lets a held one go on.
pub fn hold(on: bool) {
    HOLD.store(on, Ordering::Relaxed);
    if !on && gate::unchecked() {
        let n = CHECK.load(Ordering::Relaxed);
        crate::host::context::after(Duration::ZERO, attempt, (n, Instant::now() + bound()));
    }
}

/// Reads the start-time hold from the environment (`HOLD`).
pub fn hold_from_env() {
    if std::env::var("SHARD_DEBUG_HOLD_RING_CHECK").is_ok_and(|v| v == "yes") {
        HOLD.store(true, Ordering::Relaxed);
    }
}

/// Checks this node's rings against its peers' now (after a load, or on becoming a primary),
/// its writes refused until the check is over, if its rings name other nodes.
pub fn check_soon() {
    if crate::topology::nodes::is_replica() {
        return;
    }
    let others = {
        let st = state::lock();
        let me = st.config.ring.self_name.as_str();
        st.rings
            .current
            .as_ref()
            .is_some_and(|c| c.spec.nodes.iter().any(|n| n.name != me))
    };
    if !others {
        return;
    }
    let n = CHECK.fetch_add(1, Ordering::Relaxed) + 1;
    gate::set(true);
    let bound = bound();
    crate::host::context::after(bound, expire, n);
    attempt_now(n, Instant::now() + bound);
}

fn attempt(_ctx: &Context, (n, deadline): (u64, Instant)) {
    attempt_now(n, deadline);
}

/// The gate lifted by check `n`, if no later one began.
fn lift(n: u64) {
    if CHECK.load(Ordering::Relaxed) == n {
        gate::set(false);
    }
}

/// Whether this server is a primary that Sentinel positively names another server for: an old
/// primary restarted from its AOF (or one failed over away from) that Sentinel has not turned
/// into a replica yet. No push reaches it (pushes go to the servers Sentinel names), so its
/// rings stay as its AOF had them until it becomes a replica and syncs: it routes no write by
/// them meanwhile, whatever the bound (the nemesis test lost a write routed by such a server's
/// old ring to a key's old owner, whose copy a cleanup then deleted). A server whose Sentinel
/// answer is not known yet keeps the bound.
fn passed_over() -> bool {
    if crate::topology::nodes::is_replica() {
        return false;
    }
    let st = state::lock();
    let me = st.config.ring.self_name.as_str();
    st.rings.current.as_ref().is_some_and(|c| {
        c.spec.nodes.iter().any(|node| {
            node.name == me
                && node.via_sentinel()
                && crate::topology::nodes::address_of(me).is_some()
                && !crate::topology::nodes::names_me(me)
        })
    })
}

/// Check `n`'s bound: the gate is lifted whatever the check has found, unless Sentinel has
/// passed this server over (`passed_over`), or the check found a peer of a newer fleet term
/// holding other rings (`STALE`): then the bound is counted again.
fn expire(_ctx: &Context, n: u64) {
    if HOLD.load(Ordering::Relaxed) {
        // Held by the tests: the bound counts once the check goes on.
        crate::host::context::after(bound(), expire, n);
        return;
    }
    if CHECK.load(Ordering::Relaxed) == n && passed_over() {
        if PASSED_OVER.swap(n, Ordering::Relaxed) != n {
            redis_module::logging::log_notice(
                "shard: Sentinel names another server for this node: its writes stay refused until its rings are brought up to date, it becomes a replica, or Sentinel names it",
            );
        }
        crate::host::context::after(bound(), expire, n);
        return;
    }
    if CHECK.load(Ordering::Relaxed) == n && STALE.load(Ordering::Relaxed) == n && gate::unchecked()
    {
        // Older rings than a peer's of a newer term: kept closed until they are installed.
        crate::host::context::after(bound(), expire, n);
        return;
    }
    if CHECK.load(Ordering::Relaxed) == n && gate::unchecked() {
        redis_module::logging::log_notice(
            "shard: this node's rings could not be checked against every peer in time (after a restart or a promotion): its writes are accepted again",
        );
        gate::set(false);
    }
}

/// Check `n` tried again in a moment, unless it has gone on long enough.
fn again(n: u64, deadline: Instant) {
    if Instant::now() < deadline + GIVE_UP {
        crate::host::context::after(RETRY, attempt, (n, deadline));
    }
}

fn attempt_now(n: u64, deadline: Instant) {
    if CHECK.load(Ordering::Relaxed) != n || HOLD.load(Ordering::Relaxed) {
        return;
    }
    if crate::topology::nodes::is_replica() {
        lift(n);
        return;
    }
    let found = {
        let st = state::lock();
        let Some(current) = st.rings.current.clone() else {
            drop(st);
            lift(n);
            return;
        };
        fleet_nodes(&st, &current).ok().map(|nodes| {
            let (mine, nodes): (Vec<_>, Vec<_>) =
                nodes.into_iter().map(|n| n.0).partition(|at| at.is_self);
            (
                nodes,
                mine.into_iter().next(),
                link(&st),
                st.lease.record.term,
                current.digest.clone(),
                st.config.ring.self_name.clone(),
            )
        })
    };
    let Some((nodes, self_at, link, my_term, my_digest, me)) = found else {
        // Sentinel's nodes not located yet: again in a moment, until the bound.
        again(n, deadline);
        return;
    };
    if nodes.is_empty() {
        lift(n);
        return;
    }
    forward::spawn(link, move |steps| async move {
        let state = [b"SHARD.RING".to_vec(), b"STATE".to_vec()];
        let left = deadline.saturating_duration_since(Instant::now());
        let asked = join_all(nodes.iter().map(|at| steps.send(at, &state)));
        let replies = match select(Box::pin(asked), Box::pin(steps.sleep(left))).await {
            Either::Left((replies, _)) => replies,
            // The bound passed (`expire` lifts the gate): the answers are still used.
            Either::Right((_, asked)) => asked.await,
        };
        let newer = nodes
            .iter()
            .zip(&replies)
            .filter_map(|(at, reply)| {
                let st = NodeState::from_resp(reply.as_ref().ok()?).ok()?;
                (st.term > my_term && st.digest != my_digest).then_some((at, st))
            })
            .max_by_key(|(_, st)| st.term);
        let Some((at, newer)) = newer else {
            lift(n);
            return CallReply::Reply(Resp::Simple(b"OK".to_vec()));
        };
        let (term, digest) = (newer.term, newer.digest.clone());
        // Known older than the fleet's now: the bound no longer lifts the gate.
        STALE.store(n, Ordering::Relaxed);
        if let Some(args) = install_here(&newer, &me) {
            // The newer rings do not name this node: no push of theirs reaches it, so it
            // installs them itself (issue 33, Valkey `NEMESIS_SEED=2028666081`: a server of a
            // node a shrink removed, promoted with the rings from before the shrink, acted as
            // the owner of keys the fleet had moved away once the bound lifted its gate).
            if let Some(self_at) = &self_at {
                let reply = steps.send(self_at, &args).await;
                let installed = matches!(reply, Ok(Resp::Simple(_)));
                redis_module::logging::log_notice(format!(
                    "shard: this node's rings (fleet term {my_term}) are older than node {}'s (term {term}), which do not name it: installed here: {}",
                    at.name,
                    outcome(reply)
                ));
                // Its rings named it (`self_at`), the fleet's newer ones do not: it left the
                // ring while this server was elsewhere, and what it holds are copies the fleet
                // moved away (their owners hold them, and newer). Left there, they are keys no
                // ring names, and a later grow that brings the node back is refused until it
                // is emptied (the nemesis test, Redis `NEMESIS_SEED=1228672270`).
                if installed {
                    let left = [
                        b"SHARD.RESHARD".to_vec(),
                        b"CLEANUP".to_vec(),
                        b"LEFT".to_vec(),
                    ];
                    let reply = steps.send(self_at, &left).await;
                    redis_module::logging::log_notice(format!(
                        "shard: this node has left the ring: SHARD.RESHARD CLEANUP LEFT empties it: {}",
                        outcome(reply)
                    ));
                }
            }
        }
        // Logged once per check (a push that missed this node is asked for again).
        if LOGGED.swap(n, Ordering::Relaxed) != n {
            redis_module::logging::log_notice(format!(
                "shard: this node's rings (fleet term {my_term}) are older than node {}'s (term \
             {term}): asking it to push its rings",
                at.name
            ));
        }
        let push = [b"SHARD.RING".to_vec(), b"PUSH".to_vec()];
        let pushed = steps.send(at, &push).await.is_ok();
        let installed = {
            let st = state::lock();
            st.rings
                .current
                .as_ref()
                .is_some_and(|c| c.digest == digest)
        };
        // Not installed: the push missed this node (a peer's connection to this server's
        // previous process), or the newer rings do not name it; asked again for a while.
        if pushed && !installed && Instant::now() >= deadline + GIVE_UP {
            redis_module::logging::log_notice(format!(
                "shard: node {}'s push did not bring this node its rings (they may not name it)",
                at.name
            ));
        }
        if pushed && (installed || (Instant::now() >= deadline + GIVE_UP && !passed_over())) {
            lift(n);
            clean_up(&steps).await;
        } else {
            steps.sleep(PUSH_AGAIN).await;
            again(n, deadline);
        }
        CallReply::Reply(Resp::Simple(b"OK".to_vec()))
    });
}

/// A step's outcome, for the log.
fn outcome(reply: Result<Resp, crate::net::endpoint::StepError>) -> String {
    match reply {
        Ok(Resp::Simple(_)) => "OK".to_string(),
        Ok(Resp::Error(e)) => format!("refused: {}", String::from_utf8_lossy(&e)),
        Ok(other) => format!("{other:?}"),
        Err(e) => e.to_string(),
    }
}

/// `SHARD.RING INSTALL` of `newer`'s rings, as its `SHARD.RING STATE` gives them (pushed
/// under its term), when they do not name this node (`me`); `None` when they do (its push
/// reaches this node) or cannot be read.
fn install_here(newer: &NodeState, me: &str) -> Option<Vec<Vec<u8>>> {
    let current = crate::persist::parse_canonical(newer.ring.as_bytes()).ok()?;
    if current.node_index(me).is_some() {
        return None;
    }
    let previous = if newer.previous_ring.is_empty() {
        None
    } else {
        Some(crate::persist::parse_canonical(newer.previous_ring.as_bytes()).ok()?)
    };
    if previous
        .as_ref()
        .is_some_and(|p| p.node_index(me).is_some())
    {
        return None;
    }
    let mut args = crate::reshard::fleet::plan::Install {
        current: &current,
        previous: previous.as_ref(),
        returning: newer.returning,
        fence: newer.fence,
        settled: newer.settled,
    }
    .command();
    // As that node's push would: under its term (a ring change without a term is refused here,
    // this node following one).
    let lease_ms = state::lock().config.fleet_lease_ms.max(1).unsigned_abs();
    let record = crate::ring::lease::Record {
        term: newer.term,
        lease_ms,
        holder: crate::ring::lease::Holder {
            name: newer.term_holder.clone(),
            address: newer.term_address.clone(),
            run_id: newer.term_run_id.clone(),
        },
        released: newer.term_released,
    };
    args.extend(crate::reshard::fleet::unstepped::pushed_args(&record));
    Some(args)
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
