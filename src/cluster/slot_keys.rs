//! The keys of one slot, for `CLUSTER COUNTKEYSINSLOT` and `GETKEYSINSLOT`: from the key index
//! when it is on and ready (`index`: a `slots` ring's buckets are its slots), O(1) and O(count);
//! else, since a plain server keeps no index by slot, a walk of the caller's database with the
//! module scan API (`host::keyspace`), hashing every name: O(N) on the main thread, like `KEYS`
//! (COMMAND DOCS says so). It once went through `SCAN` replies and dropped the names that arrive
//! as simple strings (every UTF-8 name), so both answered 0 for keys that were there.

use redis_module::Context;

use crate::host::keyspace::{self, ScanCursor};
use crate::ring::{key_slot, Algo, HashTag};

/// How many keys of the selected database are in `slot` (when `count` is asked: else the walk
/// ends once it has `max` names), and the first `max` of them.
pub fn keys_in_slot(ctx: &Context, slot: u16, max: usize, count: bool) -> (u64, Vec<Vec<u8>>) {
    if let Some(found) = from_index(ctx, slot, max) {
        return found;
    }
    let mut names = Vec::new();
    let mut found = 0u64;
    let Some(cursor) = ScanCursor::new() else {
        return (0, names);
    };
    loop {
        let more = cursor.scan(ctx, &mut |name, _| {
            if key_slot(name) == slot {
                found += 1;
                if names.len() < max {
                    names.push(name.to_vec());
                }
            }
        });
        if !more || (!count && names.len() >= max) {
            return (found, names);
        }
    }
}

/// The answer of the key index, when it is ready and its buckets are Redis Cluster's slots.
fn from_index(ctx: &Context, slot: u16, max: usize) -> Option<(u64, Vec<Vec<u8>>)> {
    let ring = crate::state::lock().rings.current.clone()?;
    let slots = ring.spec.algo == Algo::Slots && ring.spec.hashtag == HashTag::Cluster;
    if !slots {
        return None;
    }
    let db = keyspace::selected_db(ctx);
    crate::index::with_ready(&ring, |index| {
        let names = index
            .names(db, slot)
            .take(max)
            .map(<[u8]>::to_vec)
            .collect();
        (index.count(db, slot) as u64, names)
    })
}
