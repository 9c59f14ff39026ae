//! `SHARD.RING STATE`: what a node says of itself to the fleet coordinator and to
//! `SHARD.RING CHECK` (its rings, its job, its keys and memory, the routed calls it still has in
//! flight from older rings), made here for this node and read back from the others' replies.

use std::sync::Arc;

use redis_module::{Context, RedisValue};

use crate::net::resp::Resp;
use crate::reshard::JobKind;
use crate::ring::placement::Placement;
use crate::state;

/// What a node answered to `SHARD.RING STATE`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeState {
    pub self_name: String,
    pub digest: String,
    pub previous_digest: String,
    pub returning: bool,
    pub job: String,
    pub job_state: String,
    pub copied: u64,
    pub failed: u64,
    pub percent: u64,
    pub last_error: String,
    pub paused: bool,
    pub keys: u64,
    pub used_memory: u64,
    /// Routed calls in flight there that were routed by rings older than the current ones.
    pub calls_before: u64,
}

impl NodeState {
    /// Reads the reply (a RESP3 map, or RESP2's flat list of names and values).
    pub fn from_resp(reply: &Resp) -> Result<NodeState, String> {
        let pairs: Vec<(&Resp, &Resp)> = match reply {
            Resp::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
            Resp::Array(items) if items.len() % 2 == 0 => {
                items.chunks(2).map(|c| (&c[0], &c[1])).collect()
            }
            Resp::Error(e) => return Err(String::from_utf8_lossy(e).into_owned()),
            other => return Err(format!("SHARD.RING STATE replied {other:?}")),
        };
        let mut st = NodeState::default();
        for (k, v) in pairs {
            let text = || match v {
                Resp::Bulk(b) | Resp::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                Resp::Int(n) => n.to_string(),
                _ => String::new(),
            };
            let int = || match v {
                Resp::Int(n) => u64::try_from(*n).unwrap_or(0),
                _ => text().parse().unwrap_or(0),
            };
            let key = match k {
                Resp::Bulk(b) | Resp::Simple(b) => b.as_slice(),
                _ => continue,
            };
            match key {
                b"self" => st.self_name = text(),
                b"digest" => st.digest = text(),
                b"previous_digest" => st.previous_digest = text(),
                b"returning" => st.returning = text() == "yes",
                b"job" => st.job = text(),
                b"job_state" => st.job_state = text(),
                b"copied" => st.copied = int(),
                b"failed" => st.failed = int(),
                b"percent" => st.percent = int(),
                b"last_error" => st.last_error = text(),
                b"paused" => st.paused = text() == "yes",
                b"keys" => st.keys = int(),
                b"used_memory" => st.used_memory = int(),
                b"calls_before" => st.calls_before = int(),
                _ => {}
            }
        }
        Ok(st)
    }

    /// Whether a job is running there.
    pub fn job_running(&self) -> bool {
        matches!(self.job_state.as_str(), "copying" | "cleaning")
    }
}

/// This node's answer to `SHARD.RING STATE`: its rings, job, key count and memory, as a map of
/// 15 fields (read back by `NodeState::from_resp`).
pub fn this_node(ctx: &Context) -> Resp {
    // INFO first: the state's lock is not held while the server gathers it.
    let keys = crate::reshard::fate::keys_in_keyspace(&info(ctx, "keyspace"));
    let used_memory = info_field(&info(ctx, "memory"), "used_memory").unwrap_or(0);
    let st = state::lock();
    let int = |n: u64| Resp::Int(i64::try_from(n).unwrap_or(i64::MAX));
    let bulk = |b: &[u8]| Resp::Bulk(b.to_vec());
    let digest =
        |p: &Option<Arc<Placement>>| p.as_ref().map(|p| p.digest.clone()).unwrap_or_default();
    let current = crate::reshard::current::lock();
    let job = &current.job;
    let kind = match job.kind {
        Some(JobKind::Copy) => "copy",
        Some(JobKind::Cleanup) => "cleanup",
        None => "",
    };
    let copied = if job.kind == Some(JobKind::Cleanup) {
        job.deleted()
    } else {
        job.copied()
    };
    let calls_before = crate::route::forward::calls_before(st.rings.epoch) as u64;
    let fields = [
        ("self", bulk(st.config.ring.self_name.as_bytes())),
        ("digest", bulk(digest(&st.rings.current).as_bytes())),
        (
            "previous_digest",
            bulk(digest(&st.rings.previous).as_bytes()),
        ),
        ("epoch", int(st.rings.epoch)),
        ("returning", bulk(yes_no(st.rings.returning))),
        ("job", bulk(kind.as_bytes())),
        ("job_state", bulk(job.state.name().as_bytes())),
        ("copied", int(copied)),
        ("failed", int(job.failed())),
        ("percent", int(job.percent())),
        ("last_error", bulk(job.last_error.as_bytes())),
        ("paused", bulk(yes_no(job.paused))),
        ("keys", int(keys)),
        ("used_memory", int(used_memory)),
        ("calls_before", int(calls_before)),
    ];
    Resp::Map(
        fields
            .into_iter()
            .map(|(name, value)| (bulk(name.as_bytes()), value))
            .collect(),
    )
}

pub(super) fn yes_no(b: bool) -> &'static [u8] {
    if b {
        b"yes"
    } else {
        b"no"
    }
}

/// The text of `INFO section` ("" if the server gives none).
fn info(ctx: &Context, section: &str) -> String {
    match ctx.call("INFO", &[section]) {
        Ok(RedisValue::SimpleString(text)) | Ok(RedisValue::BulkString(text)) => text,
        Ok(RedisValue::BulkRedisString(text)) => {
            String::from_utf8_lossy(text.as_slice()).into_owned()
        }
        _ => String::new(),
    }
}

/// A number field of an INFO text.
fn info_field(info: &str, name: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}
