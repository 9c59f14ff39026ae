//! `SHARD.WHEREIS key` and `SHARD.LOCATE key`: which node owns a key.

use crate::command;
use crate::host::register::{arg, Arg, CommandSpec, Kind};
use std::borrow::Cow;
use std::sync::Arc;

use crate::commands::{Call, CmdError, CmdResult};
use crate::ring::key_slot;
use crate::ring::placement::Placement;
use crate::state::{self, ModuleState};

/// The current ring, or the error that says how to set one (`NORING`).
pub fn current_ring(st: &ModuleState) -> Result<&Arc<Placement>, CmdError> {
    st.current_ring()
}

/// The owner of `key`: name, address, the hashed part and the deciding point.
struct Owner<'p, 'k> {
    name: Cow<'p, str>,
    address: Cow<'p, str>,
    hashed: &'k [u8],
    point: i64,
}

fn owner<'p, 'k>(
    call: &Call,
    placement: &'p Placement,
    key: &'k [u8],
) -> Result<Owner<'p, 'k>, CmdError> {
    match &placement.ring {
        Some(ring) => {
            let loc = ring.locate(key);
            let node = placement
                .spec
                .nodes
                .get(loc.node)
                .ok_or_else(|| CmdError::err("the ring has no node at the located index"))?;
            // A `sentinel` node: the address in use now.
            let address = match node.via_sentinel() {
                true => crate::topology::nodes::address_of(&node.name)
                    .map_or(Cow::Borrowed(node.address.as_str()), Cow::Owned),
                false => Cow::Borrowed(node.address.as_str()),
            };
            Ok(Owner {
                name: Cow::Borrowed(&node.name),
                address,
                hashed: loc.hashed,
                point: loc.point,
            })
        }
        None => {
            let hashed = placement.spec.hashtag.extract(key);
            let slot = key_slot(key);
            let node = crate::cluster::live_slots::owner(call.ctx, slot).map_err(CmdError::err)?;
            Ok(Owner {
                name: Cow::Owned(node.id),
                address: Cow::Owned(node.address),
                hashed,
                point: i64::from(slot),
            })
        }
    }
}

pub fn whereis(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.whereis"));
    }
    let key = call.args.get(1);
    let st = state::lock();
    let current = current_ring(&st)?;
    match &current.ring {
        // The hot path: only the owner's name, nothing built for the reply.
        Some(ring) => call.reply.bulk(ring.owner_spec(key).name.as_bytes()),
        None => call.reply.bulk(owner(call, current, key)?.name.as_bytes()),
    }
    Ok(())
}

pub fn locate(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.locate"));
    }
    let key = call.args.get(1);
    let st = state::lock();
    let current = current_ring(&st)?;
    let found = owner(call, current, key)?;
    let previous = match &st.rings.previous {
        Some(p) => Some(owner(call, p, key)?),
        None => None,
    };
    let reply = &call.reply;
    reply.map(6);
    reply.field_bulk("node", found.name.as_bytes());
    reply.field_bulk("address", found.address.as_bytes());
    reply.field_bulk("hashed", found.hashed);
    reply.field_int("point", found.point);
    reply.field_opt(
        "previous_node",
        previous.as_ref().map(|p| p.name.as_bytes()),
    );
    reply.field_opt(
        "previous_address",
        previous.as_ref().map(|p| p.address.as_bytes()),
    );
    Ok(())
}

static ARGS: &[Arg] = &[arg(c"key", Kind::Str)];

/// `SHARD.WHEREIS`: how Redis registers and documents it.
pub static WHEREIS: CommandSpec = command! {
    name: "shard.whereis",
    handler: whereis,
    flags: "readonly fast",
    arity: 2,
    summary: "Names the node that owns a key",
    complexity: "O(log N) with N the points of the ring",
    args: ARGS,
    acl: "read fast",
};

/// `SHARD.LOCATE`: how Redis registers and documents it.
pub static LOCATE: CommandSpec = command! {
    name: "shard.locate",
    handler: locate,
    flags: "readonly fast",
    arity: 2,
    summary: "Tells which node owns a key, its address, the hashed part and the deciding point",
    complexity: "O(log N) with N the points of the ring",
    args: ARGS,
    acl: "read fast",
};
