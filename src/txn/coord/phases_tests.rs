//! The phases against a fake fleet: each owner answers by a script, every request is logged,
//! the clock moves only when the coordinator pauses.

use std::cell::{Cell, RefCell};
use std::future::{ready, Future};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use super::*;
use crate::net::endpoint::StepErrorKind;
use crate::route::split::{self, splittable};
use crate::txn::coord::plan::{endpoint, Queued};
use crate::txn::coord::wire::Command;

type Answer = Box<dyn Fn(&str, &[Vec<u8>], u32) -> Result<Resp, StepError>>;

/// The fake fleet: `answer(node, request, how many times this node got this subcommand
/// before)`.
struct Fake {
    answer: Answer,
    log: RefCell<Vec<String>>,
    seen: RefCell<Vec<(String, String)>>,
    now: Cell<u64>,
    decided: RefCell<Decided>,
    forgotten: RefCell<Vec<String>>,
    refuses: RefCell<Option<String>>,
}

impl Fake {
    fn new(answer: impl Fn(&str, &[Vec<u8>], u32) -> Result<Resp, StepError> + 'static) -> Fake {
        Fake {
            answer: Box::new(answer),
            log: RefCell::default(),
            seen: RefCell::default(),
            now: Cell::new(1000),
            decided: RefCell::new(Decided::Commit),
            forgotten: RefCell::default(),
            refuses: RefCell::default(),
        }
    }

    fn log(&self) -> Vec<String> {
        self.log.borrow().clone()
    }

    fn ask(&self, at: &Endpoint, args: &[Vec<u8>]) -> Result<Resp, StepError> {
        let sub = String::from_utf8_lossy(args.get(1).map_or(&b""[..], |a| a)).into_owned();
        let key = (at.name.clone(), sub.clone());
        let before = self.seen.borrow().iter().filter(|s| **s == key).count();
        self.seen.borrow_mut().push(key);
        self.log.borrow_mut().push(format!("{} {sub}", at.name));
        (self.answer)(&at.name, args, u32::try_from(before).unwrap())
    }
}

impl Fleet for Fake {
    fn control(
        &self,
        at: &Endpoint,
        args: Vec<Vec<u8>>,
    ) -> impl Future<Output = Result<Resp, StepError>> {
        ready(self.ask(at, &args))
    }

    fn decide(&self, txn: &Txn) -> impl Future<Output = Decided> {
        self.log.borrow_mut().push(format!("DECIDE {}", txn.txid));
        ready(self.decided.borrow().clone())
    }

    fn forget(&self, txid: &str) -> impl Future<Output = ()> {
        self.forgotten.borrow_mut().push(txid.to_string());
        ready(())
    }

    fn preparing(&self, _txid: &str, deadline_ms: u64) {
        assert!(deadline_ms > self.now.get());
    }

    fn pause(&self, ms: u64) -> impl Future<Output = ()> {
        assert!(ms > 0);
        self.now.set(self.now.get() + ms);
        ready(())
    }

    fn now_ms(&self) -> u64 {
        self.now.get()
    }

    fn random(&self, n: u64) -> u64 {
        n / 2
    }

    fn refuses_to_coordinate(&self) -> Option<String> {
        self.refuses.borrow().clone()
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the fake fleet answers at once"),
    }
}

fn c(words: &[&str]) -> Command {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

fn ok() -> Resp {
    Resp::Simple(b"OK".to_vec())
}

fn sub(args: &[Vec<u8>]) -> &[u8] {
    args.get(1).map_or(&b""[..], |a| a)
}

/// A transaction: `SET a 1` at n1, `INCR b` at n2 (or only n1's), `w` watched at n1.
fn txn(owners: usize, watched: bool) -> Txn {
    let mut queue = vec![Queued::Whole {
        owner: endpoint("n1"),
        command: c(&["SET", "a", "1"]),
    }];
    if owners > 1 {
        queue.push(Queued::Whole {
            owner: endpoint("n2"),
            command: c(&["INCR", "b"]),
        });
    }
    let watches = if watched {
        vec![(endpoint("n1"), vec![b"w".to_vec()])]
    } else {
        Vec::new()
    };
    Txn::build("me/1".into(), &watches, queue)
}

/// Every owner prepares, commits with one reply per command.
fn willing(_: &str, args: &[Vec<u8>], _: u32) -> Result<Resp, StepError> {
    Ok(match sub(args) {
        b"PREPARE" => Resp::Simple(b"PREPARED".to_vec()),
        b"COMMIT" => {
            let n: usize = String::from_utf8_lossy(&args[3]).parse().unwrap();
            Resp::Array(vec![ok(); n])
        }
        _ => ok(),
    })
}

#[test]
fn one_owner_applies_and_a_lock_there_is_waited_out() {
    // Without watches: APPLY with no txid ("-").
    let fake = Fake::new(|_, args, before| {
        assert_eq!(args, wire::apply("-", &[], &[c(&["SET", "a", "1"])]));
        Ok(if before == 0 {
            Resp::Error(b"LOCKED other/7".to_vec())
        } else {
            Resp::Array(vec![ok()])
        })
    });
    let mut t = txn(1, false);
    t.txid = String::new();
    assert_eq!(
        block_on(run(&t, &fake, 100)),
        Outcome::Committed(Ok(vec![ok()]))
    );
    assert_eq!(fake.log(), vec!["n1 APPLY", "n1 APPLY"]);
    assert!(fake.now.get() > 1000);
    // With watches, a refused APPLY keeps them: tried again too, then (lock-ms passed) the
    // watches dropped and nil, not TRYAGAIN.
    let fake = Fake::new(|_, args, _| {
        Ok(match sub(args) {
            b"APPLY" => Resp::Error(b"LOCKED other/7".to_vec()),
            _ => ok(),
        })
    });
    assert_eq!(
        block_on(run(&txn(1, true), &fake, 100)),
        Outcome::LockedWatched("LOCKED other/7".into())
    );
    let log = fake.log();
    assert!(log.len() > 3);
    assert!(fake.now.get() >= 1100);
    assert_eq!(log.last().map(String::as_str), Some("n1 UNWATCH"));
    assert!(
        log[..log.len() - 1].iter().all(|l| l == "n1 APPLY"),
        "{log:?}"
    );
    // Freed within lock-ms: applied with its watches, no UNWATCH.
    let fake = Fake::new(|_, args, before| {
        Ok(match sub(args) {
            b"APPLY" if before < 2 => Resp::Error(b"LOCKED other/7".to_vec()),
            b"APPLY" => Resp::Array(vec![ok()]),
            _ => ok(),
        })
    });
    assert_eq!(
        block_on(run(&txn(1, true), &fake, 100)),
        Outcome::Committed(Ok(vec![ok()]))
    );
    assert_eq!(fake.log(), vec!["n1 APPLY"; 3]);
    let refused = Fake::new(|_, _, _| Ok(Resp::Error(b"MOVED key 'a' is not here".to_vec())));
    assert_eq!(
        block_on(run(&txn(1, false), &refused, 100)),
        Outcome::Failed("MOVED key 'a' is not here".into())
    );
}

#[test]
fn one_owner_with_watches_applies() {
    let fake = Fake::new(|_, args, _| {
        assert_eq!(
            args,
            wire::apply("me/1", &[b"w".to_vec()], &[c(&["SET", "a", "1"])])
        );
        Ok(Resp::Null)
    });
    assert_eq!(block_on(run(&txn(1, true), &fake, 100)), Outcome::Watched);
    let fake = Fake::new(|_, _, _| Ok(Resp::Array(vec![ok()])));
    assert_eq!(
        block_on(run(&txn(1, true), &fake, 100)),
        Outcome::Committed(Ok(vec![ok()]))
    );
}

#[test]
fn all_prepared_decides_then_commits_and_forgets() {
    let fake = Fake::new(willing);
    let out = block_on(run(&txn(2, true), &fake, 100));
    assert_eq!(out, Outcome::Committed(Ok(vec![ok(), ok()])));
    assert_eq!(
        fake.log(),
        vec![
            "n1 PREPARE",
            "n2 PREPARE",
            "DECIDE me/1",
            "n1 COMMIT",
            "n2 COMMIT"
        ]
    );
    assert_eq!(*fake.forgotten.borrow(), vec!["me/1".to_string()]);
}

#[test]
fn a_watched_key_written_aborts_everywhere_and_replies_nil() {
    let fake = Fake::new(|node, args, _| {
        Ok(match (node, sub(args)) {
            ("n2", b"PREPARE") => Resp::Error(b"WATCHED key 'w'".to_vec()),
            (_, b"PREPARE") => Resp::Simple(b"PREPARED".to_vec()),
            _ => ok(),
        })
    });
    assert_eq!(block_on(run(&txn(2, true), &fake, 100)), Outcome::Watched);
    assert_eq!(
        fake.log(),
        vec!["n1 PREPARE", "n2 PREPARE", "n1 ABORT", "n2 ABORT"]
    );
}

#[test]
fn a_lock_is_waited_out_then_tryagain() {
    // Locked twice, then free.
    let fake = Fake::new(|node, args, before| match (node, sub(args)) {
        ("n1", b"PREPARE") if before < 2 => Ok(Resp::Error(b"LOCKED other/7".to_vec())),
        _ => willing(node, args, before),
    });
    let out = block_on(run(&txn(2, false), &fake, 100));
    assert_eq!(out, Outcome::Committed(Ok(vec![ok(), ok()])));
    let log = fake.log();
    assert_eq!(log.iter().filter(|l| *l == "n2 ABORT").count(), 2);
    assert_eq!(log.iter().filter(|l| l.ends_with("PREPARE")).count(), 6);
    assert!(fake.now.get() > 1000 && fake.now.get() < 1100);
    // Locked for good: TRYAGAIN once lock-ms has passed, every prepared part aborted.
    let fake = Fake::new(|node, args, before| match (node, sub(args)) {
        ("n2", b"PREPARE") => Ok(Resp::Error(b"LOCKED other/7".to_vec())),
        _ => willing(node, args, before),
    });
    match block_on(run(&txn(2, false), &fake, 100)) {
        Outcome::Locked(line) => assert!(line.starts_with("TRYAGAIN"), "{line}"),
        other => panic!("{other:?}"),
    }
    assert!(fake.now.get() >= 1100);
    let log = fake.log();
    let prepares = log.iter().filter(|l| *l == "n1 PREPARE").count();
    assert_eq!(log.iter().filter(|l| *l == "n1 ABORT").count(), prepares);
    assert!(!log
        .iter()
        .any(|l| l.contains("DECIDE") || l.contains("COMMIT")));
}

#[test]
fn a_lock_with_watched_keys_is_not_waited_out_and_replies_nil() {
    // The ABORT dropped the watches everywhere: nil (the client reads again), not TRYAGAIN.
    let fake = Fake::new(|node, args, before| match (node, sub(args)) {
        ("n2", b"PREPARE") => Ok(Resp::Error(b"LOCKED other/7".to_vec())),
        _ => willing(node, args, before),
    });
    assert_eq!(
        block_on(run(&txn(2, true), &fake, 100)),
        Outcome::LockedWatched("at node n2".into())
    );
    assert_eq!(
        fake.log(),
        vec!["n1 PREPARE", "n2 PREPARE", "n1 ABORT", "n2 ABORT"]
    );
    assert_eq!(fake.now.get(), 1000);
}

#[test]
fn an_owner_that_fails_aborts_everywhere() {
    let fake = Fake::new(|node, args, before| match (node, sub(args)) {
        ("n2", b"PREPARE") => Err(StepError::of_kind(
            &endpoint("n2"),
            "no reply within 1000 ms",
            StepErrorKind::Timeout,
        )),
        _ => willing(node, args, before),
    });
    match block_on(run(&txn(2, false), &fake, 100)) {
        Outcome::Failed(line) => assert!(line.contains("node n2"), "{line}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        fake.log(),
        vec!["n1 PREPARE", "n2 PREPARE", "n1 ABORT", "n2 ABORT"]
    );
}

#[test]
fn a_refused_decision_aborts_and_an_unsure_one_sends_nothing_more() {
    let fake = Fake::new(willing);
    *fake.decided.borrow_mut() = Decided::Refused("ERR aborted: an owner asked".into());
    assert_eq!(
        block_on(run(&txn(2, false), &fake, 100)),
        Outcome::Failed("ERR aborted: an owner asked".into())
    );
    assert!(fake
        .log()
        .ends_with(&["n1 ABORT".into(), "n2 ABORT".into()]));
    let fake = Fake::new(willing);
    *fake.decided.borrow_mut() = Decided::Unsure("ERR no replica acknowledged".into());
    assert_eq!(
        block_on(run(&txn(2, false), &fake, 100)),
        Outcome::Failed("ERR no replica acknowledged".into())
    );
    assert_eq!(fake.log().last().map(String::as_str), Some("DECIDE me/1"));
}

#[test]
fn a_commit_is_sent_again_and_kept_when_an_owner_stays_silent() {
    let once = Fake::new(|node, args, before| match (node, sub(args)) {
        ("n2", b"COMMIT") if before == 0 => {
            Err(StepError::new(&endpoint("n2"), "connection reset"))
        }
        _ => willing(node, args, before),
    });
    assert_eq!(
        block_on(run(&txn(2, false), &once, 100)),
        Outcome::Committed(Ok(vec![ok(), ok()]))
    );
    assert_eq!(once.forgotten.borrow().len(), 1);
    let silent = Fake::new(|node, args, before| match (node, sub(args)) {
        ("n2", b"COMMIT") => Err(StepError::new(&endpoint("n2"), "connection reset")),
        _ => willing(node, args, before),
    });
    match block_on(run(&txn(2, false), &silent, 100)) {
        Outcome::Committed(Err(line)) => assert!(line.contains("node n2"), "{line}"),
        other => panic!("{other:?}"),
    }
    let commits = silent.log().iter().filter(|l| *l == "n2 COMMIT").count();
    assert_eq!(commits, COMMIT_TRIES as usize);
    assert!(silent.forgotten.borrow().is_empty());
}

#[test]
fn an_owner_applied_but_not_at_a_replica_is_kept_not_retried_at_once() {
    // `APPLIED ...`: the part is applied at n2, no replica of n2 has it; the decision is kept
    // for the resend, and the COMMIT not sent again at once (the owner waited already).
    let fake = Fake::new(|node, args, before| match (node, sub(args)) {
        ("n2", b"COMMIT") => Ok(Resp::Error(
            b"APPLIED me/1 is applied here, but no replica acknowledged it".to_vec(),
        )),
        _ => willing(node, args, before),
    });
    match block_on(run(&txn(2, false), &fake, 100)) {
        Outcome::Committed(Err(line)) => {
            assert!(line.contains("node n2 has not confirmed"), "{line}");
            assert!(line.contains("APPLIED"), "{line}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fake.log().iter().filter(|l| *l == "n2 COMMIT").count(), 1);
    assert!(fake.forgotten.borrow().is_empty());
}

#[test]
fn a_single_owner_block_at_no_replica_is_committed_but_not_confirmed() {
    // `NOREPLICAS the transaction is applied ...`: the one owner applied the block, no replica of it has it; committed
    // (not an abort, not sent again: no decision to keep), the owner's line relayed.
    let fake = Fake::new(|node, args, before| match (node, sub(args)) {
        ("n1", b"APPLY") => Ok(Resp::Error(
            b"NOREPLICAS the transaction is applied at node n1, but ...".to_vec(),
        )),
        _ => willing(node, args, before),
    });
    match block_on(run(&txn(1, false), &fake, 100)) {
        Outcome::Committed(Err(line)) => assert!(
            line.starts_with("NOREPLICAS the transaction is applied"),
            "{line}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(fake.log(), vec!["n1 APPLY".to_string()]);
}

#[test]
fn split_commands_merge_across_owners() {
    let how = splittable(b"DEL").unwrap();
    let args: Vec<&[u8]> = vec![b"DEL", b"x", b"y"];
    let pieces = split::split(&args, how, &[0, 1]);
    let queue = vec![Queued::Split {
        merge: how.merge,
        pieces: vec![
            (endpoint("n1"), pieces[0].clone()),
            (endpoint("n2"), pieces[1].clone()),
        ],
        keys: 2,
    }];
    let txn = Txn::build("me/2".into(), &[], queue);
    let fake = Fake::new(|node, args, before| match sub(args) {
        b"COMMIT" => Ok(Resp::Array(vec![Resp::Int(1)])),
        _ => willing(node, args, before),
    });
    assert_eq!(
        block_on(run(&txn, &fake, 100)),
        Outcome::Committed(Ok(vec![Resp::Int(2)]))
    );
}

#[test]
fn a_node_that_may_not_coordinate_prepares_nothing() {
    // Several owners: refused before any PREPARE, the watches dropped, nothing decided.
    let line = "ERR shard.txn: node me is not in the ring: ...";
    let fake = Fake::new(willing);
    *fake.refuses.borrow_mut() = Some(line.into());
    assert_eq!(
        block_on(run(&txn(2, true), &fake, 100)),
        Outcome::Failed(line.into())
    );
    assert_eq!(fake.log(), vec!["n1 UNWATCH"]);
    let fake = Fake::new(willing);
    *fake.refuses.borrow_mut() = Some(line.into());
    assert_eq!(
        block_on(run(&txn(2, false), &fake, 100)),
        Outcome::Failed(line.into())
    );
    assert!(fake.log().is_empty(), "{:?}", fake.log());
    // One owner: its APPLY needs no decision of this node, sent as before.
    let fake = Fake::new(|_, _, _| Ok(Resp::Array(vec![ok()])));
    *fake.refuses.borrow_mut() = Some(line.into());
    assert_eq!(
        block_on(run(&txn(1, false), &fake, 100)),
        Outcome::Committed(Ok(vec![ok()]))
    );
    assert_eq!(fake.log(), vec!["n1 APPLY"]);
}
