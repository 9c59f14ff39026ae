//! How this node reaches the fleet: the link its fleet requests use (the module's connections,
//! with `auth-user`/`auth-password` and the coordinator's request timeout), the nodes of the
//! current and previous rings (each once), and what the coordinator needs to drive a plan
//! (`Reach`: its lease's length and this server's run id too), or why this node cannot drive
//! it (its `self` names no node of the plan).

use std::sync::Arc;
use std::time::Duration;

use crate::host::error::CmdError;
use crate::net::endpoint::Endpoint;
use crate::net::pool::{link_timeout, Link};
use crate::reshard::fleet::coordinator::{self, Reach, REQUEST_TIMEOUT};
use crate::reshard::fleet::plan::FleetPlan;
use crate::ring::placement::Placement;
use crate::ring::NodeSpec;
use crate::state::{self, ModuleState};

/// How this node reaches the others for a fleet operation.
pub fn link(st: &ModuleState) -> Link {
    Link {
        timeout: REQUEST_TIMEOUT,
        auth: st.config.auth(),
        resp3: false,
        db: 0,
    }
}

/// A node of the current or previous ring: its endpoint, its spec in the current ring (none if
/// it is only in the previous one), and whether the previous ring names it.
pub type FleetNode<'a> = (Endpoint, Option<&'a NodeSpec>, bool);

/// The nodes of `current` (the current ring) and of the previous ring, each once.
pub fn fleet_nodes<'a>(
    st: &'a ModuleState,
    current: &'a Arc<Placement>,
) -> Result<Vec<FleetNode<'a>>, CmdError> {
    if current.ring.is_none() {
        return Err(CmdError::err(
            "the cluster algo has no ring of shard's own: Redis Cluster holds the slot map",
        ));
    }
    let self_name = st.config.ring.self_name.as_str();
    let mut out: Vec<FleetNode<'_>> = current
        .spec
        .nodes
        .iter()
        .map(|n| {
            (
                crate::topology::nodes::endpoint_of(n, self_name),
                Some(n),
                false,
            )
        })
        .collect();
    if let Some(previous) = &st.rings.previous {
        for n in &previous.spec.nodes {
            match out.iter_mut().find(|(e, _, _)| e.name == n.name) {
                Some(entry) => entry.2 = true,
                None => out.push((
                    crate::topology::nodes::endpoint_of(n, self_name),
                    None,
                    true,
                )),
            }
        }
    }
    Ok(out)
}

/// How the coordinator reaches the fleet of `plan`, or why this node cannot coordinate it.
pub fn reach(st: &ModuleState, plan: &FleetPlan) -> Result<Reach, CmdError> {
    let self_name = st.config.ring.self_name.as_str();
    if self_name.is_empty() {
        return Err(CmdError::err(
            "self is not set: CONFIG SET shard.self to this server's node name in the ring",
        ));
    }
    let me = coordinator::endpoint_of(plan, self_name, self_name).ok_or_else(|| {
        CmdError::err(format!(
            "self '{self_name}' names no node of the old or the new ring: run the command on a node of the fleet"
        ))
    })?;
    Ok(Reach {
        link: link(st),
        me,
        quiet: link_timeout(st.config.call_timeout_ms),
        lease: Duration::from_millis(st.config.fleet_lease_ms.unsigned_abs()),
        run_id: crate::host::context::run_id(),
    })
}

/// Whether there is an interrupted fleet operation to resume here (`SHARD.RESHARD RESUME`),
/// and how to reach its fleet.
pub fn plan_to_resume() -> Result<Option<Reach>, CmdError> {
    let st = state::lock();
    let current = crate::reshard::current::lock();
    let Some(plan) = current.fleet.as_ref().filter(|p| !p.phase.finished()) else {
        return Ok(None);
    };
    if coordinator::running() {
        return Ok(None);
    }
    reach(&st, plan).map(Some)
}
