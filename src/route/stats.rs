//! The counters of routed calls that `INFO shard` shows (`call_*`): calls run here, forwarded,
//! fallbacks to a previous owner, copies before writes, timeouts and errors (per node too),
//! reads at replicas, `NOREPLICAS` answers. Counted by the routing's parts, read by `info`.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// Counters shown in `INFO shard`.
#[derive(Debug, Default, Clone)]
pub struct RouteStats {
    pub local: u64,
    pub forwarded: u64,
    pub fallbacks: u64,
    pub copies: u64,
    pub timeouts: u64,
    pub errors: u64,
    /// Reads a replica answered (`shard.read-from`), and reads that fell back to the primary.
    pub replica_reads: u64,
    pub replica_fallbacks: u64,
    /// `SHARD.CALL WAIT` calls answered `NOREPLICAS` (too few replicas acknowledged a write).
    pub noreplicas: u64,
    /// Per node: (errors, timeouts).
    pub per_node: BTreeMap<String, (u64, u64)>,
}

static STATS: Mutex<Option<RouteStats>> = Mutex::new(None);

pub fn stats() -> RouteStats {
    let mut stats = STATS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .unwrap_or_default();
    stats.local += crate::route::filter::REWRITTEN.load(std::sync::atomic::Ordering::Relaxed);
    stats
}

pub fn count(update: impl FnOnce(&mut RouteStats)) {
    let mut guard = STATS.lock().unwrap_or_else(PoisonError::into_inner);
    update(guard.get_or_insert_with(RouteStats::default));
}
