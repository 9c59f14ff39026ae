//! Module configurations (`CONFIG SET shard.x`, `loadmodule ... x value`, `shard.x` in
//! redis.conf). Each one edits the configuration held in the state, which checks the whole
//! combination before accepting a value.

use redis_module::configuration::{ConfigurationContext, ConfigurationValue};
use redis_module::{RedisError, RedisString};

use crate::keys::KeyConfig;
use crate::state;

/// A text configuration: how to read and write its field.
pub struct TextConfig {
    get: fn(&KeyConfig) -> String,
    set: fn(&mut KeyConfig, String),
}

/// A numeric configuration.
pub struct IntConfig {
    get: fn(&KeyConfig) -> i64,
    set: fn(&mut KeyConfig, i64),
}

impl ConfigurationValue<RedisString> for TextConfig {
    fn get(&self, _: &ConfigurationContext) -> RedisString {
        RedisString::create(None, (self.get)(&state::lock().config))
    }

    fn set(&self, _: &ConfigurationContext, value: RedisString) -> Result<(), RedisError> {
        let text = value.try_as_str()?.to_owned();
        state::lock()
            .change_config(|c| (self.set)(c, text))
            .map_err(RedisError::String)
    }
}

impl ConfigurationValue<i64> for IntConfig {
    fn get(&self, _: &ConfigurationContext) -> i64 {
        (self.get)(&state::lock().config)
    }

    fn set(&self, _: &ConfigurationContext, value: i64) -> Result<(), RedisError> {
        state::lock()
            .change_config(|c| (self.set)(c, value))
            .map_err(RedisError::String)
    }
}

pub static LAYOUT: TextConfig = TextConfig {
    get: |c| c.layout.clone(),
    set: |c, v| c.layout = v,
};
pub static EPOCH: TextConfig = TextConfig {
    get: |c| c.epoch.clone(),
    set: |c, v| c.epoch = v,
};
pub static CUSTOM_LAYOUT: TextConfig = TextConfig {
    get: |c| c.custom_layout.clone(),
    set: |c, v| c.custom_layout = v,
};
pub static ENCODING: TextConfig = TextConfig {
    get: |c| c.encoding.clone(),
    set: |c, v| c.encoding = v,
};
pub static TYPES: TextConfig = TextConfig {
    get: |c| c.types.clone(),
    set: |c, v| c.types = v,
};
pub static NODE_ID: IntConfig = IntConfig {
    get: |c| c.node_id,
    set: |c, v| c.node_id = v,
};
pub static NODE_COUNT: IntConfig = IntConfig {
    get: |c| c.node_count,
    set: |c, v| c.node_count = v,
};
pub static MAX_DRIFT_MS: IntConfig = IntConfig {
    get: |c| c.max_drift_ms,
    set: |c, v| c.max_drift_ms = v,
};

/// Every configuration name, as accepted in `loadmodule` arguments.
pub const NAMES: &[&str] = &[
    "layout",
    "node-id",
    "epoch",
    "custom-layout",
    "encoding",
    "types",
    "node-count",
    "max-drift-ms",
];

/// Checks `loadmodule` arguments: name/value pairs of known configurations.
pub fn check_module_args(args: &[Vec<u8>]) -> Result<(), String> {
    if !args.len().is_multiple_of(2) {
        return Err(
            "module arguments must be name value pairs, e.g. 'node-id 3 layout snowflake'".into(),
        );
    }
    for name in args.iter().step_by(2) {
        if !NAMES.iter().any(|n| n.as_bytes() == name.as_slice()) {
            return Err(format!(
                "unknown module argument '{}': expected one of {}",
                String::from_utf8_lossy(name),
                NAMES.join(", ")
            ));
        }
    }
    Ok(())
}
