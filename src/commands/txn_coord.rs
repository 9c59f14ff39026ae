//! The coordinator's subcommands of `SHARD.TXN` (the container is the owner side's,
//! `commands::txn`, which lists these beside its own): `SHARD.TXN DECIDE txid COMMIT db
//! nparts (owner ncmds (argc arg...)...)...` and `SHARD.TXN DECIDE txid ABORT` (a decision, sent by
//! the coordinator to itself, replicated and written to the AOF as it is), `SHARD.TXN FORGET
//! txid` (a commit carried out everywhere), and `SHARD.TXN STATUS txid` (an owner in doubt
//! asks: `commit`, `abort` or `pending`; an abort presumed here is recorded and replicated as
//! `SHARD.TXN DECIDE txid ABORT`, so that the answer never changes; refused with `WRONGNODE`
//! at a node whose name is not the txid's). `txn::coord::book`
//! keeps the decisions.

use crate::command;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::register::{arg, many, Arg, CommandSpec, Kind};
use crate::txn::coord::{self, book};

fn txid_of(call: &Call) -> Result<String, CmdError> {
    std::str::from_utf8(call.args.get(2))
        .map(str::to_string)
        .map_err(|_| CmdError::err("a txid is text: node/hex"))
}

pub fn decide(call: &Call) -> CmdResult {
    let args: Vec<&[u8]> = (2..call.args.len()).map(|i| call.args.get(i)).collect();
    let (txid, record) = book::parse_decision(&args).map_err(CmdError::err)?;
    book::with(|b| b.decide(&txid, record)).map_err(|line| {
        let (code, rest) = line.split_once(' ').unwrap_or(("ERR", &line));
        CmdError::code(code, rest)
    })?;
    call.ctx.replicate_verbatim();
    call.reply.ok();
    Ok(())
}

pub fn forget(call: &Call) -> CmdResult {
    let txid = txid_of(call)?;
    book::with(|b| b.forget(&txid));
    call.ctx.replicate_verbatim();
    call.reply.ok();
    Ok(())
}

pub fn status(call: &Call) -> CmdResult {
    let txid = txid_of(call)?;
    // Only the coordinator named in the txid answers (an owner may ask at an address its
    // PREPARE gave, which another server may hold now): another node's "abort" presumed here
    // could be wrong.
    let self_name = crate::state::lock().config.ring.self_name.clone();
    let named = txid.split_once('/').map_or("", |(name, _)| name);
    if named != self_name {
        return Err(CmdError::code(
            "WRONGNODE",
            format!("{txid} is coordinated by node '{named}', and this node is '{self_name}'"),
        ));
    }
    let (status, recorded) = coord::status(&txid);
    if recorded {
        call.ctx.replicate(
            "SHARD.TXN",
            &[&b"DECIDE"[..], txid.as_bytes(), b"ABORT"][..],
        );
    }
    call.reply.simple(status.word().as_bytes());
    Ok(())
}

static DECIDE_ARGS: &[Arg] = &[
    arg(c"txid", Kind::Str),
    arg(c"decision", Kind::Str),
    many(c"part", Kind::Str, true),
];

static TXID_ARGS: &[Arg] = &[arg(c"txid", Kind::Str)];

pub static DECIDE: CommandSpec = command! {
    name: "shard.txn|decide",
    handler: decide,
    flags: "write",
    arity: -4,
    summary: "Internal: records a transaction coordinator's decision (commit with every owner's part, or abort)",
    complexity: "O(N) with N the arguments",
    args: DECIDE_ARGS,
    acl: "admin dangerous slow",
};

pub static FORGET: CommandSpec = command! {
    name: "shard.txn|forget",
    handler: forget,
    flags: "write",
    arity: 3,
    summary: "Internal: forgets a coordinator's decision that every owner carried out",
    complexity: "O(1)",
    args: TXID_ARGS,
    acl: "admin dangerous slow",
};

pub static STATUS: CommandSpec = command! {
    name: "shard.txn|status",
    handler: status,
    flags: "write fast",
    arity: 3,
    summary: "What the coordinator decided for a transaction: commit, abort (presumed once its prepare deadline passed, and recorded) or pending; WRONGNODE at a node not named in the txid",
    complexity: "O(1)",
    args: TXID_ARGS,
    acl: "admin dangerous slow",
};
