//! Transactions across nodes, the client's commands (`docs/transactions.md`): `SHARD.WATCH
//! key [key ...]`, `SHARD.UNWATCH`, `SHARD.MULTI`, then `SHARD.CALL command ...` queued
//! (`QUEUED`), `SHARD.EXEC` or `SHARD.DISCARD`: Redis's `WATCH`/`MULTI`/`EXEC` for keys on
//! any node. The transaction itself is `txn::coord`'s; these parse and call it.

use crate::command;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::register::{arg, many, Arg, CommandSpec, Kind};
use crate::txn::coord::exec;

pub fn watch(call: &Call) -> CmdResult {
    if call.args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.watch"));
    }
    let keys: Vec<&[u8]> = (1..call.args.len()).map(|i| call.args.get(i)).collect();
    exec::watch(call, &keys)
}

fn no_args(call: &Call, name: &str) -> CmdResult {
    if call.args.len() != 1 {
        return Err(CmdError::wrong_arity(name));
    }
    Ok(())
}

pub fn unwatch(call: &Call) -> CmdResult {
    no_args(call, "shard.unwatch")?;
    exec::unwatch(call)
}

pub fn multi(call: &Call) -> CmdResult {
    no_args(call, "shard.multi")?;
    exec::multi(call)
}

pub fn discard(call: &Call) -> CmdResult {
    no_args(call, "shard.discard")?;
    exec::discard(call)
}

pub fn exec(call: &Call) -> CmdResult {
    no_args(call, "shard.exec")?;
    exec::exec(call)
}

static WATCH_ARGS: &[Arg] = &[arg(c"key", Kind::Str), many(c"key", Kind::Str, true)];

pub static WATCH: CommandSpec = command! {
    name: "shard.watch",
    handler: watch,
    flags: "may-replicate deny-script blocking",
    arity: -2,
    summary: "Watches keys on any node for the next SHARD.EXEC: it fails (nil) if one is written first",
    complexity: "O(N) with N the keys, one round trip to their owners",
    args: WATCH_ARGS,
    acl: "transaction",
};

pub static UNWATCH: CommandSpec = command! {
    name: "shard.unwatch",
    handler: unwatch,
    flags: "deny-script fast",
    arity: 1,
    summary: "Forgets the keys SHARD.WATCH watches",
    complexity: "O(1)",
    args: &[],
    acl: "transaction",
};

pub static MULTI: CommandSpec = command! {
    name: "shard.multi",
    handler: multi,
    flags: "deny-script fast",
    arity: 1,
    summary: "Starts a transaction across nodes: SHARD.CALLs are queued until SHARD.EXEC",
    complexity: "O(1)",
    args: &[],
    acl: "transaction",
};

pub static DISCARD: CommandSpec = command! {
    name: "shard.discard",
    handler: discard,
    flags: "deny-script fast",
    arity: 1,
    summary: "Drops the commands queued since SHARD.MULTI, and the watches",
    complexity: "O(N) with N the commands queued",
    args: &[],
    acl: "transaction",
};

pub static EXEC: CommandSpec = command! {
    name: "shard.exec",
    handler: exec,
    flags: "may-replicate deny-script blocking",
    arity: 1,
    summary: "Runs the commands queued since SHARD.MULTI at their owners, all or none (two-phase commit over several nodes); nil if a watched key was written",
    complexity: "Depends on the commands queued",
    args: &[],
    acl: "transaction",
};
