//! `SHARD.CALL command arg ...`: runs a command on the owner of its keys.
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
use crate::host::register::{arg, many, Arg, CommandSpec, Kind};
use crate::route::command_table::Carried;

pub fn call(call: &Call) -> CmdResult {
    if call.args.len() < 2 {
        return Err(CmdError::err(
            "SHARD.CALL needs a command and its key: SHARD.CALL command key [arg ...]",
        ));
    }
    let command = Carried::of(call)?;
    crate::route::call::route(call, &command)
}

pub static CALL: CommandSpec = command! {
    name: "shard.call",
    handler: call,
    flags: "may-replicate deny-script blocking",
    arity: -3,
    summary: "Runs a command on the owner of its keys (multi-key commands split by owner)",
    complexity: "Depends on the command",
    args: CALL_ARGS,
    acl: "",
};

static CALL_ARGS: &[Arg] = &[
    arg(c"command", Kind::Str),
    arg(c"key", Kind::Str),
    many(c"arg", Kind::Str, true),
];
