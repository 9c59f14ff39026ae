//! Building the key index: a forked child walks the keyspace and sends every name
//! (`host::walk`), and the main thread adds them in steps of at most `STEP_BUDGET`, so that the
//! server keeps serving. Keys made or ended meanwhile reach the index through the keyspace
//! events (`follow`): a name ended after the fork is remembered, so that the child's copy of
//! it is not added back (past a million of them, each name that arrives is looked up instead,
//! so that a build ends however fast the server deletes).
//!
//! An empty keyspace (a node that joins a fleet) needs no walk: the index is ready at once,
//! without a fork.
//!
//! Redis runs one child at a time: while another one runs (a `BGSAVE`, a copy's pass), the
//! build waits and tries again.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::Context;

use crate::host::fork::{self, Exit};
use crate::host::names::DbKey;
use crate::index::{follow, Phase, FOLLOWING, TRACKER};

/// How long one step may add names before it yields to the event loop.
const STEP_BUDGET: Duration = Duration::from_millis(2);
/// How soon a build that could not fork tries again.
const RETRY: Duration = Duration::from_millis(100);
/// Names read from the pipe at a time.
const READ_BATCH: usize = 1024;

thread_local! {
    /// How the build's child ended, when the server said so.
    static CHILD_DONE: Cell<Option<Exit>> = const { Cell::new(None) };
    /// Lifecycle events are subscribed (once per process).
    static SUBSCRIBED: Cell<bool> = const { Cell::new(false) };
}

fn on_child_done(exit: Exit) {
    CHILD_DONE.with(|d| d.set(Some(exit)));
}

fn later(after: Duration, what: fn(&Context)) {
    crate::host::context::after(after, |ctx: &Context, what: fn(&Context)| what(ctx), what);
}

/// Runs `what(ctx, build)` after `after`, if build `build` is still the running one (a timer
/// of a build that was stopped or restarted meanwhile does nothing: it must not read or end
/// the next build's child).
fn later_for(after: Duration, build: u64, what: fn(&Context)) {
    crate::host::context::after(
        after,
        |ctx: &Context, (build, what): (u64, fn(&Context))| {
            if TRACKER.with(|t| t.borrow().generation) == build {
                what(ctx);
            }
        },
        (build, what),
    );
}

fn generation() -> u64 {
    TRACKER.with(|t| t.borrow().generation)
}

/// Starts a build for the current ring's buckets (when the index is wanted and there is a
/// ring with buckets; else it waits for one).
pub fn start(ctx: &Context) {
    if !crate::index::wanted() {
        return;
    }
    if !SUBSCRIBED.get() {
        if let Err(why) =
            crate::host::keyspace_events::subscribe_to_lifecycle(ctx, follow::on_key_event)
        {
            ctx.log_warning(&format!(
                "shard: the key index cannot follow the keyspace: {why}"
            ));
            return;
        }
        SUBSCRIBED.set(true);
    }
    let ring = crate::state::lock().rings.current.clone();
    let Some(ring) = ring.filter(|r| r.ring.is_some()) else {
        TRACKER.with(|t| t.borrow_mut().phase = Phase::Waiting);
        return;
    };
    // (A second start while a build runs: that build goes on.)
    if TRACKER.with(|t| t.borrow().child.is_some()) {
        return;
    }
    if keyspace_empty(ctx) {
        // Nothing to walk (a node joining a fleet): ready at once, without a fork.
        TRACKER.with(|t| {
            let mut t = t.borrow_mut();
            let index = std::mem::take(&mut t.index);
            let gone = std::mem::take(&mut t.gone);
            super::free_later((index.into_drain(), gone.into_drain()));
            t.check_arrivals = false;
            t.buckets = Some(Arc::clone(&ring));
            t.generation += 1;
            t.phase = Phase::Ready;
            t.builds += 1;
        });
        FOLLOWING.store(true, Ordering::Relaxed);
        return;
    }
    CHILD_DONE.with(|d| d.set(None));
    // Every name: the test runs in the child.
    match crate::host::walk::start(ctx, |_| true, on_child_done) {
        Ok((pid, names)) => {
            TRACKER.with(|t| {
                let mut t = t.borrow_mut();
                t.phase = Phase::Building;
                let index = std::mem::take(&mut t.index);
                let gone = std::mem::take(&mut t.gone);
                super::free_later((index.into_drain(), gone.into_drain()));
                t.check_arrivals = false;
                t.buckets = Some(Arc::clone(&ring));
                t.child = Some((pid, names));
                t.generation += 1;
            });
            FOLLOWING.store(true, Ordering::Relaxed);
            later_for(Duration::ZERO, generation(), step);
        }
        Err(_) => {
            // Another child runs: again shortly.
            TRACKER.with(|t| t.borrow_mut().phase = Phase::Waiting);
            later(RETRY, start);
        }
    }
}

/// Whether every database is empty (then a build has nothing to walk).
fn keyspace_empty(ctx: &Context) -> bool {
    let mut empty = true;
    for db in 0.. {
        if !crate::host::keyspace::select_db(ctx, db) {
            break;
        }
        if crate::host::keyspace::db_size(ctx) > 0 {
            empty = false;
            break;
        }
    }
    crate::host::keyspace::select_db(ctx, 0);
    empty
}

/// Stops a build (its child is killed, its timers do nothing more); the index is left as it is.
pub fn stop() {
    let child = TRACKER.with(|t| {
        let mut t = t.borrow_mut();
        t.generation += 1;
        t.child.take()
    });
    if let Some((pid, _names)) = child {
        fork::kill_child(pid);
    }
}

/// Builds again from the start, on the main thread's next turn.
pub fn restart() {
    TRACKER.with(|t| {
        let mut t = t.borrow_mut();
        if t.phase == Phase::Building {
            t.restarts += 1;
        }
    });
    stop();
    FOLLOWING.store(false, Ordering::Relaxed);
    TRACKER.with(|t| t.borrow_mut().phase = Phase::Waiting);
    if crate::index::wanted() {
        later(Duration::ZERO, start);
    }
}

/// A load begins: the index stops following until it ends (then `restart`).
pub fn wait_for_load() {
    stop();
    FOLLOWING.store(false, Ordering::Relaxed);
    TRACKER.with(|t| t.borrow_mut().phase = Phase::Waiting);
}

/// Adds what the child sent, for at most `STEP_BUDGET`; then another step, or the end.
fn step(ctx: &Context) {
    let _step = crate::host::latency::step_with_cpu(c"shard-index-build", c"shard-index-build-cpu");
    let deadline = Instant::now() + STEP_BUDGET;
    let mut pending: VecDeque<DbKey> = VecDeque::with_capacity(READ_BATCH);
    loop {
        let read = TRACKER.with(|t| {
            let mut t = t.borrow_mut();
            let check = t.check_arrivals;
            let (_, names) = t.child.as_mut()?;
            let open = names.read(&mut pending, READ_BATCH);
            Some((open, pending.len(), check))
        });
        let Some((open, got, check)) = read else {
            return; // stopped meanwhile
        };
        if check {
            // (Outside the index's borrow: a lookup may expire a key, and its event reaches
            // the index.)
            keep_existing(ctx, &mut pending);
        }
        let open = TRACKER.with(|t| {
            let mut t = t.borrow_mut();
            let t = &mut *t;
            let ring = t.buckets.as_ref().and_then(|b| b.ring.as_ref())?;
            for (db, name) in pending.drain(..) {
                let key = (db, name);
                if t.gone.is_empty() || !t.gone.contains(&key) {
                    t.index.insert(key.0, ring.bucket(&key.1), &key.1);
                }
            }
            Some((open, got))
        });
        match open {
            // Stopped meanwhile.
            None => return,
            // The child walks on: look again in a moment.
            Some((true, 0)) => {
                later_for(Duration::from_millis(1), generation(), step);
                return;
            }
            Some((true, _)) if Instant::now() < deadline => {}
            Some((true, _)) => {
                later_for(Duration::ZERO, generation(), step);
                return;
            }
            Some((false, _)) => {
                finish();
                return;
            }
        }
    }
}

/// Keeps the names of `pending` whose keys are still there (a lookup each, in its database).
fn keep_existing(ctx: &Context, pending: &mut VecDeque<DbKey>) {
    let mut db = None;
    pending.retain(|(key_db, name)| {
        if db != Some(*key_db) {
            crate::host::keyspace::select_db(ctx, *key_db);
            db = Some(*key_db);
        }
        crate::host::keyspace::look_up(ctx, name).is_some()
    });
    crate::host::keyspace::select_db(ctx, 0);
}

/// Every name arrived: ready if the child walked it all, else built again.
fn finish() {
    let pid = TRACKER.with(|t| t.borrow().child.as_ref().map(|(pid, _)| *pid));
    let Some(pid) = pid else {
        return;
    };
    let Some((code, signalled)) = CHILD_DONE
        .with(Cell::take)
        .or_else(|| fork::reap_if_exited(pid))
    else {
        // Exiting: look again shortly.
        later_for(Duration::from_millis(1), generation(), |_| finish());
        return;
    };
    TRACKER.with(|t| t.borrow_mut().child = None);
    if code != 0 || signalled {
        later(RETRY, start);
        return;
    }
    TRACKER.with(|t| {
        let mut t = t.borrow_mut();
        t.phase = Phase::Ready;
        t.check_arrivals = false;
        super::free_later(std::mem::take(&mut t.gone).into_drain());
        t.builds += 1;
    });
}
