//! The background resharding jobs: what the copy and the cleanup share, and the calls the
//! commands make (start, stop, throttle, pause).
//!
//! - A copy (`copy_job`) runs pass after pass in a forked child (`copy_child`): the first walks
//!   the whole keyspace, each next one the keys written here during the one before (`dirty`),
//!   until a pass had none. The main thread only forks, polls the child's counts for `STATUS`
//!   and starts the next pass. A pass may instead run in steps on the main thread, without a
//!   fork (`copy_steps`, `shard.copy-fork`), its commands shipped by a thread (`ship_thread`).
//! - A cleanup (`cleanup_job`) deletes on the main thread in steps that stop once their time
//!   budget is spent. A forked child (`cleanup_child`) walks the keyspace and sends the steps
//!   the names of the keys this node no longer owns; the keys written meanwhile are checked
//!   after it. Without a child (another one runs), the steps walk the keyspace themselves; with
//!   the key index ready they take its names themselves, without a fork (`index_cursor`).
//!
//! Both are driven by module timers, so that the server keeps serving; the running job's
//! bookkeeping (`Runner`) and its child's end live here, its counters in `current`.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::{Context, RedisValue};

use crate::host::fork::{self, Exit, Pid};
use crate::host::keyspace::ScanCursor;
use crate::host::names::Names;
use crate::reshard::copy_page::{self, Shared};
use crate::reshard::dirty::{self, DbKey};
use crate::reshard::failover::Followed;
use crate::reshard::moved;
use crate::reshard::pace::Pace;
use crate::reshard::ship::Target;
use crate::reshard::{cleanup_job, copy_job, Job, JobKind};
use crate::ring::placement::Placement;

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
    /// The ring the keys leave (the previous ring: the old one in a resharding, the one being
    /// left in a cancel's copy back; none without a resharding). Only the keys it gives to this
    /// node travel; a key it holds that that ring gives elsewhere (a stray an earlier failed
    /// cleanup left) stays put, listed for the cleanup, so an old copy never replaces, or
    /// brings back, the owner's key.
    pub leaving: Option<Arc<Placement>>,
}

/// A running job: what it works with, and where its scan stands.
pub(super) struct Runner {
    pub(super) ring: Arc<Placement>,
    pub(super) self_name: String,
    pub(super) options: CopyOptions,
    /// The cleanup's own scan cursor (none without the scan API).
    pub(super) cursor: Option<ScanCursor>,
    pub(super) started: Instant,
    /// REPLACE applies to the first pass; later passes only pick up new keys.
    pub(super) replace_now: bool,
    /// Keys scanned and not handled yet, with their databases.
    pub(super) pending: VecDeque<DbKey>,
    /// The database a cleanup's own scan (without a child) walks.
    pub(super) db: i32,
    /// The scan of this pass has reached its end.
    pub(super) scan_over: bool,
    /// A copy's or a cleanup's child, while one runs.
    pub(super) child: Option<Pid>,
    /// A cleanup's names of keys to delete, while its child sends them or it reads the copy's
    /// list.
    pub(super) names: Option<Names>,
    /// A cleanup reads the copy's list (`moved`) rather than a walk's names.
    pub(super) from_list: bool,
    /// Where a copy's walks write their list (`moved`), and whether the running pass walks.
    pub(super) list: Option<std::path::PathBuf>,
    pub(super) walking: bool,
    /// (when, keys walked) samples for `keys_per_sec`.
    samples: VecDeque<(Instant, u64)>,
    /// A cleanup's pace against `max_rate`.
    pub(super) pace: Pace,
    /// A copy's destinations followed through a failover (`failover`); the running pass's
    /// destinations as forked, and the nodes it walks all the keys of (`None`: a pass over
    /// the keys written).
    pub(super) followed: Followed,
    pub(super) pass_targets: Vec<Target>,
    pub(super) pass_walked: Option<Vec<bool>>,
    /// A copy's pass under way in steps on the main thread (`copy_steps`), instead of a child.
    pub(super) steps: Option<crate::reshard::copy_steps::Steps>,
    /// Big keys a pass in steps left for a forked pass (they travel in pieces).
    pub(super) big: Vec<DbKey>,
    /// A cleanup's walk of the key index in its own steps, instead of a child's.
    pub(super) index_walk: Option<crate::reshard::index_cursor::IndexCursor>,
}

thread_local! {
    /// Set by the fork-done handler: how the job's child ended.
    static CHILD_DONE: Cell<Option<Exit>> = const { Cell::new(None) };
}

thread_local! {
    pub(super) static RUNNER: RefCell<Option<Runner>> = const { RefCell::new(None) };
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
        copy_page::shared().ok_or("cannot map the page shared with the copy's child")?;
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
    forget_child_outcome();
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
            from_list: false,
            list: None,
            walking: false,
            samples: VecDeque::new(),
            pace: Pace::default(),
            followed: Followed::default(),
            pass_targets: Vec::new(),
            pass_walked: None,
            steps: None,
            big: Vec::new(),
            index_walk: None,
        })
    });
    match kind {
        JobKind::Copy => copy_job::begin(ctx),
        JobKind::Cleanup => cleanup_job::begin(ctx),
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
        cleanup_job::wake();
    }
    true
}

/// This server became a replica: its job ran on the data it had as a primary, which its new
/// primary's replaces. A running job stops (a replica's keys are not its to copy or delete),
/// and the job, running or finished, no longer counts for the fleet step that started it
/// (its term is forgotten): promoted again later, this server reports a job that counts for no
/// step, and the coordinator starts the step again there.
pub fn demoted() {
    request_stop();
    crate::reshard::current::lock().job.term = 0;
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
fn control(change: impl FnOnce(&mut Job, &Shared)) -> bool {
    let mut st = crate::reshard::current::lock();
    let Some(shared) = copy_page::shared().filter(|_| st.job.state.is_running()) else {
        return false;
    };
    change(&mut st.job, shared);
    true
}

/// Forgets how the last child ended (before a fork).
pub(super) fn forget_child_outcome() {
    CHILD_DONE.with(|d| d.set(None));
}

/// How the job's child ended, once it has: (exit code, killed by a signal). Reaped here when
/// the server has not yet, unless the tests leave it to the server (`copy_child::end_held`).
pub(super) fn child_outcome(runner: &Runner) -> Option<Exit> {
    CHILD_DONE.with(Cell::take).or_else(|| {
        let reap = !crate::reshard::copy_child::end_held();
        runner.child.filter(|_| reap).and_then(fork::reap_if_exited)
    })
}

/// Told by the server on the main thread when the job's child has exited.
pub(super) fn on_child_done(exit: Exit) {
    CHILD_DONE.with(|d| d.set(Some(exit)));
}

/// Ends the job after a panic in one of its steps (the panic hook logged where): its child is
/// killed and nothing of it runs on.
pub(super) fn fail_job() {
    let runner = RUNNER.with(|r| r.borrow_mut().take());
    if let Some(mut runner) = runner {
        runner.end_child();
    }
    // What a copy learnt may be half-written: the next cleanup walks.
    moved::forget();
    let mut st = crate::reshard::current::lock();
    st.job.last_error = "internal error in the resharding job; see the Redis log".into();
    st.job.failed += 1;
    st.job.finish();
}

/// Records the end of the job.
pub(super) fn finish(runner: &Runner) {
    let elapsed = runner.started.elapsed().as_millis();
    let mut st = crate::reshard::current::lock();
    st.job.elapsed_ms = u64::try_from(elapsed).unwrap_or(u64::MAX);
    if st.job.state.is_running() {
        st.job.finish();
    }
    let job = &st.job;
    // In the server log, so that a key's travels can be followed afterwards (issue 33).
    redis_module::logging::log_notice(format!(
        "shard: {} job of term {} ended {}: scanned {}, copied {}, skipped {}, deleted {}, failed {}, passes {}{}",
        match job.kind {
            Some(crate::reshard::JobKind::Copy) => "copy",
            Some(crate::reshard::JobKind::Cleanup) => "cleanup",
            None => "a",
        },
        job.term,
        job.state.name(),
        job.scanned(),
        job.copied(),
        job.skipped(),
        job.deleted(),
        job.failed(),
        job.passes,
        if job.last_error.is_empty() {
            String::new()
        } else {
            format!(" ({})", job.last_error)
        }
    ));
}

impl Runner {
    /// Kills the job's child, if one runs (or gives up its pass in steps, whose thread stops
    /// at once), and stops recording written keys.
    pub(super) fn end_child(&mut self) {
        if let Some(pid) = self.child.take() {
            fork::kill_child(pid);
        }
        self.steps = None;
        self.names = None;
        dirty::end();
    }

    /// Brings the job's elapsed time, `keys_per_sec` and `eta_ms` up to date.
    pub(super) fn update_rate(&mut self) {
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

    pub(super) fn record_rate(&mut self, walked: u64) {
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

    /// A cleanup's own scan goes back to the start.
    pub(super) fn restart_scan(&self) {
        if let Some(cursor) = &self.cursor {
            cursor.restart();
        }
    }
}
