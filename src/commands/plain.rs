//! `SHARD.PLAIN command arg ...`: a plain client's command that the command filter handed over
//! under `shard.route-plain yes` (`route::plain`): a keyed command whose keys are not all here,
//! or a keyless command the fleet answers (`route::keyless`). It is run here as it came when
//! the module's own connections sent it (a command another node forwarded), or the replication
//! stream or the AOF; queued when its client is inside a transaction across nodes; answered
//! for the fleet when it is keyless; else routed exactly as `SHARD.CALL command arg ...`.

use redis_module::ContextFlags;

use crate::cluster::clients;
use crate::command;
use crate::commands::multi;
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

/// `SHARD.PLAINAS command arg ...`: `SHARD.PLAIN` for a client the filter knows has
/// authenticated (`route::plain::AUTHORISED`). A `no-auth` command, which the server lets
/// through without checking it: its handler checks what the server would have checked for the
/// command it carries, that the client has authenticated (`cluster::auth`) and that its user
/// may run that command on those keys (the routing's check, `SHARD.CALL`'s, which the ACL log
/// records as the server does). A plain transaction command runs as the module's
/// (`SHARD.PLAINAS MULTI` as `SHARD.MULTI`), checked as the plain one.
pub fn plain_as(call: &Call) -> CmdResult {
    if call.args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.plainas"));
    }
    crate::cluster::auth::authenticated_caller(call)?;
    let name = call.args.get(1);
    let Some(verb) = crate::route::plain::transaction_verb(name) else {
        return plain(call);
    };
    let text = String::from_utf8_lossy(name).to_ascii_lowercase();
    crate::host::acl::check_caller(call, 1, &text)?;
    let inner = Call {
        ctx: call.ctx,
        args: call.args.skip(1),
        reply: call.reply,
    };
    match verb {
        b"SHARD.MULTI" => multi::multi(&inner),
        b"SHARD.EXEC" => multi::exec(&inner),
        b"SHARD.DISCARD" => multi::discard(&inner),
        b"SHARD.WATCH" => multi::watch(&inner),
        _ => multi::unwatch(&inner),
    }
}

pub static AUTHORISED: CommandSpec = command! {
    name: "shard.plainas",
    handler: plain_as,
    flags: "no-auth may-replicate deny-script blocking",
    arity: -2,
    summary: "SHARD.PLAIN for a client known to have authenticated, authorised as the command it carries (internal: route-plain's filter hands commands over this way)",
    complexity: "Depends on the command",
    args: ARGS,
    acl: "read write slow",
};

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
