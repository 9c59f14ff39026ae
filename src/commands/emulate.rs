//! `SHARD.EMULATE command arg ...` and `SHARD.INFO [section ...]`: the cluster protocol's
//! `CLUSTER ...`, `READONLY`, `READWRITE`, `ASKING` and `INFO` as a cluster node answers them.
//! The filter makes a client's command `SHARD.EMULATE` when it knows the client has
//! authenticated: the server then skips its own check (`no-auth`), and the handler checks the
//! plain command's ACL rules instead (`cluster::auth`), so a user granted `+cluster` or
//! `+info` is served as a cluster node would serve it. Otherwise `INFO` becomes `SHARD.INFO`,
//! which the server checks as itself.

use crate::cluster::{auth, emulate, protocol};
use crate::command;
use crate::commands::cluster::answer;
use crate::host::acl::Caller;
use crate::host::args::Args;
use crate::host::caller;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::host::register::{arg, many, Arg, CommandSpec, Kind};
use crate::net::resp::{read_reply, Resp};

/// `SHARD.EMULATE command arg ...`: `command` (`CLUSTER`, `READONLY`, `READWRITE`, `ASKING` or
/// `INFO`) answered as a cluster node answers it, once the client is known to have
/// authenticated and its user may run it (or `SHARD.CLUSTER`, for the cluster commands).
pub fn emulate_command(call: &Call) -> CmdResult {
    let args = &call.args;
    if args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.emulate"));
    }
    let plain: Vec<&[u8]> = (1..args.len()).map(|i| args.get(i)).collect();
    let name = String::from_utf8_lossy(args.get(1)).to_ascii_lowercase();
    match name.as_str() {
        "cluster" => {
            if args.len() < 3 {
                return Err(CmdError::wrong_arity("cluster"));
            }
            // The module's own connections send SHARD.CLUSTER INTERNAL; a cluster node has no
            // such subcommand.
            if args.get(2).eq_ignore_ascii_case(b"internal") {
                return Err(CmdError::err(
                    "unknown subcommand 'internal'. Try CLUSTER HELP.",
                ));
            }
            let grant: Vec<&[u8]> = std::iter::once(&b"shard.cluster"[..])
                .chain(plain[1..].iter().copied())
                .collect();
            auth::authorise(call, &plain, Some(&grant))?;
            answer(call, args.skip(2))
        }
        "readonly" | "readwrite" | "asking" => {
            if args.len() != 2 {
                return Err(CmdError::wrong_arity(&name));
            }
            auth::authorise(call, &plain, Some(&[b"shard.cluster", args.get(1)]))?;
            answer(call, args.skip(1))
        }
        "info" => {
            let caller = auth::authorise(call, &plain, None)?;
            info(call, &caller, args.skip(2))
        }
        _ => Err(CmdError::err(
            "shard.emulate is internal: the cluster protocol's filter makes it of CLUSTER, READONLY, READWRITE, ASKING and INFO",
        )),
    }
}

/// `SHARD.INFO [section ...]`: `INFO` as a cluster node shows it, for a user who may run `INFO`
/// too.
pub fn info_command(call: &Call) -> CmdResult {
    let plain: Vec<&[u8]> = std::iter::once(&b"info"[..])
        .chain((1..call.args.len()).map(|i| call.args.get(i)))
        .collect();
    let caller = auth::permitted(call, &plain, None)?;
    info(call, &caller, call.args.skip(1))
}

/// The server's `INFO sections...`, run as the caller; while the protocol is on, its cluster
/// section says `cluster_enabled:1` (every other byte as the server wrote it).
fn info(call: &Call, who: &Caller, sections: Args) -> CmdResult {
    let mut argv = vec![b"INFO".to_vec()];
    argv.extend((0..sections.len()).map(|i| sections.get(i).to_vec()));
    let read = |wire: &[u8]| {
        read_reply(&mut &wire[..]).map_err(|e| CmdError::err(format!("INFO's reply: {e}")))
    };
    let reply = match who {
        Caller::User(_) => caller::run_as_caller(call, &argv, read)?,
        Caller::Root => caller::run_as_root(call, &argv, read)?,
    };
    let text = match reply {
        Resp::Bulk(text) | Resp::Verbatim(_, text) => text,
        Resp::Error(e) => {
            let e = String::from_utf8_lossy(&e);
            let (code, text) = e.split_once(' ').unwrap_or(("ERR", &e));
            return Err(CmdError::code(code, text));
        }
        other => return Err(CmdError::err(format!("INFO replied {other:?}"))),
    };
    let text = if protocol::enabled() {
        emulate::as_cluster_node(&text)
    } else {
        text
    };
    call.reply.verbatim(*b"txt", &text);
    Ok(())
}

pub static EMULATE: CommandSpec = command! {
    name: "shard.emulate",
    handler: emulate_command,
    flags: "no-auth allow-stale allow-loading",
    arity: -2,
    summary: "What CLUSTER, READONLY, READWRITE, ASKING and INFO answer when shard.cluster-protocol is yes, authorised as those commands (internal: the command filter's)",
    complexity: "As the command it carries",
    args: EMULATE_ARGS,
    acl: "slow",
};

pub static INFO: CommandSpec = command! {
    name: "shard.info",
    handler: info_command,
    flags: "allow-stale allow-loading",
    arity: -1,
    summary: "INFO as a cluster node shows it when shard.cluster-protocol is yes (cluster_enabled:1)",
    complexity: "O(1)",
    args: INFO_ARGS,
    acl: "slow dangerous",
};

static EMULATE_ARGS: &[Arg] = &[arg(c"command", Kind::Str), many(c"arg", Kind::Str, true)];

static INFO_ARGS: &[Arg] = &[many(c"section", Kind::Str, true)];
