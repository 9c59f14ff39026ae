//! The background resharding jobs, driven by module timers so that the server keeps serving.
//!
//! - A copy runs pass after pass in a forked child (`fork_copy`): the first walks the whole
//!   keyspace, each next one the keys written here during the one before (`dirty`), until a
//!   pass had none. The main thread only forks, polls the child's counts for `STATUS` and
//!   starts the next pass.
//! - A cleanup deletes on the main thread in steps that stop once their time budget is spent.
//!   A forked child (`fork_cleanup`) walks the keyspace and sends the steps the names of the
//!   keys this node no longer owns; the keys written meanwhile are checked after it. Without a
//!   child (another one runs), the steps walk the keyspace themselves.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::{raw, Context, RedisString, RedisValue};

use crate::reshard::cleanup_child;
use crate::reshard::copy_child::{self, select_db, Pass, Source};
use crate::reshard::dirty::DbKey;
use crate::reshard::pace::Pace;
use crate::reshard::progress::AfterPass;
use crate::reshard::{dirty, Job, JobKind};
use crate::ring::placement::Placement;
use crate::ring::Ring;

/// How long one step may run before it yields back to the event loop.
const STEP_BUDGET: Duration = Duration::from_millis(2);
/// How often a paused or throttled cleanup looks again, at most.
const IDLE_INTERVAL: Duration = Duration::from_millis(10);
/// How often a copy looks at its child's counts, and retries a fork that could not start.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// The window `keys_per_sec` is measured over.
const RATE_WINDOW: Duration = Duration::from_secs(2);

/// Options of a copy (`SHARD.RESHARD COPY [BATCH n] [TIMEOUT ms] [REPLACE]`).
#[derive(Debug, Clone)]
pub struct CopyOptions {
    pub batch: usize,
    pub timeout_ms: u64,
    pub replace: bool,
    pub auth: Option<(String, String)>,
    /// Keys per second (`MAXRATE`, 0: no limit).
    pub max_rate: u64,
    /// Which keys travel in pieces (`big-key-bytes`, `big-key-elements`).
    pub big: crate::reshard::pieces::Limits,
}

/// A running job: what it works with, and where its scan stands.
struct Runner {
    ring: Arc<Placement>,
    self_name: String,
    options: CopyOptions,
    /// The cleanup's scan cursor (`RedisModule_ScanCursorCreate`), destroyed with the runner.
    cursor: ScanCursor,
    started: Instant,
    /// REPLACE applies to the first pass; later passes only pick up new keys.
    replace_now: bool,
    /// Keys scanned and not handled yet, with their databases.
    pending: VecDeque<DbKey>,
    /// The database a cleanup's own scan (without a child) walks.
    db: i32,
    /// The scan of this pass has reached its end.
    scan_over: bool,
    /// A copy's or a cleanup's child, while one runs.
    child: Option<c_int>,
    /// A cleanup's child's names of keys to delete, while it sends them.
    names: Option<cleanup_child::Names>,
    /// (when, keys walked) samples for `keys_per_sec`.
    samples: VecDeque<(Instant, u64)>,
    /// A cleanup's pace against `max_rate`.
    pace: Pace,
}

thread_local! {
    /// Set by the fork-done handler: (exit code, killed by a signal).
    static CHILD_DONE: Cell<Option<(c_int, bool)>> = const { Cell::new(None) };
}

thread_local! {
    static RUNNER: RefCell<Option<Runner>> = const { RefCell::new(None) };
}

/// Whether a job is running.
pub fn running() -> bool {
    RUNNER.with(|r| r.borrow().is_some())
}

/// Starts a job in the background; the caller checked that none runs and that the ring and
/// `self` allow it.
pub fn start(
    ctx: &Context,
    kind: JobKind,
    ring: Arc<Placement>,
    self_name: String,
    options: CopyOptions,
) -> Result<(), String> {
    if kind == JobKind::Copy {
        dirty::subscribe(ctx)?;
        copy_child::shared().ok_or("cannot map the page shared with the copy's child")?;
    }
    let keys_total = match ctx.call("INFO", &["keyspace"]) {
        Ok(RedisValue::SimpleString(text)) => crate::reshard::fate::keys_in_keyspace(&text),
        Ok(RedisValue::BulkString(text)) => crate::reshard::fate::keys_in_keyspace(&text),
        Ok(RedisValue::BulkRedisString(text)) => {
            crate::reshard::fate::keys_in_keyspace(&String::from_utf8_lossy(text.as_slice()))
        }
        _ => 0,
    };
    let mut job = Job::start(kind);
    job.keys_total = keys_total;
    job.max_rate = options.max_rate;
    crate::reshard::current::lock().job = job;
    CHILD_DONE.with(|d| d.set(None));
    let replace_now = options.replace;
    RUNNER.with(|r| {
        *r.borrow_mut() = Some(Runner {
            ring,
            self_name,
            options,
            cursor: ScanCursor::new(),
            started: Instant::now(),
            replace_now,
            pending: VecDeque::new(),
            db: 0,
            scan_over: false,
            child: None,
            names: None,
            samples: VecDeque::new(),
            pace: Pace::default(),
        })
    });
    match kind {
        JobKind::Copy => {
            ctx.create_timer(Duration::ZERO, |ctx: &Context, ()| on_copy_timer(ctx), ());
        }
        JobKind::Cleanup => {
            fork_cleanup_walk(ctx);
            schedule(ctx, Duration::ZERO);
        }
    }
    Ok(())
}

/// Asks the running job to stop after its current batch (a copy's child is killed at once).
pub fn request_stop() -> bool {
    {
        let mut st = crate::reshard::current::lock();
        if !st.job.state.is_running() {
            return false;
        }
        st.job.request_stop();
    }
    let was_waiting = RUNNER.with(|r| {
        r.borrow_mut().as_mut().is_some_and(|runner| {
            let waiting = runner.names.as_ref().is_some_and(|n| n.waiting());
            runner.end_child();
            waiting
        })
    });
    if was_waiting {
        // Its step waited for names that will not come now: it runs once more, and ends.
        wake();
    }
    true
}

/// Limits the running job to `rate` keys per second (0: no limit); false if none runs.
pub fn throttle(rate: u64) -> bool {
    control(|job, shared| {
        job.max_rate = rate;
        shared.max_rate.store(rate, Ordering::Relaxed);
    })
}

/// Pauses or resumes the running job; false if none runs.
pub fn set_paused(paused: bool) -> bool {
    control(|job, shared| {
        job.paused = paused;
        shared.paused.store(u64::from(paused), Ordering::Relaxed);
    })
}

/// Changes a control of the running job, in its state and in the page its child reads.
fn control(change: impl FnOnce(&mut Job, &copy_child::Shared)) -> bool {
    let mut st = crate::reshard::current::lock();
    let Some(shared) = copy_child::shared().filter(|_| st.job.state.is_running()) else {
        return false;
    };
    change(&mut st.job, shared);
    true
}

/// Hands a cleanup's walk to a forked child when it can (else the steps scan themselves).
fn fork_cleanup_walk(ctx: &Context) {
    if dirty::subscribe(ctx).is_err() {
        return;
    }
    RUNNER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let Some(runner) = slot.as_mut() else {
            return;
        };
        dirty::begin();
        CHILD_DONE.with(|d| d.set(None));
        match cleanup_child::start(ctx, &runner.ring, &runner.self_name, on_child_done) {
            Ok((pid, names)) => {
                runner.child = Some(pid);
                runner.names = Some(names);
            }
            Err(_) => dirty::end(),
        }
    });
}

/// How the job's child ended, once it has: (exit code, killed by a signal).
fn child_outcome(runner: &Runner) -> Option<(c_int, bool)> {
    CHILD_DONE
        .with(Cell::take)
        .or_else(|| runner.child.and_then(copy_child::reap_if_exited))
}

/// A cleanup's child has sent every name (or died): what is left to do, on the main thread.
fn after_cleanup_child(runner: &mut Runner) -> bool {
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
        (true, Some(written), Some(ring)) => {
            // The keys written since the fork: those this node does not own go too.
            runner.pending.extend(
                written
                    .into_iter()
                    .filter(|(_, k)| crate::reshard::cleanup_deletes(ring, &runner.self_name, k)),
            );
            runner.scan_over = true;
        }
        _ => {
            // The child failed, or too many keys were written: the steps walk it all again.
            runner.db = 0;
            runner.cursor.restart();
            runner.scan_over = false;
        }
    }
    dirty::end();
    true
}

/// Called by Redis on the main thread when a copy's child has exited.
unsafe extern "C" fn on_child_done(exitcode: c_int, bysignal: c_int, _: *mut c_void) {
    CHILD_DONE.with(|d| d.set(Some((exitcode, bysignal != 0))));
}

fn on_copy_timer(ctx: &Context) {
    let started = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| copy_tick(ctx)));
    // What the main thread spent (the fork, mostly): how long the job held the server.
    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    crate::reshard::current::lock()
        .job
        .record_step(micros.max(1));
    match outcome {
        Ok(true) => {
            ctx.create_timer(POLL_INTERVAL, |ctx: &Context, ()| on_copy_timer(ctx), ());
        }
        Ok(false) => {}
        Err(_) => fail_job(),
    }
}

/// Ends the job after a panic in one of its steps (the panic hook logged where): its child is
/// killed and nothing of it runs on.
fn fail_job() {
    let runner = RUNNER.with(|r| r.borrow_mut().take());
    if let Some(mut runner) = runner {
        runner.end_child();
    }
    let mut st = crate::reshard::current::lock();
    st.job.last_error = "internal error in the resharding job; see the Redis log".into();
    st.job.failed += 1;
    st.job.finish();
}

/// One look at a copy: starts a pass, follows the running one, or ends the job. True while
/// the job goes on.
fn copy_tick(ctx: &Context) -> bool {
    RUNNER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let Some(runner) = slot.as_mut() else {
            return false;
        };
        let Some(shared) = copy_child::shared() else {
            return false;
        };
        if crate::reshard::current::lock().job.stop_requested() {
            runner.end_child();
            finish(runner);
            *slot = None;
            return false;
        }
        if runner.child.is_some() {
            let Some((code, signalled)) = child_outcome(runner) else {
                runner.follow(shared);
                return true;
            };
            runner.child = None;
            let broken =
                signalled || code != 0 || shared.finished.load(Ordering::Acquire) != 1;
            let mut error = shared.error();
            if broken && error.is_empty() {
                error = format!("the copy's child ended before its pass was done (exit code {code}, signal {signalled})");
            }
            let written = dirty::count();
            let after = {
                let mut st = crate::reshard::current::lock();
                st.job.add_pass(shared.counts(), &shared.copied_by_db(), &error);
                if broken {
                    st.job.failed += 1;
                }
                st.job.end_fork_pass(written)
            };
            let walked = crate::reshard::current::lock().job.scanned();
            runner.record_rate(walked);
            if after == AfterPass::Finished {
                dirty::end();
                finish(runner);
                *slot = None;
                return false;
            }
        }
        // Start the next pass: the whole keyspace first, then the keys written meanwhile.
        let source = if runner.scan_over {
            match dirty::take() {
                Some(keys) => Source::Keys(keys),
                None => Source::Scan,
            }
        } else {
            Source::Scan
        };
        let (max_rate, paused) = {
            let st = crate::reshard::current::lock();
            (st.job.max_rate, st.job.paused)
        };
        let pass = Pass {
            ring: Arc::clone(&runner.ring),
            self_name: runner.self_name.clone(),
            source,
            replace: runner.replace_now,
            timeout: Duration::from_millis(runner.options.timeout_ms),
            auth: runner.options.auth.clone(),
            max_rate,
            paused,
            big: runner.options.big,
        };
        dirty::begin();
        CHILD_DONE.with(|d| d.set(None));
        match copy_child::start(ctx, &pass, on_child_done) {
            Ok(pid) => {
                runner.child = Some(pid);
                runner.scan_over = true;
                runner.replace_now = false;
            }
            Err(why) => {
                // Redis runs one child at a time: try again shortly, keeping the keys written.
                if let Source::Keys(keys) = pass.source {
                    dirty::restore(keys);
                }
                crate::reshard::current::lock().job.last_error = format!("waiting to fork: {why}");
            }
        }
        true
    })
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
    ctx.create_timer(after, |ctx: &Context, ()| on_timer(ctx), ());
}

fn on_timer(ctx: &Context) {
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
unsafe extern "C" fn on_names_ready(_fd: c_int, _: *mut c_void, _mask: c_int) {
    let _ = catch_unwind(|| {
        RUNNER.with(|r| {
            if let Some(names) = r.borrow_mut().as_mut().and_then(|r| r.names.as_mut()) {
                names.stop_waiting();
            }
        });
        wake();
    });
}

/// Runs a cleanup step from outside a timer (the event loop's callback, a STOP while the step
/// waited for names).
fn wake() {
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

/// Records the end of the job.
fn finish(runner: &Runner) {
    let elapsed = runner.started.elapsed().as_millis();
    let mut st = crate::reshard::current::lock();
    st.job.elapsed_ms = u64::try_from(elapsed).unwrap_or(u64::MAX);
    if st.job.state.is_running() {
        st.job.finish();
    }
}

/// Keys deleted (and replicated as one `UNLINK`) at a time.
const DELETE_BATCH: usize = 128;
/// A scan stops after this many keys even if few of them go.
const SCAN_LIMIT: u64 = 2048;

/// A `RedisModule_ScanCursor`, destroyed when dropped.
struct ScanCursor(*mut raw::RedisModuleScanCursor);

impl ScanCursor {
    fn new() -> ScanCursor {
        // SAFETY: the API table is filled at load.
        ScanCursor(unsafe {
            raw::RedisModule_ScanCursorCreate.map_or(std::ptr::null_mut(), |f| f())
        })
    }

    fn restart(&self) {
        // SAFETY: a live cursor.
        unsafe {
            if let (false, Some(f)) = (self.0.is_null(), raw::RedisModule_ScanCursorRestart) {
                f(self.0);
            }
        }
    }
}

impl Drop for ScanCursor {
    fn drop(&mut self) {
        // SAFETY: created by ScanCursorCreate, destroyed once.
        unsafe {
            if let (false, Some(f)) = (self.0.is_null(), raw::RedisModule_ScanCursorDestroy) {
                f(self.0);
            }
        }
    }
}

/// What the cleanup's scan callback fills.
struct CleanupScan<'a> {
    ring: &'a Ring,
    self_name: &'a str,
    db: i32,
    scanned: u64,
    doomed: &'a mut VecDeque<DbKey>,
}

extern "C" fn on_cleanup_key(
    _ctx: *mut raw::RedisModuleCtx,
    keyname: *mut raw::RedisModuleString,
    _key: *mut raw::RedisModuleKey,
    privdata: *mut std::os::raw::c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `privdata` is the CleanupScan of `scan_batch`, alive for the scan call; the
        // name is live for the callback.
        unsafe {
            let scan = &mut *privdata.cast::<CleanupScan>();
            scan.scanned += 1;
            let name = RedisString::string_as_slice(keyname);
            if crate::reshard::cleanup_deletes(scan.ring, scan.self_name, name) {
                scan.doomed.push_back((scan.db, name.to_vec()));
            }
        }
    }));
}

/// Scans on until `batch` keys to delete are found, `SCAN_LIMIT` keys were seen, or the pass
/// is over (true): the last database's scan is. The callback only collects names: keys are
/// deleted after it.
fn scan_batch(ctx: &Context, runner: &mut Runner) -> bool {
    let placement = Arc::clone(&runner.ring);
    let Some(ring) = placement.ring.as_ref() else {
        return true;
    };
    // SAFETY: the API table is filled at load.
    let Some(scan) = (unsafe { raw::RedisModule_Scan }) else {
        return true;
    };
    if runner.cursor.0.is_null() {
        return true;
    }
    if !select_db(ctx, runner.db) {
        return true;
    }
    let mut state = CleanupScan {
        ring,
        self_name: &runner.self_name,
        db: runner.db,
        scanned: 0,
        doomed: &mut runner.pending,
    };
    let mut over = false;
    while state.doomed.len() < runner.options.batch && state.scanned < SCAN_LIMIT {
        // SAFETY: a live cursor; the callback gets `state` for the duration of the call.
        let more = unsafe {
            scan(
                ctx.ctx,
                runner.cursor.0,
                Some(on_cleanup_key),
                std::ptr::addr_of_mut!(state).cast(),
            )
        };
        if more == 0 {
            over = true;
            break;
        }
    }
    let scanned = state.scanned;
    crate::reshard::current::lock()
        .job
        .record_many(scanned, 0, 0);
    if over && select_db(ctx, runner.db + 1) {
        // The next database, from its start.
        runner.db += 1;
        runner.cursor.restart();
        return false;
    }
    over
}

/// Unlinks the keys that are still there, replicating one `UNLINK` per database; how many
/// went, by database.
fn unlink(ctx: &Context, names: &[DbKey]) -> Vec<(i32, u64)> {
    let mut done = Vec::new();
    for same_db in names.chunk_by(|a, b| a.0 == b.0) {
        let db = same_db[0].0;
        if select_db(ctx, db) {
            done.push((db, unlink_here(ctx, same_db)));
        }
    }
    done
}

/// Unlinks keys of the selected database and replicates one `UNLINK` of those that went.
fn unlink_here(ctx: &Context, names: &[DbKey]) -> u64 {
    let mut gone: Vec<*mut raw::RedisModuleString> = Vec::with_capacity(names.len());
    // SAFETY: the API table is filled at load; every key opened is closed, every string made
    // here is freed here.
    unsafe {
        let (Some(create), Some(open), Some(unlink), Some(close), Some(free)) = (
            raw::RedisModule_CreateString,
            raw::RedisModule_OpenKey,
            raw::RedisModule_UnlinkKey,
            raw::RedisModule_CloseKey,
            raw::RedisModule_FreeString,
        ) else {
            return 0;
        };
        for (_, name) in names {
            let s = create(ctx.ctx, name.as_ptr().cast(), name.len());
            let key =
                open(ctx.ctx, s, raw::REDISMODULE_WRITE as c_int).cast::<raw::RedisModuleKey>();
            if !key.is_null() && unlink(key) == raw::REDISMODULE_OK as c_int {
                gone.push(s);
            } else {
                free(ctx.ctx, s);
            }
            if !key.is_null() {
                close(key);
            }
        }
        if !gone.is_empty() {
            if let Some(replicate) = raw::RedisModule_Replicate {
                replicate(
                    ctx.ctx,
                    c"UNLINK".as_ptr(),
                    c"v".as_ptr(),
                    gone.as_ptr(),
                    gone.len(),
                );
            }
        }
        for s in &gone {
            free(ctx.ctx, *s);
        }
    }
    gone.len() as u64
}

impl Runner {
    /// Kills the job's child, if one runs, and stops recording written keys.
    fn end_child(&mut self) {
        if let Some(pid) = self.child.take() {
            copy_child::kill(pid);
        }
        self.names = None;
        dirty::end();
    }

    /// How many keys a cleanup step may delete now, or how long until it may again (paused,
    /// or ahead of the rate).
    fn allowed(&mut self) -> Result<usize, Duration> {
        let (paused, rate) = {
            let st = crate::reshard::current::lock();
            (st.job.paused, st.job.max_rate)
        };
        if paused {
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

    /// Copies the running child's counts into the job, for STATUS and INFO.
    fn follow(&mut self, shared: &copy_child::Shared) {
        let live = shared.counts();
        {
            let mut st = crate::reshard::current::lock();
            st.job.live = live;
            st.job.live_by_db = shared.copied_by_db();
            st.job.in_flight = shared.in_flight.load(Ordering::Relaxed);
        }
        self.update_rate();
    }

    /// Brings the job's elapsed time, `keys_per_sec` and `eta_ms` up to date.
    fn update_rate(&mut self) {
        let walked = {
            let mut st = crate::reshard::current::lock();
            st.job.elapsed_ms =
                u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            st.job.scanned()
        };
        self.record_rate(walked);
        let mut st = crate::reshard::current::lock();
        let job = &mut st.job;
        if let (Some(&(t0, k0)), Some(&(t1, k1))) = (self.samples.front(), self.samples.back()) {
            let secs = t1.duration_since(t0).as_secs_f64();
            if secs > 0.05 {
                job.keys_per_sec = ((k1.saturating_sub(k0)) as f64 / secs) as u64;
                let left = job.keys_total.saturating_sub(k1);
                job.eta_ms = left
                    .saturating_mul(1000)
                    .checked_div(job.keys_per_sec)
                    .unwrap_or(0);
            }
        }
    }

    fn record_rate(&mut self, walked: u64) {
        let now = Instant::now();
        self.samples.push_back((now, walked));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Starts another pass over the keyspace.
    fn new_pass(&mut self) {
        self.db = 0;
        self.cursor.restart();
        self.replace_now = false;
        self.scan_over = false;
    }
}
