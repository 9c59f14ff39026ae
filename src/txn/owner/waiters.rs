//! Clients whose command meets a locked key (`SHARD.LOCKED`): each is blocked until every key
//! of its command is free in its database, then runs it as itself (`host::blocked::
//! block_then_run`); after `shard.txn-lock-ms` it gets `TRYAGAIN` instead. And the owner's
//! 100 ms tick, armed while anything is timed (a waiter, a watch, a prepared part): it refuses
//! the waiters past their time, drops the watches past their ttl, and asks the coordinators of
//! the parts in doubt (`doubt`).
//!
//! **Let go, then run: the keys are reserved in between.** A client let go when a lock ends
//! runs its command in its reply callback, which the server calls before it sleeps, after
//! every other command it has read in that turn of the event loop; a `PREPARE` among them could
//! lock a key of the command again. Refusing the command then (`TRYAGAIN`) broke clients'
//! optimistic loops, which retry a nil `EXEC`, never an error of a `GET` (issue 43); a single
//! server never refuses a `GET` for another's transaction. So the keys of each client let go
//! are reserved until its reply callback ran (or the server dropped the verdict of a client
//! gone meanwhile): a `PREPARE` of a reserved key is refused with `LOCKED`, as for a lock, which
//! the coordinator waits on and retries (a transaction with watched keys replies nil, which the
//! loops retry). The reservation lasts until the end of that turn of the event loop, so the
//! retry finds the key free. Why this and not another way:
//! - the reply callback cannot block its client again to wait once more
//!   (`RedisModule_BlockClient`'s reply callback replies, always);
//! - `RedisModule_BlockClientOnKeys` with `SignalKeyAsReady` would run the reply callbacks
//!   right after the command that ended the lock, and a callback may stay blocked; but the
//!   server serves a module's client blocked on keys only for a key that exists (Redis 7.0;
//!   7.2 adds a flag for a deleted one), while the keys a command waits for may be missing or
//!   deleted by the transaction: those would still need this module's own wait;
//! - `APPLY` (the fast path, one owner) takes no lock: it may run before the let-go command
//!   (its block is atomic, so the command sees all of it or none), and is not refused.
//!
//! `recheck` stays as the last guard: a lock that came otherwise (a load replacing the tables)
//! still refuses the command rather than run it inside the lock.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use crate::host::blocked::{self, Blocked, Verdict};
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::txn::owner::{doubt, read, with};

/// How often the tick runs while anything is timed.
pub const TICK: Duration = Duration::from_millis(100);

struct Waiter {
    client: Blocked<Verdict>,
    db: i32,
    keys: Vec<Vec<u8>>,
    deadline_ms: u64,
}

thread_local! {
    static WAITERS: RefCell<Vec<Waiter>> = const { RefCell::new(Vec::new()) };
    static TICKING: Cell<bool> = const { Cell::new(false) };
    /// A release was put off while the server's writes were paused.
    static RELEASE_LATER: Cell<bool> = const { Cell::new(false) };
    /// The keys of the clients let go whose commands have not run yet, by database and name:
    /// how many such clients have each.
    static RESERVED: RefCell<HashMap<(i32, Vec<u8>), u32>> = RefCell::new(HashMap::new());
}

/// The keys of a client let go, reserved until its command ran or never will: kept with its
/// verdict (`Verdict::Run`), dropped by the server after the reply callback.
struct Reservation {
    db: i32,
    keys: Vec<Vec<u8>>,
}

impl Reservation {
    fn new(db: i32, keys: Vec<Vec<u8>>) -> Reservation {
        RESERVED.with(|r| {
            let mut r = r.borrow_mut();
            for k in &keys {
                *r.entry((db, k.clone())).or_insert(0) += 1;
            }
        });
        Reservation { db, keys }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        RESERVED.with(|r| {
            let mut r = r.borrow_mut();
            for k in self.keys.drain(..) {
                let entry = (self.db, k);
                match r.get_mut(&entry) {
                    Some(n) if *n > 1 => *n -= 1,
                    Some(_) => {
                        r.remove(&entry);
                    }
                    None => {}
                }
            }
        });
    }
}

/// The first of `keys` (in database `db`) reserved for a client let go whose command has not
/// run yet: a `PREPARE` of it is refused until that command ran (below the module doc).
pub fn reserved(db: i32, keys: &[Vec<u8>]) -> Option<&[u8]> {
    RESERVED.with(|r| {
        let r = r.borrow();
        if r.is_empty() {
            return None;
        }
        keys.iter()
            .find(|k| r.contains_key(&(db, k.to_vec())))
            .map(Vec::as_slice)
    })
}

/// Blocks the client of `call` until the keys are free (or `shard.txn-lock-ms` passed).
pub fn wait(call: &Call, db: i32, keys: Vec<Vec<u8>>) -> CmdResult {
    let lock_ms = crate::state::lock()
        .config
        .txn_lock_ms
        .max(1)
        .unsigned_abs();
    let client = blocked::block_then_run(call).map_err(CmdError::err)?;
    WAITERS.with(|w| {
        w.borrow_mut().push(Waiter {
            client,
            db,
            keys,
            deadline_ms: crate::clock::monotonic_ms().saturating_add(lock_ms),
        })
    });
    keep_ticking();
    Ok(())
}

/// How many clients wait for a lock.
pub fn count() -> usize {
    WAITERS.with(|w| w.borrow().len())
}

/// Lets go every client whose keys are all free now (a lock ended): each runs its command.
/// While the server's writes are paused nobody is let go (its command could not run: see
/// `host::blocked::block_then_run`): the tick lets them go once the pause is over.
pub fn release() {
    if count() == 0 {
        return;
    }
    if crate::host::context::writes_paused() {
        RELEASE_LATER.with(|r| r.set(true));
        keep_ticking();
        return;
    }
    RELEASE_LATER.with(|r| r.set(false));
    let free: Vec<Waiter> = WAITERS.with(|w| {
        let mut w = w.borrow_mut();
        let (go, stay): (Vec<Waiter>, Vec<Waiter>) = w.drain(..).partition(|waiter| {
            read(|t| {
                waiter
                    .keys
                    .iter()
                    .all(|k| t.locked_by(waiter.db, k).is_none())
            })
        });
        *w = stay;
        go
    });
    for waiter in free {
        let reservation = Reservation::new(waiter.db, waiter.keys);
        waiter
            .client
            .unblock(Verdict::Run(1, Box::new(reservation)));
    }
}

/// Refuses the clients that waited `shard.txn-lock-ms`.
fn expire(now: u64) {
    let late: Vec<Waiter> = WAITERS.with(|w| {
        let mut w = w.borrow_mut();
        let (late, stay): (Vec<Waiter>, Vec<Waiter>) =
            w.drain(..).partition(|waiter| now >= waiter.deadline_ms);
        *w = stay;
        late
    });
    for waiter in late {
        let holder = read(|t| {
            waiter.keys.iter().find_map(|k| {
                t.locked_by(waiter.db, k)
                    .map(|x| (k.clone(), x.to_string()))
            })
        });
        let message = match holder {
            Some((key, txid)) => crate::txn::owner::owned::held(
                &key,
                &txid,
                "the command waited shard.txn-lock-ms for it",
            ),
            None => CmdError::code("TRYAGAIN", "a transaction held a key of the command"),
        };
        waiter
            .client
            .unblock(Verdict::Refuse(message.message().to_string()));
    }
}

/// Arms the tick unless it is armed.
pub fn keep_ticking() {
    if TICKING.with(Cell::get) {
        return;
    }
    if crate::host::context::after(TICK, tick, ()) {
        TICKING.with(|t| t.set(true));
    }
}

fn tick(ctx: &redis_module::Context, (): ()) {
    TICKING.with(|t| t.set(false));
    let now = crate::clock::monotonic_ms();
    if RELEASE_LATER.with(Cell::get) {
        release();
    }
    expire(now);
    with(|t| t.expire_watches(now));
    doubt::ask(ctx, now);
    let timed = read(|t| t.has_timed());
    if timed || count() > 0 {
        keep_ticking();
    }
}

/// The recheck of a client let go by `release` before its command runs (`host::blocked::
/// RunCheck`): a key of it locked between the release and the run is refused with `TRYAGAIN`
/// rather than run inside that transaction's lock. A `PREPARE` cannot lock it then (the keys
/// are reserved, `reserved`); only a lock that came otherwise (a load replacing the tables)
/// can.
pub fn recheck(args: &crate::host::args::Args, from: usize, db: i32) -> Option<String> {
    if !crate::txn::owner::active() {
        return None;
    }
    let argc = args.len().checked_sub(from)?;
    let arg = |i: usize| (i < argc).then(|| args.get(from + i));
    let start = crate::txn::owner::marks::carried_start(arg);
    let meta = crate::route::command_table::known(arg(start)?)?;
    let range = meta.fixed_keys(argc.saturating_sub(start))?;
    let holder = read(|t| {
        range.into_iter().find_map(|pos| {
            let key = arg(pos + start)?;
            t.locked_by(db, key)
                .map(|txid| (key.to_vec(), txid.to_string()))
        })
    })?;
    let (key, txid) = holder;
    let refusal = crate::txn::owner::owned::held(
        &key,
        &txid,
        "it was locked again as the command was let go",
    );
    Some(refusal.message().to_string())
}
