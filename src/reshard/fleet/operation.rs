//! A fleet operation as the commands ask for it: `SHARD.RESHARD START` (the target ring checked,
//! this node's state checked, the fleet asked whether it may begin and its first term taken,
//! then the plan stored, made durable and driven), `RESUME` (the plan's next term taken, then
//! driven: `resume`), `CANCEL` (the plan marked, to be replicated before it is driven back),
//! `HANDOVER` (the coordinator stops and releases its lease), and `PLAN` (a plan made durable
//! by its coordinator, or handed to another node, stored here; or read).

use std::sync::Arc;

use redis_module::Context;

use crate::host::args::printable;
use crate::host::command::Call;
use crate::host::error::CmdError;
use crate::net::endpoint::Endpoint;
use crate::net::resp::Resp;
use crate::reshard::fleet::adopt::adopted;
use crate::reshard::fleet::checks::{check_resume, check_start, resume_phase};
use crate::reshard::fleet::coordinator::{self, Reach};
use crate::reshard::fleet::lease::Term;
use crate::reshard::fleet::plan::FleetPlan;
use crate::reshard::fleet::reach::{fleet_nodes, reach};
use crate::reshard::fleet::{fencing, journal, lease};
use crate::ring::placement::Placement;
use crate::ring::{Algo, RingSpec};
use crate::route::forward::{CallReply, NetSteps};
use crate::state::{self, ModuleState};

/// START's check of the ring to go to: one shard reshards itself, and one that builds.
pub fn check_target(new: &RingSpec) -> Result<(), CmdError> {
    if new.algo == Algo::Cluster {
        return Err(CmdError::err(
            "the cluster algo is resharded by Redis Cluster itself (redis-cli --cluster reshard), not by shard",
        ));
    }
    Placement::build(new.clone()).map_err(CmdError::err)?;
    Ok(())
}

/// What a START comes to, from this node's state.
pub enum Start {
    /// The unfinished plan is to this very ring: it is driven on.
    Resume(Reach),
    /// A new plan, to check with the fleet before it starts (`begin`).
    New(FleetPlan, Reach),
}

/// START's checks against this node's state (`current`: the current ring, or the error when
/// there is none): an unfinished plan to another ring, an open resharding, the fleet on this
/// ring already, a `self` that names no node of the plan, a plan being driven here already.
/// Holds the resharding's lock (`reshard::current`) only while it looks: a `Resume` is driven
/// by the caller after.
pub fn prepare_start(
    st: &ModuleState,
    current: Result<&Arc<Placement>, CmdError>,
    new: RingSpec,
    max_rate: u64,
) -> Result<Start, CmdError> {
    let held = crate::reshard::current::lock();
    if let Some(plan) = held.fleet.as_ref().filter(|p| !p.phase.finished()) {
        if plan.new.digest() != new.digest() {
            return Err(CmdError::err(format!(
                "a fleet operation to ring {} is in phase {}: SHARD.RESHARD RESUME it, or CANCEL it first",
                plan.new.digest(),
                plan.phase
            )));
        }
        // The same ring again: resume.
        return Ok(Start::Resume(reach(st, plan)?));
    }
    let current = current?;
    if st.rings.previous.is_some() {
        return Err(CmdError::err(
            "a resharding is open on this node (SHARD.RING BEGIN): COMMIT or ABORT it first",
        ));
    }
    if current.spec.digest() == new.digest() {
        return Err(CmdError::err("the fleet is on this ring already"));
    }
    let plan = FleetPlan::new(current.spec.clone(), new, max_rate);
    let reach = reach(st, &plan)?;
    if coordinator::running() {
        return Err(CmdError::err(
            "this node is driving a fleet operation already",
        ));
    }
    Ok(Start::New(plan, reach))
}

/// A new plan's start, in the background of the START call: every node of the plan is asked
/// for its state and must fit (`check_start`), and no other coordinator's lease may run there
/// (`lease::take`: the plan's first term); then the plan is stored here, made durable and
/// driven. The reply: `OK`, or why START was refused.
pub async fn begin(steps: NetSteps, mut plan: FleetPlan, reach: Reach) -> CallReply {
    let endpoints = coordinator::endpoints(&plan, &reach.me.name);
    let answers = coordinator::ask_states(&steps, &endpoints).await;
    let mut problems = check_start(&plan, &answers);
    let term = lease::take(0, &endpoints, &answers, &reach);
    if let Err(e) = &term {
        problems.push(e.clone());
    }
    let (Ok(term), true) = (term, problems.is_empty()) else {
        return CallReply::Error(format!(
            "ERR shard.reshard start refused: {}",
            problems.join("; ")
        ));
    };
    plan.term = term.claim.term;
    {
        let mut current = crate::reshard::current::lock();
        if current.fleet.as_ref().is_some_and(|p| !p.phase.finished())
            || !coordinator::begin_driving()
        {
            return CallReply::Error(
                "ERR shard.reshard start: another fleet operation started meanwhile".into(),
            );
        }
        journal::note(&format!("START accepted: {}", journal::plan_text(&plan)));
        current.fleet = Some(plan);
    }
    if let Err(e) = coordinator::persist(&steps, &reach).await {
        crate::reshard::current::lock().fleet = None;
        coordinator::not_driven(&e);
        return CallReply::Error(format!("ERR shard.reshard start: {e}"));
    }
    coordinator::drive(reach, term);
    CallReply::Reply(Resp::Simple(b"OK".to_vec()))
}

/// RESUME, START again to the same ring, CANCEL of a plan not being driven: in the background
/// of the call, the nodes asked and the plan's next term taken (`coordinator::acquire`:
/// refused while another coordinator's lease runs, naming it and how long it still runs), then
/// the plan driven. The reply: `OK` once it is driven (at once when it is already), or why not.
pub fn resume(call: &Call, reach: Reach) -> Result<(), CmdError> {
    resume_as(call, reach, false)
}

/// CANCEL of a plan not being driven: driven back as RESUME drives it (`resume`), but refused,
/// and not driven, when the plan turns out to be past its copies (`acquire`).
pub fn resume_cancel(call: &Call, reach: Reach) -> Result<(), CmdError> {
    resume_as(call, reach, true)
}

fn resume_as(call: &Call, reach: Reach, cancelling: bool) -> Result<(), CmdError> {
    if !coordinator::begin_driving() {
        call.reply.ok();
        return Ok(());
    }
    let link = reach.link.clone();
    let started = crate::route::forward::run(call, link, move |steps| async move {
        acquire_and_drive(&steps, reach, cancelling).await
    });
    started.map_err(|e| {
        coordinator::not_driven(&e);
        CmdError::err(e)
    })
}

/// RESUME where no plan is unfinished (none here, or one that ended): the plan whose rings the
/// fleet holds (`adopt`), of a newer term than this node's plan, is adopted and driven as RESUME
/// drives; refused when no node of this node's rings holds an unfinished operation's rings.
pub fn adopt(call: &Call) -> Result<(), CmdError> {
    let (reach, nodes, above) = {
        let st = state::lock();
        let current = st.current_ring()?.clone();
        let nodes: Vec<Endpoint> = fleet_nodes(&st, &current)?
            .into_iter()
            .map(|n| n.0)
            .collect();
        let rings = FleetPlan::new(
            st.rings
                .previous
                .as_ref()
                .map_or_else(|| current.spec.clone(), |p| p.spec.clone()),
            current.spec.clone(),
            0,
        );
        let above = crate::reshard::current::lock()
            .fleet
            .as_ref()
            .map_or(0, |p| p.term);
        (reach(&st, &rings)?, nodes, above)
    };
    if !coordinator::begin_driving() {
        call.reply.ok();
        return Ok(());
    }
    let link = reach.link.clone();
    let started = crate::route::forward::run(call, link, move |steps| async move {
        let answers = coordinator::ask_states(&steps, &nodes).await;
        let plan = match adopted(&answers, above, false) {
            Ok(Some(plan)) => plan,
            Ok(None) => {
                coordinator::not_driven("");
                return CallReply::Error(
                    "ERR nothing to resume: no resharding job is running here, no fleet operation is unfinished here, and no node of this node's rings holds the rings of an unfinished one"
                        .into(),
                );
            }
            Err(e) => {
                coordinator::not_driven("");
                return CallReply::Error(format!("ERR nothing to resume here: {e}"));
            }
        };
        if coordinator::endpoint_of(&plan, &reach.me.name, &reach.me.name).is_none() {
            coordinator::not_driven("");
            return CallReply::Error(format!(
                "ERR the fleet holds the rings of an unfinished operation to ring {} that does not name this node: RESUME it on a node of its rings",
                plan.new.digest()
            ));
        }
        journal::note(&format!(
            "RESUME adopts the operation whose rings the fleet holds: {}",
            journal::plan_text(&plan)
        ));
        crate::reshard::current::lock().fleet = Some(plan);
        acquire_and_drive(&steps, reach, false).await
    });
    started.map_err(|e| {
        coordinator::not_driven(&e);
        CmdError::err(e)
    })
}

/// The term to drive the unfinished plan under (RESUME, START again, CANCEL of a plan not
/// driven): every node asked; refused while another coordinator's lease runs. A plan recorded
/// behind the fleet (in a phase before `commit` while a node holds its new ring alone under its
/// term or a newer one: `checks::resume_phase`) goes on from `commit`. When a node holds
/// rings that do not fit the plan's phase (`check_resume`: the plan is older than the fleet,
/// restored from an older copy), the plan whose rings the fleet holds is adopted instead
/// (`adopt`), when it is of this plan's term or a newer one; else RESUME is refused, naming the
/// nodes. The new term is made durable in the plan before any step carries it. A CANCEL
/// (`cancelling`) of a plan past its copies is refused, the plan left as it is, as CANCEL is
/// refused from `settle` on: RESUME finishes it.
async fn acquire(steps: &NetSteps, reach: &Reach, cancelling: bool) -> Result<Term, String> {
    let mut plan = coordinator::current_plan()?;
    let mut nodes = coordinator::endpoints(&plan, &reach.me.name);
    let mut answers = lease::ask(steps, &nodes, reach).await?;
    let recorded = plan.phase;
    plan.phase = resume_phase(&plan, &answers);
    let problems = check_resume(&plan, &answers);
    let mut adopted_plan = false;
    if !problems.is_empty() {
        let refused = |more: String| {
            format!(
                "ERR refused to drive the plan: {}{more}",
                problems.join("; ")
            )
        };
        plan = match adopted(&answers, plan.term, true) {
            Ok(Some(found)) => found,
            Ok(None) => return Err(refused(String::new())),
            Err(e) => return Err(refused(format!("; {e}"))),
        };
        journal::note(&format!(
            "RESUME adopts the operation whose rings the fleet holds: {}",
            journal::plan_text(&plan)
        ));
        adopted_plan = true;
        nodes = coordinator::endpoints(&plan, &reach.me.name);
        answers = lease::ask(steps, &nodes, reach).await?;
        plan.phase = resume_phase(&plan, &answers);
    }
    let past = !adopted_plan && recorded.cancellable() && !plan.phase.cancellable();
    if past && cancelling {
        return Err(format!(
            "ERR the resharding can no longer be cancelled: the plan here is in phase {recorded}, but a node holds its new ring alone (the fleet committed to it); SHARD.RESHARD RESUME finishes it, or START the reverse resharding once it is done"
        ));
    }
    if past {
        // Recorded behind the fleet, which committed (`checks::resume_phase`): past the
        // copies, where a cancel no longer applies.
        journal::note(&format!(
            "RESUME: the plan here is in phase {recorded}, but a node holds its new ring alone: the fleet committed, the plan goes on from {}{}",
            plan.phase,
            if plan.cancel { " (the cancel asked for no longer applies)" } else { "" }
        ));
    }
    let term = lease::take(plan.term, &nodes, &answers, reach)?;
    journal::note(&format!(
        "RESUME: {} now under term {}",
        journal::plan_text(&plan),
        term.claim.term
    ));
    let phase = plan.phase;
    if adopted_plan {
        plan.enter(phase);
        plan.term = term.claim.term;
        crate::reshard::current::lock().fleet = Some(plan);
    } else {
        coordinator::with_plan(|p| {
            if p.phase != phase {
                p.enter(phase);
            }
            if past {
                p.cancel = false;
            }
            p.term = term.claim.term;
            p.error.clear();
        });
    }
    coordinator::persist(steps, reach).await?;
    Ok(term)
}

fn coded(e: String) -> String {
    let coded = ["LEASEHELD ", "STALETERM ", "ERR "]
        .iter()
        .any(|c| e.starts_with(c));
    if coded {
        e
    } else {
        format!("ERR {e}")
    }
}

/// HANDOVER: the coordinator stops at its next step and releases its lease at every node, so a
/// RESUME on a node that holds the plan goes on at once.
pub fn handover() -> Result<(), CmdError> {
    if lease::request_handover() {
        return Ok(());
    }
    Err(CmdError::err(
        "this node is not driving a fleet operation: nothing to hand over",
    ))
}

/// PLAN without bytes: this node's plan's bytes (`None`: it holds none), to hand the plan to
/// another node of the fleet (`PLAN bytes` there, then RESUME).
pub fn read_plan() -> Option<Vec<u8>> {
    crate::reshard::current::lock()
        .fleet
        .as_ref()
        .map(FleetPlan::encode)
}

/// CANCEL: marks the unfinished plan cancelled; how to drive it back, and the plan's bytes, to
/// replicate (as `SHARD.RESHARD PLAN`) before it is driven.
pub fn request_cancel() -> Result<(Reach, Vec<u8>), CmdError> {
    let st = state::lock();
    let mut current = crate::reshard::current::lock();
    let Some(plan) = current.fleet.as_ref().filter(|p| !p.phase.finished()) else {
        return Err(CmdError::err(
            "no fleet operation to cancel here: CANCEL runs on the node where START ran",
        ));
    };
    let mut next = plan.clone();
    next.request_cancel().map_err(CmdError::err)?;
    let reach = reach(&st, &next)?;
    let bytes = next.encode();
    current.fleet = Some(next);
    Ok((reach, bytes))
}

/// PLAN: stores the coordinator's plan (`bytes`; empty: none), unless this node drives its
/// plan now (its state holds the newest already). A client's plan of an older term than the
/// one this node follows is refused (`STALETERM`).
pub fn save_plan(ctx: &Context, bytes: &[u8]) -> Result<(), CmdError> {
    let plan = if bytes.is_empty() {
        None
    } else {
        Some(FleetPlan::decode(bytes).map_err(|e| {
            CmdError::err(format!(
                "not a fleet plan ({e}): {}",
                printable(&bytes[..bytes.len().min(16)])
            ))
        })?)
    };
    if let Some(plan) = &plan {
        fencing::check_plan_term(ctx, plan.term)?;
    }
    if !coordinator::running() {
        let mut current = crate::reshard::current::lock();
        journal::stored("PLAN", current.fleet.as_ref(), plan.as_ref());
        current.fleet = plan;
    }
    Ok(())
}

/// The term for this node's plan (`acquire`), then the plan driven under it: the reply of
/// RESUME (and of START again, CANCEL of a plan not driven).
async fn acquire_and_drive(steps: &NetSteps, reach: Reach, cancelling: bool) -> CallReply {
    match acquire(steps, &reach, cancelling).await {
        Ok(term) => {
            coordinator::drive(reach, term);
            CallReply::Reply(Resp::Simple(b"OK".to_vec()))
        }
        Err(e) => {
            coordinator::not_driven(&e);
            CallReply::Error(coded(e))
        }
    }
}
