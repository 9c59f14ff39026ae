//! Persistence and replication of the module's state.
//!
//! - RDB: an auxiliary field (data type `shard-aux`, no keys of its own) holds the generator's
//!   high-water mark and the rings, in the format of `persist`.
//! - Replicas and the AOF: SHARD.GENKEY propagates `SHARD.ADVANCE <ms>` (the new high-water
//!   mark, never the command itself, so a replica does not generate keys of its own), and the
//!   ring commands propagate verbatim.

use std::os::raw::{c_int, c_longlong};

use redis_module::native_types::RedisType;
use redis_module::{logging, raw, ContextFlags};

use crate::commands::args::int_in;
use crate::commands::{Call, CmdError, CmdResult};
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
    let bytes = std::panic::catch_unwind(|| state::lock().snapshot().encode());
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
        let persisted = Persisted::decode(buffer.as_ref())?;
        state::lock().restore(persisted)
    });
    let error = match result {
        Ok(Ok(())) => return raw::REDISMODULE_OK as c_int,
        Ok(Err(e)) => e,
        Err(_) => "internal error while reading shard's data".to_string(),
    };
    logging::log_warning(format!("shard: refusing to load the RDB: {error}"));
    raw::REDISMODULE_ERR as c_int
}

/// Propagates a new high-water mark to replicas and the AOF as `SHARD.ADVANCE ms`.
pub fn propagate_high_water(call: &Call, high_water_ms: i64) {
    // SAFETY: called from a command callback with its live context; "l" takes one long long.
    unsafe {
        if let Some(replicate) = raw::RedisModule_Replicate {
            replicate(
                call.ctx.ctx,
                c"shard.advance".as_ptr(),
                c"l".as_ptr(),
                high_water_ms as c_longlong,
            );
        }
    }
}

/// `SHARD.ADVANCE ms`: applies a master's (or the AOF's) high-water mark. Internal: refused
/// from ordinary clients, who could otherwise push the generator ahead of the clock.
pub fn advance(call: &Call) -> CmdResult {
    let flags = call.ctx.get_flags();
    if !flags.contains(ContextFlags::REPLICATED) && !flags.contains(ContextFlags::LOADING) {
        return Err(CmdError::err(
            "shard.advance is internal: it carries the generator's high-water mark from a master or the AOF",
        ));
    }
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.advance"));
    }
    let ms = int_in(call.args.get(1), "the high-water mark", 0, i64::MAX)?;
    let mut st = state::lock();
    let st = &mut *st;
    st.generator.advance_past_ms(&st.keys.layout, ms);
    call.reply.ok();
    Ok(())
}
