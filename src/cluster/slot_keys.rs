//! The keys of one slot, for `CLUSTER COUNTKEYSINSLOT` and `GETKEYSINSLOT`: a plain server
//! keeps no index by slot, so this walks the caller's database with the module scan API
//! (`host::keyspace`), hashing every name: O(N) on the main thread, like `KEYS` (COMMAND DOCS
//! says so). It once went through `SCAN` replies and dropped the names that arrive as simple
//! strings (every UTF-8 name), so both answered 0 for keys that were there.

use redis_module::Context;

use crate::host::keyspace::ScanCursor;
use crate::ring::key_slot;

/// How many keys of the selected database are in `slot`, and the first `max` of them.
pub fn keys_in_slot(ctx: &Context, slot: u16, max: usize) -> (u64, Vec<Vec<u8>>) {
    let mut names = Vec::new();
    let mut count = 0u64;
    let Some(cursor) = ScanCursor::new() else {
        return (0, names);
    };
    loop {
        let more = cursor.scan(ctx, &mut |name, _| {
            if key_slot(name) == slot {
                count += 1;
                if names.len() < max {
                    names.push(name.to_vec());
                }
            }
        });
        if !more {
            return (count, names);
        }
    }
}
