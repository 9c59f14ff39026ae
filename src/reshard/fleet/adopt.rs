//! The plan whose rings the fleet holds, pure: what RESUME drives when the plan here is gone or
//! older than the fleet.
//!
//! Why: a plan lives at its coordinator's server and that server's replica only. When Sentinel
//! promotes a replica that never got the plan (one restarted from an older AOF, promoted before
//! it synced), and the old primary then comes back and is turned into its replica, the full
//! sync replaces the old primary's plan with the promoted one's older plan: no server holds the
//! running operation's plan any more, while every other node holds its rings under its term
//! (the nemesis test found this, `NEMESIS_SEED=32`). RESUME found nothing to resume, or a plan
//! "older than the fleet", and the fleet stayed on two operations' rings for good.
//!
//! So the nodes' answers to `SHARD.RING STATE` (their rings' canonical texts, marks and term)
//! give the plan back: the node of the newest term that holds two rings names the operation
//! (the old ring and the new one, and its direction: a cancel's return holds the old ring over
//! the new one, returning, not the fence), and the most advanced rings any node holds of it
//! name the phase to drive from (every phase starts only once the one before ended at every
//! node, and each phase's install is idempotent, so driving it again is harmless).
//! A cancel whose revert may have begun (a node holds the old ring alone) is not adopted: the
//! copy back with REPLACE, run again, would overwrite writes made at a reverted node.
//! When no node of the newest term holds two rings but those nodes hold, alone, the new ring of
//! a node left behind on the open rings under an older term, the operation was committed
//! without that node (`committed_behind`): it is adopted from `commit`.

use crate::persist::parse_canonical;
use crate::reshard::fleet::node_state::NodeState;
use crate::reshard::fleet::plan::{FleetPlan, Phase};

/// The plan of the newest fleet operation the answering nodes hold the open rings of, at the
/// phase to drive it from; `Ok(None)` when no node holds an open operation newer than term
/// `above` (or as new, with `or_equal`); `Err` names why the open rings cannot be adopted.
pub fn adopted(
    answers: &[Result<NodeState, String>],
    above: u64,
    or_equal: bool,
) -> Result<Option<FleetPlan>, String> {
    let states: Vec<&NodeState> = answers.iter().flatten().collect();
    let newest = states.iter().map(|st| st.term).max().unwrap_or(0);
    let Some(top) = states
        .iter()
        .copied()
        .filter(|st| !st.previous_ring.is_empty() && st.term == newest)
        .max_by_key(|st| (st.returning && !st.fence, st.returning, st.settled))
        .or_else(|| committed_behind(&states, newest))
    else {
        return Ok(None);
    };
    if newest < above || (newest == above && !or_equal) {
        return Ok(None);
    }
    let ring = |text: &str| {
        parse_canonical(text.as_bytes())
            .map_err(|e| format!("node {}'s ring cannot be read back: {e}", top.self_name))
    };
    let (current, previous) = (ring(&top.ring)?, ring(&top.previous_ring)?);
    let cancel = top.returning && !top.fence;
    let (old, new) = if top.returning {
        (current, previous)
    } else {
        (previous, current)
    };
    let mut plan = FleetPlan::new(old, new, 0);
    plan.term = newest;
    let (old_d, new_d) = (plan.old.digest(), plan.new.digest());
    let holds = |d: &str, p: &str, settled: bool| {
        states
            .iter()
            .any(|st| st.digest == d && st.previous_digest == p && (st.settled || !settled))
    };
    let phase = if cancel {
        if holds(&old_d, "", false) {
            return Err(format!(
                "the fleet holds a cancel of the operation to ring {new_d} between its return and its revert (a node holds ring {old_d} alone): not adopted; SHARD.RING PUSH the old ring from a node that holds it alone"
            ));
        }
        plan.cancel = true;
        Phase::CancelReturn
    } else if holds(&new_d, "", false) {
        Phase::Commit
    } else if holds(&new_d, &old_d, true) {
        Phase::Settle
    } else if holds(&new_d, &old_d, false) {
        Phase::Begin
    } else {
        Phase::Fence
    };
    plan.enter(phase);
    Ok(Some(plan))
}

/// A node that holds an operation's open rings (the new ring over the old one) under an older
/// term than the newest, whose new ring the nodes of the newest term hold alone: the operation
/// was committed under the newest term (that coordinator's plan is gone) while this node was
/// left behind (a replica promoted with the rings it had before it stopped following its
/// primary: the nemesis test, Valkey seed 7). No node of the newest term holds two rings, so
/// without it nothing would be adopted and that node would stay on two rings for good; adopted,
/// the operation goes on from `commit` (back to `settle` while that node is not settled) and
/// ends on the ring the fleet committed to. The newest such node names it.
fn committed_behind<'a>(states: &[&'a NodeState], newest: u64) -> Option<&'a NodeState> {
    let committed = |digest: &str| {
        states
            .iter()
            .any(|st| st.term == newest && st.digest == digest && st.previous_digest.is_empty())
    };
    states
        .iter()
        .copied()
        .filter(|st| !st.previous_ring.is_empty() && !st.returning && committed(&st.digest))
        .max_by_key(|st| (st.term, st.settled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{test_spec, RingSpec};

    /// A node's answer: its rings (current, previous), marks and term.
    fn node(
        name: &str,
        rings: (Option<&RingSpec>, Option<&RingSpec>),
        marks: (bool, bool, bool),
        term: u64,
    ) -> Result<NodeState, String> {
        let text = |r: Option<&RingSpec>| r.map(RingSpec::canonical).unwrap_or_default();
        let digest = |r: Option<&RingSpec>| r.map(RingSpec::digest).unwrap_or_default();
        let (returning, fence, settled) = marks;
        Ok(NodeState {
            self_name: name.into(),
            digest: digest(rings.0),
            previous_digest: digest(rings.1),
            ring: text(rings.0),
            previous_ring: text(rings.1),
            returning,
            fence,
            settled,
            term,
            ..NodeState::default()
        })
    }

    const OPEN: (bool, bool, bool) = (false, false, false);
    const SETTLED: (bool, bool, bool) = (false, false, true);
    const FENCE: (bool, bool, bool) = (true, true, false);
    const RETURNING: (bool, bool, bool) = (true, false, false);

    #[test]
    fn the_newest_operation_the_fleet_holds_at_its_most_advanced_phase() {
        let (old, new) = (
            test_spec(&["a", "b", "c"]),
            test_spec(&["a", "b", "c", "d"]),
        );
        // The grow in settle (term 3); node a failed over to a replica on the old ring alone
        // (term 2); nothing here.
        let mut answers = vec![
            node("a", (Some(&old), None), OPEN, 2),
            node("b", (Some(&new), Some(&old)), SETTLED, 3),
            node("c", (Some(&new), Some(&old)), OPEN, 3),
            node("d", (Some(&new), Some(&old)), SETTLED, 3),
        ];
        let plan = adopted(&answers, 2, false).unwrap().unwrap();
        assert_eq!((&plan.old, &plan.new), (&old, &new));
        assert_eq!(
            (plan.phase, plan.term, plan.cancel),
            (Phase::Settle, 3, false)
        );
        assert_eq!(plan.nodes.len(), 4);
        // Not newer than the plan here: nothing to adopt, unless as new is asked for.
        assert!(adopted(&answers, 3, false).unwrap().is_none());
        assert!(adopted(&answers, 3, true).unwrap().is_some());
        // A node committed: commit (RESUME takes it back to settle where one lost its settle).
        answers[1] = node("b", (Some(&new), None), OPEN, 3);
        assert_eq!(
            adopted(&answers, 0, false).unwrap().unwrap().phase,
            Phase::Commit
        );
        // Only begun: begin, then the copies again.
        answers[1] = node("b", (Some(&new), Some(&old)), OPEN, 3);
        answers[3] = node("d", (Some(&new), Some(&old)), OPEN, 3);
        assert_eq!(
            adopted(&answers, 0, false).unwrap().unwrap().phase,
            Phase::Begin
        );
        // The fence: the old ring over the new one, returning.
        let fenced: Vec<_> = ["a", "b"]
            .iter()
            .map(|n| node(n, (Some(&old), Some(&new)), FENCE, 4))
            .collect();
        let plan = adopted(&fenced, 0, false).unwrap().unwrap();
        assert_eq!(
            (&plan.old, &plan.new, plan.phase),
            (&old, &new, Phase::Fence)
        );
        // A cancel's return: the cancel goes on.
        let back: Vec<_> = ["a", "b"]
            .iter()
            .map(|n| node(n, (Some(&old), Some(&new)), RETURNING, 4))
            .collect();
        let plan = adopted(&back, 0, false).unwrap().unwrap();
        assert_eq!((plan.phase, plan.cancel), (Phase::CancelReturn, true));
        // ...but not once a node may have reverted to the old ring alone.
        let mut reverted = back.clone();
        reverted[0] = node("a", (Some(&old), None), OPEN, 4);
        assert!(adopted(&reverted, 0, false).is_err());
    }

    #[test]
    fn a_node_left_behind_a_commit_of_a_newer_term_names_the_operation() {
        let (old, new) = (
            test_spec(&["a", "b", "c"]),
            test_spec(&["a", "b", "c", "d"]),
        );
        // Node a, a replica promoted with its rings of the copy (term 2); the others committed
        // under term 3 (the plan that drove them is gone): no node of term 3 holds two rings.
        let answers = vec![
            node("a", (Some(&new), Some(&old)), OPEN, 2),
            node("b", (Some(&new), None), OPEN, 3),
            node("c", (Some(&new), None), OPEN, 3),
            node("d", (Some(&new), None), OPEN, 3),
        ];
        let plan = adopted(&answers, 0, false).unwrap().unwrap();
        assert_eq!((&plan.old, &plan.new), (&old, &new));
        assert_eq!(
            (plan.phase, plan.term, plan.cancel),
            (Phase::Commit, 3, false)
        );
        assert!(adopted(&answers, 3, false).unwrap().is_none());
        assert!(adopted(&answers, 3, true).unwrap().is_some());
        // The newest term on another ring alone (the old one: a cancel, a reverse operation):
        // node a's rings are an older operation's, nothing to adopt.
        let moved_on = vec![
            node("a", (Some(&new), Some(&old)), OPEN, 2),
            node("b", (Some(&old), None), OPEN, 3),
        ];
        assert!(adopted(&moved_on, 0, false).unwrap().is_none());
        // A cancel's return left behind is not taken for the operation either.
        let back = vec![
            node("a", (Some(&old), Some(&new)), RETURNING, 2),
            node("b", (Some(&old), None), OPEN, 3),
        ];
        assert!(adopted(&back, 0, false).unwrap().is_none());
    }

    #[test]
    fn only_the_newest_term_counts() {
        let (old, new) = (
            test_spec(&["a", "b", "c"]),
            test_spec(&["a", "b", "c", "d"]),
        );
        // A node back from an old AOF holds an older operation's rings (term 2); the newest
        // operation (term 3) ended: every other node holds its ring alone.
        let answers = vec![
            node("a", (Some(&new), Some(&old)), SETTLED, 2),
            node("b", (Some(&old), None), OPEN, 3),
            node("c", (Some(&old), None), OPEN, 3),
        ];
        assert!(adopted(&answers, 0, false).unwrap().is_none());
        // No open rings anywhere: nothing.
        let closed = vec![
            node("a", (Some(&old), None), OPEN, 3),
            Err("refused".into()),
        ];
        assert!(adopted(&closed, 0, false).unwrap().is_none());
    }
}
