//! Blocking commands routed (issue 43): `BLPOP`, `BRPOP`, `BLMOVE`, `BLMPOP`, `BZPOPMIN`,
//! `BZPOPMAX`, `BZMPOP`, `BRPOPLPUSH`, `XREAD ... BLOCK`, `XREADGROUP ... BLOCK` through
//! `SHARD.CALL` or `shard.route-plain`.
//!
//! A blocking command waits at the owner of its keys, on a connection of its own to that node
//! (`net::lanes`, bounded per node as `SHARD.CALL WAIT`'s: a node with every such connection
//! busy refuses at once, naming the node), so no other call queues behind it; the node itself
//! keeps its timeout, and its reply (an element, or nil at the timeout) is the client's. The
//! owner may be this very node: the command then goes over a connection to itself, so that it
//! blocks as the server's own blocking command does (a module cannot block the server's way).
//! A client that disconnects while it waits has that connection closed: the node stops waiting
//! and pops nothing for it. A node that fails (killed, failed over) fails the connection: the
//! client gets an error naming the node, and no element was popped for it.
//!
//! A ring change that gives a waiting command's key to another node (a resharding begun)
//! ends its wait at the owner: the client gets `TRYAGAIN` saying so (`blocking_moves`).
//!
//! Refused, saying why: keys of several owners (the command waits at one node; give them one
//! hash tag), a key a resharding is moving (its element could be at either owner: `TRYAGAIN`
//! once the move is done), rings unchecked, a server Sentinel passed over; inside `MULTI` or a
//! script a blocking command does not block, as on any server, so it runs as `SHARD.CALL`'s
//! other commands do.

use crate::host::acl;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::net::pool::Link;
use crate::route::command_table::Carried;
use crate::route::forward;
use crate::state;

/// Whether the command a call carries from `start` on blocks: a blocking command (the command
/// table's flag), but `XREAD`/`XREADGROUP` only with `BLOCK`.
pub fn blocks(call: &Call, command: &Carried) -> bool {
    if !command.meta.blocking {
        return false;
    }
    let name = command.name;
    let reads_streams =
        name.eq_ignore_ascii_case(b"xread") || name.eq_ignore_ascii_case(b"xreadgroup");
    !reads_streams
        || (command.start + 1..call.args.len())
            .any(|i| call.args.get(i).eq_ignore_ascii_case(b"block"))
}

/// Routes the blocking command `command` of `call` to its owner, or refuses it.
pub fn route(call: &Call, command: &Carried) -> CmdResult {
    let start = command.start;
    acl::check_caller(call, start, &command.name_text)?;
    if crate::route::gate::closed() {
        return Err(crate::route::gate::refusal());
    }
    let (owner, name, link) = owner_of(call, command)?;
    let args: Vec<Vec<u8>> = (start..call.args.len())
        .map(|i| call.args.get(i).to_vec())
        .collect();
    let watched = crate::route::blocking_moves::Watched {
        owner: name,
        keys: command
            .positions
            .iter()
            .map(|&pos| call.args.get(pos + start).to_vec())
            .collect(),
        name: command.name_text.clone(),
    };
    let bound = wait_bound(&args);
    forward::forward_blocking(call, &owner, &link, &args, watched, bound).map_err(CmdError::err)
}

/// How long the owner may take to answer the blocking command `args` (its name first) beyond
/// the call timeout: the command's own timeout, or `None` for one that waits for ever (`0`).
/// Past it the owner's reply is overdue (its link cut, or the node stopped): the client gets
/// an error naming the node instead of waiting past the timeout it asked for. A timeout that
/// does not parse is the owner's to refuse: no bound is added.
pub fn wait_bound(args: &[Vec<u8>]) -> Option<std::time::Duration> {
    let name = args.first()?.to_ascii_lowercase();
    let (text, unit_ms) = match name.as_slice() {
        b"blpop" | b"brpop" | b"bzpopmin" | b"bzpopmax" | b"brpoplpush" | b"blmove" => {
            (args.last()?, false)
        }
        b"blmpop" | b"bzmpop" => (args.get(1)?, false),
        b"xread" | b"xreadgroup" => {
            let streams = args
                .iter()
                .position(|a| a.eq_ignore_ascii_case(b"streams"))
                .unwrap_or(args.len());
            let block = args[..streams]
                .iter()
                .position(|a| a.eq_ignore_ascii_case(b"block"))?;
            (args.get(block + 1)?, true)
        }
        _ => return None,
    };
    let value: f64 = std::str::from_utf8(text).ok()?.trim().parse().ok()?;
    let ms = if unit_ms { value } else { value * 1000.0 };
    (ms.is_finite() && ms > 0.0 && ms < 1e12)
        .then(|| std::time::Duration::from_millis(ms.ceil() as u64))
}

/// The one node that owns every key of the command: its endpoint, its name, and the link to
/// it.
fn owner_of(
    call: &Call,
    command: &Carried,
) -> Result<(crate::net::endpoint::Endpoint, String, Link), CmdError> {
    let st = state::lock();
    let current = st.current_ring()?;
    let ring = current.ring.as_ref().ok_or_else(|| {
        CmdError::err(
            "SHARD.CALL needs a ring of shard's own; with the cluster algo use a cluster client",
        )
    })?;
    crate::route::call::refuse_if_passed_over(&st)?;
    let self_name = st.config.ring.self_name.as_str();
    let previous = st.rings.previous.as_ref().and_then(|p| p.ring.as_ref());
    let mut owners: Vec<&str> = Vec::new();
    let mut first = None;
    for &pos in &command.positions {
        let key = call.args.get(pos + command.start);
        let node = ring.settled_owner(previous, key).map_err(|to| {
            CmdError::code(
                "TRYAGAIN",
                format!(
                    "a resharding is moving a key of '{}' (to {}): a blocking command waits at one owner, try again once the move is done",
                    command.name_text, to.name
                ),
            )
        })?;
        if !owners.contains(&node.name.as_str()) {
            owners.push(node.name.as_str());
        }
        first.get_or_insert(node);
    }
    let Some(node) = first else {
        return Err(CmdError::err(format!(
            "'{}' has no key here: SHARD.CALL routes commands by their keys",
            command.name_text
        )));
    };
    if owners.len() > 1 {
        owners.sort_unstable();
        return Err(CmdError::err(format!(
            "the keys of '{}' live on different nodes ({}): a blocking command waits at one owner; give the keys one hash tag",
            command.name_text,
            owners.join(", ")
        )));
    }
    let owner = crate::topology::nodes::endpoint_of(node, self_name);
    let link = crate::route::call::link_for(call, &st);
    Ok((owner, node.name.clone(), link))
}

#[cfg(test)]
mod tests {
    use super::wait_bound;
    use std::time::Duration;

    fn bound(words: &str) -> Option<Duration> {
        let args: Vec<Vec<u8>> = words.split(' ').map(|w| w.as_bytes().to_vec()).collect();
        wait_bound(&args)
    }

    #[test]
    fn the_bound_is_the_commands_own_timeout_wherever_it_stands() {
        let s = Duration::from_secs;
        assert_eq!(bound("BLPOP a b 2"), Some(s(2)));
        assert_eq!(bound("brpop a 0.5"), Some(Duration::from_millis(500)));
        assert_eq!(
            bound("BZPOPMAX z 1.0001"),
            Some(Duration::from_millis(1001))
        );
        assert_eq!(bound("BRPOPLPUSH a b 3"), Some(s(3)));
        assert_eq!(bound("BLMOVE a b LEFT RIGHT 4"), Some(s(4)));
        assert_eq!(bound("BLMPOP 5 2 a b LEFT"), Some(s(5)));
        assert_eq!(bound("BZMPOP 6 1 z MIN COUNT 2"), Some(s(6)));
        assert_eq!(
            bound("XREAD COUNT 2 BLOCK 700 STREAMS s 0"),
            Some(Duration::from_millis(700))
        );
        assert_eq!(
            bound("XREADGROUP GROUP g c BLOCK 50 NOACK STREAMS block 0"),
            Some(Duration::from_millis(50))
        );
    }

    #[test]
    fn a_command_that_waits_for_ever_or_cannot_be_read_has_none() {
        for words in [
            "BLPOP a 0",
            "BLMPOP 0 1 a LEFT",
            "XREAD BLOCK 0 STREAMS s $",
            "XREAD STREAMS block 5",
            "BLPOP a nope",
            "BLPOP a -1",
            "BLPOP a inf",
            "GET a",
        ] {
            assert_eq!(bound(words), None, "{words}");
        }
    }
}
