//! `SHARD.PLAIN command arg ...`: a plain client's command that the command filter handed over
//! under `shard.route-plain yes` (`route::plain`): a keyed command whose keys are not all here,
//! or a keyless command the fleet answers (`route::keyless`). It is run here as it came when
//! the module's own connections sent it (a command another node forwarded), or the replication
//! stream or the AOF; queued when its client is inside a transaction across nodes; answered
//! for the fleet when it is keyless; else routed exactly as `SHARD.CALL command arg ...`.

use redis_module::ContextFlags;

use crate::cluster::clients;
use crate::command;
use crate::host::caller;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::host::register::{arg, many, Arg, CommandSpec, Kind};

pub fn plain(call: &Call) -> CmdResult {
    if call.args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.plain"));
    }
    let name = call.args.get(1);
    let flags = call.ctx.get_flags();
    if flags.contains(ContextFlags::REPLICATED) || flags.contains(ContextFlags::LOADING) {
        return caller::pass_through_obeyed(call, name, 2);
    }
    if clients::is_internal(caller::client_id(call)) {
        return caller::pass_through(call, name, 2);
    }
    crate::commands::call::call(call)
}

pub static COMMAND: CommandSpec = command! {
    name: "shard.plain",
    handler: plain,
    flags: "may-replicate deny-script blocking",
    arity: -2,
    summary: "A plain client's command under shard.route-plain yes, handed over by the command filter: routed to the owner of its keys as SHARD.CALL, or answered for the fleet when keyless",
    complexity: "Depends on the command",
    args: ARGS,
    acl: "read write slow",
};

static ARGS: &[Arg] = &[arg(c"command", Kind::Str), many(c"arg", Kind::Str, true)];
