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
use crate::net::resp::Resp;
use crate::reshard::fleet::checks::check_start;
use crate::reshard::fleet::coordinator::{self, Reach};
use crate::reshard::fleet::plan::FleetPlan;
use crate::reshard::fleet::reach::reach;
use crate::reshard::fleet::{fencing, lease};
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
    if !coordinator::begin_driving() {
        call.reply.ok();
        return Ok(());
    }
    let link = reach.link.clone();
    let started = crate::route::forward::run(call, link, move |steps| async move {
        match coordinator::acquire(&steps, &reach).await {
            Ok(term) => {
                coordinator::drive(reach, term);
                CallReply::Reply(Resp::Simple(b"OK".to_vec()))
            }
            Err(e) => {
                coordinator::not_driven(&e);
                let coded = ["LEASEHELD ", "STALETERM ", "ERR "]
                    .iter()
                    .any(|c| e.starts_with(c));
                CallReply::Error(if coded { e } else { format!("ERR {e}") })
            }
        }
    });
    started.map_err(|e| {
        coordinator::not_driven(&e);
        CmdError::err(e)
    })
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
        crate::reshard::current::lock().fleet = plan;
    }
    Ok(())
}
