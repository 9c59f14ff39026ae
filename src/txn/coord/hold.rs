//! A test's hold of this node's transactions at a named step of the two-phase commit
//! (`SHARD.DEBUG TXN-HOLD read|scratch|prepared|decided|committed-one|OFF`), so that a test can kill,
//! stop or fail over a node at that exact step (as `SHARD.DEBUG FLEET-HOLD` holds the fleet
//! coordinator):
//!
//! - `read`: a gathered command's keys are watched and read at their owners (`SHARD.TXN
//!   READ`), nothing prepared yet;
//! - `scratch`: a gathered command's copies are restored in the scratch database and kept
//!   there (the command not run yet) across turns of the event loop (`gather_step`);
//! - `prepared`: every owner replied `PREPARED`, the decision is not recorded yet;
//! - `decided`: the decision to commit is recorded (and acknowledged by a replica), no
//!   `COMMIT` sent yet;
//! - `committed-one`: one owner's `COMMIT` was sent, the others' wait;
//! - `kill-after-commit`: not a hold: the node kills itself (SIGKILL) the moment the bytes of a
//!   transaction's first `COMMIT` are written to its owner's socket (`net::pool`), so that a
//!   test sees that the decision was in the AOF before any `COMMIT` left (`turn`).
//!
//! Kept in memory only (a restart lifts it); the transactions waiting at it are counted
//! (`SHARD.DEBUG TXN-HOLD HELD`). A held transaction waits on the event loop, never blocking
//! the main thread.

use std::cell::Cell;

/// A step of the two-phase commit a test can hold transactions at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Read,
    Scratch,
    Prepared,
    Decided,
    CommittedOne,
    KillAfterCommit,
}

impl Step {
    pub fn named(name: &str) -> Option<Step> {
        match name {
            "read" => Some(Step::Read),
            "scratch" => Some(Step::Scratch),
            "prepared" => Some(Step::Prepared),
            "decided" => Some(Step::Decided),
            "committed-one" => Some(Step::CommittedOne),
            "kill-after-commit" => Some(Step::KillAfterCommit),
            _ => None,
        }
    }
}

thread_local! {
    static HOLD: Cell<Option<Step>> = const { Cell::new(None) };
    static HELD: Cell<u64> = const { Cell::new(0) };
}

/// Holds this node's transactions at `step` (`None`: lifts the hold).
pub fn set(step: Option<Step>) {
    HOLD.with(|h| h.set(step));
    FIRST.with(|f| f.borrow_mut().clear());
}

/// Whether transactions are held at `step` now.
pub fn holds(step: Step) -> bool {
    HOLD.with(Cell::get) == Some(step)
}

/// How many transactions wait at the hold now.
pub fn held() -> u64 {
    HELD.with(Cell::get)
}

/// Counts one transaction as waiting at the hold while the guard lives.
pub struct Waiting(());

impl Waiting {
    pub fn start() -> Waiting {
        HELD.with(|h| h.set(h.get() + 1));
        Waiting(())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

thread_local! {
    /// The txids one `COMMIT` of which went out while held at `committed-one`.
    static FIRST: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether the control request `args` is a `COMMIT` that waits at `committed-one`: every
/// `COMMIT` of a txid but its first while the hold is on.
pub fn commit_waits(args: &[Vec<u8>]) -> bool {
    if !holds(Step::CommittedOne) {
        return false;
    }
    let (Some(verb), Some(txid)) = (args.get(1), args.get(2)) else {
        return false;
    };
    if !verb.eq_ignore_ascii_case(b"COMMIT") {
        return false;
    }
    FIRST.with(|f| {
        let mut f = f.borrow_mut();
        if f.contains(txid) {
            return true;
        }
        f.push(txid.clone());
        false
    })
}
