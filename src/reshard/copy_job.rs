//! A copy job's driver, on the main thread: a module timer that forks a pass's child
//! (`copy_child`), looks at its counts every few milliseconds (for `STATUS` and INFO) until it
//! exits, then starts the next pass: the first walks the whole keyspace, each next one the keys
//! written here during the one before (`dirty`), until a pass had none. What the copy and the
//! cleanup share (the running job, its child, its rate) is `jobs`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::Context;

use crate::reshard::copy_child::{self, Pass, Source};
use crate::reshard::copy_page::{self, Shared};
use crate::reshard::jobs::{
    child_outcome, fail_job, finish, forget_child_outcome, on_child_done, Runner, RUNNER,
};
use crate::reshard::progress::AfterPass;
use crate::reshard::{dirty, moved};

/// How often a copy looks at its child's counts, and retries a fork that could not start.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Starts the copy's first look (the runner is in place).
pub(super) fn begin(ctx: &Context) {
    RUNNER.with(|r| {
        if let Some(runner) = r.borrow_mut().as_mut() {
            runner.list = moved::begin_copy(&runner.ring, &runner.self_name);
        }
    });
    ctx.create_timer(Duration::ZERO, |ctx: &Context, ()| on_copy_timer(ctx), ());
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

/// One look at a copy: starts a pass, follows the running one, or ends the job. True while
/// the job goes on.
fn copy_tick(ctx: &Context) -> bool {
    RUNNER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let Some(runner) = slot.as_mut() else {
            return false;
        };
        let Some(shared) = copy_page::shared() else {
            return false;
        };
        if crate::reshard::current::lock().job.stop_requested() {
            runner.end_child();
            // A walk cut short leaves no list to trust.
            moved::forget();
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
            if runner.walking {
                moved::walk_ended(!broken, runner.list.as_deref());
                runner.walking = false;
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
        // Start the next pass: the whole keyspace first (or what the key index names in the
        // buckets that move), then the keys written meanwhile.
        let whole = |runner: &super::jobs::Runner| {
            if crate::index::complete_for(ctx, &runner.ring) {
                crate::reshard::current::lock().job.keys_from = "index";
                Source::Index
            } else {
                Source::Scan
            }
        };
        let source = if runner.scan_over {
            match dirty::take() {
                Some(keys) => Source::Keys(keys),
                None => whole(runner),
            }
        } else {
            whole(runner)
        };
        let (max_rate, paused) = {
            let st = crate::reshard::current::lock();
            (st.job.max_rate, st.job.paused)
        };
        let walking = matches!(source, Source::Scan | Source::Index);
        let pass = Pass {
            list: if walking { runner.list.clone() } else { None },
            leaving: runner.options.leaving.clone(),
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
        dirty::begin(&runner.ring, &runner.self_name);
        forget_child_outcome();
        match copy_child::start(ctx, &pass, on_child_done) {
            Ok(pid) => {
                runner.child = Some(pid);
                runner.walking = walking;
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

impl Runner {
    /// Copies the running child's counts into the job, for STATUS and INFO.
    fn follow(&mut self, shared: &Shared) {
        let live = shared.counts();
        {
            let mut st = crate::reshard::current::lock();
            st.job.live = live;
            st.job.live_by_db = shared.copied_by_db();
            st.job.in_flight = shared.in_flight.load(Ordering::Relaxed);
        }
        self.update_rate();
    }
}

/// Keys in flight to the destinations now: while a copy's child runs, its own count read live
/// (the child marks a batch in flight before it looks at the pause, so a PAUSE followed by a
/// read of 0 means nothing more will be sent); else the last count followed.
pub fn in_flight_now(job: &crate::reshard::Job) -> u64 {
    let child_runs = super::jobs::RUNNER.with(|r| {
        r.try_borrow()
            .ok()
            .is_some_and(|r| r.as_ref().is_some_and(|r| r.child.is_some()))
    });
    if job.kind == Some(crate::reshard::JobKind::Copy)
        && job.state == crate::reshard::JobState::Copying
        && child_runs
    {
        if let Some(shared) = copy_page::shared() {
            return shared.in_flight.load(Ordering::SeqCst);
        }
    }
    job.in_flight
}
