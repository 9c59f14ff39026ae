//! The fleet coordinator: drives the plan of `SHARD.RESHARD START` (`plan::FleetPlan`, held in
//! `reshard::current`) phase by phase over the module's own connections (`net::pool` through
//! `route::forward`'s steps, the layer SHARD.CALL uses: authentication with `auth-user`/`auth-password`, timeouts that name
//! the node), as a background task on the main thread's event loop: every wait (a reply, the
//! pause between two looks at the nodes' jobs) is a future woken by the loop, so the server
//! never blocks while the fleet works.
//!
//! Each phase change, and each node that finishes its step, is made durable before the
//! coordinator goes on: it sends `SHARD.RESHARD PLAN <plan>` to itself, a command that (like
//! the ring changes) reaches the AOF and the replicas and whose plan the RDB keeps. After a
//! restart or a failover the plan is there with `running: no`, and RESUME goes on from its
//! phase: every step is idempotent (rings installed whole, copies that skip what is there,
//! cleanups that delete only what another node owns), so a step repeated is harmless.
//!
//! One coordinator at a time (`lease`): before it drives, the coordinator takes a new term
//! (`acquire`), refused while another coordinator's lease runs; every step it sends carries the
//! term, and a node that follows a newer term refuses it: the coordinator then stops.

use std::cell::Cell;
use std::time::Duration;

use futures_util::future::join_all;

use crate::net::endpoint::Endpoint;
use crate::net::pool::Link;
use crate::net::resp::Resp;
use crate::reshard::fleet::checks::not_holding;
use crate::reshard::fleet::landed::{self, Landed};
use crate::reshard::fleet::lease::{self, Term};
use crate::reshard::fleet::node_state::NodeState;
use crate::reshard::fleet::plan::{FleetPlan, Phase, MAX_ATTEMPTS};
use crate::reshard::fleet::{durable, jobs_phase, journal};
use crate::route::forward::{self, CallReply, NetSteps};

/// How often the coordinator looks at the nodes' jobs.
pub(super) const POLL: Duration = Duration::from_millis(100);
/// The coordinator's requests are small and answered at once; a node slower than this is
/// counted as not answering.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

thread_local! {
    static RUNNING: Cell<bool> = const { Cell::new(false) };
    /// A test's hold (`SHARD.DEBUG FLEET-HOLD phase n`): in `phase`, the rings go to the plan's
    /// first `n` nodes only, then the coordinator waits until the hold is lifted; in a phase that
    /// installs no rings (`copy`, `cancel-stop`), it waits once the phase's jobs are done.
    static HOLD: Cell<Option<(Phase, usize)>> = const { Cell::new(None) };
}

/// Holds the coordinator in `phase` after it has installed the rings on the plan's first `n`
/// nodes (`None`: lifts the hold); `n` at least the plan's nodes: after the rings are on every
/// node, before the phase's jobs; in a phase that installs no rings (`copy`, `cancel-stop`),
/// once its jobs are done. For tests, which drive the step between two nodes of a phase
/// (`SHARD.DEBUG FLEET-HOLD`); kept in memory only, so a restart lifts it.
pub fn set_hold(hold: Option<(Phase, usize)>) {
    HOLD.with(|h| h.set(hold));
}

/// Whether a hold of `phase` on every one of the plan's `nodes` keeps the coordinator after the
/// phase's rings are installed, before its jobs (a hold of `n` at least the plan's nodes: the
/// tests act between a phase's install and its jobs).
fn held_before_jobs(phase: Phase, nodes: usize) -> bool {
    HOLD.with(Cell::get)
        .is_some_and(|(held, n)| held == phase && n >= nodes)
}

/// Whether node `i` may get the rings of `phase` now.
fn not_held(phase: Phase, i: usize) -> bool {
    HOLD.with(Cell::get)
        .is_none_or(|(held, n)| held != phase || i < n)
}

/// Whether this node is driving its plan now.
pub fn running() -> bool {
    RUNNING.with(Cell::get)
}

/// Clears the running flag however the task ends (a caught panic drops the future too).
struct RunningGuard;

impl Drop for RunningGuard {
    fn drop(&mut self) {
        RUNNING.with(|r| r.set(false));
    }
}

/// How the coordinator reaches the nodes, itself included.
#[derive(Clone)]
pub struct Reach {
    pub link: Link,
    /// This node, as the rings name it: where the plan is made durable.
    pub me: Endpoint,
    /// How long a routed call may still arrive after the rings change (the call timeout).
    pub quiet: Duration,
    /// How long the nodes count this coordinator alive after hearing from it.
    pub lease: Duration,
    /// This server's run id (the lease's holder is this run).
    pub run_id: String,
}

/// Marks this node as driving its plan (taking its term first); false if it is already.
pub fn begin_driving() -> bool {
    !RUNNING.with(|r| r.replace(true))
}

/// The plan could not be driven after `begin_driving` (its term was refused): `why` shown.
pub fn not_driven(why: &str) {
    RUNNING.with(|r| r.set(false));
    with_plan(|p| p.error = why.to_string());
}

/// Drives the state's plan in the background under `term` (taken by `acquire`, or by START),
/// after `begin_driving`: the term claimed at every node and renewed while it drives; released
/// when it stops, unless it was lost.
pub fn drive(reach: Reach, term: Term) {
    let link = reach.link.clone();
    forward::spawn(link, move |steps| async move {
        let _guard = RunningGuard;
        lease::hold(&term);
        let nodes = current_plan()
            .map(|p| endpoints(&p, &reach.me.name))
            .unwrap_or_default();
        let mut result = lease::claim(&steps, &nodes, &term).await;
        if result.is_ok() {
            let names = nodes.iter().map(|n| n.name.clone()).collect();
            lease::renew_in_background(&reach, &term, names);
            result = run(&steps, &reach).await;
        }
        lease::end(&steps, &nodes).await;
        let plan = current_plan()
            .map(|p| journal::plan_text(&p))
            .unwrap_or_default();
        match result {
            Ok(()) => journal::note(&format!("the coordinator stopped: {plan}")),
            Err(e) => {
                journal::note(&format!("the coordinator stopped: {plan}: {e}"));
                with_plan(|p| p.error = e);
            }
        }
        CallReply::Reply(Resp::Null)
    });
}

/// Reads or changes the state's plan.
pub fn with_plan<T>(f: impl FnOnce(&mut FleetPlan) -> T) -> Option<T> {
    crate::reshard::current::lock().fleet.as_mut().map(f)
}

pub fn current_plan() -> Result<FleetPlan, String> {
    crate::reshard::current::lock()
        .fleet
        .clone()
        .ok_or_else(|| "the fleet plan is gone".to_string())
}

/// The endpoint of a node of either ring.
pub fn endpoint_of(plan: &FleetPlan, name: &str, self_name: &str) -> Option<Endpoint> {
    let node = plan
        .new
        .nodes
        .iter()
        .chain(plan.old.nodes.iter())
        .find(|n| n.name == name)?;
    Some(crate::topology::nodes::endpoint_of(node, self_name))
}

/// The endpoints of every node of the plan, in the plan's order.
pub fn endpoints(plan: &FleetPlan, self_name: &str) -> Vec<Endpoint> {
    plan.nodes
        .iter()
        .filter_map(|n| endpoint_of(plan, &n.name, self_name))
        .collect()
}

async fn run(steps: &NetSteps, reach: &Reach) -> Result<(), String> {
    // A RESUME gives every unfinished node its tries again.
    with_plan(|p| {
        for n in p.nodes.iter_mut().filter(|n| !n.done) {
            n.attempts = 0;
        }
        // Copies or deletions not confirmed landed by this run run again (`landed::unwatched`).
        landed::unwatched(p);
    });
    loop {
        lease::fresh(steps, reach).await?;
        let plan = current_plan()?;
        if plan.cancel && plan.phase.cancellable() {
            enter(steps, reach, Phase::CancelStop).await?;
            continue;
        }
        if plan.phase.finished() {
            return Ok(());
        }
        if plan.install().is_some() {
            install_everywhere(steps, reach, Rings::Phase).await?;
            with_plan(FleetPlan::reset_steps);
            if plan.phase.waits_for_calls() {
                wait_for_calls(steps, reach).await?;
            }
        }
        while held_before_jobs(plan.phase, plan.nodes.len()) {
            lease::fresh(steps, reach).await?;
            steps.sleep(POLL).await;
        }
        let sent = landed::addresses(&current_plan()?, &reach.me.name);
        if !jobs_phase::run_jobs(steps, reach).await? {
            continue; // cancelled: the loop turns to the cancel's phases
        }
        if !copies_landed(steps, reach, &sent).await? {
            persist(steps, reach).await?;
            continue; // a destination failed over: the copies run again
        }
        held_after_jobs(steps, reach, &plan).await?;
        if plan.final_install().is_some() {
            with_plan(FleetPlan::reset_steps);
            install_everywhere(steps, reach, Rings::Final).await?;
        }
        enter(steps, reach, plan.phase.next()).await?;
    }
}

/// A test's hold of a phase that installs no rings (`copy`, `cancel-stop`: `set_hold`, whatever
/// its `n`): the coordinator waits, its jobs done and the plan made durable, until the hold is
/// lifted (or its lease is lost or handed over).
async fn held_after_jobs(steps: &NetSteps, reach: &Reach, plan: &FleetPlan) -> Result<(), String> {
    let no_rings = plan.install().is_none() && plan.final_install().is_none();
    while no_rings
        && HOLD
            .with(Cell::get)
            .is_some_and(|(held, _)| held == plan.phase)
    {
        lease::fresh(steps, reach).await?;
        steps.sleep(POLL).await;
    }
    Ok(())
}

/// Waits until the phase's copies have reached each destination's replica (`landed`);
/// `false` when a destination failed over since and the copies must run again.
async fn copies_landed(
    steps: &NetSteps,
    reach: &Reach,
    sent: &landed::Sent,
) -> Result<bool, String> {
    let mut round = 0;
    loop {
        match landed::confirm(steps, reach, sent).await? {
            Landed::Yes => return Ok(true),
            Landed::Again => return Ok(false),
            Landed::NotYet(why) => {
                let plan = current_plan()?;
                if plan.cancel && plan.phase.cancellable() {
                    // A CANCEL asked for meanwhile applies now (the loop enters it).
                    return Ok(false);
                }
                round += 1;
                give_up_or_wait(steps, round, plan.phase, &[why]).await?;
            }
        }
    }
}

/// Waits until no node has a routed call in flight that its earlier rings routed: after the
/// fence, a write routed to an old owner by the old ring alone would land after a new owner
/// copied the key, and be lost; after a cancel's return, one routed to a new owner would land
/// after its key was copied back. A node that does not answer sends nothing. Bounded: after
/// four times the call timeout (the longest a call's steps can take) it goes on.
async fn wait_for_calls(steps: &NetSteps, reach: &Reach) -> Result<(), String> {
    let plan = current_plan()?;
    let nodes = endpoints(&plan, &reach.me.name);
    let look = POLL / 5;
    let cap = (reach.quiet * 4).as_millis() / look.as_millis();
    for _ in 0..=cap {
        lease::fresh(steps, reach).await?;
        let answers = ask_states(steps, &nodes).await;
        if answers.iter().flatten().all(|st| st.calls_before == 0) {
            return Ok(());
        }
        steps.sleep(look).await;
    }
    Ok(())
}

/// Moves the plan to `phase` and makes it durable (not once the lease is lost).
async fn enter(steps: &NetSteps, reach: &Reach, phase: Phase) -> Result<(), String> {
    lease::fresh(steps, reach).await?;
    if let Some(text) = with_plan(|p| {
        p.enter(phase);
        journal::plan_text(p)
    }) {
        journal::note(&format!("entered {text}"));
    }
    persist(steps, reach).await
}

/// Sends the plan to this node itself as `SHARD.RESHARD PLAN`, which replicates it (refused,
/// and the lease lost, once this node follows a newer term than the plan's), and waits for
/// this node's replica to acknowledge it (`durable`, as a step at any node): a plan only the
/// primary held would be lost with it if Sentinel promoted the replica, which would then hold
/// an older phase than the nodes were driven to. A replica that does not acknowledge it is
/// waited for again (`PERSIST_TRIES` times in all) before the coordinator stops.
pub async fn persist(steps: &NetSteps, reach: &Reach) -> Result<(), String> {
    let mut tries = 0;
    loop {
        tries += 1;
        lease::fresh(steps, reach).await?;
        let bytes = current_plan()?.encode();
        let args = vec![b"SHARD.RESHARD".to_vec(), b"PLAN".to_vec(), bytes];
        let reply = durable::send(steps, &reach.me, &args).await;
        lease::note_refusals([(reach.me.name.as_str(), &reply)])?;
        match reply {
            Ok(Resp::Simple(_)) => return Ok(()),
            Ok(other) => return Err(format!("cannot save the plan here: {}", reply_text(&other))),
            Err(e) if tries < PERSIST_TRIES => {
                journal::note(&format!("the plan is not yet durable here, again: {e}"));
            }
            Err(e) => return Err(format!("cannot save the plan here: {e}")),
        }
    }
}

/// How many times the plan is sent (each waiting up to `durable::REPLICA_WAIT_MS` for the
/// replica) before the coordinator gives up and stops (RESUME drives it again).
const PERSIST_TRIES: u32 = 5;

/// Which rings `install_everywhere` installs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rings {
    /// The current phase's (`FleetPlan::install`).
    Phase,
    /// The rings the operation ends on, once the last phase's jobs are done
    /// (`FleetPlan::final_install`).
    Final,
}

/// Installs the rings on every node, retrying those that fail: a node's install counts once
/// its replica acknowledged it (`durable`). Then every node's rings are looked at
/// (`SHARD.RING STATE`): a node that does not hold them (its primary failed over to a replica
/// that never got them, or it does not answer) is installed again, so the coordinator moves on
/// only once every node holds the rings.
async fn install_everywhere(steps: &NetSteps, reach: &Reach, rings: Rings) -> Result<(), String> {
    let mut round = 0;
    loop {
        let plan = current_plan()?;
        let install = match rings {
            Rings::Phase => plan.install(),
            Rings::Final => plan.final_install(),
        };
        let Some(install) = install else {
            return Ok(());
        };
        lease::fresh(steps, reach).await?;
        let args = lease::stamped(install.command());
        let pending: Vec<Endpoint> = plan
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| !n.done && not_held(plan.phase, *i))
            .filter_map(|(_, n)| endpoint_of(&plan, &n.name, &reach.me.name))
            .collect();
        if pending.is_empty() {
            if plan.nodes.iter().all(|n| n.done) {
                let nodes = endpoints(&plan, &reach.me.name);
                let missing = not_holding(&nodes, ask_states(steps, &nodes).await, &install);
                if missing.is_empty() {
                    return Ok(());
                }
                round += 1;
                with_plan(|p| {
                    for (name, why) in &missing {
                        if let Some(i) = p.node(name) {
                            p.nodes[i].done = false;
                            p.nodes[i].last_error.clone_from(why);
                        }
                    }
                });
                let failed: Vec<String> = missing
                    .iter()
                    .map(|(name, why)| format!("node {name}: {why}"))
                    .collect();
                give_up_or_wait(steps, round, plan.phase, &failed).await?;
                continue;
            }
            // Held by a test (`set_hold`): wait, using no try, until the hold is lifted.
            steps.sleep(POLL).await;
            continue;
        }
        round += 1;
        let replies = join_all(pending.iter().map(|at| durable::send(steps, at, &args))).await;
        lease::note_refusals(
            pending
                .iter()
                .map(|at| at.name.as_str())
                .zip(replies.iter()),
        )?;
        let mut failed = Vec::new();
        with_plan(|p| {
            for (at, reply) in pending.iter().zip(replies) {
                let Some(i) = p.node(&at.name) else { continue };
                let node = &mut p.nodes[i];
                node.attempts += 1;
                match reply {
                    Ok(Resp::Simple(_)) => {
                        node.done = true;
                        node.last_error.clear();
                    }
                    Ok(other) => node.last_error = reply_text(&other),
                    Err(e) => node.last_error = e.to_string(),
                }
                if !node.done {
                    failed.push(format!("node {}: {}", node.name, node.last_error));
                }
            }
        });
        if failed.is_empty() {
            continue; // every node has them now, or the rest are held
        }
        give_up_or_wait(steps, round, plan.phase, &failed).await?;
    }
}

/// Round `round` of an install left `failed`: the coordinator waits its backoff, or gives up
/// once it has had its tries.
async fn give_up_or_wait(
    steps: &NetSteps,
    round: u32,
    phase: Phase,
    failed: &[String],
) -> Result<(), String> {
    with_plan(|p| p.error = failed.join("; "));
    if round < MAX_ATTEMPTS {
        steps.sleep(backoff(round)).await;
        return Ok(());
    }
    Err(format!(
        "phase {phase}: gave up after {MAX_ATTEMPTS} tries: {}; SHARD.RESHARD RESUME to try again",
        failed.join("; ")
    ))
}

/// The wait before try `n + 1`: 0.5 s, 1 s, 2 s, ... up to 8 s.
pub(super) fn backoff(n: u32) -> Duration {
    Duration::from_millis(500u64 << n.saturating_sub(1).min(4))
}

pub(super) fn reply_text(reply: &Resp) -> String {
    match reply {
        Resp::Error(e) | Resp::Simple(e) | Resp::Bulk(e) => String::from_utf8_lossy(e).into_owned(),
        other => format!("{other:?}"),
    }
}

/// Asks every node of the plan for its state (START's check, `SHARD.RING CHECK`).
pub async fn ask_states(steps: &NetSteps, nodes: &[Endpoint]) -> Vec<Result<NodeState, String>> {
    let args = vec![b"SHARD.RING".to_vec(), b"STATE".to_vec()];
    join_all(nodes.iter().map(|at| steps.send(at, &args)))
        .await
        .into_iter()
        .map(|r| {
            r.map_err(|e| e.message)
                .and_then(|reply| NodeState::from_resp(&reply))
        })
        .collect()
}
