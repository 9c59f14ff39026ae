//! The keys written on this node (and their databases) while a copy's child runs: the child's
//! snapshot predates them, so the next pass copies them (and a cleanup checks them after its
//! child's walk). Recorded from keyspace events (`host::keyspace_events`, subscribed at the
//! first job, so that a server that never reshards pays nothing; afterwards a write costs one call
//! that checks a flag while no copy runs).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::Context;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::host::keyspace_events::{self, KeyspaceEvent};

/// A database number and a key of it.
pub type DbKey = (i32, Vec<u8>);

/// The keys written, per database.
#[derive(Default)]
struct Written {
    by_db: FxHashMap<i32, FxHashSet<Vec<u8>>>,
    len: usize,
}

/// More keys than this written during one pass: the next pass walks the whole keyspace again
/// instead of holding them all.
const MAX_KEYS: usize = 1_000_000;

static SUBSCRIBED: AtomicBool = AtomicBool::new(false);
static TRACKING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The keys written, or `None` once more than `MAX_KEYS` were.
    static DIRTY: RefCell<Option<Written>> = RefCell::new(Some(Written::default()));
}

/// Subscribes to the keyspace events of writes, once.
pub fn subscribe(ctx: &Context) -> Result<(), String> {
    if SUBSCRIBED.load(Ordering::Relaxed) {
        return Ok(());
    }
    keyspace_events::subscribe_to_writes(ctx, on_event)?;
    SUBSCRIBED.store(true, Ordering::Relaxed);
    Ok(())
}

/// Events after which the key is gone from this node: nothing of it is left to copy or delete.
/// (A cleanup's own `UNLINK`s are among them: recording them cost a cleanup a third of its
/// speed.)
const GONE: [&[u8]; 5] = [b"del", b"expired", b"evicted", b"rename_from", b"move_from"];

fn on_event(event: &KeyspaceEvent) {
    if !TRACKING.load(Ordering::Relaxed) {
        return;
    }
    if GONE.contains(&event.name()) {
        return;
    }
    let bytes = event.key();
    let db = event.db();
    DIRTY.with(|d| {
        let mut d = d.borrow_mut();
        if let Some(written) = d.as_mut() {
            if written.len >= MAX_KEYS {
                *d = None;
                return;
            }
            let set = written.by_db.entry(db).or_default();
            if !set.contains(bytes) {
                set.insert(bytes.to_vec());
                written.len += 1;
            }
        }
    });
}

/// Starts recording, with nothing recorded (at a child's fork).
pub fn begin() {
    DIRTY.with(|d| *d.borrow_mut() = Some(Written::default()));
    TRACKING.store(true, Ordering::Relaxed);
}

/// The keys written since `begin`, by database, or `None` when there were too many to keep.
pub fn take() -> Option<Vec<DbKey>> {
    DIRTY.with(|d| {
        d.borrow_mut().replace(Written::default()).map(|w| {
            let mut keys: Vec<DbKey> = w
                .by_db
                .into_iter()
                .flat_map(|(db, set)| set.into_iter().map(move |k| (db, k)))
                .collect();
            keys.sort_unstable_by_key(|(db, _)| *db);
            keys
        })
    })
}

/// Puts back keys taken for a pass that could not start.
pub fn restore(keys: Vec<DbKey>) {
    DIRTY.with(|d| {
        let mut d = d.borrow_mut();
        if let Some(written) = d.as_mut() {
            for (db, key) in keys {
                if written.by_db.entry(db).or_default().insert(key) {
                    written.len += 1;
                }
            }
        }
    });
}

/// How many keys are recorded (`None`: too many).
pub fn count() -> Option<usize> {
    DIRTY.with(|d| d.borrow().as_ref().map(|w| w.len))
}

/// Stops recording and forgets what was recorded.
pub fn end() {
    TRACKING.store(false, Ordering::Relaxed);
    DIRTY.with(|d| *d.borrow_mut() = Some(Written::default()));
}
