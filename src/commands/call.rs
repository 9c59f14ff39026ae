//! `SHARD.CALL [WAIT numreplicas timeout-ms] command arg ...`: runs a command on the owner of
//! its keys; with `WAIT`, replies once that many of the owner's replicas acknowledged the write
//! (`route::wait`), else `NOREPLICAS`.
//!
//! The keys are found as the server finds them (its command table and key specs), so any
//! keyed command routes: `GET`, `EVAL ... numkeys`, `XREAD ... STREAMS`, `OBJECT ENCODING`.
//! Keys all here, no resharding step pending: the command filter (`route::filter`) has already
//! made it the plain command, unless this is the first call of that command or its keys move
//! with its arguments; then it runs here, as the calling user. Otherwise the call is routed
//! (`route::call`): forwarded whole, split over owners, read at a replica, or planned while a
//! resharding moves its key; anything else with keys on several nodes is refused, naming them.

use crate::command;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::host::register::{arg, many, opt, Arg, CommandSpec, Kind};
use crate::route::command_table::Carried;

pub fn call(call: &Call) -> CmdResult {
    // Inside SHARD.MULTI the call is queued (the command filter left it alone).
    if crate::txn::coord::exec::queueing(call) {
        return crate::txn::coord::exec::queue_call(call);
    }
    if call.args.len() < 2 {
        return Err(CmdError::err(
            "SHARD.CALL needs a command and its key: SHARD.CALL command key [arg ...]",
        ));
    }
    let (start, wait) = crate::route::wait::prefix(&call.args)?;
    let command = Carried::at(call, start)?;
    crate::route::call::route(call, &command, wait)
}

pub static CALL: CommandSpec = command! {
    name: "shard.call",
    handler: call,
    flags: "may-replicate deny-script blocking",
    arity: -3,
    summary: "Runs a command on the owner of its keys (multi-key commands split by owner); with WAIT, replies once that many of the owner's replicas have the write",
    complexity: "Depends on the command",
    args: CALL_ARGS,
    acl: "",
};

static CALL_ARGS: &[Arg] = &[
    Arg {
        subargs: WAIT_ARGS,
        ..opt(c"wait", c"WAIT", Kind::Block)
    },
    arg(c"command", Kind::Str),
    arg(c"key", Kind::Str),
    many(c"arg", Kind::Str, true),
];

/// `WAIT numreplicas timeout-ms`, as Redis's `WAIT` (timeout 0: for ever).
static WAIT_ARGS: &[Arg] = &[
    arg(c"numreplicas", Kind::Int),
    arg(c"timeout-ms", Kind::Int),
];
