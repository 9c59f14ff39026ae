//! `SHARD.RING STATE`: what a node says of itself to the fleet coordinator and to
//! `SHARD.RING CHECK` (its rings, its job, its keys and memory, the routed calls it still has in
//! flight from older rings), made here for this node and read back from the others' replies.

use std::sync::Arc;

use redis_module::{Context, RedisValue};

use crate::net::resp::Resp;
use crate::reshard::JobKind;
use crate::ring::placement::Placement;
use crate::ring::{keys_by_share, KeysByShare};
use crate::state;

/// What a node answered to `SHARD.RING STATE`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeState {
    pub self_name: String,
    pub digest: String,
    pub previous_digest: String,
    pub returning: bool,
    /// The returning rings are a fleet operation's fence (`RingState::fence`).
    pub fence: bool,
    /// The canonical texts of its current and previous rings ("" when none): what a RESUME
    /// that adopts the operation whose rings the fleet holds builds its plan from
    /// (`fleet::adopt`).
    pub ring: String,
    pub previous_ring: String,
    /// The rings are settled (`RingState::settled`): the copies are done.
    pub settled: bool,
    pub job: String,
    pub job_state: String,
    /// The term of the fleet step that started the job (0: none, or its server has been a
    /// replica since).
    pub job_term: u64,
    /// The digests of the rings the job ran on, current and previous ("" when none, or from a
    /// build that does not report them).
    pub job_digest: String,
    pub job_previous_digest: String,
    pub copied: u64,
    pub failed: u64,
    pub percent: u64,
    pub last_error: String,
    pub paused: bool,
    pub keys: u64,
    pub used_memory: u64,
    /// Its keys by what it owns of their buckets under its current ring (from its key index;
    /// `None` when it keeps none, or none ready).
    pub keys_by_share: Option<KeysByShare>,
    /// Routed calls in flight there that were routed by rings older than the current ones.
    pub calls_before: u64,
    /// The node's server's run id (a new one at every start).
    pub run_id: String,
    /// The term of the fleet operation it follows (0: none), and that term's holder.
    pub term: u64,
    pub term_holder: String,
    pub term_address: String,
    pub term_run_id: String,
    pub term_released: bool,
    /// How long the holder's lease still runs there (0: run out, released, or none).
    pub lease_left_ms: u64,
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
                b"fence" => st.fence = text() == "yes",
                b"ring" => st.ring = text(),
                b"previous_ring" => st.previous_ring = text(),
                b"settled" => st.settled = text() == "yes",
                b"job" => st.job = text(),
                b"job_state" => st.job_state = text(),
                b"job_term" => st.job_term = int(),
                b"job_digest" => st.job_digest = text(),
                b"job_previous_digest" => st.job_previous_digest = text(),
                b"copied" => st.copied = int(),
                b"failed" => st.failed = int(),
                b"percent" => st.percent = int(),
                b"last_error" => st.last_error = text(),
                b"paused" => st.paused = text() == "yes",
                b"keys" => st.keys = int(),
                b"used_memory" => st.used_memory = int(),
                b"calls_before" => st.calls_before = int(),
                b"run_id" => st.run_id = text(),
                b"term" => st.term = int(),
                b"term_holder" => st.term_holder = text(),
                b"term_address" => st.term_address = text(),
                b"term_run_id" => st.term_run_id = text(),
                b"term_released" => st.term_released = text() == "yes",
                b"lease_left_ms" => st.lease_left_ms = int(),
                b"key_ranges" => {
                    if let Resp::Array(ranges) = v {
                        let by = st.keys_by_share.get_or_insert_with(KeysByShare::default);
                        by.ranges = ranges.iter().filter_map(range).collect();
                    }
                }
                b"keys_in_part_buckets" => {
                    st.keys_by_share
                        .get_or_insert_with(KeysByShare::default)
                        .in_part = int();
                }
                b"keys_not_owned" => {
                    st.keys_by_share
                        .get_or_insert_with(KeysByShare::default)
                        .not_owned = int();
                }
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

/// A `[first, last, keys]` range of `key_ranges`.
fn range(r: &Resp) -> Option<(u16, u16, u64)> {
    let Resp::Array(parts) = r else {
        return None;
    };
    let n = |i: usize| match parts.get(i) {
        Some(Resp::Int(n)) => Some(*n),
        _ => None,
    };
    Some((
        u16::try_from(n(0)?).ok()?,
        u16::try_from(n(1)?).ok()?,
        u64::try_from(n(2)?).ok()?,
    ))
}

/// This node's keys by what it owns of their buckets under `current`, from the key index when
/// it is ready for that ring (one sweep of the ring and of the index's 16384 counts).
fn my_keys_by_share(current: &Option<Arc<Placement>>, self_name: &str) -> Option<KeysByShare> {
    let current = current.as_ref()?;
    let ring = current.ring.as_ref()?;
    let me = current.spec.node_index(self_name)?;
    let counts = crate::index::keys_by_bucket(current)?;
    Some(keys_by_share(&ring.bucket_shares(me), &counts))
}

/// This node's answer to `SHARD.RING STATE`: its rings, job, key count and memory, its run id
/// and the fleet operation's term it follows (`ring::lease`), as a map of 29 fields (`settled`,
/// `fence`, the rings' canonical texts `ring` and `previous_ring`, and the digests of the rings
/// its job ran on, `job_digest` and `job_previous_digest`, among them), and with a
/// ready key index 3 more: `key_ranges` (`[first, last, keys]` for each range of buckets it
/// owns wholly), `keys_in_part_buckets`, `keys_not_owned` (read back by
/// `NodeState::from_resp`).
pub fn this_node(ctx: &Context) -> Resp {
    // INFO first: the state's lock is not held while the server gathers it.
    let keys = crate::reshard::fate::keys_in_keyspace(&info(ctx, "keyspace"));
    let used_memory = info_field(&info(ctx, "memory"), "used_memory").unwrap_or(0);
    let st = state::lock();
    let int = |n: u64| Resp::Int(i64::try_from(n).unwrap_or(i64::MAX));
    let bulk = |b: &[u8]| Resp::Bulk(b.to_vec());
    let digest =
        |p: &Option<Arc<Placement>>| p.as_ref().map(|p| p.digest.clone()).unwrap_or_default();
    let canonical =
        |p: &Option<Arc<Placement>>| p.as_ref().map(|p| p.spec.canonical()).unwrap_or_default();
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
    let by_share = my_keys_by_share(&st.rings.current, &st.config.ring.self_name);
    let lease = &st.lease.record;
    let lease_left_ms = st.lease.left_ms(crate::clock::monotonic_ms());
    let mut fields = vec![
        ("self", bulk(st.config.ring.self_name.as_bytes())),
        ("digest", bulk(digest(&st.rings.current).as_bytes())),
        (
            "previous_digest",
            bulk(digest(&st.rings.previous).as_bytes()),
        ),
        ("epoch", int(st.rings.epoch)),
        ("returning", bulk(yes_no(st.rings.returning))),
        ("fence", bulk(yes_no(st.rings.fence))),
        ("ring", bulk(canonical(&st.rings.current).as_bytes())),
        (
            "previous_ring",
            bulk(canonical(&st.rings.previous).as_bytes()),
        ),
        ("settled", bulk(yes_no(st.rings.settled))),
        ("job", bulk(kind.as_bytes())),
        ("job_state", bulk(job.state.name().as_bytes())),
        ("job_term", int(job.term)),
        ("job_digest", bulk(job.rings.0.as_bytes())),
        ("job_previous_digest", bulk(job.rings.1.as_bytes())),
        ("copied", int(copied)),
        ("failed", int(job.failed())),
        ("percent", int(job.percent())),
        ("last_error", bulk(job.last_error.as_bytes())),
        ("paused", bulk(yes_no(job.paused))),
        ("keys", int(keys)),
        ("used_memory", int(used_memory)),
        ("calls_before", int(calls_before)),
        ("run_id", bulk(crate::host::context::run_id().as_bytes())),
        ("term", int(lease.term)),
        ("term_holder", bulk(lease.holder.name.as_bytes())),
        ("term_address", bulk(lease.holder.address.as_bytes())),
        ("term_run_id", bulk(lease.holder.run_id.as_bytes())),
        ("term_released", bulk(yes_no(lease.released))),
        ("lease_left_ms", int(lease_left_ms)),
    ];
    if let Some(by) = by_share {
        let ranges = by
            .ranges
            .iter()
            .map(|&(first, last, keys)| {
                Resp::Array(vec![int(u64::from(first)), int(u64::from(last)), int(keys)])
            })
            .collect();
        fields.push(("key_ranges", Resp::Array(ranges)));
        fields.push(("keys_in_part_buckets", int(by.in_part)));
        fields.push(("keys_not_owned", int(by.not_owned)));
    }
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
