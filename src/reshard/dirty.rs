//! The keys written on this node (and their databases) while a copy's child runs: the child's
//! snapshot predates them, so the next pass copies them (and a cleanup checks them after its
//! child's walk). Recorded from keyspace events (`host::keyspace_events`, subscribed at the
//! first job, so that a server that never reshards pays nothing; afterwards a write costs one call
//! that checks a flag while no copy runs).
//!
//! A second record, `since`, keeps from a copy's first fork until its cleanup the keys written
//! here that the copy's ring gives to another node: with the list of the copy's walk
//! (`moved`), they are every key the cleanup must delete, so that it need not walk again.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis_module::Context;
use rustc_hash::FxHashMap;

use crate::host::keyspace_events::{self, KeyspaceEvent};
use crate::keyindex::chunked::ChunkedSet;
use crate::ring::placement::Placement;

/// A database number and a key of it (the same type as `host::names`'s).
pub use crate::host::names::DbKey;

/// The keys written, per database.
#[derive(Default, Clone)]
struct Written {
    /// (Tables never resized, `ChunkedSet`: a table of a million keys grown at once would hold
    /// the main thread for tens of ms in one keyspace event.)
    by_db: FxHashMap<i32, ChunkedSet<Vec<u8>>>,
    len: usize,
}

/// More keys than this written during one pass: the next pass walks the whole keyspace again
/// instead of holding them all.
const MAX_KEYS: usize = 1_000_000;

static SUBSCRIBED: AtomicBool = AtomicBool::new(false);
static TRACKING: AtomicBool = AtomicBool::new(false);
static SINCE_TRACKING: AtomicBool = AtomicBool::new(false);

/// The `since` record: the ring that decides which keys it keeps, and the keys.
struct Since {
    ring: Arc<Placement>,
    self_name: String,
    /// `None` once more than `MAX_KEYS` were written.
    written: Option<Written>,
}

thread_local! {
    /// The keys written, or `None` once more than `MAX_KEYS` were.
    static DIRTY: RefCell<Option<Written>> = RefCell::new(Some(Written::default()));
    /// The ring and the node name that decide which written keys the record keeps: those the
    /// ring gives to another node (a write of a key this node keeps needs no next pass).
    static DIRTY_RING: RefCell<Option<(Arc<Placement>, String)>> = const { RefCell::new(None) };
    static SINCE: RefCell<Option<Since>> = const { RefCell::new(None) };
}

impl Written {
    /// Adds a key (false once there are too many to keep).
    fn add(&mut self, db: i32, key: &[u8]) -> bool {
        if self.len >= MAX_KEYS {
            return false;
        }
        let set = self.by_db.entry(db).or_default();
        if !set.contains(key) && set.insert(key.to_vec()) {
            self.len += 1;
        }
        true
    }

    /// Adds a key it may own (false once there are too many to keep).
    fn add_owned(&mut self, db: i32, key: Vec<u8>) -> bool {
        if self.len >= MAX_KEYS {
            return false;
        }
        if self.by_db.entry(db).or_default().insert(key) {
            self.len += 1;
        }
        true
    }

    /// The keys, by database in ascending order (the databases sorted, not the keys: up to
    /// a million keys are moved, never compared).
    fn into_keys(self) -> Vec<DbKey> {
        let mut dbs: Vec<(i32, ChunkedSet<Vec<u8>>)> = self.by_db.into_iter().collect();
        dbs.sort_unstable_by_key(|(db, _)| *db);
        let mut keys = Vec::with_capacity(self.len);
        for (db, set) in dbs {
            keys.extend(set.into_iter().map(|k| (db, k)));
        }
        keys
    }
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

fn on_event(event: &KeyspaceEvent) {
    let tracking = TRACKING.load(Ordering::Relaxed);
    let since = SINCE_TRACKING.load(Ordering::Relaxed);
    // A key gone from this node leaves nothing to copy or delete (and a cleanup's own
    // `UNLINK`s are among them: recording them cost a cleanup a third of its speed).
    if !(tracking || since) || event.ends_key() {
        return;
    }
    let bytes = event.key();
    let db = event.db();
    let goes = || {
        DIRTY_RING.with(|r| {
            r.borrow().as_ref().is_none_or(|(placement, self_name)| {
                placement
                    .ring
                    .as_ref()
                    .is_none_or(|ring| crate::reshard::cleanup_deletes(ring, self_name, bytes))
            })
        })
    };
    if tracking && goes() {
        DIRTY.with(|d| {
            let mut d = d.borrow_mut();
            if d.as_mut().is_some_and(|written| !written.add(db, bytes)) {
                free_later(d.take());
            }
        });
    }
    if since {
        SINCE.with(|s| {
            if let Some(since) = s.borrow_mut().as_mut() {
                let Some(ring) = since.ring.ring.as_ref() else {
                    return;
                };
                if !crate::reshard::cleanup_deletes(ring, &since.self_name, bytes) {
                    return;
                }
                if since.written.as_mut().is_some_and(|w| !w.add(db, bytes)) {
                    free_later(since.written.take());
                }
            }
        });
    }
}

/// Starts the `since` record afresh: the keys written from now on that `ring` gives to another
/// node than `self_name`.
pub fn begin_since(ring: Arc<Placement>, self_name: &str) {
    SINCE.with(|s| {
        *s.borrow_mut() = Some(Since {
            ring,
            self_name: self_name.to_owned(),
            written: Some(Written::default()),
        })
    });
    SINCE_TRACKING.store(true, Ordering::Relaxed);
}

/// Takes the keys of the `since` record so far, by database (moved out, not copied: the record
/// goes on from empty); a cleanup stopped before it handled them all gives the rest back
/// (`give_back_since`). `None` if it does not run or overflowed.
pub fn take_since_keys() -> Option<Vec<DbKey>> {
    SINCE.with(|s| {
        let mut s = s.borrow_mut();
        let written = s.as_mut()?.written.as_mut()?;
        Some(std::mem::take(written).into_keys())
    })
}

/// Puts keys taken by `take_since_keys` back in the `since` record (while it runs and holds
/// every key), for the next cleanup.
pub fn give_back_since(keys: impl IntoIterator<Item = DbKey>) {
    SINCE.with(|s| {
        let mut s = s.borrow_mut();
        let Some(written) = s.as_mut().and_then(|s| s.written.as_mut()) else {
            return;
        };
        for (db, key) in keys {
            if !written.add_owned(db, key) {
                if let Some(s) = s.as_mut() {
                    free_later(s.written.take());
                }
                return;
            }
        }
    });
}

/// Whether the `since` record runs and holds every key written since it began.
pub fn since_whole() -> bool {
    SINCE.with(|s| s.borrow().as_ref().is_some_and(|s| s.written.is_some()))
}

/// Records nothing more, forgetting nothing (in a forked child: the records are the parent's).
pub fn stop_recording() {
    TRACKING.store(false, Ordering::Relaxed);
    SINCE_TRACKING.store(false, Ordering::Relaxed);
}

/// Stops the `since` record and forgets it.
pub fn end_since() {
    SINCE_TRACKING.store(false, Ordering::Relaxed);
    SINCE.with(|s| free_later(s.borrow_mut().take()));
}

/// Starts recording, with nothing recorded (at a child's fork), the keys written that `ring`
/// gives to another node than `self_name`: a copy's next pass has those to copy, and a copy
/// under writes of keys it keeps ends once none of the others is written.
pub fn begin(ring: &Arc<Placement>, self_name: &str) {
    DIRTY_RING.with(|r| *r.borrow_mut() = Some((Arc::clone(ring), self_name.to_owned())));
    DIRTY.with(|d| free_later(d.borrow_mut().replace(Written::default())));
    TRACKING.store(true, Ordering::Relaxed);
}

/// The keys written since `begin`, by database, or `None` when there were too many to keep.
pub fn take() -> Option<Vec<DbKey>> {
    DIRTY.with(|d| {
        d.borrow_mut()
            .replace(Written::default())
            .map(Written::into_keys)
    })
}

/// Puts back keys taken for a pass that could not start.
pub fn restore(keys: Vec<DbKey>) {
    DIRTY.with(|d| {
        let mut d = d.borrow_mut();
        if let Some(written) = d.as_mut() {
            for (db, key) in keys {
                if !written.add_owned(db, key) {
                    free_later(d.take());
                    return;
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
    DIRTY.with(|d| free_later(d.borrow_mut().replace(Written::default())));
}

/// Frees a record in steps on the main thread when it is large (`index::free`: a million
/// keys take tens of ms to free); a small one here.
fn free_later<T: Record>(record: Option<T>) {
    match record {
        Some(r) if r.keys() >= FREE_IN_STEPS => {
            let sets: Vec<_> = r
                .into_sets()
                .into_iter()
                .map(ChunkedSet::into_drain)
                .collect();
            crate::index::free_later(sets);
        }
        other => drop(other),
    }
}

/// Records of at least this many keys are freed in steps.
const FREE_IN_STEPS: usize = 10_000;

/// A record of keys.
trait Record {
    /// How many keys it holds.
    fn keys(&self) -> usize;
    /// Its sets of keys (the rest dropped).
    fn into_sets(self) -> Vec<ChunkedSet<Vec<u8>>>;
}

impl Record for Written {
    fn keys(&self) -> usize {
        self.len
    }

    fn into_sets(self) -> Vec<ChunkedSet<Vec<u8>>> {
        self.by_db.into_values().collect()
    }
}

impl Record for Since {
    fn keys(&self) -> usize {
        self.written.as_ref().map_or(0, |w| w.len)
    }

    fn into_sets(self) -> Vec<ChunkedSet<Vec<u8>>> {
        self.written.map(Written::into_sets).unwrap_or_default()
    }
}
