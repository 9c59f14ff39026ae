//! The fleet operation's notices in the server log: a plan started, resumed, moved to a phase,
//! stopped, stored from its coordinator (`SHARD.RESHARD PLAN`, a full sync, a load), and the
//! rings a step installed; so that an operator (and the nemesis test's report) can tell which
//! coordinator drove which plan where, and which plan each server held.

use crate::reshard::fleet::plan::FleetPlan;

/// A short form of a ring's digest (its first 8 characters), as the notices name rings.
pub fn short(digest: &str) -> &str {
    digest.get(..8).unwrap_or(digest)
}

/// `old→new phase P term T` for a plan.
pub fn plan_text(plan: &FleetPlan) -> String {
    format!(
        "{}→{} phase {} term {}{}",
        short(&plan.old.digest()),
        short(&plan.new.digest()),
        plan.phase,
        plan.term,
        if plan.cancel { " (cancel asked)" } else { "" }
    )
}

/// Writes `text` to the server log at notice level.
pub fn note(text: &str) {
    redis_module::logging::log_notice(format!("shard: fleet: {text}"));
}

/// A plan stored at this node (`how`: by PLAN, a load) in place of `before`: noted when its
/// rings, phase or term changed.
pub fn stored(how: &str, before: Option<&FleetPlan>, after: Option<&FleetPlan>) {
    let same = match (before, after) {
        (Some(b), Some(a)) => {
            b.old == a.old && b.new == a.new && b.phase == a.phase && b.term == a.term
        }
        (None, None) => true,
        _ => false,
    };
    if same {
        return;
    }
    let text = |p: Option<&FleetPlan>| p.map_or_else(|| "none".to_string(), plan_text);
    note(&format!(
        "plan {} by {how} (was {})",
        text(after),
        text(before)
    ));
}
