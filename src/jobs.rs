//! The background resharding jobs (copy and cleanup), driven by a module timer in small steps
//! so that the server keeps serving: each step scans a batch of keys and handles it, and stops
//! once its time budget is spent. Everything runs on Redis's main thread.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::key::RedisKey;
use redis_module::{CallOptionsBuilder, CallResult, Context, KeysCursor, RedisString, RedisValue};

use crate::placement::Placement;
use crate::reshard::job::AfterPass;
use crate::reshard::{copy_target, migrate, Job, JobKind, Outcome};
use crate::ring::{NodeSpec, Ring};
use crate::state;

/// How long one step may run before it yields back to the event loop.
const STEP_BUDGET: Duration = Duration::from_millis(2);
/// Delay between steps.
const STEP_INTERVAL: Duration = Duration::from_millis(1);

/// Options of a copy (`SHARD.RESHARD COPY [BATCH n] [TIMEOUT ms] [REPLACE]`).
#[derive(Debug, Clone)]
pub struct CopyOptions {
    pub batch: usize,
    pub timeout_ms: u64,
    pub replace: bool,
    pub auth: Option<(String, String)>,
}

/// A running job: what it works with, and where its scan stands.
struct Runner {
    kind: JobKind,
    ring: Arc<Placement>,
    self_name: String,
    options: CopyOptions,
    cursor: KeysCursor,
    started: Instant,
    /// Destinations that failed in this pass, with their error: their keys fail at once.
    down: HashMap<String, String>,
    /// REPLACE applies to the first pass; later passes only pick up new keys.
    replace_now: bool,
    /// Keys scanned and not handled yet.
    pending: VecDeque<Vec<u8>>,
    /// The scan of this pass has reached its end.
    scan_over: bool,
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
) {
    state::lock().job = Job::start(kind);
    let replace_now = options.replace;
    RUNNER.with(|r| {
        *r.borrow_mut() = Some(Runner {
            kind,
            ring,
            self_name,
            options,
            cursor: KeysCursor::new(),
            started: Instant::now(),
            down: HashMap::new(),
            replace_now,
            pending: VecDeque::new(),
            scan_over: false,
        })
    });
    schedule(ctx);
}

/// Asks the running job to stop after its current batch.
pub fn request_stop() -> bool {
    let mut st = state::lock();
    if st.job.state.is_running() {
        st.job.request_stop();
        true
    } else {
        false
    }
}

fn schedule(ctx: &Context) {
    ctx.create_timer(STEP_INTERVAL, |ctx: &Context, ()| on_timer(ctx), ());
}

fn on_timer(ctx: &Context) {
    let started = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| step(ctx)));
    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    state::lock().job.record_step(micros);
    match outcome {
        Ok(true) => schedule(ctx),
        Ok(false) => {}
        Err(_) => {
            // The panic hook logged where; end the job so that nothing half-runs.
            RUNNER.with(|r| r.borrow_mut().take());
            let mut st = state::lock();
            st.job.last_error = "internal error in the resharding job; see the Redis log".into();
            st.job.failed += 1;
            st.job.finish();
        }
    }
}

/// Runs one step; true when the job goes on.
fn step(ctx: &Context) -> bool {
    let deadline = Instant::now() + STEP_BUDGET;
    RUNNER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let Some(runner) = slot.as_mut() else {
            return false;
        };
        loop {
            if state::lock().job.stop_requested() {
                finish(runner);
                *slot = None;
                return false;
            }
            if runner.pending.is_empty() {
                if runner.scan_over {
                    // The pass is over: another one, or the end. (The lock is released before
                    // `finish` takes it again.)
                    let after = state::lock().job.end_pass();
                    match after {
                        AfterPass::Again => runner.new_pass(),
                        AfterPass::Finished => {
                            finish(runner);
                            *slot = None;
                            return false;
                        }
                    }
                }
                let (keys, over) = scan_batch(ctx, runner);
                runner.pending.extend(keys);
                runner.scan_over = over;
            }
            // One key at a time, so that the time budget holds however slow a MIGRATE is.
            while let Some(key) = runner.pending.pop_front() {
                let outcome = runner.handle(ctx, &key);
                state::lock().job.record(outcome);
                if Instant::now() >= deadline {
                    break;
                }
            }
            if Instant::now() >= deadline {
                let elapsed = runner.started.elapsed().as_millis();
                state::lock().job.elapsed_ms = u64::try_from(elapsed).unwrap_or(u64::MAX);
                return true;
            }
        }
    })
}

/// Records the end of the job.
fn finish(runner: &Runner) {
    let elapsed = runner.started.elapsed().as_millis();
    let mut st = state::lock();
    st.job.elapsed_ms = u64::try_from(elapsed).unwrap_or(u64::MAX);
    if st.job.state.is_running() {
        st.job.finish();
    }
}

/// Scans until `batch` key names are collected or the pass is over (true).
fn scan_batch(ctx: &Context, runner: &Runner) -> (Vec<Vec<u8>>, bool) {
    // The scan callback may not change the keyspace: it only collects names, handled after.
    let collected = RefCell::new(Vec::with_capacity(runner.options.batch));
    let collect = |_: &Context, name: &RedisString, _: Option<&RedisKey>| {
        collected.borrow_mut().push(name.as_slice().to_vec());
    };
    let mut over = false;
    while collected.borrow().len() < runner.options.batch {
        if !runner.cursor.scan(ctx, &collect) {
            over = true;
            break;
        }
    }
    (collected.into_inner(), over)
}

impl Runner {
    /// Starts another pass over the keyspace.
    fn new_pass(&mut self) {
        self.cursor.restart();
        self.down.clear();
        self.replace_now = false;
        self.scan_over = false;
    }

    fn handle(&mut self, ctx: &Context, key: &[u8]) -> Outcome {
        let placement = Arc::clone(&self.ring);
        let Some(ring) = placement.ring.as_ref() else {
            return Outcome::Failed("the cluster algo has no ring to reshard".into());
        };
        match self.kind {
            JobKind::Copy => match copy_target(ring, &self.self_name, key) {
                None => Outcome::Kept,
                Some(target) => self.copy(ctx, target, key),
            },
            JobKind::Cleanup => cleanup(ctx, ring, &self.self_name, key),
        }
    }

    fn copy(&mut self, ctx: &Context, target: &NodeSpec, key: &[u8]) -> Outcome {
        if let Some(err) = self.down.get(&target.address) {
            return Outcome::Failed(err.clone());
        }
        let args = migrate::copy_args(
            &target.host,
            target.port,
            key,
            self.options.timeout_ms,
            self.replace_now,
            self.options.auth.as_ref(),
        );
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        match ctx.call("MIGRATE", args.as_slice()) {
            Ok(RedisValue::SimpleString(s)) if s == "NOKEY" => Outcome::Kept,
            Ok(RedisValue::SimpleStringStatic("NOKEY")) => Outcome::Kept,
            Ok(_) => Outcome::Moved,
            Err(e) => {
                let msg = e.to_string();
                if msg.contains("BUSYKEY") {
                    Outcome::Skipped
                } else {
                    let reason = format!("{} ({}): {msg}", target.name, target.address);
                    self.down.insert(target.address.clone(), reason.clone());
                    Outcome::Failed(reason)
                }
            }
        }
    }
}

fn cleanup(ctx: &Context, ring: &Ring, self_name: &str, key: &[u8]) -> Outcome {
    if !crate::reshard::cleanup_deletes(ring, self_name, key) {
        return Outcome::Kept;
    }
    let options = CallOptionsBuilder::new()
        .replicate()
        .errors_as_replies()
        .build();
    let result: CallResult = ctx.call_ext("UNLINK", &options, &[key]);
    match result {
        Ok(_) => Outcome::Moved,
        Err(e) => Outcome::Failed(format!(
            "UNLINK failed: {}",
            e.to_utf8_string().unwrap_or_default()
        )),
    }
}
