//! The owner's side of transactions across nodes (docs/transactions.md, "Owner protocol"):
//!
//! - `table`: the watch table, the prepared parts and their locks, the done list (pure);
//! - `parse`: the protocol's `nwatched key ...` and `ncmds (argc arg ...) ...` (pure);
//! - `durable`: the prepared parts and the done list as bytes (the RDB aux field);
//! - `run`: `SHARD.TXN WATCH|UNWATCH|APPLY|PREPARE|COMMIT|ABORT` carried out, and a part
//!   committed or aborted by this node alone once its coordinator answered;
//! - `marks`: what marks a watched key written (the command filter, the module's own
//!   writes, expiries and evictions, flushes) and the filter's rewrite of a command of a
//!   locked key (`SHARD.LOCKED`);
//! - `waiters`: clients blocked on a lock, run or refused when it ends or after
//!   `shard.txn-lock-ms`; and the owner's 100 ms tick;
//! - `doubt`: a prepared part past its deadline asks its coordinator `SHARD.TXN STATUS`;
//! - `acked`: the reply to a block applied here waits for a replica of this server;
//! - `owned`: whether the keys of a part are this node's and not moving, and whether a
//!   resharding step would move a locked key.
//!
//! The tables live on the main thread (`with`); `ACTIVE` says, for the command filter's first
//! look, whether any key is watched or locked.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::host::events::KeyspaceChange;
use crate::txn::Decision;

pub mod acked;
pub mod doubt;
pub mod durable;
pub mod marks;
pub mod owned;
pub mod parse;
pub mod run;
pub mod table;
pub mod waiters;

use table::Tables;

thread_local! {
    static TABLES: RefCell<Tables> = RefCell::new(Tables::default());
}

/// Whether any key is watched or locked.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The tables' filter of the watched and locked names, copied out at each change (`with`) for
/// the command filter's probe: statics, which a shared library reads without the
/// `__tls_get_addr` call and the borrow a thread-local costs. The main thread's only.
static LENGTHS: AtomicU64 = AtomicU64::new(0);
static FILTER: [AtomicU64; table::FILTER_SLOTS / 64] =
    [const { AtomicU64::new(0) }; table::FILTER_SLOTS / 64];

/// Whether any key is watched or locked (one load; the filter's first look).
#[inline]
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Reads or changes the tables (never re-entered: nothing called inside runs a command).
pub fn with<R>(f: impl FnOnce(&mut Tables) -> R) -> R {
    let (out, idle, timed) = TABLES.with(|t| {
        let mut t = t.borrow_mut();
        let out = f(&mut t);
        let (lengths, filter) = t.filter_bits();
        LENGTHS.store(lengths, Ordering::Relaxed);
        for (i, word) in FILTER.iter().enumerate() {
            word.store(filter.get(i).copied().unwrap_or(0), Ordering::Relaxed);
        }
        (out, t.is_idle(), t.has_timed())
    });
    ACTIVE.store(!idle, Ordering::Relaxed);
    crate::host::writes::set_following(!idle);
    if timed {
        waiters::keep_ticking();
    }
    out
}

/// The bit per name length of the watched and locked names (`table::length_bit`): the
/// filter's first look at each argument.
#[inline(always)]
pub fn name_lengths() -> u64 {
    LENGTHS.load(Ordering::Relaxed)
}

/// Whether a key of this name may be watched or locked, in some database (the tables' bit
/// filter: false means surely not).
#[inline]
pub fn may_hold(name: &[u8]) -> bool {
    if LENGTHS.load(Ordering::Relaxed) & (1 << table::length_bit(name)) == 0 {
        return false;
    }
    let slot = table::slot_of(name);
    FILTER[slot / 64].load(Ordering::Relaxed) & (1 << (slot % 64)) != 0
}

/// Marks the key `name` written in database `db` (`None`: every database). A mark adds and
/// drops no key, so unlike `with` it leaves the flags (`active`, the own writes' switch) as
/// they are.
pub fn mark(db: Option<i32>, name: &[u8]) {
    TABLES.with(|t| t.borrow_mut().mark(db, name));
}

/// Reads the tables, changing nothing (a forked child's save reads them too).
pub fn read<R>(f: impl FnOnce(&Tables) -> R) -> R {
    TABLES.with(|t| f(&t.borrow()))
}

/// What this owner knows of `txid`: applied here, `commit`; else `pending` (the coordinator's
/// side, `txn::coord::status`, answers from its decisions).
pub fn status(txid: &str) -> Decision {
    if read(|t| t.is_done(txid)) {
        Decision::Commit
    } else {
        Decision::Pending
    }
}

/// The prepared parts and the done list, for the RDB aux field.
pub fn durable_records() -> durable::Records {
    read(|t| durable::Records {
        prepared: t
            .all_prepared()
            .map(|(txid, p)| (txid.to_string(), p.clone()))
            .collect(),
        done: t.done_list().map(str::to_string).collect(),
        forgotten: t
            .forgotten_marks()
            .map(|(c, n)| (c.to_string(), n))
            .collect(),
    })
}

/// Takes the records of a load (an RDB, a primary's at a full sync) in place of the tables'.
pub fn restore_records(records: durable::Records) {
    with(|t| t.replace_durable(records.prepared, records.done, records.forgotten));
}

/// A change of the keyspace as a whole: a flush marks its database's watched keys written,
/// `SWAPDB` both databases', a load every one.
pub fn on_keyspace_change(change: KeyspaceChange) {
    if !active() {
        return;
    }
    with(|t| match change {
        KeyspaceChange::Flushed(db) => t.mark_db(db),
        KeyspaceChange::Swapped(a, b) => {
            t.mark_db(Some(a));
            t.mark_db(Some(b));
        }
        KeyspaceChange::LoadStarted => t.mark_db(None),
        KeyspaceChange::LoadEnded => {}
    });
}

/// `INFO shard`'s owner fields: the locks held, the oldest lock's age (ms), the parts in doubt.
pub fn info() -> (u64, u64, u64) {
    let now = crate::clock::monotonic_ms();
    read(|t| {
        (
            t.locks_held() as u64,
            t.longest_lock_ms(now),
            t.in_doubt(now).len() as u64,
        )
    })
}
