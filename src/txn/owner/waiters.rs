//! Clients whose command meets a locked key (`SHARD.LOCKED`): each is blocked until every key
//! of its command is free in its database, then runs it as itself (`host::blocked::
//! block_then_run`); after `shard.txn-lock-ms` it gets `TRYAGAIN` instead. And the owner's
//! 100 ms tick, armed while anything is timed (a waiter, a watch, a prepared part): it refuses
//! the waiters past their time, drops the watches past their ttl, and asks the coordinators of
//! the parts in doubt (`doubt`).

use std::cell::{Cell, RefCell};
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
        waiter.client.unblock(Verdict::Run(1));
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
/// RunCheck`): between the release and the run, in the same turn of the event loop, a
/// `PREPARE` may have locked one of its keys again; the command is then refused with
/// `TRYAGAIN` rather than run inside that transaction's lock.
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
