//! The index follows the keyspace: each key made or ended (keyspace events) and each change of
//! the keyspace as a whole (server events: a flush, a `SWAPDB`, a load).

use std::sync::atomic::Ordering;

use crate::host::events::KeyspaceChange;
use crate::host::keyspace_events::KeyspaceEvent;
use crate::index::{build, Phase, FOLLOWING, TRACKER};

/// Most names removed while a build runs that are kept to be left out of it: past this, the
/// build looks each name up as it arrives instead (`Tracker::check_arrivals`). 1 000 000
/// unless `SHARD.DEBUG KEYINDEX-GONE-LIMIT` says otherwise.
pub(crate) static MAX_GONE: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(1_000_000);

/// A key lifecycle event (`host::keyspace_events::subscribe_to_lifecycle`).
pub(crate) fn on_key_event(event: &KeyspaceEvent) {
    if !FOLLOWING.load(Ordering::Relaxed) {
        return;
    }
    let name = event.name();
    let made = name == b"new";
    if !made && !event.ends_key() {
        return;
    }
    let key = event.key();
    let db = event.db();
    TRACKER.with(|t| {
        let mut t = t.borrow_mut();
        let t = &mut *t;
        let Some(ring) = t.buckets.as_ref().and_then(|b| b.ring.as_ref()) else {
            return;
        };
        let bucket = ring.bucket(key);
        if made {
            t.index.insert(db, bucket, key);
            return;
        }
        t.index.remove(db, bucket, key);
        if t.phase == Phase::Building && !t.check_arrivals {
            t.gone.insert((db, key.to_vec()));
            if t.gone.len() > MAX_GONE.load(Ordering::Relaxed) {
                t.check_arrivals = true;
                super::free_later(std::mem::take(&mut t.gone).into_drain());
            }
        }
    });
}

/// A change of the keyspace as a whole (`host::events::on_keyspace_change`).
pub fn on_keyspace_change(change: KeyspaceChange) {
    if !crate::index::wanted() {
        return;
    }
    match change {
        KeyspaceChange::LoadStarted => build::wait_for_load(),
        KeyspaceChange::LoadEnded => build::restart(),
        // A build's child sends the names of its snapshot, which a flush or a swap made
        // wrong: it starts again.
        KeyspaceChange::Flushed(_) | KeyspaceChange::Swapped(..) if building() => build::restart(),
        KeyspaceChange::Flushed(db) => TRACKER.with(|t| {
            let mut t = t.borrow_mut();
            match db {
                Some(db) => t.index.clear_db(db),
                None => super::free_later(std::mem::take(&mut t.index).into_drain()),
            }
        }),
        KeyspaceChange::Swapped(a, b) => TRACKER.with(|t| t.borrow_mut().index.swap_dbs(a, b)),
    }
}

fn building() -> bool {
    TRACKER.with(|t| t.borrow().phase == Phase::Building)
}
