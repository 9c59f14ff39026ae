//! `SHARD.CLUSTER sub ...` and `SHARD.REDIRECT command ...`: the cluster protocol's commands
//! (the filter makes them of `CLUSTER ...`, `READONLY`, `READWRITE`, `ASKING`, and of keyed
//! commands that cannot run here as they are; `cluster::filter`).

use crate::cluster::redirect::{self, Redirect};
use crate::cluster::{clients, protocol, slot_keys};
use crate::command;
use crate::host::caller;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::host::register::{arg, many, Arg, CommandSpec, Kind};
use crate::net::resp::{ReplyResp, Resp};
use crate::ring::{key_slot, SLOTS};

/// `SHARD.CLUSTER sub ...`: what a cluster node answers to `CLUSTER sub ...`, `READONLY`,
/// `READWRITE` and `ASKING`.
pub fn cluster(call: &Call) -> CmdResult {
    let args = &call.args;
    if args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.cluster"));
    }
    let sub = String::from_utf8_lossy(args.get(1)).to_ascii_lowercase();
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
        "keyslot" if args.len() == 3 => reply.int(i64::from(key_slot(args.get(2)))),
        "myid" => {
            let view = protocol::view()?;
            reply.bulk(view.my_id().unwrap_or_default().as_bytes());
        }
        "slots" => reply.resp(&protocol::view()?.slots()),
        "shards" => reply.resp(&protocol::view()?.shards()),
        // Verbatim text under RESP3, a bulk string under RESP2, as cluster mode replies.
        "nodes" => {
            let text = protocol::view()?.nodes_text();
            reply.resp(&Resp::Verbatim(*b"txt", text.into_bytes()));
        }
        "info" => {
            let text = protocol::view()?.info_text();
            reply.resp(&Resp::Verbatim(*b"txt", text.into_bytes()));
        }
        "countkeysinslot" if args.len() == 3 => {
            let slot = u16::try_from(integer_arg(args.get(2))?)
                .ok()
                .filter(|s| usize::from(*s) < SLOTS)
                .ok_or_else(|| CmdError::err("Invalid slot"))?;
            let (count, _) = slot_keys::keys_in_slot(call.ctx, slot, 0, true);
            reply.int(i64::try_from(count).unwrap_or(i64::MAX));
        }
        "getkeysinslot" if args.len() == 4 => {
            // As cluster mode: both integers first, then their ranges.
            let (slot, count) = (integer_arg(args.get(2))?, integer_arg(args.get(3))?);
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
            return Err(CmdError::err(format!(
                "unknown subcommand or wrong number of arguments for '{sub}'. Try CLUSTER HELP."
            )))
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
    summary: "What CLUSTER, READONLY, READWRITE and ASKING answer when shard.cluster-protocol is yes",
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
