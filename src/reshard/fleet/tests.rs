//! The fleet plan's unit tests: roles and work per phase, installs, cancel, START's and
//! RESUME's checks, job verdicts, the state reply in both RESP versions, the byte form.

use crate::net::endpoint::Endpoint;
use crate::net::resp::Resp;
use crate::reshard::fleet::checks::{
    check_resume, check_start, job_verdict, not_holding, resume_phase, JobVerdict,
};
use crate::reshard::fleet::node_state::NodeState;
use crate::reshard::fleet::plan::{FleetPlan, Phase, Role, Work};
use crate::ring::RingSpec;

fn spec(names: &[&str]) -> RingSpec {
    crate::ring::test_spec(names)
}

fn grow() -> FleetPlan {
    FleetPlan::new(spec(&["a", "b", "c"]), spec(&["a", "b", "c", "d"]), 0)
}

fn shrink() -> FleetPlan {
    FleetPlan::new(spec(&["a", "b", "c", "d"]), spec(&["a", "b", "c"]), 500)
}

#[test]
fn roles_and_work_per_phase() {
    let mut p = grow();
    let roles: Vec<Role> = p.nodes.iter().map(|n| n.role).collect();
    assert_eq!(roles, [Role::Both, Role::Both, Role::Both, Role::New]);
    p.enter(Phase::Copy);
    assert_eq!(p.work(0), Some(Work::Copy { replace: false }));
    assert_eq!(p.work(3), None, "a joining node has nothing to copy");
    p.enter(Phase::Cleanup);
    assert_eq!(p.work(3), Some(Work::Cleanup { left: false }));
    p.enter(Phase::CancelReturn);
    assert_eq!(p.work(3), Some(Work::Copy { replace: true }));
    p.enter(Phase::CancelCleanup);
    assert_eq!(p.work(3), Some(Work::Cleanup { left: true }));
    assert_eq!(p.work(0), Some(Work::Cleanup { left: false }));

    let mut s = shrink();
    assert_eq!(s.nodes[3].role, Role::Old);
    s.enter(Phase::Cleanup);
    assert_eq!(s.work(3), Some(Work::Cleanup { left: true }));
    s.enter(Phase::Copy);
    assert_eq!(s.work(3), Some(Work::Copy { replace: false }));
    assert_eq!(
        s.work(3).unwrap().command(s.max_rate),
        [&b"SHARD.RESHARD"[..], b"COPY", b"MAXRATE", b"500"]
    );
}

#[test]
fn installs_per_phase() {
    let mut p = grow();
    assert_eq!(p.phase, Phase::Fence);
    let i = p.install().unwrap();
    assert_eq!(
        (i.current, i.previous, i.returning),
        (&p.old, Some(&p.new), true)
    );
    assert!(p.phase.waits_for_calls());
    p.enter(p.phase.next());
    let i = p.install().unwrap();
    assert_eq!(
        (i.current, i.previous, i.returning),
        (&p.new, Some(&p.old), false)
    );
    p.enter(Phase::CancelReturn);
    let i = p.install().unwrap();
    assert_eq!(
        (i.current, i.previous, i.returning),
        (&p.old, Some(&p.new), true)
    );
    assert_eq!(i.command().last().unwrap(), b"RETURNING");
    p.enter(Phase::Copy);
    assert!(p.install().is_none());
    // COMMIT's first step: the rings of BEGIN, settled, then the wait for calls routed before.
    assert_eq!(p.phase.next(), Phase::Settle);
    p.enter(Phase::Settle);
    let i = p.install().unwrap();
    assert_eq!(
        (i.current, i.previous, i.returning, i.settled),
        (&p.new, Some(&p.old), false, true)
    );
    assert_eq!(i.command().last().unwrap(), b"SETTLED");
    assert!(p.phase.waits_for_calls());
    assert_eq!(p.phase.next(), Phase::Commit);
    p.enter(Phase::Commit);
    let i = p.install().unwrap();
    assert_eq!((i.previous, i.settled), (None, false));
    assert_eq!(i.command().len(), 3);
}

#[test]
fn a_new_phase_keeps_the_codes_of_the_others() {
    // The byte codes are the plans' on disk: `settle` came last. The phase's byte follows the
    // magic and version, both rings (length-prefixed) and the max rate.
    let mut p = grow();
    let at = 5 + 8 + p.old.canonical().len() + 8 + p.new.canonical().len() + 8;
    for (phase, code) in [
        (Phase::Commit, 3),
        (Phase::Cancelled, 10),
        (Phase::Settle, 11),
    ] {
        p.enter(phase);
        assert_eq!(p.encode()[at], code, "{phase}");
    }
    assert_eq!(FleetPlan::decode(&p.encode()).unwrap(), p);
    assert_eq!(Phase::named("settle"), Some(Phase::Settle));
    // A code past the known ones is refused, as a build before `settle` refuses code 11.
    let mut bytes = p.encode();
    bytes[at] = 12;
    assert!(FleetPlan::decode(&bytes)
        .unwrap_err()
        .contains("unknown phase"));
}

#[test]
fn cancel_only_before_commit() {
    let mut p = grow();
    p.enter(Phase::Copy);
    assert!(p.request_cancel().is_ok() && p.cancel);
    for phase in [Phase::Settle, Phase::Commit] {
        p.enter(phase);
        p.cancel = false;
        assert!(p
            .request_cancel()
            .unwrap_err()
            .contains("no longer be cancelled"));
    }
    let order: Vec<Phase> = std::iter::successors(Some(Phase::CancelStop), |p| {
        (!p.finished()).then(|| p.next())
    })
    .collect();
    assert_eq!(order.last(), Some(&Phase::Cancelled));
    assert_eq!(order.len(), 5);
}

fn state(name: &str, digest: &str, previous: &str, keys: u64) -> Result<NodeState, String> {
    Ok(NodeState {
        self_name: name.into(),
        digest: digest.into(),
        previous_digest: previous.into(),
        keys,
        job_state: "idle".into(),
        ..NodeState::default()
    })
}

#[test]
fn start_checks_name_each_node() {
    let p = grow();
    let (old, new) = (p.old.digest(), p.new.digest());
    let fine = vec![
        state("a", &old, "", 10),
        state("b", &old, "", 10),
        state("c", &old, "", 10),
        state("d", "", "", 0),
    ];
    assert!(check_start(&p, &fine).is_empty());
    let mut bad = fine.clone();
    bad[1] = Err("connection refused".into());
    bad[2] = state("c", "ffff", "", 10);
    bad[3] = state("d", "", "", 12);
    let problems = check_start(&p, &bad);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].starts_with("node b (127.0.0.1:7001) does not answer"));
    assert!(problems[1].contains("node c") && problems[1].contains("ffff"));
    assert!(problems[2].contains("node d") && problems[2].contains("12 keys"));
    // Resumed: every node already holds the new ring over the old; the joining node's
    // copies do not count against it.
    let begun: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| state(n, &new, &old, 5))
        .collect();
    assert!(check_start(&p, &begun).is_empty());
    // The reverse operation's fence (or cancel) holds the same two rings, returning: that
    // operation is unfinished there, and START refuses rather than take its rings for its own.
    let mut reverse = begun.clone();
    reverse[1] = state("b", &new, &old, 5).map(|st| NodeState {
        returning: true,
        fence: true,
        ..st
    });
    let problems = check_start(&p, &reverse);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("node b") && problems[0].contains("holds another ring"));
    let mut wrong_self = fine;
    wrong_self[0] = state("x", &old, "", 1);
    assert!(check_start(&p, &wrong_self)[0].contains("calls itself 'x'"));
}

#[test]
fn resume_refuses_a_plan_older_than_the_fleet() {
    let mut p = grow();
    let (old, new) = (p.old.digest(), p.new.digest());
    p.enter(Phase::Copy);
    let begun: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| state(n, &new, &old, 5))
        .collect();
    assert!(check_resume(&p, &begun).is_empty());
    // The fleet was cancelled meanwhile: every node back on the old ring alone.
    let cancelled: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| state(n, &old, "", 5))
        .collect();
    let problems = check_resume(&p, &cancelled);
    assert_eq!(problems.len(), 4, "{problems:?}");
    assert!(problems[0].contains("node a") && problems[0].contains("phase copy"));
    // A node that does not answer is the driver's to retry, not a refusal.
    let mut partly = begun.clone();
    partly[2] = Err("refused".into());
    assert!(check_resume(&p, &partly).is_empty());
    // Settle and commit reach the nodes one by one: the rings before and after fit.
    p.enter(Phase::Settle);
    let settled = |n: &str| {
        state(n, &new, &old, 5).map(|st| NodeState {
            settled: true,
            ..st
        })
    };
    let mut mixed = begun.clone();
    mixed[0] = settled("a");
    assert!(check_resume(&p, &mixed).is_empty());
    p.enter(Phase::Commit);
    let mut mixed: Vec<_> = ["a", "b", "c", "d"].iter().map(|n| settled(n)).collect();
    mixed[0] = state("a", &new, "", 5);
    assert!(check_resume(&p, &mixed).is_empty());
    // A node that never settled does not fit commit: a node that commits could delete a key
    // at its new owner alone, and that node would still read the old owner's copy.
    mixed[1] = state("b", &new, &old, 5);
    let problems = check_resume(&p, &mixed);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("node b") && problems[0].contains("phase commit"));
    // So RESUME drives such a plan back to settle (node b lost its settle: a failover or an
    // old AOF), where every node, committed ones too, fits.
    assert_eq!(resume_phase(&p, &mixed), Phase::Settle);
    p.enter(Phase::Settle);
    assert!(check_resume(&p, &mixed).is_empty());
    p.enter(Phase::Commit);
    mixed[1] = settled("b");
    assert_eq!(resume_phase(&p, &mixed), Phase::Commit);
}

#[test]
fn resume_goes_on_from_commit_when_the_fleet_committed_past_the_plan() {
    let mut p = grow();
    let (old, new) = (p.old.digest(), p.new.digest());
    p.enter(Phase::Copy);
    p.term = 4;
    let at = |name: &str, digest: &str, previous: &str, term: u64| {
        state(name, digest, previous, 5).map(|st| NodeState { term, ..st })
    };
    // The plan here was left in copy (its server's replica, promoted, had it so), as were this
    // node's rings; the others committed under a newer term.
    let mut answers = vec![
        at("a", &new, &old, 4),
        at("b", &new, "", 6),
        at("c", &new, "", 6),
        at("d", &new, "", 6),
    ];
    assert!(!check_resume(&p, &answers).is_empty(), "copy does not fit");
    // Past the copies: settle first, node a being only begun, then commit.
    assert_eq!(resume_phase(&p, &answers), Phase::Settle);
    p.enter(Phase::Settle);
    assert!(check_resume(&p, &answers).is_empty());
    // Every node committed under the plan's own term: commit (then cleanup).
    p.enter(Phase::Begin);
    for (i, n) in ["a", "b", "c", "d"].iter().enumerate() {
        answers[i] = at(n, &new, "", 4);
    }
    assert_eq!(resume_phase(&p, &answers), Phase::Commit);
    // The new ring alone under an older term than the plan's is from before it (a node back
    // from an older file): it says nothing of the copies, and the plan stays in its phase.
    p.enter(Phase::Copy);
    answers = vec![at("a", &new, &old, 4), at("b", &new, "", 3)];
    assert_eq!(resume_phase(&p, &answers), Phase::Copy);
    assert!(!check_resume(&p, &answers).is_empty());
}

#[test]
fn a_node_that_lost_its_settle_does_not_hold_the_settle_rings() {
    let mut p = grow();
    p.enter(Phase::Settle);
    let (old, new) = (p.old.digest(), p.new.digest());
    let install = p.install().expect("settle installs rings");
    let nodes: Vec<Endpoint> = ["a", "b"]
        .iter()
        .map(|n| Endpoint {
            name: n.to_string(),
            host: "127.0.0.1".into(),
            port: 7000,
            address: "127.0.0.1:7000".into(),
            is_self: false,
        })
        .collect();
    let settled = state("a", &new, &old, 5).map(|st| NodeState {
        settled: true,
        ..st
    });
    let answers = vec![settled, state("b", &new, &old, 5)];
    let missing = not_holding(&nodes, answers, &install);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert_eq!(missing[0].0, "b");
    assert!(
        missing[0].1.contains("settled: installing again"),
        "{missing:?}"
    );
}

#[test]
fn verdicts() {
    let mut st = NodeState {
        job: "copy".into(),
        job_state: "copying".into(),
        job_term: 7,
        ..NodeState::default()
    };
    let copy = Work::Copy { replace: false };
    assert_eq!(job_verdict(copy, &st, 7, None), JobVerdict::Running);
    st.job_state = "done".into();
    assert_eq!(job_verdict(copy, &st, 7, None), JobVerdict::Done);
    st.failed = 3;
    assert!(
        matches!(job_verdict(copy, &st, 7, None), JobVerdict::Retry(e) if e.contains("3 keys"))
    );
    st.job_state = "idle".into();
    assert_eq!(job_verdict(Work::Stop, &st, 7, None), JobVerdict::Done);
    assert!(matches!(
        job_verdict(Work::Cleanup { left: false }, &st, 7, None),
        JobVerdict::Retry(_)
    ));
}

#[test]
fn a_job_of_another_term_never_counts_done() {
    // A promoted server's copy of an older operation (or run before its demotion: term 0).
    let mut st = NodeState {
        job: "copy".into(),
        job_state: "done".into(),
        job_term: 3,
        ..NodeState::default()
    };
    let copy = Work::Copy { replace: false };
    assert!(
        matches!(job_verdict(copy, &st, 4, None), JobVerdict::Retry(e) if e.contains("term 3"))
    );
    st.job_term = 0;
    assert!(matches!(job_verdict(copy, &st, 4, None), JobVerdict::Retry(e) if e.contains("none")));
    // Still running: waited for, then started again.
    st.job_state = "copying".into();
    assert_eq!(job_verdict(copy, &st, 4, None), JobVerdict::Running);
    // A coordinator without a term counts the jobs started without one.
    st.job_state = "done".into();
    assert_eq!(job_verdict(copy, &st, 0, None), JobVerdict::Done);
}

#[test]
fn a_job_run_on_other_rings_than_its_phases_never_counts_done() {
    // A cancel's copy back run at a server promoted before the return's rings reached it.
    let old = spec(&["a", "b"]);
    let new = spec(&["a", "b", "c"]);
    let mut plan = FleetPlan::new(old.clone(), new.clone(), 0);
    plan.enter(Phase::CancelReturn);
    let rings = plan.job_rings();
    let copy = Work::Copy { replace: true };
    let mut st = NodeState {
        job: "copy".into(),
        job_state: "done".into(),
        job_term: 4,
        job_digest: new.digest(),
        job_previous_digest: old.digest(),
        ..NodeState::default()
    };
    assert!(matches!(
        job_verdict(copy, &st, 4, rings.as_ref()),
        JobVerdict::OtherRings(e) if e.contains("not the phase's")
    ));
    // Still running: waited for first.
    st.job_state = "copying".into();
    assert_eq!(
        job_verdict(copy, &st, 4, rings.as_ref()),
        JobVerdict::Running
    );
    // On the return's rings it counts.
    st.job_state = "done".into();
    st.job_digest = old.digest();
    st.job_previous_digest = new.digest();
    assert_eq!(job_verdict(copy, &st, 4, rings.as_ref()), JobVerdict::Done);
    // A node that does not report its job's rings is not held to them.
    st.job_digest.clear();
    st.job_previous_digest.clear();
    assert_eq!(job_verdict(copy, &st, 4, rings.as_ref()), JobVerdict::Done);
    // A cleanup runs on the ring the operation ends on, alone.
    plan.enter(Phase::CancelCleanup);
    let rings = plan.job_rings();
    st.job = "cleanup".into();
    st.job_digest = old.digest();
    let cleanup = Work::Cleanup { left: false };
    assert_eq!(
        job_verdict(cleanup, &st, 4, rings.as_ref()),
        JobVerdict::Done
    );
    st.job_previous_digest = new.digest();
    assert!(matches!(
        job_verdict(cleanup, &st, 4, rings.as_ref()),
        JobVerdict::OtherRings(_)
    ));
}

#[test]
fn state_reads_both_resp_versions() {
    let pairs = vec![
        (Resp::Bulk(b"self".to_vec()), Resp::Bulk(b"a".to_vec())),
        (Resp::Bulk(b"keys".to_vec()), Resp::Int(42)),
        (
            Resp::Bulk(b"returning".to_vec()),
            Resp::Bulk(b"yes".to_vec()),
        ),
    ];
    let flat: Vec<Resp> = pairs
        .iter()
        .flat_map(|(k, v)| [k.clone(), v.clone()])
        .collect();
    for reply in [Resp::Map(pairs), Resp::Array(flat)] {
        let st = NodeState::from_resp(&reply).unwrap();
        assert_eq!(
            (st.self_name.as_str(), st.keys, st.returning),
            ("a", 42, true)
        );
    }
    assert!(
        NodeState::from_resp(&Resp::Error(b"ERR unknown command".to_vec()))
            .unwrap_err()
            .contains("unknown command")
    );
}

#[test]
fn plan_round_trips_and_rejects_truncation() {
    let mut p = shrink();
    p.enter(Phase::Copy);
    p.nodes[1].done = true;
    p.nodes[2].attempts = 3;
    p.nodes[2].last_error = "node c: refused".into();
    p.cancel = true;
    let bytes = p.encode();
    assert_eq!(FleetPlan::decode(&bytes).unwrap(), p);
    for cut in 0..bytes.len() {
        assert!(FleetPlan::decode(&bytes[..cut]).is_err(), "{cut}");
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(FleetPlan::decode(&long).is_err());
}

#[test]
fn a_plan_with_a_term_is_version_2_and_version_1_still_reads() {
    let mut p = grow();
    let v1 = p.encode();
    assert_eq!(v1[4], 1, "no term yet: an older build reads it");
    assert_eq!(FleetPlan::decode(&v1).unwrap(), p);
    p.term = 7;
    let v2 = p.encode();
    assert_eq!(v2[4], 2);
    assert_eq!(v2.len(), v1.len() + 8);
    assert_eq!(FleetPlan::decode(&v2).unwrap(), p);
    for cut in 0..v2.len() {
        assert!(FleetPlan::decode(&v2[..cut]).is_err(), "{cut}");
    }
    let mut v3 = v2.clone();
    v3[4] = 3;
    assert!(FleetPlan::decode(&v3).unwrap_err().contains("version 3"));
}

mod lease {
    use std::time::Duration;

    use crate::net::endpoint::Endpoint;
    use crate::net::pool::Link;
    use crate::reshard::fleet::coordinator::Reach;
    use crate::reshard::fleet::lease::take;
    use crate::reshard::fleet::node_state::NodeState;

    fn at(name: &str, port: u16) -> Endpoint {
        Endpoint {
            name: name.into(),
            host: "h".into(),
            port,
            address: format!("h:{port}"),
            is_self: false,
        }
    }

    fn reach(me: &Endpoint, run: &str) -> Reach {
        Reach {
            link: Link {
                timeout: Duration::from_secs(5),
                auth: None,
                resp3: false,
                db: 0,
            },
            me: me.clone(),
            quiet: Duration::from_secs(1),
            lease: Duration::from_millis(3000),
            run_id: run.into(),
        }
    }

    /// A node's answer: its own run, and the term it follows held by `holder` at `address`.
    fn answer(run: &str, term: u64, holder: (&str, &str, &str), left_ms: u64) -> NodeState {
        NodeState {
            run_id: run.into(),
            term,
            term_holder: holder.0.into(),
            term_address: holder.1.into(),
            term_run_id: holder.2.into(),
            lease_left_ms: left_ms,
            ..NodeState::default()
        }
    }

    #[test]
    fn a_running_lease_of_another_coordinator_refuses_naming_it_and_the_time_left() {
        let nodes = [at("n0", 1), at("n1", 2), at("n2", 3)];
        let n0 = ("n0", "h:1", "r0");
        let answers = vec![
            Err("timed out".to_string()),
            Ok(answer("r1", 3, n0, 0)),
            Ok(answer("r2", 3, n0, 2500)),
        ];
        let err = take(3, &nodes, &answers, &reach(&nodes[1], "r1")).unwrap_err();
        assert!(err.starts_with("LEASEHELD term 3 of n0 (h:1)"), "{err}");
        assert!(
            err.contains("node n2") && err.contains("2500 ms more"),
            "{err}"
        );
        // Run out everywhere: the next term, above every term seen.
        let answers = vec![
            Err("timed out".to_string()),
            Ok(answer("r1", 3, n0, 0)),
            Ok(answer("r2", 4, ("n2", "h:3", "r2"), 0)),
        ];
        let term = take(3, &nodes, &answers, &reach(&nodes[1], "r1")).unwrap();
        assert_eq!((term.claim.term, term.takeover), (5, false));
        assert_eq!(term.claim.lease_ms, 3000);
        assert_eq!(term.claim.holder.name, "n1");
        assert_eq!(term.claim.holder.run_id, "r1");
        // A released term is free at once; the plan's own term counts too.
        let mut released = answer("r2", 4, n0, 2500);
        released.term_released = true;
        let answers = vec![Err("x".into()), Err("x".into()), Ok(released)];
        let term = take(9, &nodes, &answers, &reach(&nodes[1], "r1")).unwrap();
        assert_eq!(term.claim.term, 10);
    }

    #[test]
    fn an_earlier_run_at_this_address_is_taken_over_once_the_address_answers_with_this_run() {
        let nodes = [at("n0", 1), at("n1", 2)];
        let old = ("n0", "h:1", "old");
        // The restarted n0: its address answers with its own run.
        let answers = vec![
            Ok(answer("new", 2, old, 2900)),
            Ok(answer("r1", 2, old, 2000)),
        ];
        let term = take(2, &nodes, &answers, &reach(&nodes[0], "new")).unwrap();
        assert_eq!((term.claim.term, term.takeover), (3, true));
        // A promoted replica named n0 whose ring address still reaches the old primary (or
        // nothing): not proven, it waits.
        let answers = vec![
            Ok(answer("old", 2, old, 2900)),
            Ok(answer("r1", 2, old, 2000)),
        ];
        assert!(take(2, &nodes, &answers, &reach(&nodes[0], "replica")).is_err());
        let answers = vec![Err("timed out".into()), Ok(answer("r1", 2, old, 2000))];
        assert!(take(2, &nodes, &answers, &reach(&nodes[0], "replica")).is_err());
        // This very run held it (it gave up, and its release did not reach n1): free.
        let answers = vec![
            Ok(answer("new", 3, ("n0", "h:1", "new"), 0)),
            Ok(answer("r1", 3, ("n0", "h:1", "new"), 2000)),
        ];
        assert_eq!(
            take(3, &nodes, &answers, &reach(&nodes[0], "new"))
                .unwrap()
                .claim
                .term,
            4
        );
    }
}

#[test]
fn resume_goes_back_to_revert_when_a_node_lost_the_revert() {
    let mut p = grow();
    let (old, new) = (p.old.digest(), p.new.digest());
    p.enter(Phase::CancelCleanup);
    p.term = 5;
    let at = |name: &str, digest: &str, previous: &str, returning: bool, term: u64| {
        state(name, digest, previous, 5).map(|st| NodeState {
            term,
            returning,
            ..st
        })
    };
    // The nemesis, Redis seed 2054124654: node a's primary and replica were both killed after
    // the revert, and came back from files that held the cancel's return.
    let mut answers = vec![
        at("a", &old, &new, true, 5),
        at("b", &old, "", false, 5),
        at("c", &old, "", false, 5),
        at("d", &old, "", false, 5),
    ];
    assert!(
        !check_resume(&p, &answers).is_empty(),
        "the return does not fit cancel-cleanup"
    );
    assert_eq!(resume_phase(&p, &answers), Phase::CancelRevert);
    p.enter(Phase::CancelRevert);
    assert!(check_resume(&p, &answers).is_empty());
    // A joining node back with no ring at all goes back to the revert too.
    p.enter(Phase::CancelCleanup);
    answers[0] = at("a", &old, "", false, 5);
    answers[3] = at("d", "", "", false, 0);
    assert_eq!(resume_phase(&p, &answers), Phase::CancelRevert);
    // Every node reverted: the cleanup goes on.
    answers[3] = at("d", &old, "", false, 5);
    assert_eq!(resume_phase(&p, &answers), Phase::CancelCleanup);
    assert!(check_resume(&p, &answers).is_empty());
    // A return under a newer term is another operation's: the plan here is older than the fleet.
    answers[0] = at("a", &old, &new, true, 6);
    assert_eq!(resume_phase(&p, &answers), Phase::CancelCleanup);
    assert!(!check_resume(&p, &answers).is_empty());
}
