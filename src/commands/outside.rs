//! `SHARD.OUTSIDE command arg ...`: a command that may create a key, which the filter hands
//! over on a primary outside its rings (`route::outside`): refused with `TRYAGAIN` when the
//! module's own connections sent it (a write routed here by rings older than the fleet's),
//! else run as it would have run (a plain client's, the replication stream's, the AOF's).

use redis_module::ContextFlags;

use crate::cluster::clients;
use crate::command;
use crate::host::caller;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::host::register::Kind;
use crate::host::register::{arg, many, Arg, CommandSpec};

/// Runs the command it carries, unless the module's own connections sent it to a node outside
/// its rings.
pub fn outside(call: &Call) -> CmdResult {
    if call.args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.outside"));
    }
    let name = call.args.get(1);
    let flags = call.ctx.get_flags();
    if flags.contains(ContextFlags::REPLICATED) || flags.contains(ContextFlags::LOADING) {
        return caller::pass_through_obeyed(call, name, 2);
    }
    if clients::is_internal(caller::client_id(call)) && crate::route::outside::refuses(name) {
        return Err(crate::route::outside::refusal());
    }
    caller::pass_through(call, name, 2)
}

pub static COMMAND: CommandSpec = command! {
    name: "shard.outside",
    handler: outside,
    flags: "may-replicate deny-script",
    arity: -2,
    summary: "A write on a node outside its rings (it left the ring, or has not joined it): refused with TRYAGAIN when another node routed it here, else run",
    complexity: "Depends on the command",
    args: ARGS,
    acl: "write slow",
};

static ARGS: &[Arg] = &[arg(c"command", Kind::Str), many(c"arg", Kind::Str, true)];
