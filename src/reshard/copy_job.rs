//! A copy job's driver, on the main thread: a module timer that forks a pass's child
//! (`copy_child`), looks at its counts every few milliseconds (for `STATUS` and INFO) until it
//! exits, then starts the next pass: the first walks the whole keyspace, each next one the keys
//! written here during the one before (`dirty`), until a pass had none. A destination behind
//! Sentinel that a pass lost (its primary died or was demoted) is followed (`failover`): once
//! its new primary is known, a pass walks again for it alone, and the job does not end while
//! one is waited for. What the copy and the cleanup share (the running job, its child, its
//! rate) is `jobs`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::Context;

use crate::reshard::copy_child::{self, Pass, Source};
use crate::reshard::copy_page::{self, Shared};
use crate::reshard::copy_steps::{self, Mode, Progress};
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
    crate::host::timers::after_on(
        ctx,
        Duration::ZERO,
        |ctx: &Context, ()| on_copy_timer(ctx),
        (),
    );
}

fn on_copy_timer(ctx: &Context) {
    let _step = crate::host::latency::step_with_cpu(c"shard-copy-step", c"shard-copy-step-cpu");
    let started = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| copy_tick(ctx)));
    // What the main thread spent (the fork, mostly): how long the job held the server.
    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    crate::reshard::current::lock()
        .job
        .record_step(micros.max(1));
    match outcome {
        Ok(Some(next)) => {
            crate::host::timers::after_on(ctx, next, |ctx: &Context, ()| on_copy_timer(ctx), ());
        }
        Ok(None) => {}
        Err(_) => fail_job(),
    }
}

/// One look at a copy: starts a pass, runs a step of the pass in steps or follows the child,
/// or ends the job. While the job goes on, when to look again.
fn copy_tick(ctx: &Context) -> Option<Duration> {
    RUNNER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let runner = slot.as_mut()?;
        let shared = copy_page::shared()?;
        if crate::reshard::current::lock().job.stop_requested() {
            runner.end_child();
            // A walk cut short leaves no list to trust.
            moved::forget();
            finish(runner);
            *slot = None;
            return None;
        }
        if runner.child.is_some() || runner.steps.is_some() {
            let (broken, error) = match pass_outcome(ctx, runner, shared) {
                Ok(ended) => ended,
                Err(next) => return Some(next),
            };
            if runner.walking {
                moved::walk_ended(!broken, runner.list.as_deref());
                runner.walking = false;
            }
            // (Big keys left by a pass in steps make one more pass, forked.)
            let written = dirty::count().map(|w| w + runner.big.len());
            let now = Instant::now();
            let walked = runner.pass_walked.take();
            let recovered = runner.followed.pass_ended(
                &runner.pass_targets,
                walked.as_deref(),
                &shared.lost_by_node(),
                now,
            );
            runner
                .followed
                .moved(&copy_child::targets(&runner.ring), now);
            let given_up = runner.followed.give_up(now);
            let after = {
                let mut st = crate::reshard::current::lock();
                st.job.add_pass(shared.counts(), &shared.copied_by_db(), &error);
                if broken {
                    st.job.failed += 1;
                }
                for (name, old, new) in recovered {
                    st.job.last_error = if old == new {
                        format!("{name} ({new}) was out of reach during the copy: its keys were sent again")
                    } else {
                        format!("{name} failed over from {old} to {new} during the copy: its keys were sent again there")
                    };
                }
                count_given_up(&mut st.job, given_up);
                if runner.followed.waiting() && !st.job.stop_requested() {
                    let why = if error.is_empty() {
                        String::new()
                    } else {
                        format!(" ({error})")
                    };
                    st.job.last_error = format!(
                        "waiting for the failover of {}: its keys are sent again once Sentinel names a new primary, or it answers again{why}",
                        runner.followed.names()
                    );
                    st.job.hold_for_failover();
                    AfterPass::Again
                } else {
                    st.job.end_fork_pass(written)
                }
            };
            note_pass(&runner.pass_targets, &runner.self_name, shared.counts(), &error);
            let walked = crate::reshard::current::lock().job.scanned();
            runner.record_rate(walked);
            if after == AfterPass::Finished {
                dirty::end();
                finish(runner);
                *slot = None;
                return None;
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
        let now = Instant::now();
        let targets = copy_child::targets(&runner.ring);
        let redo = runner.followed.due(&targets, now);
        if redo.is_none() && runner.followed.waiting() && dirty::count() == Some(0) {
            // Nothing to send until a lost destination's new primary is known: look again.
            let given_up = runner.followed.give_up(now);
            if !given_up.is_empty() && !runner.followed.waiting() {
                count_given_up(&mut crate::reshard::current::lock().job, given_up);
                dirty::end();
                crate::reshard::current::lock().job.finish();
                finish(runner);
                *slot = None;
                return None;
            }
            count_given_up(&mut crate::reshard::current::lock().job, given_up);
            return Some(POLL_INTERVAL);
        }
        // The keys written meanwhile, kept through a pass that walks for lost destinations.
        let mut kept = None;
        let (source, only, walking, replace) = match redo {
            // Walk again for the destinations a failover lost, by the copy's own rule.
            Some(only) => match dirty::take() {
                Some(keys) => {
                    kept = Some(keys);
                    (whole(runner), Some(only), false, runner.options.replace)
                }
                // Too many keys written to keep: a walk for every destination.
                None => (whole(runner), None, false, runner.options.replace),
            },
            None => {
                let source = if runner.scan_over {
                    match dirty::take() {
                        Some(keys) => Source::Keys(keys),
                        None => whole(runner),
                    }
                } else {
                    whole(runner)
                };
                let walking = matches!(source, Source::Scan | Source::Index);
                (source, None, walking, runner.replace_now)
            }
        };
        let walked = match (&source, &only) {
            (Source::Keys(_), _) => None,
            (_, Some(only)) => Some(only.clone()),
            (_, None) => Some(vec![true; targets.len()]),
        };
        let (max_rate, paused) = {
            let st = crate::reshard::current::lock();
            (st.job.max_rate, st.job.paused)
        };
        // Big keys a pass in steps left travel in pieces from a forked pass.
        let big = std::mem::take(&mut runner.big);
        let (source, fork_for_big) = match source {
            Source::Keys(mut keys) if !big.is_empty() => {
                keys.extend(big);
                keys.sort_by_key(|(db, _)| *db);
                (Source::Keys(keys), true)
            }
            // (A walk finds them again.)
            other => (other, false),
        };
        let by_steps = !fork_for_big && Mode::now().by_steps(&source);
        let mut pass = Pass {
            list: if walking { runner.list.clone() } else { None },
            leaving: runner.options.leaving.clone(),
            ring: Arc::clone(&runner.ring),
            self_name: runner.self_name.clone(),
            source,
            replace,
            timeout: Duration::from_millis(runner.options.timeout_ms),
            auth: runner.options.auth.clone(),
            max_rate,
            paused,
            big: runner.options.big,
            targets,
            only,
        };
        dirty::begin(&runner.ring, &runner.self_name);
        if let Some(keys) = kept {
            dirty::restore(keys);
        }
        forget_child_outcome();
        let started = if by_steps {
            copy_steps::start(ctx, &mut pass).map(|steps| runner.steps = Some(steps))
        } else {
            copy_child::start(ctx, &pass, on_child_done).map(|pid| runner.child = Some(pid))
        };
        match started {
            Ok(()) => {
                {
                    let mut st = crate::reshard::current::lock();
                    if by_steps {
                        st.job.passes_stepped += 1;
                    } else {
                        st.job.passes_forked += 1;
                    }
                }
                runner.walking = walking;
                runner.scan_over = true;
                runner.replace_now = false;
                runner.pass_targets = pass.targets;
                runner.pass_walked = walked;
            }
            Err(why) => {
                // Redis runs one child at a time: try again shortly, keeping the keys written.
                if let Source::Keys(keys) = pass.source {
                    dirty::restore(keys);
                }
                crate::reshard::current::lock().job.last_error = if by_steps {
                    format!("waiting to start a pass in steps: {why}")
                } else {
                    format!("waiting to fork: {why}")
                };
            }
        }
        Some(if by_steps { Duration::ZERO } else { POLL_INTERVAL })
    })
}

/// How long one step of a pass in steps may run before it yields back to the event loop.
const STEP_BUDGET: Duration = Duration::from_millis(1);

/// The running pass's end, once it ended: (broken, its error); else when to look again (a
/// step of a pass in steps runs here).
fn pass_outcome(
    ctx: &Context,
    runner: &mut Runner,
    shared: &Shared,
) -> Result<(bool, String), Duration> {
    if let Some(steps) = runner.steps.as_mut() {
        let (rate, paused) = {
            let st = crate::reshard::current::lock();
            (st.job.max_rate, st.job.paused)
        };
        let next = match steps.step(ctx, STEP_BUDGET, rate, paused) {
            Progress::More => Some(Duration::ZERO),
            Progress::Wait(next) => Some(next),
            Progress::Done => None,
        };
        if let Some(next) = next {
            runner.follow(shared);
            return Err(next);
        }
        let mut steps = runner.steps.take().ok_or(POLL_INTERVAL)?;
        runner.big.extend(steps.take_big());
        let broken = steps.broken.is_some() || shared.finished.load(Ordering::Acquire) != 1;
        let error = match steps.broken.take() {
            Some(why) => why,
            None if broken => "the copy's shipping thread ended before its pass was done".into(),
            None => shared.error(),
        };
        return Ok((broken, error));
    }
    let Some((code, signalled)) = child_outcome(runner) else {
        runner.follow(shared);
        return Err(POLL_INTERVAL);
    };
    runner.child = None;
    let broken = signalled || code != 0 || shared.finished.load(Ordering::Acquire) != 1;
    let mut error = shared.error();
    if broken && error.is_empty() {
        error = format!("the copy's child ended before its pass was done (exit code {code}, signal {signalled})");
    }
    Ok((broken, error))
}

/// A pass's end in the server log, with where it sent the keys: so that a key's travels can be
/// followed afterwards (issue 33's nemesis test).
fn note_pass(
    targets: &[crate::reshard::ship::Target],
    self_name: &str,
    counts: [u64; 5],
    error: &str,
) {
    let to: Vec<String> = targets
        .iter()
        .filter(|t| t.name != self_name)
        .map(|t| format!("{} at {}", t.name, t.address))
        .collect();
    let [scanned, copied, skipped, failed, _] = counts;
    redis_module::logging::log_notice(format!(
        "shard: copy pass ended: scanned {scanned}, copied {copied}, skipped {skipped}, failed {failed}; to {}{}",
        to.join(", "),
        if error.is_empty() { String::new() } else { format!(" ({error})") }
    ));
}

/// Counts the keys of the destinations given up on (no new primary within `GIVE_UP`) as
/// failed: they stay here, for a later COPY.
fn count_given_up(job: &mut crate::reshard::Job, given_up: Vec<(String, u64)>) {
    for (name, keys) in given_up {
        job.failed += keys;
        job.last_error = format!(
            "{name}: no new primary reached within {} s of losing it, {keys} of its keys failed (run COPY again): {}",
            crate::reshard::failover::GIVE_UP.as_secs(),
            job.last_error
        );
    }
}

impl Runner {
    /// Copies the running child's counts into the job, for STATUS and INFO.
    fn follow(&mut self, shared: &Shared) {
        let live = shared.counts();
        {
            let mut st = crate::reshard::current::lock();
            st.job.live = live;
            st.job.live_by_db = shared.copied_by_db();
            st.job.in_flight = match &self.steps {
                Some(steps) => steps.in_flight(),
                None => shared.in_flight.load(Ordering::Relaxed),
            };
        }
        self.update_rate();
    }
}

/// Keys in flight to the destinations now: while a copy's child runs, its own count read live
/// (the child marks a batch in flight before it looks at the pause, so a PAUSE followed by a
/// read of 0 means nothing more will be sent); else the last count followed.
pub fn in_flight_now(job: &crate::reshard::Job) -> u64 {
    // A pass in steps: what its thread has not had answered (counted live, so that a read
    // of 0 after a PAUSE means nothing more will be sent: the steps queue nothing while
    // paused).
    let in_steps = super::jobs::RUNNER.with(|r| {
        r.try_borrow().ok().and_then(|r| {
            r.as_ref()
                .and_then(|r| r.steps.as_ref().map(|s| s.in_flight()))
        })
    });
    if let Some(in_flight) = in_steps {
        return in_flight;
    }
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
