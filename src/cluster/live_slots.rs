//! The live Redis Cluster slot map, for the `cluster` algo: who serves a slot, read from
//! `CLUSTER SLOTS` and kept for at most one second.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis_module::{Context, RedisValue};

const MAX_AGE: Duration = Duration::from_secs(1);
const SLOTS: usize = 16384;

/// A node that serves slots: its cluster node id and `ip:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    pub address: String,
}

struct SlotMap {
    fetched: Instant,
    nodes: Vec<ClusterNode>,
    /// Index into `nodes` for each slot, or `u16::MAX` for an unserved slot.
    owners: Vec<u16>,
}

static CACHE: Mutex<Option<SlotMap>> = Mutex::new(None);

/// The master serving `slot`, refreshing the map when it is older than a second.
pub fn owner(ctx: &Context, slot: u16) -> Result<ClusterNode, String> {
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    let stale = cache.as_ref().is_none_or(|m| m.fetched.elapsed() > MAX_AGE);
    if stale {
        *cache = Some(fetch(ctx)?);
    }
    let map = cache
        .as_ref()
        .ok_or("the cluster slot map is unavailable")?;
    map.owners
        .get(usize::from(slot))
        .and_then(|&i| map.nodes.get(usize::from(i)))
        .cloned()
        .ok_or_else(|| format!("slot {slot} is not served by any node of the cluster"))
}

fn fetch(ctx: &Context) -> Result<SlotMap, String> {
    let reply = ctx
        .call("CLUSTER", &["SLOTS"])
        .map_err(|e| format!("CLUSTER SLOTS failed: {e}; is cluster-enabled yes?"))?;
    let RedisValue::Array(ranges) = reply else {
        return Err("CLUSTER SLOTS gave an unexpected reply".into());
    };
    let mut map = SlotMap {
        fetched: Instant::now(),
        nodes: Vec::new(),
        owners: vec![u16::MAX; SLOTS],
    };
    for range in ranges {
        let RedisValue::Array(items) = range else {
            continue;
        };
        let (Some(start), Some(end), Some(RedisValue::Array(master))) = (
            items.first().and_then(int),
            items.get(1).and_then(int),
            items.get(2),
        ) else {
            continue;
        };
        let (Some(ip), Some(port), Some(id)) = (
            master.first().and_then(text),
            master.get(1).and_then(int),
            master.get(2).and_then(text),
        ) else {
            continue;
        };
        let node = ClusterNode {
            id,
            address: format!("{ip}:{port}"),
        };
        let index = match map.nodes.iter().position(|n| *n == node) {
            Some(i) => i,
            None => {
                map.nodes.push(node);
                map.nodes.len() - 1
            }
        };
        let index = u16::try_from(index).map_err(|_| "too many cluster nodes")?;
        let (start, end) = (start.clamp(0, 16383) as usize, end.clamp(0, 16383) as usize);
        for owner in map.owners.iter_mut().take(end + 1).skip(start) {
            *owner = index;
        }
    }
    Ok(map)
}

fn int(v: &RedisValue) -> Option<i64> {
    match v {
        RedisValue::Integer(n) => Some(*n),
        _ => None,
    }
}

fn text(v: &RedisValue) -> Option<String> {
    match v {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s.clone()),
        RedisValue::SimpleStringStatic(s) => Some((*s).to_string()),
        RedisValue::BulkRedisString(s) => Some(s.to_string_lossy()),
        RedisValue::StringBuffer(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}
