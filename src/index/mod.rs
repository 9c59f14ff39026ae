//! The key index kept in step with the keyspace (`shard.key-index yes`): the names of this
//! node's keys by database and ring bucket (`keyindex`, the pure structure; `Ring::bucket`), so
//! that a copy visits only the buckets a ring change gives away and `CLUSTER COUNTKEYSINSLOT`
//! and `GETKEYSINSLOT` answer without a walk.
//!
//! How it stays exact:
//! - every key made (`new`: any command, `RESTORE`, a module) is added and every key that ends
//!   (`del`, `expired`, `evicted`, `rename_from`, `move_from`) removed, from the keyspace events
//!   (`host::keyspace_events`, subscribed the first time the index is turned on, so that a server
//!   that never uses it pays nothing);
//! - `FLUSHDB`/`FLUSHALL` empty its databases and `SWAPDB` swaps them (server events);
//! - a load (an RDB or AOF at start, `DEBUG RELOAD`, a replica's full sync) stops it, and once
//!   the load ended it is built again (`build`): by a child that walks the keyspace, while the
//!   main thread adds what arrives in time-bounded steps;
//! - its buckets are those of the ring current when it was built; a current ring of another
//!   algo or hash-tag rule makes it build again when next asked.
//!
//! Until it is `ready`, nothing relies on it: a copy walks, `COUNTKEYSINSLOT` scans. Keys that
//! another module deletes without a keyspace event (`RedisModule_DeleteKey` does not tell) stay
//! named here until a rebuild: a copy looks each name up and skips what is gone.

pub mod build;
mod follow;
pub mod free;

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::host::fork::Pid;
use crate::keyindex::KeyIndex;
use crate::ring::placement::Placement;

pub use follow::on_keyspace_change;

/// Where the index stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Turned off (or not turned on yet).
    #[default]
    Off,
    /// Turned on, waiting for a ring (its buckets) or for a load to end.
    Waiting,
    /// A child walks the keyspace; the names arrive.
    Building,
    /// Exact.
    Ready,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Off => "off",
            Phase::Waiting => "waiting",
            Phase::Building => "building",
            Phase::Ready => "ready",
        }
    }
}

/// The index and what keeps it.
#[derive(Default)]
pub(crate) struct Tracker {
    pub(crate) phase: Phase,
    pub(crate) index: KeyIndex,
    /// The ring whose buckets the index uses.
    pub(crate) buckets: Option<Arc<Placement>>,
    /// During a build: the names deleted since the child's fork, which must not be added when
    /// the child sends them.
    /// (Tables never resized, `ChunkedSet`: one table of a million names grown at once would
    /// hold the main thread for tens of ms in one keyspace event.)
    pub(crate) gone: crate::keyindex::chunked::ChunkedSet<(i32, Vec<u8>)>,
    /// During a build whose `gone` grew past its bound (a server deleting faster than the
    /// build reads): `gone` is dropped and each name the child sends is looked up before it is
    /// added, so that the build ends however many keys are deleted meanwhile.
    pub(crate) check_arrivals: bool,
    /// The building child and what it sends.
    pub(crate) child: Option<(Pid, crate::host::names::Names)>,
    /// How many builds ran (a figure for INFO and the tests).
    pub(crate) builds: u64,
    /// How many builds were started again before they ended (a load, a flush or a swap
    /// meanwhile, a ring of other buckets).
    pub(crate) restarts: u64,
    /// The running build's number: its timers check it, so that a build stopped or restarted
    /// meanwhile leaves the next one alone.
    pub(crate) generation: u64,
}

thread_local! {
    pub(crate) static TRACKER: RefCell<Tracker> = RefCell::new(Tracker::default());
}

/// Whether `shard.key-index` is `yes`.
static WANTED: AtomicBool = AtomicBool::new(false);
/// Whether keyspace events change the index (building or ready): checked first by the event
/// handler, so that a write costs one load while the index is off.
pub(crate) static FOLLOWING: AtomicBool = AtomicBool::new(false);

/// Frees what an index held (its names, a build's `gone` names) in steps on the main thread
/// (`free`): a million names take tens of milliseconds to free, which the main thread must not
/// spend in one step (Redis frees big values on a thread, `lazyfree`; here another thread's
/// frees made the main thread wait for the allocator's locks).
pub(crate) use free::free_later;

/// `shard.key-index` was set: the index is built (on the main thread's next turn) or dropped.
pub fn set_wanted(on: bool) {
    if WANTED.swap(on, Ordering::Relaxed) == on {
        return;
    }
    if on {
        TRACKER.with(|t| t.borrow_mut().phase = Phase::Waiting);
        crate::host::context::after(
            std::time::Duration::ZERO,
            |ctx: &redis_module::Context, ()| build::start(ctx),
            (),
        );
    } else {
        build::stop();
        FOLLOWING.store(false, Ordering::Relaxed);
        TRACKER.with(|t| {
            let mut t = t.borrow_mut();
            // (The build number goes on: a timer of the dropped build must not match the next.)
            let generation = t.generation + 1;
            let old = std::mem::replace(
                &mut *t,
                Tracker {
                    generation,
                    ..Tracker::default()
                },
            );
            free_later((old.index.into_drain(), old.gone.into_drain()));
        });
    }
}

/// The current ring changed: an index waiting for a ring, or built for other buckets, is
/// built (again) for it.
pub fn ring_changed() {
    if !wanted() {
        return;
    }
    let Some(ring) = crate::state::lock().rings.current.clone() else {
        return;
    };
    let rebuild = TRACKER.with(|t| {
        let t = t.borrow();
        match (
            t.phase,
            t.buckets.as_ref().and_then(|b| b.ring.as_ref()),
            ring.ring.as_ref(),
        ) {
            (Phase::Waiting, _, Some(_)) => true,
            (Phase::Building | Phase::Ready, Some(mine), Some(theirs)) => {
                !mine.same_buckets(theirs)
            }
            _ => false,
        }
    });
    if rebuild {
        build::restart();
    }
}

/// Keyspace events change the index no more (in a forked child: its copy is the parent's).
pub fn stop_following() {
    FOLLOWING.store(false, Ordering::Relaxed);
}

/// Whether `shard.key-index` is `yes`.
pub fn wanted() -> bool {
    WANTED.load(Ordering::Relaxed)
}

/// Where the index stands, for INFO.
pub struct Status {
    pub phase: Phase,
    pub keys: usize,
    pub builds: u64,
    pub restarts: u64,
    pub bytes: usize,
}

/// Where the index stands, for INFO.
pub fn status() -> Status {
    TRACKER.with(|t| {
        let t = t.borrow();
        Status {
            phase: t.phase,
            keys: t.index.len(),
            builds: t.builds,
            restarts: t.restarts,
            bytes: t.index.heap_bytes(),
        }
    })
}

/// Whether a copy may trust the index for `ring`: it is ready for that ring's buckets, and no
/// database holds more keys than it names (a guard against an event missed: then it is built
/// again and the copy walks). More names than keys is fine: a key another module deleted
/// without an event stays named, and a copy skips a name it cannot find.
pub fn complete_for(ctx: &redis_module::Context, ring: &Arc<Placement>) -> bool {
    let counts = with_ready(ring, |index| {
        (0..MAX_DBS)
            .map(|db| (db, index.db_len(db)))
            .collect::<Vec<_>>()
    });
    let Some(counts) = counts else {
        return false;
    };
    let mut complete = true;
    for (db, named) in counts {
        if !crate::host::keyspace::select_db(ctx, db) {
            break;
        }
        if crate::host::keyspace::db_size(ctx) > named as u64 {
            complete = false;
            break;
        }
    }
    crate::host::keyspace::select_db(ctx, 0);
    if !complete {
        ctx.log_warning("shard: the key index names fewer keys than a database holds: built again");
        build::restart();
    }
    complete
}

/// How many keys the index names in each bucket (16384 counts, every database summed), when it
/// is ready for `ring`'s buckets.
pub fn keys_by_bucket(ring: &Arc<Placement>) -> Option<Vec<u64>> {
    with_ready(ring, |index| {
        let mut counts = vec![0u64; crate::ring::BUCKETS];
        for db in index.databases() {
            for (bucket, n) in index.buckets(db) {
                if let Some(c) = counts.get_mut(usize::from(bucket)) {
                    *c += n as u64;
                }
            }
        }
        counts
    })
}

/// Sets how many names deleted during a build are remembered before the build looks names up
/// as they arrive instead (`SHARD.DEBUG KEYINDEX-GONE-LIMIT`).
pub fn set_gone_limit(n: usize) {
    follow::MAX_GONE.store(n, Ordering::Relaxed);
}

/// Takes `key` of `db` out of a ready index, as a missed event would (`SHARD.DEBUG
/// KEYINDEX-FORGET`); whether it was there, or `None` when the index is not ready for `ring`.
pub fn forget_for_test(ring: &Arc<Placement>, db: i32, key: &[u8]) -> Option<bool> {
    with_ready(ring, |_| ())?;
    let bucket = ring.ring.as_ref()?.bucket(key);
    Some(TRACKER.with(|t| t.borrow_mut().index.remove(db, bucket, key)))
}

/// Databases the completeness check looks at, at most (a server's `databases`, 16 by default;
/// the check stops at the first that does not exist).
const MAX_DBS: i32 = 1024;

/// Runs `f` on the index as it is, in a forked child whose parent checked it was ready for the
/// child's ring (`with_ready`): the child's snapshot of the index is that of its keyspace.
pub fn in_child<R>(f: impl FnOnce(&KeyIndex) -> R) -> R {
    TRACKER.with(|t| f(&t.borrow().index))
}

/// Runs `f` on the index when it is ready and its buckets are those of `ring` (same algo and
/// hash-tag rule); `None` otherwise (and, when the index is wanted but its buckets are another
/// ring's, a build for `ring`'s starts).
pub fn with_ready<R>(ring: &Arc<Placement>, f: impl FnOnce(&KeyIndex) -> R) -> Option<R> {
    let stale = TRACKER.with(|t| {
        let t = t.borrow();
        if t.phase != Phase::Ready {
            return None;
        }
        let same = match (
            t.buckets.as_ref().and_then(|b| b.ring.as_ref()),
            ring.ring.as_ref(),
        ) {
            (Some(mine), Some(theirs)) => mine.same_buckets(theirs),
            _ => false,
        };
        Some(!same)
    });
    match stale {
        Some(false) => TRACKER.with(|t| Some(f(&t.borrow().index))),
        Some(true) => {
            // Built for a ring of other buckets: built again, for this one.
            build::restart();
            None
        }
        None => {
            // Wanted, but waiting for a ring it did not have: now it may.
            if wanted() && TRACKER.with(|t| t.borrow().phase == Phase::Waiting) {
                build::restart();
            }
            None
        }
    }
}
