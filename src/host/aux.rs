//! The module's auxiliary field in the RDB (data type `shard-aux`, no keys of its own): Redis
//! asks for its bytes when it saves (before the keys) and hands them back when it loads. What
//! the bytes are is the caller's (`durability`), registered once at load with [`set_hooks`].

use std::os::raw::c_int;
use std::sync::OnceLock;

use redis_module::native_types::RedisType;
use redis_module::{logging, raw};

/// The RDB encoding version of the aux field.
const AUX_VERSION: c_int = 1;

/// What the field holds: the bytes to save, and what to do with the bytes loaded (an error
/// refuses the whole RDB, with that message in the log).
pub struct AuxHooks {
    pub save: fn() -> Vec<u8>,
    /// The bytes to save when `save` panicked: never leave the field empty, since an empty
    /// value would not decode at load.
    pub fallback: fn() -> Vec<u8>,
    pub load: fn(&[u8]) -> Result<(), String>,
}

static HOOKS: OnceLock<AuxHooks> = OnceLock::new();

/// Registers what the aux field holds (once, at load).
pub fn set_hooks(hooks: AuxHooks) {
    let _ = HOOKS.set(hooks);
}

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
    let Some(hooks) = HOOKS.get() else {
        return;
    };
    match std::panic::catch_unwind(hooks.save) {
        Ok(bytes) => raw::save_slice(rdb, &bytes),
        Err(_) => raw::save_slice(rdb, &(hooks.fallback)()),
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
        let hooks = HOOKS.get().ok_or("the module is not loaded yet")?;
        (hooks.load)(buffer.as_ref())
    });
    let error = match result {
        Ok(Ok(())) => return raw::REDISMODULE_OK as c_int,
        Ok(Err(e)) => e,
        Err(_) => "internal error while reading shard's data".to_string(),
    };
    logging::log_warning(format!("shard: refusing to load the RDB: {error}"));
    raw::REDISMODULE_ERR as c_int
}
