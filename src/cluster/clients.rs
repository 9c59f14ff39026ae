//! What the cluster protocol remembers of clients, by client id: the module's own connections
//! from other nodes (`SHARD.CLUSTER INTERNAL`: never redirected), the clients that sent
//! `ASKING` and have not used it yet (their next redirected command may run at the previous
//! owner of a slot being moved), the clients that sent `READONLY` (on a replica, their reads of
//! its shard's keys run there, as in cluster mode, until `READWRITE`), and, on a replica, the
//! client its primary's replication stream comes from (learned from the first redirected
//! command it sends: the filter then lets the stream through untouched where it can tell the
//! client). A client that disconnects is forgotten (`forget`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

static INTERNAL: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
static ASKING: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
static READONLY: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
/// The replication stream's client on a replica (0: not known).
static PRIMARY_LINK: AtomicU64 = AtomicU64::new(0);

/// The client is one of the module's own connections from another node.
pub fn mark_internal(id: u64) {
    mark(&INTERNAL, id);
}

pub fn is_internal(id: u64) -> bool {
    contains(&INTERNAL, id)
}

/// The client sent `ASKING`.
pub fn mark_asking(id: u64) {
    mark(&ASKING, id);
}

/// Whether the client sent `ASKING` since its last redirected command (used up by asking).
pub fn take_asking(id: u64) -> bool {
    ASKING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
        .is_some_and(|s| s.remove(&id))
}

/// The client sent `READONLY` (`on`) or `READWRITE` (`!on`).
pub fn set_readonly(id: u64, on: bool) {
    if on {
        mark(&READONLY, id);
    } else if let Some(s) = READONLY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
    {
        s.remove(&id);
    }
}

/// Whether the client is in `READONLY` mode.
pub fn is_readonly(id: u64) -> bool {
    contains(&READONLY, id)
}

/// The client is the replication stream from this replica's primary.
pub fn mark_primary_link(id: u64) {
    PRIMARY_LINK.store(id, Ordering::Relaxed);
}

pub fn is_primary_link(id: u64) -> bool {
    id != 0 && PRIMARY_LINK.load(Ordering::Relaxed) == id
}

/// Forgets a client that disconnected.
pub fn forget(id: u64) {
    for set in [&INTERNAL, &ASKING, &READONLY] {
        if let Some(s) = set.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            s.remove(&id);
        }
    }
    let _ = PRIMARY_LINK.compare_exchange(id, 0, Ordering::Relaxed, Ordering::Relaxed);
}

fn contains(set: &Mutex<Option<HashSet<u64>>>, id: u64) -> bool {
    set.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .is_some_and(|s| s.contains(&id))
}

fn mark(set: &Mutex<Option<HashSet<u64>>>, id: u64) {
    set.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashSet::new)
        .insert(id);
}
