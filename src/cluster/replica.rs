//! What a replica answers a keyed command that came to `SHARD.REDIRECT` (the filter sends it
//! every keyed command it cannot judge on a replica; `filter`), as a replica of cluster mode
//! does:
//!
//! - a read of its shard's keys by a client that sent `READONLY` runs here (its primary's
//!   slots: the shard it serves is `topology::me::shard`); during a resharding, a read of a key
//!   not here yet whose slot is arriving is sent where the key still is (`ASK` to the previous
//!   owner; `MOVED` to the primary when that owner is leaving the fleet or a cancelled
//!   resharding is bringing the keys back), unless the resharding is settled (its copies are
//!   done: the key is here if anywhere);
//! - a write, or a read without `READONLY`, is `MOVED` to the slot's owner (the primary);
//! - the module's own connections (SHARD.CALL's replica reads) read here; their writes get the
//!   server's own refusal, as without the protocol: a replica never writes for a client.
//!
//! The replication stream and a load are obeyed before this is asked (`redirect`).

use crate::cluster::clients;
use crate::cluster::protocol::address_in_use;
use crate::cluster::redirect::{exists, Redirect};
use crate::host::command::Call;
use crate::host::error::CmdError;
use crate::ring::key_slot;
use crate::ring::placement::Placement;
use crate::route::command_table;
use crate::state;

/// The server's own refusal of a write on a replica.
fn read_only_replica() -> CmdError {
    CmdError::code("READONLY", "You can't write against a read only replica.")
}

/// The verdict on `call` (`SHARD.REDIRECT command arg ...`) on a replica, from client `id`.
pub fn verdict(call: &Call, id: u64) -> Result<Redirect, CmdError> {
    let args = &call.args;
    let readonly = command_table::known(args.get(1)).is_some_and(|m| m.readonly);
    // Used up as on a primary; a replica serves no ASK (the previous owner's primary does).
    clients::take_asking(id);
    if clients::is_internal(id) {
        return if readonly {
            Ok(Redirect::RunHere)
        } else {
            Err(read_only_replica())
        };
    }
    let positions = command_table::key_positions(call)?;
    let keys: Vec<&[u8]> = positions.iter().map(|&p| args.get(p + 1)).collect();
    let Some(first) = keys.first() else {
        return if readonly {
            Ok(Redirect::RunHere)
        } else {
            Err(read_only_replica())
        };
    };
    let slot = key_slot(first);
    if keys.iter().any(|k| key_slot(k) != slot) {
        return Err(CmdError::code(
            "CROSSSLOT",
            "Keys in request don't hash to the same slot",
        ));
    }
    let (owner, previous, previous_in_map, mine, returning, settled) = {
        let st = state::lock();
        let owner = |p: &Placement| {
            p.ring
                .as_ref()
                .and_then(|r| r.spec().nodes.get(r.owner(first)).cloned())
        };
        let current = st.rings.current.as_deref();
        let mine = current.and_then(|c| {
            crate::topology::me::shard(&c.spec, &st.config.ring.self_name).map(str::to_string)
        });
        let previous = st.rings.previous.as_deref().and_then(owner);
        let in_map = previous
            .as_ref()
            .is_some_and(|p| current.is_some_and(|c| c.spec.node_index(&p.name).is_some()));
        (
            current.and_then(owner),
            previous,
            in_map,
            mine,
            st.rings.returning,
            st.rings.settled,
        )
    };
    let Some(owner) = owner else {
        // No ring: a replica as without the protocol.
        return if readonly {
            Ok(Redirect::RunHere)
        } else {
            Err(read_only_replica())
        };
    };
    let moved = || CmdError::code("MOVED", format!("{slot} {}", address_in_use(&owner)));
    if !readonly || !clients::is_readonly(id) || mine.as_deref() != Some(owner.name.as_str()) {
        return Err(moved());
    }
    // A READONLY read of this replica's shard's keys. A slot still arriving: the key may be at
    // its previous owner yet, unless the copies are done (settled).
    let arriving = previous.filter(|p| p.name != owner.name && !settled);
    if let Some(previous) = arriving {
        if returning {
            // A cancelled resharding brings the slot's keys back: the primary says when.
            return Err(moved());
        }
        if !keys.iter().all(|k| exists(call, k)) {
            if previous_in_map {
                return Err(CmdError::code(
                    "ASK",
                    format!("{slot} {}", address_in_use(&previous)),
                ));
            }
            return Err(moved());
        }
    }
    Ok(Redirect::RunHere)
}
