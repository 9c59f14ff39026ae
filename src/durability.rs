//! Persistence and replication of the module's state.
//!
//! - RDB: an auxiliary field (`host::aux`) holds the generator's high-water mark, the rings
//!   and the fleet plan this node coordinates, in the format of `persist`.
//! - Replicas and the AOF: SHARD.GENKEY propagates `SHARD.ADVANCE <ms>` (the new high-water
//!   mark, never the command itself, so a replica does not generate keys of its own), and the
//!   ring commands propagate verbatim.
//! - The transactions' records (`txn::durable_bytes`: an owner's prepared parts and done list)
//!   go in the RDB aux field too; their commands replicate themselves (`txn::owner::run`).

use crate::persist::Persisted;
use crate::state;

/// Registers the RDB aux field's contents (at load).
pub fn register() {
    crate::host::aux::set_hooks(crate::host::aux::AuxHooks {
        save: || snapshot().encode(),
        fallback: || Persisted::default().encode(),
        load: |bytes| restore(Persisted::decode(bytes)?),
    });
}

/// What survives a restart: the state's high-water mark and rings, and the plan of the fleet
/// operation this node coordinates.
pub fn snapshot() -> Persisted {
    let mut persisted = state::lock().snapshot();
    persisted.fleet = crate::reshard::current::lock()
        .fleet
        .as_ref()
        .map(|f| f.encode());
    persisted.txn = crate::txn::durable_bytes();
    persisted
}

/// Takes the persisted state (an RDB at start, or a master's at a full sync), whole or not at
/// all: the fleet plan is decoded before anything changes.
pub fn restore(persisted: Persisted) -> Result<(), String> {
    let fleet = persisted
        .fleet
        .as_deref()
        .map(crate::reshard::fleet::plan::FleetPlan::decode)
        .transpose()
        .map_err(|e| format!("the fleet plan: {e}"))?;
    let txn = crate::txn::decode_durable(persisted.txn.as_deref())
        .map_err(|e| format!("the transactions' records: {e}"))?;
    state::lock().restore(persisted)?;
    txn.restore();
    let mut current = crate::reshard::current::lock();
    crate::reshard::fleet::journal::stored("a load", current.fleet.as_ref(), fleet.as_ref());
    current.fleet = fleet;
    Ok(())
}
