//! The coordinator of transactions across nodes (`docs/transactions.md`): the node a client
//! is connected to keeps the client's watched keys and queued commands and runs the
//! transaction at the owners of its keys.
//!
//! - `wire`: the `SHARD.TXN` requests it sends and the replies read back, pure.
//! - `plan`: the queued commands gathered into one part per owner, and the replies merged
//!   back in queue order, pure.
//! - `phases`: the phases of `SHARD.EXEC` (one owner's block or `APPLY`; two-phase commit
//!   over several), pure, driven through the `Fleet` trait and tested against a fake fleet.
//! - `book`: the decisions, durable, and `SHARD.TXN STATUS`'s answer from them.
//! - `clients`: each client's transaction by client id (its txid, watches, queue), dropped
//!   when it disconnects; the counters of INFO.
//! - `queue`: a `SHARD.CALL` queued inside `SHARD.MULTI`: checked and placed at queue time.
//! - `local`: the owner side of this node, called directly when it registered (else over a
//!   connection to this node's own address).
//! - `exec`: the glue: `SHARD.WATCH` and `SHARD.EXEC` over the module's connections
//!   (`route::forward`), the decisions sent to this node itself, and the commits carried out
//!   again after a restart or a promotion.
//! - `turn`: the decisions and forgets recorded in this process at the end of the event
//!   loop's turn, before the server writes its AOF, and the `COMMIT`s sent at the next.
//! - `gather`: a command over keys of several owners that does not split, run as an
//!   optimistic transaction across them (its keys watched and read, the command run here on
//!   copies, its writes committed at the owners); `gather_step`: its main-thread step in the
//!   scratch database; `moves`: the pure moves and copies (`RENAME`, `RENAMENX`, `COPY`)
//!   worked out without it.
//! - `hold`: a test's hold at a named step of the two-phase commit (`SHARD.DEBUG TXN-HOLD`).
//!
//! May import: `host`, `net`, `state`, `topology`, `route` and the pure rooms; never
//! `cluster`, `reshard` or `commands`.

pub mod book;
pub mod clients;
pub mod confirm;
pub mod exec;
pub mod fleet;
pub mod gather;
pub mod gather_step;
pub mod hold;
pub mod local;
pub mod moves;
pub mod phases;
pub mod plan;
pub mod queue;
pub mod turn;
pub mod wire;

pub use book::Status;

/// This node's answer for an owner of this very node in doubt (`txn::set_status_hook`): an
/// abort presumed here is recorded (not replicated: a replica promoted without it presumes
/// the same abort, having no prepare of its own under way).
pub fn status_hook(txid: &str) -> Option<crate::txn::Decision> {
    Some(match status(txid).0 {
        Status::Commit => crate::txn::Decision::Commit,
        Status::Abort => crate::txn::Decision::Abort,
        Status::Pending => crate::txn::Decision::Pending,
    })
}

/// `SHARD.TXN STATUS txid`'s answer at this node (`commands::txn_coord::status`):
/// `commit`, `abort` or `pending`; `true` when the abort was recorded by this question, which
/// the caller then replicates as `SHARD.TXN DECIDE txid ABORT` (`commands::txn_coord`).
pub fn status(txid: &str) -> (Status, bool) {
    // A part applied by this node as an owner was decided `commit` (an owner applies only a
    // commit): so answered, even once the decision is forgotten.
    if crate::txn::owner::status(txid) == crate::txn::Decision::Commit {
        return (Status::Commit, false);
    }
    let answer = book::with(|b| b.status(txid, crate::clock::monotonic_ms()));
    if answer.0 == Status::Pending {
        // Perhaps a commit held for a replica (`confirm`): its loop, should none run.
        confirm::kick();
    }
    answer
}
