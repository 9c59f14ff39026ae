//! `SHARD.CLUSTER sub ...` and `SHARD.REDIRECT command ...`: the cluster protocol's commands
//! (the filter makes them of `CLUSTER ...`, `READONLY`, `READWRITE`, `ASKING`, and of keyed
//! commands that cannot run here as they are; `cluster::filter`), and the answer to each
//! `CLUSTER` subcommand, which `SHARD.EMULATE` gives too (`commands::emulate`).

use crate::cluster::redirect::{self, Redirect};
use crate::cluster::{clients, emulate, protocol, slot_keys};
use crate::command;
use crate::host::args::Args;
use crate::host::caller;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::host::register::{arg, many, Arg, CommandSpec, Kind};
use crate::net::resp::{ReplyResp, Resp};
use crate::ring::{key_slot, SLOTS};

/// `SHARD.CLUSTER sub ...`: what a cluster node answers to `CLUSTER sub ...`, `READONLY`,
/// `READWRITE` and `ASKING`, checked by the server as `SHARD.CLUSTER` (the filter's choice when
/// it cannot tell that the client has authenticated; `cluster::auth`).
pub fn cluster(call: &Call) -> CmdResult {
    if call.args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.cluster"));
    }
    answer(call, call.args.skip(1))
}

/// The answer to `CLUSTER sub ...` (or `READONLY`, `READWRITE`, `ASKING`) whose subcommand is
/// `args.get(0)`, as cluster mode gives it, from the ring.
pub fn answer(call: &Call, args: Args) -> CmdResult {
    let sub = String::from_utf8_lossy(args.get(0)).to_ascii_lowercase();
    let reply = call.reply;
    match sub.as_str() {
        // The module's own connections say who they are; they are never redirected.
        "internal" => {
            clients::mark_internal(caller::client_id(call));
            reply.ok();
        }
        "asking" => {
            clients::mark_asking(caller::client_id(call));
            reply.ok();
        }
        // On a replica, a READONLY client reads its shard's keys there (`cluster::replica`).
        "readonly" | "readwrite" => {
            clients::set_readonly(caller::client_id(call), sub == "readonly");
            reply.ok();
        }
        "keyslot" if args.len() == 2 => reply.int(i64::from(key_slot(args.get(1)))),
        "myid" if args.len() == 1 => {
            let view = protocol::view()?;
            reply.bulk(view.my_id().unwrap_or_default().as_bytes());
        }
        "myshardid" if args.len() == 1 => {
            reply.bulk(
                protocol::view()?
                    .my_shard_id()
                    .unwrap_or_default()
                    .as_bytes(),
            );
        }
        "slots" if args.len() == 1 => reply.resp(&protocol::view()?.slots()),
        "shards" if args.len() == 1 => reply.resp(&protocol::view()?.shards()),
        "links" if args.len() == 1 => {
            reply.resp(&protocol::view()?.links(protocol::enabled_at_ms()));
        }
        // Verbatim text under RESP3, a bulk string under RESP2, as cluster mode replies.
        "nodes" if args.len() == 1 => {
            let text = protocol::view()?.nodes_text();
            reply.resp(&Resp::Verbatim(*b"txt", text.into_bytes()));
        }
        "info" if args.len() == 1 => {
            let text = protocol::view()?.info_text();
            reply.resp(&Resp::Verbatim(*b"txt", text.into_bytes()));
        }
        "replicas" | "slaves" if args.len() == 2 => {
            let lines = protocol::view()?
                .replicas_of(args.get(1))
                .map_err(CmdError::err)?;
            reply.array(lines.len());
            for line in lines {
                reply.bulk(line.as_bytes());
            }
        }
        "count-failure-reports" if args.len() == 2 => {
            let view = protocol::view()?;
            if !view.knows(args.get(1)) {
                return Err(CmdError::err(format!(
                    "Unknown node {}",
                    String::from_utf8_lossy(args.get(1))
                )));
            }
            reply.int(0);
        }
        // The fleet's configuration is its ring, saved with the data (the RDB's aux field).
        "saveconfig" if args.len() == 1 => reply.ok(),
        "help" if args.len() == 1 => {
            reply.array(emulate::HELP.len());
            for line in emulate::HELP {
                reply.simple(line.as_bytes());
            }
        }
        "countkeysinslot" if args.len() == 2 => {
            let slot = u16::try_from(integer_arg(args.get(1))?)
                .ok()
                .filter(|s| usize::from(*s) < SLOTS)
                .ok_or_else(|| CmdError::err("Invalid slot"))?;
            let (count, _) = slot_keys::keys_in_slot(call.ctx, slot, 0, true);
            reply.int(i64::try_from(count).unwrap_or(i64::MAX));
        }
        "getkeysinslot" if args.len() == 3 => {
            // As cluster mode: both integers first, then their ranges.
            let (slot, count) = (integer_arg(args.get(1))?, integer_arg(args.get(2))?);
            let invalid = || CmdError::err("Invalid slot or number of keys");
            let slot = u16::try_from(slot)
                .ok()
                .filter(|s| usize::from(*s) < SLOTS)
                .ok_or_else(invalid)?;
            let count = usize::try_from(count).map_err(|_| invalid())?;
            let (_, keys) = slot_keys::keys_in_slot(call.ctx, slot, count, false);
            reply.array(keys.len());
            for k in keys {
                reply.bulk(&k);
            }
        }
        _ => {
            if let Some(refusal) = emulate::by_hand(&sub) {
                return Err(CmdError::err(refusal));
            }
            return Err(CmdError::err(format!(
                "unknown subcommand or wrong number of arguments for '{sub}'. Try CLUSTER HELP."
            )));
        }
    }
    Ok(())
}

/// An integer argument, or the error cluster mode gives for one that is not.
fn integer_arg(arg: &[u8]) -> Result<i64, CmdError> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| CmdError::err("value is not an integer or out of range"))
}

/// `SHARD.REDIRECT command arg ...`: a keyed command the filter could not let through; it is
/// refused with the redirect a cluster client follows, run here, or routed as SHARD.CALL.
pub fn redirect(call: &Call) -> CmdResult {
    if call.args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.redirect"));
    }
    match redirect::verdict(call)? {
        Redirect::RunHere => caller::pass_through(call, call.args.get(1), 2),
        Redirect::Obey => caller::pass_through_obeyed(call, call.args.get(1), 2),
        Redirect::Route => crate::commands::call::call(call),
    }
}

pub static CLUSTER: CommandSpec = command! {
    name: "shard.cluster",
    handler: cluster,
    flags: "fast allow-stale allow-loading",
    arity: -2,
    summary: "What CLUSTER, READONLY, READWRITE and ASKING answer when shard.cluster-protocol is yes, checked as SHARD.CLUSTER",
    complexity: "O(N) with N the nodes; COUNTKEYSINSLOT O(1) and GETKEYSINSLOT O(count) from the key index (shard.key-index yes), else both a walk of the whole keyspace on the main thread, O(N) with N the keys",
    args: CLUSTER_ARGS,
    acl: "connection slow",
};

pub static REDIRECT: CommandSpec = command! {
    name: "shard.redirect",
    handler: redirect,
    flags: "may-replicate deny-script blocking",
    arity: -2,
    summary: "A keyed command for another node's slot, when shard.cluster-protocol is yes: MOVED, ASK, CROSSSLOT or run here",
    complexity: "Depends on the command",
    args: REDIRECT_ARGS,
    acl: "read write slow",
};

static CLUSTER_ARGS: &[Arg] = &[arg(c"subcommand", Kind::Str), many(c"arg", Kind::Str, true)];

static REDIRECT_ARGS: &[Arg] = &[arg(c"command", Kind::Str), many(c"arg", Kind::Str, true)];
