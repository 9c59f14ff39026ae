//! `SHARD.RESHARD STATUS`'s `fleet` field: nil, or the plan this node coordinates, its phase,
//! whether it is being driven now, each node's part and progress, and the plan's term and
//! lease (`lease`).

use crate::net::resp::Resp;
use crate::reshard::fleet::node_state::yes_no;
use crate::reshard::fleet::plan::FleetPlan;
use crate::reshard::fleet::{coordinator, lease};

/// The `fleet` field's value: nil without a plan, else a map of 9 fields whose `nodes` maps
/// each node's name to its 8 fields.
pub fn fleet_status(fleet: Option<&FleetPlan>) -> Resp {
    let Some(plan) = fleet else {
        return Resp::Null;
    };
    let int = |n: u64| Resp::Int(i64::try_from(n).unwrap_or(i64::MAX));
    let bulk = |b: &[u8]| Resp::Bulk(b.to_vec());
    let map = |fields: Vec<(&str, Resp)>| {
        Resp::Map(
            fields
                .into_iter()
                .map(|(name, value)| (bulk(name.as_bytes()), value))
                .collect(),
        )
    };
    let nodes = plan
        .nodes
        .iter()
        .map(|n| {
            let fields = vec![
                ("address", bulk(n.address.as_bytes())),
                ("role", bulk(n.role.name().as_bytes())),
                ("state", bulk(n.state.as_bytes())),
                ("step_done", bulk(yes_no(n.done))),
                ("copied", int(n.copied)),
                ("percent", int(n.percent)),
                ("attempts", Resp::Int(i64::from(n.attempts))),
                ("last_error", bulk(n.last_error.as_bytes())),
            ];
            (bulk(n.name.as_bytes()), map(fields))
        })
        .collect();
    map(vec![
        ("phase", bulk(plan.phase.name().as_bytes())),
        ("running", bulk(yes_no(coordinator::running()))),
        ("cancel", bulk(yes_no(plan.cancel))),
        ("error", bulk(plan.error.as_bytes())),
        ("old_digest", bulk(plan.old.digest().as_bytes())),
        ("new_digest", bulk(plan.new.digest().as_bytes())),
        ("nodes", Resp::Map(nodes)),
        ("term", int(plan.term)),
        (
            "lease",
            bulk(lease::status(coordinator::running()).as_bytes()),
        ),
    ])
}
