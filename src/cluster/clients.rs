//! What the cluster protocol remembers of clients, by client id: the module's own connections
//! from other nodes (`SHARD.CLUSTER INTERNAL`: never redirected), and the clients that sent
//! `ASKING` and have not used it yet (their next redirected command may run at the previous
//! owner of a slot being moved).

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

static INTERNAL: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
static ASKING: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

/// The client is one of the module's own connections from another node.
pub fn mark_internal(id: u64) {
    mark(&INTERNAL, id);
}

pub fn is_internal(id: u64) -> bool {
    INTERNAL
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .is_some_and(|s| s.contains(&id))
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

fn mark(set: &Mutex<Option<HashSet<u64>>>, id: u64) {
    set.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashSet::new)
        .insert(id);
}
