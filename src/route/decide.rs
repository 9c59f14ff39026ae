//! SHARD.CALL's decision, pure: from where each key of the call lives now (and, while a
//! resharding is open, where it lived before), what the command is, whether a cancelled
//! resharding is bringing keys back or the copies are done (settled), `shard.read-from`, the
//! field dictionary, whether the client may wait and whether the call waits for replicas
//! (`SHARD.CALL WAIT`: a write then always goes over a connection, to its owner even when that
//! is this node, since `WAIT` runs after it there), who runs what: this node, one other node
//! whole, a replica of the owner,
//! the single-key plan of fallbacks and copies (`steps`), one part per owner (`split`), or a
//! refusal with the error the client gets. `call` gathers these facts and carries the decision
//! out; the table of cases it is tested against is in `decide_tests.rs`.

use crate::host::args::ArgList;
use crate::host::error::{CmdError, CmdResult};
use crate::net::endpoint::Endpoint;
use crate::route::split::{Merge, Splittable};
use crate::route::steps::CommandKind;
use crate::topology::nodes::ReadFrom;

/// Where one key of the call lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub current: Endpoint,
    /// The previous owner, when a resharding is open and moves this key.
    pub previous: Option<Endpoint>,
}

/// What the decision is made from.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The command's name as messages show it.
    pub name: &'a str,
    pub kind: CommandKind,
    /// How the command splits by key, if it does.
    pub splittable: Option<Splittable>,
    /// Its keys, in the order of its arguments.
    pub keys: Vec<Placed>,
    /// The previous ring is being returned to (a cancelled resharding brings its keys back),
    /// or, with `fence`, a fleet operation's fence holds the rings so for a moment.
    pub returning: bool,
    /// The returning rings are a fence, not a cancel: the refusal says so.
    pub fence: bool,
    /// The resharding is settled (its copies are done): a moving key is read at its new owner
    /// only, as if it did not move; a write keeps the previous owner, to remove the key there
    /// too when it removes it (`steps`).
    pub settled: bool,
    pub read_from: ReadFrom,
    /// A hash command whose field names the dictionary translates.
    pub translated: bool,
    /// The client may be blocked (it is not inside `MULTI` or a script).
    pub can_wait: bool,
    /// The client cannot wait only because the command was let go by a transaction's lock (a
    /// blocked client's reply callback runs it: not inside `MULTI` nor a script).
    pub released: bool,
    /// A write waited for at its owners' replicas (`SHARD.CALL WAIT`, not a read).
    pub replicated: bool,
}

/// Who runs what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This node, the command as it came; its reply is the call's.
    Here,
    /// This node, with the field names the dictionary stores.
    HereTranslated,
    /// One other node, the command whole.
    Forward(Endpoint),
    /// A replica of the key's owner (a read under `shard.read-from`).
    Replica { primary: Endpoint, mode: ReadFrom },
    /// The single-key plan at the first key's owner: fallbacks to and copies from the
    /// previous owner while a resharding moves the key (`steps::execute`).
    Plan {
        current: Endpoint,
        previous: Option<Endpoint>,
        translated: bool,
    },
    /// One part per owner, merged (`split`).
    Split(Split),
    /// Keys of several owners in a command that does not split: gathered at this node and
    /// run there as one transaction across the owners (`txn::coord::gather`, above routing).
    Gather,
}

/// A split command's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    pub how: Splittable,
    /// Where the parts go: one per owner, or one per key while keys move.
    pub targets: Vec<Target>,
    /// For each key, the index of its target.
    pub target_of_key: Vec<usize>,
    /// Reads go to replicas of the targets.
    pub replica: Option<ReadFrom>,
}

/// Where one part of a split command goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub current: Endpoint,
    pub previous: Option<Endpoint>,
    /// This node's part, run here at once without a hop to itself.
    pub here: bool,
}

/// Why a write of a moving key is refused while the rings are returning, naming what holds
/// them so: a fleet operation's fence, or a cancel bringing keys back (`what`: "key", or
/// "slot" for a cluster client).
pub fn refusal(fence: bool, what: &str) -> CmdError {
    if fence {
        CmdError::code(
            "TRYAGAIN",
            format!(
                "a resharding is starting (its fence): a write of a {what} about to move waits until every node has the new ring; retry in a moment"
            ),
        )
    } else {
        CmdError::code(
            "TRYAGAIN",
            format!(
                "a cancelled resharding is bringing this {what}'s keys back to their owner: retry in a moment"
            ),
        )
    }
}

/// The decision for a call.
pub fn decide(facts: Facts) -> Result<Route, CmdError> {
    let Facts {
        name,
        kind,
        splittable,
        mut keys,
        returning,
        fence,
        settled,
        read_from,
        translated,
        can_wait,
        released,
        replicated,
    } = facts;
    if settled && kind == CommandKind::Read {
        // The copies are done: the key is at its new owner if anywhere. The previous owner's
        // copy may be one that a node that committed has deleted since, at the new owner alone.
        for p in &mut keys {
            p.previous = None;
        }
    }
    let moving = keys.iter().any(|p| p.previous.is_some());
    if moving && returning {
        // A cancelled resharding brings these keys back from the new owners (the previous
        // ring's), whose copies are the newest: a write now could be overwritten by the copy
        // coming back, so it is refused until the keys are home; a read prefers the previous
        // owner, where the newest version is while it is there.
        if kind != CommandKind::Read {
            return Err(refusal(fence, "key"));
        }
        for p in &mut keys {
            if let Some(previous) = p.previous.take() {
                p.previous = Some(std::mem::replace(&mut p.current, previous));
            }
        }
    }
    let Some(first) = keys.first() else {
        return Err(CmdError::err("internal error: a routed call without a key"));
    };
    let single_owner = keys.iter().all(|p| p.current.name == first.current.name);
    // Hash commands under the field dictionary: short names stored, long names replied.
    if translated {
        if !moving && first.current.is_self && !replicated {
            return Ok(Route::HereTranslated);
        }
        refuse_waiting(can_wait, &first.current)?;
        let Placed { current, previous } = keys.swap_remove(0);
        return Ok(Route::Plan {
            current,
            previous,
            translated: true,
        });
    }
    // Reads that go to a replica of their owner; keys that move in a resharding keep the
    // primaries' fallback rules.
    let replica = match read_from {
        ReadFrom::Primary => None,
        mode => (kind == CommandKind::Read && !moving).then_some(mode),
    };
    if !moving && single_owner && first.current.is_self && replica.is_none() && !replicated {
        return Ok(Route::Here);
    }
    if !single_owner && splittable.is_none() && !moving {
        if can_wait && !replicated {
            return Ok(Route::Gather);
        }
        if released {
            return Err(CmdError::code(
                "TRYAGAIN",
                format!(
                    "a key of '{name}' was locked by a transaction until now, and a command over keys of several owners is not gathered once let go: retry"
                ),
            ));
        }
        let mut owners: Vec<&str> = keys.iter().map(|p| p.current.name.as_str()).collect();
        owners.sort_unstable();
        owners.dedup();
        return Err(CmdError::err(format!(
            "the keys of '{name}' live on different nodes ({}): a command over keys of several owners is gathered as a transaction, which {}; give the keys one hash tag to keep them together",
            owners.join(", "),
            if can_wait { "SHARD.CALL WAIT does not wait for" } else { "cannot run inside MULTI or a script" }
        )));
    }
    if moving && keys.len() > 1 && splittable.is_none() {
        return Err(CmdError::err(format!(
            "the keys of '{name}' are moving between nodes in a resharding: SHARD.CALL runs commands with several keys then only if they split by key (MGET, MSET, DEL, UNLINK, EXISTS, TOUCH)"
        )));
    }
    refuse_waiting(can_wait, &first.current)?;
    if let Some(mode) = replica.filter(|_| single_owner) {
        let primary = keys.swap_remove(0).current;
        return Ok(Route::Replica { primary, mode });
    }
    // A write waited for is a plan: its WAIT follows it at the owner (`steps`).
    if !moving && single_owner && !replicated {
        return Ok(Route::Forward(keys.swap_remove(0).current));
    }
    if let Some(how) = splittable.filter(|_| keys.len() > 1 && (moving || !single_owner)) {
        return Ok(Route::Split(split(keys, how, moving, replica, replicated)));
    }
    let Placed { current, previous } = keys.swap_remove(0);
    Ok(Route::Plan {
        current,
        previous,
        translated: false,
    })
}

/// The parts of a splittable command: by owner when no key moves, else one per key (each
/// runs by the single-key rules). This node's part runs here at once, unless it stores its
/// arguments (MSET: values stored through RedisModule_Call keep no integer encoding, so it
/// goes the way a client's MSET goes, over a connection), reads go to replicas, or it is
/// waited for at this node's replicas (its WAIT follows it on a connection).
fn split(
    keys: Vec<Placed>,
    how: Splittable,
    moving: bool,
    replica: Option<ReadFrom>,
    replicated: bool,
) -> Split {
    let mut targets: Vec<Target> = Vec::new();
    let mut target_of_key = Vec::with_capacity(keys.len());
    for Placed { current, previous } in keys {
        let known = if moving {
            None
        } else {
            targets.iter().position(|t| t.current.name == current.name)
        };
        match known {
            Some(at) => target_of_key.push(at),
            None => {
                let previous = if moving { previous } else { None };
                let here = current.is_self
                    && previous.is_none()
                    && replica.is_none()
                    && !replicated
                    && how.merge != Merge::AllOk;
                targets.push(Target {
                    current,
                    previous,
                    here,
                });
                target_of_key.push(targets.len() - 1);
            }
        }
    }
    Split {
        how,
        targets,
        target_of_key,
        replica,
    }
}

/// Forwarding blocks the client: refused where the client cannot wait (MULTI, scripts).
fn refuse_waiting(can_wait: bool, at: &Endpoint) -> CmdResult {
    if can_wait {
        return Ok(());
    }
    Err(CmdError::err(format!(
        "SHARD.CALL cannot wait for node {} ({}) inside MULTI or a script",
        at.name, at.address
    )))
}

/// Refuses a command that would block: a command flagged `blocking` always, except `XREAD`
/// and `XREADGROUP` without `BLOCK`. A blocking command would hold the connection every call
/// to its node shares, and the client until its timeout. `args` are the call's: the command's
/// name at `start`.
pub fn refuse_blocking<A: ArgList + ?Sized>(
    blocking: bool,
    name: &str,
    args: &A,
    start: usize,
) -> CmdResult {
    let command = args.arg(start);
    let reads_streams =
        command.eq_ignore_ascii_case(b"xread") || command.eq_ignore_ascii_case(b"xreadgroup");
    let blocks = !reads_streams
        || (start + 1..args.count()).any(|i| args.arg(i).eq_ignore_ascii_case(b"block"));
    if blocking && blocks {
        return Err(CmdError::err(format!(
            "'{name}' can block: SHARD.CALL routes a blocking command on its own (not with WAIT, nor inside MULTI or SHARD.MULTI)"
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
