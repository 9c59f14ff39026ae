//! The keys of one slot, for `CLUSTER COUNTKEYSINSLOT` and `GETKEYSINSLOT`: a plain server
//! keeps no index by slot, so this walks database 0's keyspace (`SCAN`): O(N), like `KEYS`.

use redis_module::{Context, RedisValue};

use crate::host::error::CmdError;
use crate::ring::key_slot;

/// Keys of database 0 in `slot` (up to `max`).
pub fn keys_in_slot(ctx: &Context, slot: u16, max: usize) -> Result<Vec<Vec<u8>>, CmdError> {
    let mut out = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let reply = ctx
            .call("SCAN", &[cursor.as_str(), "COUNT", "1000"])
            .map_err(|e| CmdError::err(format!("SCAN failed: {e}")))?;
        let RedisValue::Array(parts) = reply else {
            return Err(CmdError::err("SCAN replied something else"));
        };
        let mut parts = parts.into_iter();
        cursor = match parts.next() {
            Some(RedisValue::BulkString(s)) => s,
            Some(RedisValue::SimpleString(s)) => s,
            Some(RedisValue::BulkRedisString(s)) => s.to_string_lossy(),
            _ => return Err(CmdError::err("SCAN replied no cursor")),
        };
        if let Some(RedisValue::Array(keys)) = parts.next() {
            for k in keys {
                let bytes = match k {
                    RedisValue::BulkRedisString(s) => s.as_slice().to_vec(),
                    RedisValue::StringBuffer(b) => b,
                    RedisValue::BulkString(s) => s.into_bytes(),
                    _ => continue,
                };
                if key_slot(&bytes) == slot && out.len() < max {
                    out.push(bytes);
                }
            }
        }
        if cursor == "0" || out.len() >= max {
            return Ok(out);
        }
    }
}
