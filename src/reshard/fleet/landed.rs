//! A phase's copies (and a cleanup's deletions) counted done only once they have landed where a
//! failover keeps them.
//!
//! Why (issue 33, the nemesis test): a copy job ends when its destination's primary has
//! acknowledged every key; the coordinator then settles and commits the fleet, and the
//! cleanup deletes the keys at their source. A destination behind Sentinel whose primary had
//! no replica following it then (its partner an old primary Sentinel had not turned into a
//! replica yet, or a replica that had fallen out of sync) held the moved keys alone; when
//! Sentinel promoted that partner, every moved key was gone from the fleet (`list:3` and
//! `list:7` of the nemesis test lost everything written before a grow). The failover after
//! the copy job's end is not followed by the job (`copy_job`), and the fleet steps' own wait
//! for a replica (`durable`) waits for none where `ROLE` lists none.
//!
//! So at the end of a phase whose jobs copy (`copy`, `cancel-return`), before any node moves
//! on to the next rings, every destination is sent the phase's rings again (an idempotent,
//! replicated `SHARD.RING INSTALL`, which follows the copies on the destination's replication
//! stream) and its replica must acknowledge it; a destination behind Sentinel for which
//! Sentinel lists a replica it may promote (linked to the primary or not, up or down now:
//! `topology::nodes::replicas_it_may_promote`) waits for one even when its primary has none
//! linked now, the step tried again with the coordinator's backoff. A replica that is down
//! counts: it comes back from its own AOF without the copies, and Sentinel may promote it
//! before it has synced (the nemesis test, Valkey seed 1171234040). So a grow whose
//! destination has a replica down waits in its copy phase until the replica is back (or
//! Sentinel forgets it: `SENTINEL RESET`), as a write with `SHARD.CALL WAIT` is refused while
//! the owner has no replica. A destination
//! whose primary is no longer the one the copies went to (Sentinel failed it over meanwhile)
//! gets the copies again: the phase's jobs run again (a copy skips what is there already).
//!
//! A cleanup's deletions (`cleanup`, `cancel-cleanup`) are held to the same rule, every node
//! that deletes being a destination: a replica that missed them (down while they ran, back from
//! its own AOF) and is promoted later would bring back every key the cleanup deleted, copies
//! the fleet moved away, at a node that left or at a staying node (the ten-minute Redis
//! nemesis run, seed 1228672270: `list:3` and `list:7` back at n3 after a grow cancelled
//! early, and every later grow refused, "a joining node must be empty"). The phase's rings sent
//! again after the deletions follow them on the replication stream, so a replica that
//! acknowledged them holds the deletions; a node that failed over since runs its cleanup again.

use std::collections::HashMap;

use futures_util::future::join_all;

use crate::net::endpoint::Endpoint;
use crate::net::resp::Resp;
use crate::reshard::fleet::coordinator::{current_plan, endpoint_of, with_plan, Reach};
use crate::reshard::fleet::durable;
use crate::reshard::fleet::lease;
use crate::reshard::fleet::plan::{FleetPlan, Install, Phase};
use crate::route::forward::NetSteps;

/// A run of the coordinator that begins in a phase whose jobs change destinations' keys runs
/// those jobs again (each idempotent: a copy skips what is there, a cancel's copy back meets no
/// write, returning rings refuse them, a cleanup deletes what it deleted), rather than count
/// the ones done before it: a destination may have failed over, or its primary restarted,
/// while no coordinator watched it (this one stopped after waiting too long for a replica, as
/// an operator restarted that replica, which Sentinel promoted before it had synced), and
/// `confirm` sees only a failover since the jobs it watched began.
pub fn unwatched(plan: &mut FleetPlan) {
    if destinations(plan).is_empty() {
        return;
    }
    let workers: Vec<usize> = (0..plan.nodes.len())
        .filter(|&j| plan.work(j).is_some())
        .collect();
    for j in workers {
        plan.nodes[j].done = false;
    }
}

/// Where each destination of the phase's copies is now: its name and address.
pub type Sent = HashMap<String, String>;

/// The nodes (by index) whose data the phase's jobs change: those a copy sends keys to, every
/// node of a cleanup; none for another phase.
fn destinations(plan: &FleetPlan) -> Vec<usize> {
    (0..plan.nodes.len())
        .filter(|&i| match plan.phase {
            Phase::Copy => plan.nodes[i].role.in_new(),
            Phase::CancelReturn => plan.nodes[i].role.in_old(),
            Phase::Cleanup | Phase::CancelCleanup => plan.work(i).is_some(),
            _ => false,
        })
        .collect()
}

/// The destinations' addresses now (before the jobs run): empty for a phase that copies nothing.
pub fn addresses(plan: &FleetPlan, self_name: &str) -> Sent {
    destinations(plan)
        .into_iter()
        .filter_map(|i| {
            let name = &plan.nodes[i].name;
            endpoint_of(plan, name, self_name).map(|at| (name.clone(), at.address))
        })
        .collect()
}

/// The rings a copying or deleting phase's destinations hold: sent again as the step that
/// must reach their replicas.
fn rings(plan: &FleetPlan) -> Option<Install<'_>> {
    match plan.phase {
        Phase::Copy | Phase::CancelReturn | Phase::Cleanup | Phase::CancelCleanup => {
            plan.job_rings()
        }
        _ => None,
    }
}

/// What `confirm` found.
pub enum Landed {
    /// Every destination's replica holds the copies or deletions (or the phase has none).
    Yes,
    /// A destination failed over since the copies began: the jobs run again.
    Again,
    /// A destination's replica has not acknowledged yet (why): tried again after a backoff.
    NotYet(String),
}

/// Checks once that the phase's copies landed (see the module's doc); `sent`: the
/// destinations' addresses when the jobs began.
pub async fn confirm(steps: &NetSteps, reach: &Reach, sent: &Sent) -> Result<Landed, String> {
    let plan = current_plan()?;
    let Some(install) = rings(&plan) else {
        return Ok(Landed::Yes);
    };
    let me = reach.me.name.as_str();
    let mut targets: Vec<(Endpoint, bool)> = Vec::new();
    for i in destinations(&plan) {
        let name = &plan.nodes[i].name;
        let Some(at) = endpoint_of(&plan, name, me) else {
            continue;
        };
        if sent.get(name).is_some_and(|a| *a != at.address) {
            let why = format!(
                "node {name} failed over from {} to {} after the phase's jobs changed its keys: they run again",
                sent.get(name).map_or("?", String::as_str),
                at.address
            );
            with_plan(|p| {
                p.error.clone_from(&why);
                unwatched(p);
            });
            crate::reshard::fleet::journal::note(&why);
            return Ok(Landed::Again);
        }
        let sentinel = plan
            .new
            .nodes
            .iter()
            .chain(plan.old.nodes.iter())
            .find(|n| n.name == *name)
            .is_some_and(|n| n.via_sentinel());
        targets.push((at, sentinel));
    }
    lease::fresh(steps, reach).await?;
    let args = lease::stamped(install.command());
    let replies = join_all(targets.iter().map(|(at, sentinel)| {
        // A server Sentinel may promote for the node must have the copies, linked to the
        // primary now or not, down now or not (while its replicas are not known yet, one is
        // waited for).
        durable::send_at_least(
            steps,
            at,
            &args,
            durable::least_for_data(&at.name, *sentinel),
        )
    }))
    .await;
    lease::note_refusals(
        targets
            .iter()
            .map(|(at, _)| at.name.as_str())
            .zip(replies.iter()),
    )?;
    let failed: Vec<String> = targets
        .iter()
        .zip(replies)
        .filter_map(|((at, _), reply)| match reply {
            Ok(Resp::Simple(_)) => None,
            Ok(other) => Some(format!("node {}: {other:?}", at.name)),
            Err(e) => Some(format!("node {}: {e}{}", at.name, waits_for_down(&at.name))),
        })
        .collect();
    if failed.is_empty() {
        Ok(Landed::Yes)
    } else {
        Ok(Landed::NotYet(format!(
            "the phase's copies or deletions have not reached every destination's replica: {}",
            failed.join("; ")
        )))
    }
}

/// What a destination whose only replicas Sentinel lists are down waits for, and how an
/// operator ends the wait: empty when it has a replica up.
fn waits_for_down(name: &str) -> String {
    use crate::topology::nodes::{promotable_replicas, replicas_it_may_promote};
    if promotable_replicas(name) > 0 || replicas_it_may_promote(name) == 0 {
        return String::new();
    }
    format!(
        " (Sentinel lists a replica of {name} that is down, which it may promote once it is back, before it has synced: restart it, or send SENTINEL RESET {name} to every sentinel if it is gone for good)"
    )
}
