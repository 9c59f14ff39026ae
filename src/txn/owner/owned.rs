//! Whether a part's keys are this node's to prepare or apply (owned by the ring, this server
//! acting as that node, and not moving in an open resharding: a moving key is refused as a
//! routed write of it would be during a fence), and whether a resharding step would move a
//! key a transaction holds (refused with `TRYAGAIN` until the lock ends).

use crate::host::error::CmdError;
use crate::ring::placement::Placement;
use crate::state;

fn printable(key: &[u8]) -> String {
    crate::host::args::printable(key)
}

/// `Ok` when every key is this node's and none is moving. A server with no ring of its own
/// (no ring, or the cluster algo) owns what it holds.
pub fn check_keys(keys: &[Vec<u8>]) -> Result<(), CmdError> {
    let st = state::lock();
    let Some(ring) = st.rings.current.as_ref().and_then(|p| p.ring.as_ref()) else {
        return Ok(());
    };
    let self_name = st.config.ring.self_name.as_str();
    let previous = st.rings.previous.as_ref().and_then(|p| p.ring.as_ref());
    for key in keys {
        let node = ring.owner_spec(key);
        if !crate::topology::nodes::acts_as(node, self_name) {
            return Err(CmdError::code(
                "MOVED",
                format!(
                    "the key '{}' is owned by node {}, not by this server",
                    printable(key),
                    node.name
                ),
            ));
        }
        if previous.is_some_and(|p| p.owner_spec(key).name != node.name) {
            if st.rings.fence {
                return Err(crate::route::decide::refusal(true, "key"));
            }
            return Err(CmdError::code(
                "TRYAGAIN",
                format!(
                    "the key '{}' is moving (a resharding is open): retry once it settles",
                    printable(key)
                ),
            ));
        }
    }
    Ok(())
}

/// `Ok` when no locked key is placed on another node by any of `rings` than by the rings in
/// force (`SHARD.RING SET|BEGIN|INSTALL`: the step would move it).
pub fn refuse_moving_locks(rings: &[&Placement]) -> Result<(), CmdError> {
    let _step = crate::host::latency::step(c"shard-lock-scan");
    if !super::active() {
        return Ok(());
    }
    let locked = locked_names();
    if locked.is_empty() {
        return Ok(());
    }
    let st = state::lock();
    let in_force: Vec<&Placement> = [st.rings.current.as_deref(), st.rings.previous.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    let owner = |p: &Placement, key: &[u8]| p.ring.as_ref().map(|r| r.owner_spec(key).name.clone());
    for (key, txid) in &locked {
        let Some(now) = in_force.first().and_then(|p| owner(p, key)) else {
            continue;
        };
        let moves = in_force
            .iter()
            .chain(rings.iter())
            .any(|p| owner(p, key).is_some_and(|o| o != now));
        if moves {
            return Err(held(key, txid, "this step would move it"));
        }
    }
    Ok(())
}

/// `Ok` when no locked key is one a copy from this node would move (its owner by the current
/// ring is not this node: `SHARD.RESHARD COPY`).
pub fn refuse_copied_locks() -> Result<(), CmdError> {
    if !super::active() {
        return Ok(());
    }
    let locked = locked_names();
    let st = state::lock();
    let Some(ring) = st.rings.current.as_ref().and_then(|p| p.ring.as_ref()) else {
        return Ok(());
    };
    let self_name = st.config.ring.self_name.as_str();
    for (key, txid) in &locked {
        if ring.owner_spec(key).name != self_name {
            return Err(held(key, txid, "the copy would move it"));
        }
    }
    Ok(())
}

/// The refusal of a step or a command that meets a key a transaction holds.
pub fn held(key: &[u8], txid: &str, why: &str) -> CmdError {
    CmdError::code(
        "TRYAGAIN",
        format!(
            "a transaction ({txid}) holds the key '{}': {why}; retry when it ends",
            printable(key)
        ),
    )
}

/// Every locked key's name (in any database) with the txid that holds it, copied out of the
/// tables so that the state's lock can be taken while looking at them.
fn locked_names() -> Vec<(Vec<u8>, String)> {
    super::read(|t| {
        t.locked_keys()
            .map(|((_, k), txid)| (k.clone(), txid.to_string()))
            .collect()
    })
}
