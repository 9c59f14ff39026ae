//! `SHARD.REDIRECT command arg ...`'s verdict: a keyed command the cluster protocol's filter
//! could not let through (`filter`), judged with the context the filter lacks: who sent it
//! (the primary's replication stream, the AOF, the module's own connections between nodes and
//! an `ASKING` client are obeyed) and whether its keys are here. The verdict is a refusal a
//! cluster client follows (`MOVED`, `ASK`, `CROSSSLOT`, `TRYAGAIN`), running the command here,
//! or routing it as SHARD.CALL does: a write of a key not copied yet in a resharding is made
//! safe by SHARD.CALL's copy-before-write plan, and a delete reaches both owners. Once the
//! resharding is settled (its copies are done), a moving slot's keys are at the new owner if
//! anywhere: it runs their reads and writes itself, and the previous owner no longer serves an
//! `ASK` for them (its copy may be one a node that committed has deleted since). With
//! `shard.route-plain yes` beside the protocol, a client's command is routed, never
//! redirected: plain clients cannot follow `MOVED`, and a cluster client is answered too. On a
//! replica,
//! what is not its primary's replication stream is judged by `replica`.

use redis_module::ContextFlags;

use crate::cluster::clients;
use crate::cluster::protocol::{address_in_use, not_named};
use crate::host::caller;
use crate::host::command::Call;
use crate::host::error::CmdError;
use crate::ring::key_slot;
use crate::ring::placement::Placement;
use crate::route::command_table;
use crate::route::steps::CommandKind;
use crate::state;

/// What becomes of a redirected command that is not refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirect {
    /// It runs here, as the calling user, replicated like itself.
    RunHere,
    /// It runs here whoever sent it: the primary's replication stream on a replica.
    Obey,
    /// It is routed as SHARD.CALL routes it.
    Route,
}

/// The verdict on `call` (`SHARD.REDIRECT command arg ...`, at least two arguments): what
/// becomes of the command, or the refusal the client gets.
pub fn verdict(call: &Call) -> Result<Redirect, CmdError> {
    let args = &call.args;
    let flags = call.ctx.get_flags();
    let id = caller::client_id(call);
    if flags.contains(ContextFlags::REPLICATED) {
        // The filter lets this client through untouched from now on, where it can tell it.
        clients::mark_primary_link(id);
        return Ok(Redirect::Obey);
    }
    if flags.contains(ContextFlags::LOADING) {
        return Ok(Redirect::RunHere);
    }
    if crate::host::context::server_is_replica() {
        return crate::cluster::replica::verdict(call, id);
    }
    if clients::is_internal(id) {
        // A node outside its rings owns no key: a write routed here by older rings is refused
        // (`route::outside`).
        if crate::route::outside::refuses(args.get(1)) {
            return Err(crate::route::outside::refusal());
        }
        return Ok(Redirect::RunHere);
    }
    let readonly = command_table::known(args.get(1)).is_some_and(|m| m.readonly);
    if !readonly && crate::route::gate::closed() {
        return Err(crate::route::gate::refusal());
    }
    // Plain clients beside cluster clients (`shard.route-plain yes`): every client's command
    // is routed rather than redirected, which a cluster client follows as well (its command
    // answered where its map would have sent it) and a plain client needs.
    if crate::route::plain::enabled() {
        return Ok(Redirect::Route);
    }
    let asking = clients::take_asking(id);
    let positions = command_table::key_positions(call)?;
    let keys: Vec<&[u8]> = positions.iter().map(|&p| args.get(p + 1)).collect();
    let Some(first) = keys.first() else {
        return Ok(Redirect::RunHere);
    };
    // A read placed by unchecked rings could miss what the newer rings' owner acknowledged.
    if crate::route::gate::closed() {
        return Err(crate::route::gate::refusal());
    }
    let slot = key_slot(first);
    if keys.iter().any(|k| key_slot(k) != slot) {
        return Err(CmdError::code(
            "CROSSSLOT",
            "Keys in request don't hash to the same slot",
        ));
    }
    let (current, previous, previous_in_map, self_name, (returning, fence, settled)) = {
        let st = state::lock();
        let owner = |p: &Placement| {
            p.ring
                .as_ref()
                .and_then(|r| r.spec().nodes.get(r.owner(first)).cloned())
        };
        let current = st.rings.current.as_deref().and_then(owner);
        let previous = st.rings.previous.as_deref().and_then(owner);
        // Whether clients can reach the previous owner from the map (a node that is leaving
        // the fleet is not in it).
        let in_map = previous.as_ref().is_some_and(|p| {
            st.rings
                .current
                .as_ref()
                .is_some_and(|c| c.spec.node_index(&p.name).is_some())
        });
        (
            current,
            previous,
            in_map,
            st.config.ring.self_name.clone(),
            (st.rings.returning, st.rings.fence, st.rings.settled),
        )
    };
    let Some(current) = current else {
        return Ok(Redirect::RunHere);
    };
    let previous = previous.filter(|p| p.name != current.name);
    if returning && previous.is_some() {
        // A cancelled resharding brings this slot's keys back (`route::decide`): clients
        // retry on TRYAGAIN, as during a cluster's multi-key migration.
        return Err(crate::route::decide::refusal(fence, "slot"));
    }
    if current.name != self_name {
        // A read of a key still at its previous owner, asked for after an ASK.
        if asking && readonly && !settled && previous.as_ref().is_some_and(|p| p.name == self_name)
        {
            return Ok(Redirect::RunHere);
        }
        return Err(CmdError::code(
            "MOVED",
            format!("{slot} {}", address_in_use(&current)),
        ));
    }
    if !crate::topology::nodes::acts_as(&current, &self_name) {
        // This server's own `sentinel` node, whose primary Sentinel says is another server (or
        // has not said yet): never run here as the owner's.
        let (code, text) = not_named(slot, &current);
        return Err(CmdError::code(code, text));
    }
    let Some(previous) = previous else {
        return Ok(Redirect::RunHere);
    };
    // This node is the new owner of a slot being moved here. It holds the key already, the
    // copies are done (settled), or this is the copy arriving (MIGRATE's RESTORE from the
    // previous owner); a delete, and before the resharding settles any write (it may remove
    // the key: GETDEL, EXPIRE 0, a last pop), goes the routed way, which removes the previous
    // owner's copy too, unless it is in a transaction (it cannot wait there: it runs here).
    let name = args.get(1);
    let readonly = command_table::known(name).is_some_and(|m| m.readonly);
    let removes = match CommandKind::of(name, readonly) {
        CommandKind::Delete => true,
        CommandKind::Write => !settled,
        CommandKind::Read => false,
    } && !flags.contains(ContextFlags::MULTI);
    let restore =
        name.eq_ignore_ascii_case(b"restore") || name.eq_ignore_ascii_case(b"restore-asking");
    if restore || (!removes && (settled || keys.iter().all(|k| exists(call, k)))) {
        return Ok(Redirect::RunHere);
    }
    if readonly && previous_in_map {
        return Err(CmdError::code(
            "ASK",
            format!("{slot} {}", address_in_use(&previous)),
        ));
    }
    // A write of a key not copied yet: SHARD.CALL's copy-before-write, then the write here. A
    // read of a key still at a node that is leaving the fleet (not in the map, so cluster
    // clients cannot follow an ASK there): SHARD.CALL's fallback reads it there for them.
    Ok(Redirect::Route)
}

/// Whether `key` is in the calling client's database here.
pub(crate) fn exists(call: &Call, key: &[u8]) -> bool {
    let key = call.ctx.create_string(key);
    matches!(
        call.ctx.call("EXISTS", &[&key]),
        Ok(redis_module::RedisValue::Integer(1))
    )
}
