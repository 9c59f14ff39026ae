//! Persistence and replication of the module's state.
//!
//! - RDB: an auxiliary field (data type `shard-aux`, no keys of its own) holds the generator's
//!   high-water mark and the rings, in the format of `persist`.
//! - Replicas and the AOF: SHARD.GENKEY propagates `SHARD.ADVANCE <ms>` (the new high-water
//!   mark, never the command itself, so a replica does not generate keys of its own), and the
//!   ring commands propagate verbatim.

use std::os::raw::c_int;

use redis_module::native_types::RedisType;
use redis_module::{logging, raw};

use crate::persist::Persisted;
use crate::state;

/// The RDB encoding version of the aux field.
const AUX_VERSION: c_int = 1;

pub static SHARD_AUX: RedisType = RedisType::new(
    "shard-aux",
    AUX_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: None,
        rdb_save: None,
        aof_rewrite: None,
        free: None,
        mem_usage: None,
        digest: None,
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save2: None,
        aux_save_triggers: raw::Aux::Before as c_int,
        free_effort: None,
        unlink: None,
        copy: None,
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, _when: c_int) {
    let bytes = std::panic::catch_unwind(|| snapshot().encode());
    match bytes {
        Ok(bytes) => raw::save_slice(rdb, &bytes),
        // Never leave the field empty: an empty value would not decode at load.
        Err(_) => raw::save_slice(rdb, &Persisted::default().encode()),
    }
}

extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, _when: c_int) -> c_int {
    let result = std::panic::catch_unwind(|| -> Result<(), String> {
        if encver > AUX_VERSION {
            return Err(format!(
                "the RDB holds shard data of encoding version {encver}, newer than this module's {AUX_VERSION}"
            ));
        }
        let buffer =
            raw::load_string_buffer(rdb).map_err(|e| format!("cannot read shard's data: {e}"))?;
        restore(Persisted::decode(buffer.as_ref())?)
    });
    let error = match result {
        Ok(Ok(())) => return raw::REDISMODULE_OK as c_int,
        Ok(Err(e)) => e,
        Err(_) => "internal error while reading shard's data".to_string(),
    };
    logging::log_warning(format!("shard: refusing to load the RDB: {error}"));
    raw::REDISMODULE_ERR as c_int
}

/// What survives a restart: the state's high-water mark and rings, and the plan of the fleet
/// operation this node coordinates.
pub fn snapshot() -> Persisted {
    let mut persisted = state::lock().snapshot();
    persisted.fleet = crate::reshard::current::lock()
        .fleet
        .as_ref()
        .map(|f| f.encode());
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
    state::lock().restore(persisted)?;
    crate::reshard::current::lock().fleet = fleet;
    Ok(())
}
