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
//! resharding moves its key; a command that does not split, over keys of several owners, is
//! gathered at this node as one transaction across them (`txn::coord::gather`).
//! A keyless command of the data (`DBSIZE`, `KEYS`, `SCAN`, `RANDOMKEY`, the flushes, `SCRIPT`,
//! `FUNCTION`, `PUBLISH`) is answered for the whole fleet (`route::keyless`); any other keyless
//! command runs here, as this server's own.

use crate::command;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::host::register::{arg, many, opt, Arg, CommandSpec, Kind};
use crate::route::call::Handled;
use crate::route::command_table::Carried;

pub fn call(call: &Call) -> CmdResult {
    // Inside SHARD.MULTI the call is queued (the command filter left it alone).
    if crate::txn::coord::exec::queueing(call) {
        return crate::txn::coord::exec::queue_call(call);
    }
    if call.args.len() < 2 {
        return Err(CmdError::err(
            "SHARD.CALL needs a command: SHARD.CALL command [key] [arg ...]",
        ));
    }
    let (start, wait) = crate::route::wait::prefix(&call.args)?;
    let name = call.args.get(start);
    if crate::route::keyless::subscribes(name) {
        return Err(CmdError::err(format!(
            "'{}' subscribes a connection: send it to a node directly (PUBLISH and SPUBLISH reach the subscribers of every node)",
            crate::host::args::printable(name).to_ascii_lowercase()
        )));
    }
    let sub = (start + 1 < call.args.len()).then(|| call.args.get(start + 1));
    if let Some(kind) = crate::route::keyless::of(name, sub) {
        if wait.is_some() {
            return Err(CmdError::err(
                "SHARD.CALL WAIT takes keyed commands: a keyless command answered for the fleet waits for no replica",
            ));
        }
        return crate::route::keyless_call::route(call, start, kind);
    }
    let command = Carried::at_any(call, start)?;
    if crate::route::command_table::reads_unnamed_keys(call.args.len() - start, |i| {
        (i + start < call.args.len()).then(|| call.args.get(i + start))
    }) {
        return Err(crate::route::command_table::unnamed_keys_refusal(
            &command.name_text,
        ));
    }
    if command.positions.is_empty() {
        // WAIT waits for a routed write: a command with no key has none to wait for.
        if wait.is_some() {
            return Err(CmdError::err(format!(
                "'{}' has no key here: SHARD.CALL routes commands by their keys",
                command.name_text
            )));
        }
        // A harmless keyless command, or a script with no key (`EVAL script 0`): this
        // server's own, as one server would run it; any other is the node's to be sent.
        if !crate::route::keyless::runs_here(name, sub) {
            return Err(CmdError::err(format!(
                "'{}' has no key: SHARD.CALL answers DBSIZE, KEYS, SCAN, RANDOMKEY, the flushes, SCRIPT, FUNCTION and PUBLISH for the whole fleet and runs PING, ECHO, TIME and scripts without keys here; send other server commands to a node directly",
                command.name_text
            )));
        }
        return crate::host::caller::pass_through(call, name, start + 1);
    }
    match crate::route::call::route(call, &command, wait)? {
        Handled::Routed => Ok(()),
        Handled::Gather => crate::txn::coord::gather::gather(call, &command),
    }
}

pub static CALL: CommandSpec = command! {
    name: "shard.call",
    handler: call,
    flags: "may-replicate deny-script blocking",
    arity: -2,
    summary: "Runs a command on the owner of its keys (multi-key commands split by owner, other commands over keys of several owners gathered as a transaction), a keyless one for the whole fleet (DBSIZE, KEYS, SCAN, RANDOMKEY, the flushes, SCRIPT, FUNCTION, PUBLISH) or here (PING, INFO...); with WAIT, replies once that many of the owner's replicas have the write",
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
    many(c"arg", Kind::Str, true),
];

/// `WAIT numreplicas timeout-ms`, as Redis's `WAIT` (timeout 0: for ever).
static WAIT_ARGS: &[Arg] = &[
    arg(c"numreplicas", Kind::Int),
    arg(c"timeout-ms", Kind::Int),
];
