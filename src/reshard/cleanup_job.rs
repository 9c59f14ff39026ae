//! A cleanup job's driver, on the main thread: steps on module timers, each deleting keys
//! until its time budget (`STEP_BUDGET`) is spent, so that the server keeps serving. The names
//! come from the copy's list when it left one for this ring (`moved`); else, when the key index
//! is ready, the steps take its names of the buckets the ring does not give wholly to this node
//! themselves, a page at a time (`index_cursor`, `keys_from: index`; a forked child sends them
//! under `shard.copy-fork yes`); else a forked child (`host::walk`) sends the steps the names of
//! the keys this node no longer owns from a walk of the whole keyspace; while it walks, a step with nothing to delete waits in the event loop
//! for its next names. The keys written meanwhile (`dirty`) are checked after it. Without a
//! child (another one runs), the steps walk the keyspace themselves. What the copy and the
//! cleanup share (the running job, its child, its rate) is `jobs`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::Context;

use crate::host::keyspace;
use crate::host::names::Names;
use crate::host::walk::Emit;
use crate::reshard::dirty::{self, DbKey};
use crate::reshard::index_cursor::{self, IndexCursor};
use crate::reshard::jobs::{
    child_outcome, fail_job, finish, forget_child_outcome, on_child_done, Runner, RUNNER,
};
use crate::reshard::moved;
use crate::reshard::progress::AfterPass;
use crate::ring::placement::Placement;

/// How long one step may run before it yields back to the event loop.
const STEP_BUDGET: Duration = Duration::from_millis(2);
/// How often a paused or throttled cleanup looks again, at most.
const IDLE_INTERVAL: Duration = Duration::from_millis(10);
/// Keys deleted (and replicated as one `UNLINK`) at a time.
const DELETE_BATCH: usize = 128;
/// A scan stops after this many keys even if few of them go.
const SCAN_LIMIT: u64 = 2048;

/// Starts the cleanup (the runner is in place): its walk in a child if it can fork, and its
/// first step.
pub(super) fn begin(ctx: &Context) {
    fork_cleanup_walk(ctx);
    schedule(ctx, Duration::ZERO);
}

/// Finds the keys to delete without a walk when a copy on this ring left its list (`moved`);
/// else hands the walk to a forked child when it can (else the steps scan themselves).
fn fork_cleanup_walk(ctx: &Context) {
    if dirty::subscribe(ctx).is_err() {
        return;
    }
    RUNNER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let Some(runner) = slot.as_mut() else {
            return;
        };
        if let Some(list) = moved::list_for(&runner.ring, &runner.self_name) {
            runner.names = Some(list);
            runner.from_list = true;
            crate::reshard::current::lock().job.keys_from = "list";
            return;
        }
        dirty::begin(&runner.ring, &runner.self_name);
        forget_child_outcome();
        let placement = Arc::clone(&runner.ring);
        let self_name = runner.self_name.clone();
        if crate::index::complete_for(ctx, &placement) {
            // Without a fork (`shard.copy-fork` other than yes): the steps take the index's
            // names themselves, a page at a time, and check the keys written meanwhile after.
            if crate::reshard::copy_steps::Mode::now() != crate::reshard::copy_steps::Mode::Yes {
                if let Some(cursor) = IndexCursor::new(&placement, &self_name) {
                    crate::reshard::current::lock().job.keys_from = "index";
                    runner.index_walk = Some(cursor);
                    return;
                }
            }
            // The key index names the keys by bucket: the child sends those of the buckets
            // the ring does not give wholly to this node, and looks at no other key.
            let produce = move |emit: &mut Emit| names_from_index(&placement, &self_name, emit);
            match crate::host::walk::start_from(ctx, produce, on_child_done) {
                Ok((pid, names)) => {
                    crate::reshard::current::lock().job.keys_from = "index";
                    runner.child = Some(pid);
                    runner.names = Some(names);
                }
                Err(_) => dirty::end(),
            }
            return;
        }
        // (Run in the child only.)
        let goes = move |name: &[u8]| {
            placement
                .ring
                .as_ref()
                .is_some_and(|ring| crate::reshard::cleanup_deletes(ring, &self_name, name))
        };
        match crate::host::walk::start(ctx, goes, on_child_done) {
            Ok((pid, names)) => {
                runner.child = Some(pid);
                runner.names = Some(names);
            }
            Err(_) => dirty::end(),
        }
    });
}

/// In a cleanup's child: the names the key index holds in the buckets `placement`'s ring does
/// not give wholly to `self_name`, each sent if this node no longer owns it.
fn names_from_index(placement: &Placement, self_name: &str, emit: &mut Emit) {
    let Some(ring) = placement.ring.as_ref() else {
        return;
    };
    let visit = ring.buckets_not_wholly_of(ring.spec().node_index(self_name));
    crate::index::in_child(|index| {
        for db in index.databases() {
            emit.database(db);
            for (bucket, _) in index.buckets(db) {
                if !visit.get(usize::from(bucket)).copied().unwrap_or(true) {
                    continue;
                }
                for name in index.names(db, bucket) {
                    emit.name(name, crate::reshard::cleanup_deletes(ring, self_name, name));
                }
            }
        }
    });
}

/// A cleanup's child has sent every name (or died), or the copy's list was read: what is left
/// to do, on the main thread.
fn after_cleanup_child(runner: &mut Runner) -> bool {
    if runner.from_list {
        let whole = runner.names.as_ref().is_some_and(Names::whole_list);
        runner.names = None;
        runner.from_list = false;
        // The keys written since the copy's walk that go elsewhere (the list's names went
        // elsewhere under this very ring when the copy found them; the `since` record kept only
        // the written keys this ring gives away).
        let placement = Arc::clone(&runner.ring);
        match (
            whole.then(dirty::take_since_keys).flatten(),
            placement.ring.as_ref(),
        ) {
            (Some(written), Some(_)) => {
                runner.pending.extend(written);
                runner.scan_over = true;
            }
            _ => {
                crate::reshard::current::lock().job.keys_from = "walk";
                runner.db = 0;
                runner.restart_scan();
                runner.scan_over = false;
            }
        }
        return true;
    }
    let Some((code, signalled)) = child_outcome(runner) else {
        return false; // not ended yet: look again shortly
    };
    runner.names = None;
    runner.child = None;
    let placement = Arc::clone(&runner.ring);
    match (
        code == 0 && !signalled,
        dirty::take(),
        placement.ring.as_ref(),
    ) {
        (true, Some(written), Some(_)) => {
            // The keys written since the fork that this node does not own (the only ones the
            // record keeps, `dirty::begin`) go too.
            runner.pending.extend(written);
            runner.scan_over = true;
        }
        _ => {
            // The child failed, or too many keys were written: the steps walk it all again.
            runner.db = 0;
            runner.restart_scan();
            runner.scan_over = false;
        }
    }
    dirty::end();
    true
}

/// What a cleanup asks for after a step.
enum Next {
    /// Another step as soon as the event loop has served the clients.
    Now,
    /// Another step after this long (paused, ahead of its rate, or its child is exiting).
    After(Duration),
    /// Another step when the child's next names arrive.
    Names,
    /// Nothing: the job is over.
    Done,
}

fn schedule(ctx: &Context, after: Duration) {
    crate::host::timers::after_on(ctx, after, |ctx: &Context, ()| on_timer(ctx), ());
}

fn on_timer(ctx: &Context) {
    let _step =
        crate::host::latency::step_with_cpu(c"shard-cleanup-step", c"shard-cleanup-step-cpu");
    let started = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| step(ctx)));
    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    crate::reshard::current::lock().job.record_step(micros);
    match outcome {
        Ok(Next::Now) => schedule(ctx, Duration::ZERO),
        Ok(Next::After(after)) => schedule(ctx, after),
        Ok(Next::Names) => {
            let waiting = RUNNER.with(|r| {
                r.borrow_mut()
                    .as_mut()
                    .and_then(|r| r.names.as_mut())
                    .is_some_and(|names| names.wait_readable(on_names_ready))
            });
            if !waiting {
                schedule(ctx, Duration::from_millis(1));
            }
        }
        Ok(Next::Done) => {}
        Err(_) => fail_job(),
    }
}

/// The event loop found the cleanup child's next names (or its end): the next step, now.
fn on_names_ready() {
    RUNNER.with(|r| {
        if let Some(names) = r.borrow_mut().as_mut().and_then(|r| r.names.as_mut()) {
            names.stop_waiting();
        }
    });
    wake();
}

/// Runs a cleanup step from outside a timer (the event loop's callback, a STOP while the step
/// waited for names).
pub(super) fn wake() {
    crate::host::context::after(Duration::ZERO, |ctx: &Context, ()| on_timer(ctx), ());
}

/// Runs one step of a cleanup.
fn step(ctx: &Context) -> Next {
    let deadline = Instant::now() + STEP_BUDGET;
    RUNNER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let Some(runner) = slot.as_mut() else {
            return Next::Done;
        };
        loop {
            if crate::reshard::current::lock().job.stop_requested() {
                runner.end_child();
                // The keys not handled yet wait for the next cleanup in the `since` record.
                dirty::give_back_since(runner.pending.drain(..));
                finish(runner);
                *slot = None;
                return Next::Done;
            }
            if runner.pending.is_empty() {
                if let Some(names) = runner.names.as_mut() {
                    let before = names.walked;
                    let open = names.read(&mut runner.pending, 4 * DELETE_BATCH);
                    crate::reshard::current::lock()
                        .job
                        .record_many(names.walked - before, 0, 0);
                    if runner.pending.is_empty() {
                        if open {
                            runner.update_rate();
                            return Next::Names;
                        }
                        if !after_cleanup_child(runner) {
                            return Next::After(Duration::from_millis(1));
                        }
                        continue;
                    }
                } else if runner.scan_over {
                    // The pass is over: another one, or the end. (The lock is released before
                    // `finish` takes it again.)
                    let after = crate::reshard::current::lock().job.end_pass();
                    match after {
                        AfterPass::Again => runner.new_pass(),
                        AfterPass::Finished => {
                            // What the copy learnt is spent (or was not for this ring).
                            moved::cleanup_done();
                            finish(runner);
                            *slot = None;
                            return Next::Done;
                        }
                    }
                }
                if runner.names.is_none() && !runner.scan_over {
                    let over = scan_batch(ctx, runner);
                    runner.scan_over = over;
                }
            }
            // A few keys at a time, so that the time budget holds.
            while !runner.pending.is_empty() {
                let allowed = match runner.allowed() {
                    Ok(allowed) => allowed,
                    Err(wait) => {
                        runner.update_rate();
                        return Next::After(wait);
                    }
                };
                let n = runner.pending.len().min(DELETE_BATCH).min(allowed);
                let names: Vec<DbKey> = runner.pending.drain(..n).collect();
                let deleted = unlink(ctx, &names);
                runner.pace.spend(names.len() as u64);
                let mut st = crate::reshard::current::lock();
                for (db, n) in deleted {
                    st.job.record_many(0, n, 0);
                    st.job.record_db(db, n);
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            if Instant::now() >= deadline {
                runner.update_rate();
                return Next::Now;
            }
        }
    })
}

/// Scans on until `batch` keys to delete are found, `SCAN_LIMIT` keys were seen, or the pass
/// is over (true): the last database's scan is. The scan only collects names: keys are
/// deleted after it.
fn scan_batch(ctx: &Context, runner: &mut Runner) -> bool {
    if runner.index_walk.is_some() {
        return index_batch(runner);
    }
    let placement = Arc::clone(&runner.ring);
    let Some(ring) = placement.ring.as_ref() else {
        return true;
    };
    let Some(cursor) = runner.cursor.as_ref() else {
        return true;
    };
    if !keyspace::select_db(ctx, runner.db) {
        return true;
    }
    let db = runner.db;
    let self_name = runner.self_name.as_str();
    let doomed = &mut runner.pending;
    let mut scanned: u64 = 0;
    let mut over = false;
    while doomed.len() < runner.options.batch && scanned < SCAN_LIMIT {
        let more = cursor.scan(ctx, &mut |name, _| {
            scanned += 1;
            if crate::reshard::cleanup_deletes(ring, self_name, name) {
                doomed.push_back((db, name.to_vec()));
            }
        });
        if !more {
            over = true;
            break;
        }
    }
    crate::reshard::current::lock()
        .job
        .record_many(scanned, 0, 0);
    if over && keyspace::select_db(ctx, runner.db + 1) {
        // The next database, from its start.
        runner.db += 1;
        runner.restart_scan();
        return false;
    }
    over
}

/// Takes the next page of the key index's names (`IndexCursor`), keeping those this node no
/// longer owns; true when the pass is over. At the walk's end the keys written since it began
/// that go elsewhere (`dirty`) are added; too many of them, or the index no longer ready, and
/// the steps walk the keyspace with their own scan instead.
fn index_batch(runner: &mut Runner) -> bool {
    let placement = Arc::clone(&runner.ring);
    let Some(ring) = placement.ring.as_ref() else {
        return true;
    };
    let Some(cursor) = runner.index_walk.as_mut() else {
        return true;
    };
    let next = cursor.next_page();
    let self_name = runner.self_name.as_str();
    match next {
        index_cursor::Next::Names(db, names) => {
            crate::reshard::current::lock()
                .job
                .record_many(names.len() as u64, 0, 0);
            runner.pending.extend(
                names
                    .into_iter()
                    .filter(|name| crate::reshard::cleanup_deletes(ring, self_name, name))
                    .map(|name| (db, name)),
            );
            false
        }
        index_cursor::Next::End => {
            runner.index_walk = None;
            match dirty::take() {
                Some(written) => {
                    runner.pending.extend(written);
                    dirty::end();
                    true
                }
                None => {
                    dirty::end();
                    walk_instead(runner)
                }
            }
        }
        index_cursor::Next::NotReady => {
            runner.index_walk = None;
            dirty::end();
            walk_instead(runner)
        }
    }
}

/// The steps walk the whole keyspace with their own scan (false: the pass goes on).
fn walk_instead(runner: &mut Runner) -> bool {
    crate::reshard::current::lock().job.keys_from = "walk";
    runner.db = 0;
    runner.restart_scan();
    false
}

/// Unlinks the keys that are still there, replicating one `UNLINK` per database; how many
/// went, by database.
fn unlink(ctx: &Context, names: &[DbKey]) -> Vec<(i32, u64)> {
    let mut done = Vec::new();
    for same_db in names.chunk_by(|a, b| a.0 == b.0) {
        let db = same_db[0].0;
        if keyspace::select_db(ctx, db) {
            let gone = keyspace::unlink(ctx, same_db.iter().map(|(_, name)| name.as_slice()));
            done.push((db, gone));
        }
    }
    done
}

impl Runner {
    /// How many keys a cleanup step may delete now, or how long until it may again (paused,
    /// the server's writes paused, or ahead of the rate). While the server's writes are paused
    /// (`CLIENT PAUSE WRITE`, a `FAILOVER` under way) nothing may be replicated: Redis 7.0 and
    /// Valkey fail an assertion when a timer's deletes are propagated then.
    fn allowed(&mut self) -> Result<usize, Duration> {
        let (paused, rate) = {
            let st = crate::reshard::current::lock();
            (st.job.paused, st.job.max_rate)
        };
        if paused || crate::host::context::writes_paused() {
            self.pace.restart();
            return Err(IDLE_INTERVAL);
        }
        let now = Instant::now();
        match self.pace.allowance(rate, now) {
            0 => Err(self
                .pace
                .wait(now)
                .clamp(Duration::from_millis(1), IDLE_INTERVAL)),
            left => Ok(usize::try_from(left).unwrap_or(usize::MAX)),
        }
    }

    /// Starts another pass over the keyspace.
    fn new_pass(&mut self) {
        self.db = 0;
        self.restart_scan();
        self.replace_now = false;
        self.scan_over = false;
    }
}
