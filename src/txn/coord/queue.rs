//! A `SHARD.CALL` inside `SHARD.MULTI`, checked and placed at queue time, as Redis checks a
//! command queued in `MULTI`: a command the server does not know, a wrong number of
//! arguments, a command that can block, the calling user's ACL, or a key a resharding is
//! moving now are refused here, naming what was wrong; the transaction then ends in
//! `EXECABORT`. A command whose keys have one owner is queued whole for it; a splittable one
//! over several owners, one piece per owner; any other over keys of several owners is queued
//! to be gathered (`Entry::placed` is `None`): the whole transaction then runs gathered at
//! `SHARD.EXEC` (`gather::exec_gathered`). Also here: where keys live, for `SHARD.WATCH`.

use crate::host::acl;
use crate::host::command::Call;
use crate::host::error::CmdError;
use crate::net::endpoint::Endpoint;
use crate::route::command_table::Carried;
use crate::route::decide::refuse_blocking;
use crate::route::split;
use crate::state;
use crate::txn::coord::plan::Queued;
use crate::txn::coord::wire::Command;

/// A command as queued: its place at the owners (`None`: its keys have several owners and it
/// does not split, so the transaction is gathered), the command whole and its keys (what a
/// gathered transaction runs and reads).
#[derive(Debug, Clone)]
pub struct Entry {
    pub placed: Option<Queued>,
    pub command: Command,
    pub keys: Vec<Vec<u8>>,
}

/// The queued form of the call's carried command (`SHARD.CALL command key ...`).
pub fn queue(call: &Call) -> Result<Entry, CmdError> {
    if call.args.len() < 2 {
        return Err(CmdError::err(
            "SHARD.CALL needs a command and its key: SHARD.CALL command key [arg ...]",
        ));
    }
    if call.args.get(1).eq_ignore_ascii_case(b"wait") {
        return Err(CmdError::err(
            "SHARD.CALL WAIT is not queued inside SHARD.MULTI: the transaction's writes are applied as one",
        ));
    }
    let command = Carried::at_any(call, 1)?;
    if command.positions.is_empty() {
        return queue_keyless(call, &command);
    }
    refuse_blocking(command.meta.blocking, &command.name_text, &call.args, 1)?;
    if crate::route::fields::translates(command.name) {
        return Err(CmdError::err(format!(
            "'{}' under the field dictionary (shard.fields) is not queued inside SHARD.MULTI",
            command.name_text
        )));
    }
    acl::check_caller(call, 1, &command.name_text)?;
    let args: Vec<&[u8]> = (1..call.args.len()).map(|i| call.args.get(i)).collect();
    let keys: Vec<&[u8]> = command
        .positions
        .iter()
        .filter_map(|&p| args.get(p).copied())
        .collect();
    let owners = owners_of(&keys)?;
    let whole: Command = args.iter().map(|a| a.to_vec()).collect();
    let entry = |placed: Option<Queued>, command: Command| Entry {
        placed,
        command,
        keys: keys.iter().map(|k| k.to_vec()).collect(),
    };
    let Some(first) = owners.first() else {
        return Err(CmdError::err(format!(
            "'{}' has no key here: SHARD.CALL routes commands by their keys",
            command.name_text
        )));
    };
    if owners.iter().all(|o| o.name == first.name) {
        let placed = Queued::Whole {
            owner: first.clone(),
            command: whole.clone(),
        };
        return Ok(entry(Some(placed), whole));
    }
    let Some(how) = split::splittable(command.name) else {
        // Gathered at EXEC, with the whole transaction: refused now what the gather refuses.
        crate::txn::coord::gather_step::scratch_db()?;
        return Ok(entry(None, whole));
    };
    let mut distinct: Vec<Endpoint> = Vec::new();
    let index: Vec<usize> = owners
        .iter()
        .map(|o| match distinct.iter().position(|d| d.name == o.name) {
            Some(at) => at,
            None => {
                distinct.push(o.clone());
                distinct.len() - 1
            }
        })
        .collect();
    let pieces = split::split(&args, how, &index)
        .into_iter()
        .map(|p| (distinct[p.owner].clone(), p))
        .collect();
    let placed = Queued::Split {
        merge: how.merge,
        pieces,
        keys: keys.len(),
    };
    Ok(entry(Some(placed), whole))
}

/// The owner of each key by the current ring; a key that a resharding is moving now is
/// refused (`TRYAGAIN`): a transaction runs at settled owners.
pub fn owners_of(keys: &[&[u8]]) -> Result<Vec<Endpoint>, CmdError> {
    let st = state::lock();
    let current = st.current_ring()?;
    let ring = current.ring.as_ref().ok_or_else(|| {
        CmdError::err(
            "SHARD.MULTI needs a ring of shard's own; with the cluster algo use a cluster client",
        )
    })?;
    let self_name = st.config.ring.self_name.as_str();
    let previous = st.rings.previous.as_ref().and_then(|p| p.ring.as_ref());
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let node = ring.settled_owner(previous, key).map_err(|to| {
            CmdError::code(
                "TRYAGAIN",
                format!(
                    "key '{}' is moving to node {} in a resharding: transactions wait until it is there; retry in a moment",
                    crate::host::args::printable(key),
                    to.name
                ),
            )
        })?;
        out.push(crate::topology::nodes::endpoint_of(node, self_name));
    }
    Ok(out)
}

/// A command with no key inside the transaction (`PING`, `ECHO`, `TIME`, a script without
/// keys, as `keyless::runs_here` lets them run): queued for this node, where it runs with this
/// node's part. Any other keyless command is refused at queue time (the transaction then ends
/// in `EXECABORT`): the commands about a server are that server's, outside a transaction.
fn queue_keyless(call: &Call, command: &Carried) -> Result<Entry, CmdError> {
    let sub = (call.args.len() > 2).then(|| call.args.get(2));
    if !crate::route::keyless::runs_here(command.name, sub) {
        return Err(CmdError::err(format!(
            "'{}' has no key: inside a transaction across nodes only PING, ECHO, TIME and scripts without keys run beside the keyed commands",
            command.name_text
        )));
    }
    acl::check_caller(call, 1, &command.name_text)?;
    let owner = this_node().ok_or_else(|| {
        CmdError::err(format!(
            "'{}' has no key, and this server is no node of the ring to run it",
            command.name_text
        ))
    })?;
    let whole: Command = (1..call.args.len())
        .map(|i| call.args.get(i).to_vec())
        .collect();
    Ok(Entry {
        placed: Some(Queued::Whole {
            owner,
            command: whole.clone(),
        }),
        command: whole,
        keys: Vec::new(),
    })
}

/// This node as an endpoint (its node of the current ring), for the requests it sends
/// itself.
pub fn this_node() -> Option<Endpoint> {
    let st = state::lock();
    let self_name = st.config.ring.self_name.as_str();
    let current = st.rings.current.as_ref()?;
    let node = current.spec.nodes.iter().find(|n| n.name == self_name)?;
    Some(crate::topology::nodes::endpoint_of(node, self_name))
}

/// Why this node coordinates no transaction across nodes, when it does not: no current ring
/// names it (a shrink took it out, or is taking it out, or it has not joined yet), so it could
/// record no commit decision (`fleet::NetFleet::record` records it as this node of the current
/// ring) and would only lock the owners' keys to abort. Refused before anything is prepared,
/// with no ring or name at all too (a transaction across nodes has its owners from a ring).
pub fn refuses_to_coordinate() -> Option<String> {
    let st = state::lock();
    let me = st.config.ring.self_name.as_str();
    let names_me = |p: &Option<std::sync::Arc<crate::ring::placement::Placement>>| {
        p.as_ref().is_some_and(|p| p.spec.node_index(me).is_some())
    };
    if !me.is_empty() && names_me(&st.rings.current) {
        return None;
    }
    let why = if me.is_empty() {
        "this server has no node name (shard.self)".to_string()
    } else if names_me(&st.rings.previous) {
        format!(
            "node {me} is not in the ring: only the previous ring of the resharding under way names it (it is leaving the ring)"
        )
    } else {
        format!(
            "node {me} is not in the ring: no ring here names it (a shrink took it out, or it has not joined yet)"
        )
    };
    Some(format!(
        "ERR shard.txn: {why}; it coordinates no transaction across nodes, and nothing was prepared: send the transaction to a node of the ring"
    ))
}

/// The node called `name` in the current (or previous) ring.
pub fn node_named(name: &str) -> Option<Endpoint> {
    let st = state::lock();
    let self_name = st.config.ring.self_name.as_str();
    let found = st
        .rings
        .node(name)
        .map(|node| crate::topology::nodes::endpoint_of(node, self_name));
    found
}
