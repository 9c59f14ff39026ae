//! One node's hottest keys, for `SHARD.HOTKEYS LOCAL` and this node's part of the fleet's
//! `SHARD.HOTKEYS` (merged by `keyless::hot_keys`): a sample of the keyspace, each key's LFU
//! counter, the top `count` kept.
//!
//! How: the keys of the client's database are walked with the module's scan cursor
//! (`RedisModule_Scan`), their counters read as `OBJECT FREQ` reads them
//! (`host::keyspace::ScannedKey::lfu`: nothing is touched, neither the counters nor the access
//! times that eviction goes by). The walk runs in steps of at most `STEP` (1 ms) of the main
//! thread, each in its own turn of the event loop (a timer of 0 ms between them), so clients are
//! served between steps (Redis 7.0 runs a module timer armed in a timer's callback 1 ms later
//! at the soonest, so there the walk takes at most about half of the main thread); it ends at the end of the keyspace, after `samples` keys, or at half of
//! `shard.call-timeout-ms` (so that a node asked by another answers within the asker's call
//! timeout), whichever comes first. A keyspace of at most `samples` keys is read whole, and the
//! top is exact; a larger one is sampled: the scan's order is the hash table's, so the keys read
//! are a sample without repeats, in effect uniform (unlike `RANDOMKEY`, which repeats keys and
//! favours those alone in their bucket). A key the scan meets twice (a rehash under way) is
//! kept once.
//!
//! Why LFU only: without an LFU `maxmemory-policy` the server keeps no access counter (the
//! field holds the last access time instead), and nothing else counts accesses without a
//! cost on every command (a command filter counting keys would tax the hot path the module
//! keeps at the server's own speed). So under another policy `SHARD.HOTKEYS` refuses, saying
//! to set `allkeys-lfu` or `volatile-lfu` (`CONFIG SET maxmemory-policy allkeys-lfu`: with no
//! `maxmemory`, nothing is evicted, only counted).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::time::{Duration, Instant};

use redis_module::ContextFlags;

use crate::host::caller;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::host::keyspace::{self, ScanCursor};
use crate::net::pool::{link_timeout, Link};
use crate::net::resp::Resp;
use crate::route::forward::{self, CallReply, NetSteps};

/// The longest a step of the walk holds the main thread.
pub const STEP: Duration = Duration::from_millis(1);

/// The top `count` keys by counter among those offered; equal counters by key name (smaller
/// first), so that the result does not depend on the order the keys came in.
pub struct Top {
    count: usize,
    /// The kept keys, the worst on top.
    heap: BinaryHeap<Reverse<(u64, Reverse<Vec<u8>>)>>,
    names: HashSet<Vec<u8>>,
}

impl Top {
    pub fn new(count: usize) -> Top {
        Top {
            count,
            heap: BinaryHeap::with_capacity(count.saturating_add(1)),
            names: HashSet::with_capacity(count.saturating_add(1)),
        }
    }

    /// Offers a key; it is kept while it is among the top `count` (a key kept already is not
    /// kept twice). The name is copied only when the key is kept.
    pub fn offer(&mut self, key: &[u8], freq: u64) {
        if self.count == 0 {
            return;
        }
        let full = self.heap.len() == self.count;
        if full {
            let Some(Reverse((worst, Reverse(worst_key)))) = self.heap.peek() else {
                return;
            };
            // Better: a higher counter, or the same one and a smaller name (most keys are
            // not, and are let go before the name is hashed).
            let better = freq > *worst || (freq == *worst && key < worst_key.as_slice());
            if !better {
                return;
            }
        }
        if self.names.contains(key) {
            return;
        }
        if full {
            if let Some(Reverse((_, Reverse(gone)))) = self.heap.pop() {
                self.names.remove(&gone);
            }
        }
        self.names.insert(key.to_vec());
        self.heap.push(Reverse((freq, Reverse(key.to_vec()))));
    }

    /// The kept keys, hottest first.
    pub fn into_sorted(self) -> Vec<(Vec<u8>, u64)> {
        // Ascending `Reverse(...)` is descending by counter, then ascending by name.
        self.heap
            .into_sorted_vec()
            .into_iter()
            .map(|Reverse((freq, Reverse(key)))| (key, freq))
            .collect()
    }
}

/// Refuses unless the server keeps LFU counters (`maxmemory-policy` `allkeys-lfu` or
/// `volatile-lfu`).
pub fn check_policy() -> Result<(), CmdError> {
    let policy = crate::host::context::server_config("maxmemory-policy");
    if policy.ends_with("-lfu") {
        return Ok(());
    }
    Err(CmdError::err(format!(
        "SHARD.HOTKEYS reads the keys' LFU counters, which the server keeps only under an LFU policy: set maxmemory-policy to allkeys-lfu or volatile-lfu (it is '{policy}' here)"
    )))
}

/// How far a walk goes: at most `samples` keys, for at most `time`.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    pub samples: u64,
    pub time: Duration,
}

impl Limit {
    /// `samples` keys, for at most half of this node's `shard.call-timeout-ms`.
    pub fn of(samples: u64) -> Limit {
        let ms = crate::state::lock().config.call_timeout_ms.max(2) / 2;
        Limit {
            samples,
            time: Duration::from_millis(u64::try_from(ms).unwrap_or(500)),
        }
    }
}

/// This node's top `count` keys of database `db`, hottest first: the walk in steps of `STEP`,
/// a turn of the event loop between two (`steps.sleep`). Main thread only.
pub async fn sample(
    steps: &NetSteps,
    db: i32,
    count: usize,
    limit: Limit,
) -> Result<Vec<(Vec<u8>, u64)>, String> {
    let cursor = ScanCursor::new().ok_or_else(|| {
        "ERR the server has no RedisModule_Scan: no keys can be sampled".to_string()
    })?;
    let deadline = Instant::now() + limit.time;
    let mut walk = Walk {
        cursor,
        top: Top::new(count),
        seen: 0,
    };
    loop {
        let more = walk.step(db, limit.samples)?;
        if !more || walk.seen >= limit.samples || Instant::now() >= deadline {
            return Ok(walk.top.into_sorted());
        }
        steps.sleep(Duration::ZERO).await;
    }
}

/// A node's top as `SHARD.HOTKEYS LOCAL` replies it: `[[key, freq] ...]`, hottest first.
pub fn local_reply(top: Vec<(Vec<u8>, u64)>) -> Resp {
    Resp::Array(
        top.into_iter()
            .map(|(key, freq)| {
                Resp::Array(vec![
                    Resp::Bulk(key),
                    Resp::Int(i64::try_from(freq).unwrap_or(i64::MAX)),
                ])
            })
            .collect(),
    )
}

/// `SHARD.HOTKEYS LOCAL`: this node's top `count` of the client's database, the client
/// blocked while the walk runs in steps.
pub fn local(call: &Call, count: usize, samples: u64) -> CmdResult {
    check_policy()?;
    let db = caller::selected_db(call);
    let link = {
        let st = crate::state::lock();
        Link {
            timeout: link_timeout(st.config.call_timeout_ms),
            auth: st.config.auth(),
            resp3: call.ctx.get_flags().contains(ContextFlags::FLAGS_RESP3),
            db,
        }
    };
    let db = i32::try_from(db).unwrap_or(0);
    let limit = Limit::of(samples);
    forward::run(call, link, move |steps| async move {
        CallReply::Reply(match sample(&steps, db, count, limit).await {
            Ok(top) => local_reply(top),
            Err(e) => Resp::Error(e.into_bytes()),
        })
    })
    .map_err(CmdError::err)
}

/// A walk under way: where the scan is, the top so far, how many keys were read.
struct Walk {
    cursor: ScanCursor,
    top: Top,
    seen: u64,
}

impl Walk {
    /// One step of at most `STEP`: scans on in database `db` (the detached context's
    /// database set back after) until `samples` keys were read in all; true while the
    /// keyspace has more.
    fn step(&mut self, db: i32, samples: u64) -> Result<bool, String> {
        let ctx = crate::host::context::detached()
            .ok_or_else(|| "ERR the module is not loaded yet".to_string())?;
        let before = keyspace::selected_db(&ctx);
        if !keyspace::select_db(&ctx, db) {
            return Err(format!("ERR there is no database {db} to sample"));
        }
        let started = Instant::now();
        let (top, seen) = (&mut self.top, &mut self.seen);
        let mut more = true;
        while *seen < samples && started.elapsed() < STEP {
            more = self.cursor.scan(&ctx, &mut |name, key| {
                *seen += 1;
                if let Some(freq) = key.lfu() {
                    top.offer(name, freq);
                }
            });
            if !more {
                break;
            }
        }
        keyspace::select_db(&ctx, before);
        Ok(more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top_of(count: usize, keys: &[(&str, u64)]) -> Vec<(String, u64)> {
        let mut top = Top::new(count);
        for (k, f) in keys {
            top.offer(k.as_bytes(), *f);
        }
        top.into_sorted()
            .into_iter()
            .map(|(k, f)| (String::from_utf8(k).unwrap(), f))
            .collect()
    }

    fn owned(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|(k, f)| (k.to_string(), *f)).collect()
    }

    #[test]
    fn keeps_the_hottest_whatever_the_order() {
        let keys = [
            ("a", 5),
            ("hot", 200),
            ("b", 6),
            ("warm", 90),
            ("c", 5),
            ("hotter", 250),
        ];
        let want = owned(&[("hotter", 250), ("hot", 200), ("warm", 90)]);
        assert_eq!(top_of(3, &keys), want);
        let mut reversed = keys;
        reversed.reverse();
        assert_eq!(top_of(3, &reversed), want);
        assert_eq!(top_of(0, &keys), Vec::new());
        assert_eq!(top_of(100, &keys).len(), keys.len());
    }

    #[test]
    fn ties_by_name_and_a_key_met_twice_kept_once() {
        let keys = [("z", 7), ("y", 7), ("x", 7), ("y", 7), ("w", 1)];
        assert_eq!(top_of(2, &keys), owned(&[("x", 7), ("y", 7)]));
        assert_eq!(
            top_of(10, &keys),
            owned(&[("x", 7), ("y", 7), ("z", 7), ("w", 1)])
        );
        // A key dropped from the top and met again stays out.
        let keys = [("a", 1), ("b", 9), ("a", 1)];
        assert_eq!(top_of(1, &keys), owned(&[("b", 9)]));
    }
}
