//! What the coordinator concludes from the nodes' answers to `SHARD.RING STATE` (`node_state`),
//! pure: where a node's job step stands (`job_verdict`), START's check that the fleet may begin
//! a plan, RESUME's check that a plan restored from an older copy still fits the rings the
//! fleet holds (and the phase it resumes from), and a phase's check that every node holds its
//! rings (`not_holding`). Each problem names its node.

use crate::net::endpoint::Endpoint;
use crate::reshard::fleet::node_state::NodeState;
use crate::reshard::fleet::plan::{FleetPlan, Install, Phase, Role, Work};

/// Where a node's job step stands, from its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobVerdict {
    Running,
    Done,
    /// Ended without finishing (failed keys, stopped, or never started): try again.
    Retry(String),
    /// Ran on other rings than its phase's (why): the phase's rings are installed there again,
    /// then the job is started again.
    OtherRings(String),
}

/// Reads a node's state after its step `work` was started under the fleet term `term`. Only
/// a job of that term counts: the node's job may be an older one (of an earlier operation or
/// run, or started by hand), or one its server ran before a demotion (a promoted server's
/// record of the copy it made as a primary before, while the copy of this step ran at the
/// primary that failed over: that copy never finished, and the keys it had not sent yet would
/// be left behind); such a job is waited for while it runs, then the step is started again.
///
/// A job of the term counts only when it ran on `rings`, the rings of the step's phase
/// (`FleetPlan::job_rings`), when given: a server promoted after the phase's rings reached the
/// primary it replaced, but not it, runs the step on the rings before them (a cancel's copy
/// back run on the copy's rings copies nothing back). Such a job is waited for while it runs;
/// then the rings are installed there again and the step started again (`OtherRings`). A node
/// that does not report its job's rings (an older build) is not held to them.
pub fn job_verdict(
    work: Work,
    st: &NodeState,
    term: u64,
    rings: Option<&Install<'_>>,
) -> JobVerdict {
    if work == Work::Stop {
        return if st.job_running() {
            JobVerdict::Running
        } else {
            JobVerdict::Done
        };
    }
    if st.job != work.job_name() {
        return JobVerdict::Retry(format!("its job is '{}', not {}", st.job, work.job_name()));
    }
    if st.job_term != term {
        if st.job_running() {
            return JobVerdict::Running;
        }
        return JobVerdict::Retry(format!(
            "its {} job ({}) is not of this operation's term {term} but of {} (an older job, or one its server ran before a failover)",
            st.job,
            st.job_state,
            if st.job_term == 0 { "none".to_string() } else { format!("term {}", st.job_term) }
        ));
    }
    if st.job_running() {
        return JobVerdict::Running;
    }
    if let Some(want) = rings {
        let want_previous = want.previous.map(|p| p.digest()).unwrap_or_default();
        let reported = !st.job_digest.is_empty();
        if reported
            && (st.job_digest != want.current.digest() || st.job_previous_digest != want_previous)
        {
            return JobVerdict::OtherRings(format!(
                "its {} job ran on rings {} (previous {}), not the phase's {} (previous {}): the rings are installed there again, then the job",
                st.job,
                or_none(&st.job_digest),
                or_none(&st.job_previous_digest),
                want.current.digest(),
                or_none(&want_previous)
            ));
        }
    }
    match st.job_state.as_str() {
        "done" if st.failed == 0 => JobVerdict::Done,
        "done" | "failed" => {
            JobVerdict::Retry(format!("{} keys failed: {}", st.failed, st.last_error))
        }
        other => JobVerdict::Retry(format!("the job ended {other}: {}", st.last_error)),
    }
}

/// START's check of the nodes' answers (`answers[i]` for `plan.nodes[i]`): the problems, each
/// naming its node; none means the fleet may start (or resume) the plan.
pub fn check_start(plan: &FleetPlan, answers: &[Result<NodeState, String>]) -> Vec<String> {
    let old = plan.old.digest();
    let new = plan.new.digest();
    let mut problems = Vec::new();
    for (node, answer) in plan.nodes.iter().zip(answers) {
        let who = format!("node {} ({})", node.name, node.address);
        let st = match answer {
            Ok(st) => st,
            Err(e) => {
                problems.push(format!("{who} does not answer: {e}"));
                continue;
            }
        };
        if st.self_name != node.name {
            problems.push(format!(
                "{who} calls itself '{}' (shard.self): set shard.self to {} there",
                st.self_name, node.name
            ));
            continue;
        }
        // Already begun (a START repeated, or resumed): the new ring over the old one, not
        // returning (those are the reverse operation's fence or cancel: the reverse operation
        // is unfinished there).
        let begun = st.digest == new && st.previous_digest == old && !st.returning;
        let holds_old = st.digest == old && st.previous_digest.is_empty();
        let fresh = st.digest.is_empty() && st.previous_digest.is_empty();
        match node.role {
            Role::New if !begun && !holds_old && !fresh => problems.push(format!(
                "{who} holds another ring (digest {}{}), not the fleet's {old}",
                st.digest,
                previous_text(st)
            )),
            Role::New if !begun && st.keys > 0 => problems.push(format!(
                "{who} holds {} keys: a joining node must be empty (old copies there would shadow the ones the copy skips); empty it first (FLUSHALL there, once sure its data is elsewhere)",
                st.keys
            )),
            Role::Old | Role::Both if !begun && !holds_old => problems.push(format!(
                "{who} holds another ring (digest {}{}), not this node's {old}: SHARD.RING PUSH from the node whose ring is right",
                st.digest,
                previous_text(st)
            )),
            _ => {}
        }
        if !begun && st.job_running() {
            problems.push(format!(
                "{who} is running a {} job: wait for it or SHARD.RESHARD STOP it",
                st.job
            ));
        }
    }
    problems
}

/// The rings a node holds, as the plan sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rings {
    /// No ring at all (a joining node before the fence).
    Empty,
    /// The old ring alone.
    Old,
    /// The old ring over the new one, returning (the fence, or a cancel's return).
    Fenced,
    /// The new ring over the old one.
    Begun,
    /// The new ring over the old one, settled (the copies are done).
    Settled,
    /// The new ring alone.
    New,
    Other,
}

fn rings_of(plan: &FleetPlan, st: &NodeState) -> Rings {
    let (old, new) = (plan.old.digest(), plan.new.digest());
    let (d, p) = (st.digest.as_str(), st.previous_digest.as_str());
    match (d, p, st.returning) {
        ("", "", false) => Rings::Empty,
        (d, "", false) if d == old => Rings::Old,
        (d, p, true) if d == old && p == new => Rings::Fenced,
        (d, p, false) if d == new && p == old && st.settled => Rings::Settled,
        (d, p, false) if d == new && p == old => Rings::Begun,
        (d, "", false) if d == new => Rings::New,
        _ => Rings::Other,
    }
}

/// The phase RESUME drives a plan from: its own, except
/// - a plan recorded behind the fleet: in `fence`, `begin` or `copy` while a node holds the
///   plan's new ring alone under the plan's term or a newer one (`committed`): the plan goes on
///   from `commit`;
/// - a `commit` in which a node holds the new ring over the old one no longer settled (its
///   primary failed over, or restarted from an AOF, before the settle reached a replica or the
///   disk), or rings from before (an adopted plan, `adopt`, whose node came back from an older
///   file): the plan goes back to `settle`, so that every node is settled again before any
///   other commits (a committed node settled again only reads and writes as it did; nothing is
///   cleaned up before `cleanup`);
/// - a `cancel-cleanup` in which a node, under the plan's term or an older one, holds the
///   cancel's return (the old ring over the new one, returning) or no ring: its primary and
///   replica were both killed before the revert reached their files (the nemesis, Redis seed
///   2054124654), so it came back from an older AOF. The plan goes back to `cancel-revert`,
///   which installs the old ring alone everywhere again; the cleanup then runs again (it only
///   deletes what the old ring gives another node, so a node cleaned already loses nothing).
pub fn resume_phase(plan: &FleetPlan, answers: &[Result<NodeState, String>]) -> Phase {
    if plan.phase == Phase::CancelCleanup {
        let unreverted = answers.iter().flatten().any(|st| {
            st.term <= plan.term && matches!(rings_of(plan, st), Rings::Fenced | Rings::Empty)
        });
        if unreverted {
            return Phase::CancelRevert;
        }
    }
    let unsettled = answers.iter().flatten().any(|st| {
        matches!(
            rings_of(plan, st),
            Rings::Begun | Rings::Fenced | Rings::Old | Rings::Empty
        )
    });
    let phase = match plan.phase {
        Phase::Fence | Phase::Begin | Phase::Copy if committed(plan, answers) => Phase::Commit,
        phase => phase,
    };
    match phase {
        Phase::Commit if unsettled => Phase::Settle,
        phase => phase,
    }
}

/// Whether a node holds the plan's new ring alone under the plan's term or a newer one: a
/// coordinator drove this operation past its copies, though the plan here says otherwise.
///
/// Why (issue 33, the nemesis test, Valkey seed 7): the plan here can be recorded behind what
/// the nodes hold. A coordinator's step counts durable once its server's replica acknowledged
/// it (`durable`), but a primary with no replica linked at that moment (one killed, or not yet
/// synced after a restart) waits for none: that coordinator (or one that RESUMEd the plan
/// elsewhere under a newer term) drove the fleet through settle and commit while the replica
/// kept the plan in `copy` and this node's rings begun; then Sentinel promoted that replica. Its
/// plan, and its rings, were behind every other node's: RESUME refused them as "older than
/// the fleet", no node held the operation's open rings under the newest term for RESUME to
/// adopt (`adopt`), and the fleet stayed split for good.
///
/// The commit rings are installed only once the copies landed at every destination's replica
/// (`landed`) and every node was settled, so the copies are done: driving this plan back
/// through `copy` would only copy again, and a CANCEL can no longer apply (a node that committed
/// may have deleted a key at its new owner alone). So the plan goes on from `commit` (back to
/// `settle` while a node is not settled yet, as above), which ends the fleet on the ring the
/// committed nodes hold. A node that holds the new ring alone under an older term than the
/// plan's does not count: those are rings from before this plan (a node back from an older file,
/// an earlier operation to the same ring), which say nothing of its copies.
fn committed(plan: &FleetPlan, answers: &[Result<NodeState, String>]) -> bool {
    answers
        .iter()
        .flatten()
        .any(|st| st.term >= plan.term && rings_of(plan, st) == Rings::New)
}

/// RESUME's check: each node that answers must hold rings the plan's phase can be in (those of
/// the phase, or of the one before, since a phase's rings reach the nodes one by one). A plan
/// restored from an older copy (an RDB, or a replica promoted before it got the last phase)
/// whose fleet has moved on is refused, naming the nodes, rather than driven backwards.
pub fn check_resume(plan: &FleetPlan, answers: &[Result<NodeState, String>]) -> Vec<String> {
    use Rings::*;
    let fits: &[Rings] = match plan.phase {
        Phase::Fence => &[Empty, Old, Fenced],
        Phase::Begin => &[Fenced, Begun],
        Phase::Copy => &[Begun],
        // New: a `commit` driven back to `settle` (`resume_phase`).
        Phase::Settle => &[Begun, Settled, New],
        Phase::Commit => &[Settled, New],
        Phase::Cleanup => &[New],
        Phase::CancelStop | Phase::CancelReturn => &[Empty, Old, Fenced, Begun],
        Phase::CancelRevert => &[Empty, Fenced, Old],
        Phase::CancelCleanup => &[Old],
        Phase::Done | Phase::Cancelled => return Vec::new(),
    };
    plan.nodes
        .iter()
        .zip(answers)
        .filter_map(|(node, answer)| {
            let st = answer.as_ref().ok()?;
            let rings = rings_of(plan, st);
            (!fits.contains(&rings)).then(|| {
                    format!(
                        "node {} ({}) holds ring {}{}{}, which does not fit phase {} of this plan (old {}, new {}): the plan is older than the fleet",
                        node.name,
                        node.address,
                        if st.digest.is_empty() { "none" } else { &st.digest },
                        previous_text(st),
                        if st.returning {
                            " (returning)"
                        } else if st.settled {
                            " (settled)"
                        } else {
                            ""
                        },
                        plan.phase,
                        plan.old.digest(),
                        plan.new.digest()
                    )
                })
        })
        .collect()
}

fn previous_text(st: &NodeState) -> String {
    if st.previous_digest.is_empty() {
        String::new()
    } else {
        format!(", previous {}", st.previous_digest)
    }
}

/// The nodes (of `nodes`, answered in order by `answers`) that do not hold `install`'s rings,
/// flags included (a node that lost `settled` holds the right rings and still reads the old
/// owner), each with what it holds or why it did not answer.
pub fn not_holding(
    nodes: &[Endpoint],
    answers: Vec<Result<NodeState, String>>,
    install: &Install<'_>,
) -> Vec<(String, String)> {
    let want = install.current.digest();
    let want_previous = install.previous.map(|p| p.digest()).unwrap_or_default();
    let flags = |returning: bool, settled: bool| match (returning, settled) {
        (true, _) => " returning",
        (false, true) => " settled",
        (false, false) => "",
    };
    let want_flags = flags(install.returning, install.settled && !install.returning);
    nodes
        .iter()
        .zip(answers)
        .filter_map(|(at, answer)| {
            let why = match answer {
                Ok(st)
                    if st.digest == want
                        && st.previous_digest == want_previous
                        && flags(st.returning, st.settled) == want_flags =>
                {
                    return None
                }
                Ok(st) => format!(
                    "holds rings {} (previous {}){} after the install, not {want} (previous {}){want_flags}: installing again",
                    or_none(&st.digest),
                    or_none(&st.previous_digest),
                    flags(st.returning, st.settled),
                    or_none(&want_previous)
                ),
                Err(e) => format!("its rings could not be checked after the install: {e}"),
            };
            Some((at.name.clone(), why))
        })
        .collect()
}

fn or_none(digest: &str) -> &str {
    if digest.is_empty() {
        "none"
    } else {
        digest
    }
}
