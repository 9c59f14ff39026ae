//! `SHARD.TXN WATCH|READ|UNWATCH|APPLY|PREPARE|COMMIT|ABORT|SYNC|STATUS`: the owner protocol of
//! transactions across nodes (internal, node to node: docs/transactions.md), carried out by
//! `txn::owner::run`; STATUS, DECIDE and FORGET are the coordinator's (`commands::txn_coord`). And `SHARD.LOCKED command ...`: what
//! the command filter makes of a client's command of a key a transaction locks
//! (`txn::owner::marks`).

use crate::command;
use crate::commands::{txn_coord, Call, CmdResult};
use crate::host::register::{arg, many, Arg, CommandSpec, Kind};
use crate::txn::owner::run;

pub static TXN: CommandSpec = command! {
    name: "shard.txn",
    container,
    summary: "Internal, node to node: the owner's side of transactions across nodes",
    subcommands: &[&TXN_WATCH, &TXN_READ, &TXN_UNWATCH, &TXN_APPLY, &TXN_PREPARE, &TXN_COMMIT, &TXN_ABORT, &TXN_SYNC, &txn_coord::STATUS, &txn_coord::DECIDE, &txn_coord::FORGET],
};

pub static TXN_WATCH: CommandSpec = command! {
    name: "shard.txn|watch",
    handler: run::watch,
    flags: "fast",
    arity: -5,
    summary: "Internal: watches keys for a transaction at their owner, for ttl-ms without use",
    complexity: "O(N) with N the keys",
    args: WATCH_ARGS,
    acl: "admin dangerous slow",
};

pub static TXN_READ: CommandSpec = command! {
    name: "shard.txn|read",
    handler: run::read,
    flags: "readonly",
    arity: -5,
    summary: "Internal: watches keys for a transaction at their owner, as WATCH, and reads each (its DUMP payload and PEXPIRETIME) in the same command",
    complexity: "O(N) with N the keys, plus DUMP's",
    args: WATCH_ARGS,
    acl: "admin dangerous slow",
};

pub static TXN_UNWATCH: CommandSpec = command! {
    name: "shard.txn|unwatch",
    handler: run::unwatch,
    flags: "fast",
    arity: 3,
    summary: "Internal: drops a transaction's watches",
    complexity: "O(N) with N the keys watched",
    args: TXID_ARGS,
    acl: "admin dangerous slow",
};

pub static TXN_APPLY: CommandSpec = command! {
    name: "shard.txn|apply",
    handler: run::apply,
    flags: "write",
    arity: -5,
    summary: "Internal: a transaction of one owner: nil if a watched key was written, else the commands' replies, run as one atomic block",
    complexity: "Depends on the commands",
    args: APPLY_ARGS,
    acl: "admin dangerous slow",
};

pub static TXN_PREPARE: CommandSpec = command! {
    name: "shard.txn|prepare",
    handler: run::prepare,
    flags: "write",
    arity: -6,
    summary: "Internal: checks a transaction's part and locks its keys, recorded durably (PREPARED, or TRYAGAIN, MOVED, WATCHED, LOCKED)",
    complexity: "O(N) with N the arguments",
    args: PREPARE_ARGS,
    acl: "admin dangerous slow",
};

pub static TXN_COMMIT: CommandSpec = command! {
    name: "shard.txn|commit",
    handler: run::commit,
    flags: "write",
    arity: -3,
    summary: "Internal: applies a prepared part as one atomic block and unlocks it (DONE if applied already)",
    complexity: "Depends on the commands",
    args: COMMIT_ARGS,
    acl: "admin dangerous slow",
};

pub static TXN_ABORT: CommandSpec = command! {
    name: "shard.txn|abort",
    handler: run::abort,
    flags: "write",
    arity: 3,
    summary: "Internal: drops a prepared part and its watches, unlocking its keys",
    complexity: "O(N) with N the keys",
    args: TXID_ARGS,
    acl: "admin dangerous slow",
};

pub static TXN_SYNC: CommandSpec = command! {
    name: "shard.txn|sync",
    handler: crate::txn::owner::acked::sync,
    flags: "may-replicate fast",
    arity: 2,
    summary: "Internal: replicates a PING, so that a WAIT after it on the same connection waits for everything this server replicated before it",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};

/// `SHARD.LOCKED command ...`: a `SHARD.CALL` (or a route-plain client's `SHARD.PLAIN` /
/// `SHARD.PLAINAS`) of a client inside `SHARD.MULTI` is queued (it
/// touches no key now; the filter cannot tell the client on every server); anything else waits
/// for the lock (`run::locked`).
pub fn locked(call: &Call) -> CmdResult {
    let inner = call.args.get(1);
    let plain = inner.eq_ignore_ascii_case(b"shard.plain");
    let plain_as = inner.eq_ignore_ascii_case(b"shard.plainas");
    if plain || plain_as || inner.eq_ignore_ascii_case(b"shard.call") {
        let carried = Call {
            ctx: call.ctx,
            args: call.args.skip(1),
            reply: call.reply,
        };
        if crate::txn::coord::exec::queueing(&carried) {
            // A route-plain client's command inside its transaction (`SHARD.PLAIN ...`): queued
            // as its handler queues it, after the checks that handler makes; never run now,
            // outside the transaction, once the lock ends.
            return match (plain, plain_as) {
                (true, _) => crate::commands::plain::plain(&carried),
                (_, true) => crate::commands::plain::plain_as(&carried),
                _ => crate::txn::coord::exec::queue_call(&carried),
            };
        }
    }
    run::locked(call)
}

pub static LOCKED: CommandSpec = command! {
    name: "shard.locked",
    handler: locked,
    flags: "may-replicate blocking",
    arity: -2,
    summary: "Internal: a command of a key a transaction locks (the command filter makes it), run once the lock ends, TRYAGAIN after shard.txn-lock-ms",
    complexity: "Depends on the command",
    args: LOCKED_ARGS,
    acl: "read write slow",
};

static TXID_ARGS: &[Arg] = &[arg(c"txid", Kind::Str)];

static WATCH_ARGS: &[Arg] = &[
    arg(c"txid", Kind::Str),
    arg(c"ttl-ms", Kind::Int),
    many(c"key", Kind::Str, false),
];

static APPLY_ARGS: &[Arg] = &[
    arg(c"txid", Kind::Str),
    arg(c"nwatched", Kind::Int),
    many(c"watched-key", Kind::Str, true),
    arg(c"ncmds", Kind::Int),
    many(c"command", Kind::Str, true),
];

static PREPARE_ARGS: &[Arg] = &[
    arg(c"txid", Kind::Str),
    arg(c"lock-ms", Kind::Int),
    arg(c"nwatched", Kind::Int),
    many(c"watched-key", Kind::Str, true),
    arg(c"ncmds", Kind::Int),
    many(c"command", Kind::Str, true),
    Arg {
        token: Some(c"FROM"),
        optional: true,
        ..arg(c"coordinator-address", Kind::Str)
    },
];

static COMMIT_ARGS: &[Arg] = &[
    arg(c"txid", Kind::Str),
    Arg {
        optional: true,
        ..arg(c"ncmds", Kind::Int)
    },
    many(c"command", Kind::Str, true),
];

static LOCKED_ARGS: &[Arg] = &[arg(c"command", Kind::Str), many(c"arg", Kind::Str, true)];
