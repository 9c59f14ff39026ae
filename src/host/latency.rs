//! The module's main-thread steps, reported to the server's latency monitor (`LATENCY LATEST`,
//! `LATENCY HISTORY <event>`) under an event name per kind of step (`shard-copy-step`,
//! `shard-index-build`, ...), so that a step that held the server shows by name beside the
//! server's own events (`command`, `fork`, ...).
//!
//! What it costs: while the monitor is off (`latency-monitor-threshold 0`, the default) an
//! atomic load per step; while it is on, a clock read at the start and at the end of each step,
//! and a call into the server only for a step at or over the threshold; a job's step
//! (`step_with_cpu`) also reads the thread's CPU clock at both ends and its context switches
//! (`getrusage`, a system call) at the start. No allocation but a logged line's.
//!
//! On a machine shared with other processes a step can wait for the CPU in the middle: its wall
//! time is then longer than its work. The steps of the jobs (`step_with_cpu`) also read the
//! thread's CPU time while the monitor is on, and a step that used at least the threshold of CPU
//! is reported a second time under its `...-cpu` event: a step with a wall event and no `-cpu`
//! event waited for the CPU (another process ran), one with both worked that long.
//!
//! Such a step (one of the jobs' at or over the threshold) is also logged at the `verbose` level
//! with where its wall time went: its CPU time, how often the kernel preempted the thread
//! (`ru_nivcsw`: another process took the CPU) and how often it slept within the step
//! (`ru_nvcsw`: a lock, a blocking call). `bench/stall.py` reads these lines. At most
//! `MAX_EXPLAINED` a second.
//!
//! The threshold is kept here: read at load and again after each `CONFIG SET` of it
//! (`events::on_config_change`). The server's `RedisModule_LatencyAddSample` compares with the
//! threshold but not with 0, so without this check every step would be recorded while the
//! monitor is off.

use std::cell::Cell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redis_module::raw;

/// The server's `latency-monitor-threshold` in ms (0: the monitor is off).
static THRESHOLD_MS: AtomicU64 = AtomicU64::new(0);

/// The setting's name, as `CONFIG SET` reports it.
pub(crate) const SETTING: &[u8] = b"latency-monitor-threshold";

/// Reads the server's threshold again (at load, after a `CONFIG SET` of it). Main thread only.
pub fn refresh_threshold() {
    let text = crate::host::context::server_config("latency-monitor-threshold");
    THRESHOLD_MS.store(text.trim().parse().unwrap_or(0), Ordering::Relaxed);
}

/// The threshold in force (0: off).
pub fn threshold_ms() -> u64 {
    THRESHOLD_MS.load(Ordering::Relaxed)
}

/// Whether a step of `ms` milliseconds is reported under threshold `threshold` (0: never).
pub fn over(ms: u64, threshold: u64) -> bool {
    threshold > 0 && ms >= threshold
}

/// One main-thread step being timed: reported under its event when dropped (or `end`ed) if it
/// took at least the threshold. Main thread only.
#[must_use = "a step is timed until it is dropped"]
pub struct Step {
    event: &'static CStr,
    started: Option<Instant>,
    /// For `step_with_cpu`: the `-cpu` event and the thread's CPU time (ns) and context
    /// switches at the start.
    cpu: Option<(&'static CStr, u64, Switches)>,
}

/// The calling thread's context switches so far: (slept, preempted).
type Switches = (i64, i64);

/// Over-threshold steps logged a second, at most.
const MAX_EXPLAINED: u32 = 10;

thread_local! {
    /// (The second, steps logged in it.)
    static EXPLAINED: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
}

/// Starts timing a step of kind `event` (a name of the form `shard-...`).
#[inline]
pub fn step(event: &'static CStr) -> Step {
    let started = (threshold_ms() > 0).then(Instant::now);
    Step {
        event,
        started,
        cpu: None,
    }
}

/// As `step`, and the thread's CPU time too (reported under `cpu_event`): for the steps of the
/// jobs, a few hundred a second, not for what runs per key or per command.
#[inline]
pub fn step_with_cpu(event: &'static CStr, cpu_event: &'static CStr) -> Step {
    let mut step = step(event);
    if step.started.is_some() {
        step.cpu = Some((cpu_event, thread_cpu_ns(), switches()));
    }
    step
}

/// The calling thread's context switches so far (zeros if they cannot be read).
fn switches() -> Switches {
    // SAFETY: `rusage` is plain data, valid zeroed; RUSAGE_THREAD fills the calling thread's.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid rusage to write.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return (0, 0);
    }
    (ru.ru_nvcsw, ru.ru_nivcsw)
}

/// The calling thread's CPU time in ns (0 if it cannot be read).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

impl Step {
    /// Ends the step now (as dropping it does).
    pub fn end(self) {}
}

impl Drop for Step {
    #[inline]
    fn drop(&mut self) {
        let Some(started) = self.started else {
            return;
        };
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let threshold = threshold_ms();
        if over(ms, threshold) {
            add_sample(self.event, ms);
        }
        if let Some((cpu_event, at, switched)) = self.cpu {
            let cpu_us = thread_cpu_ns().saturating_sub(at) / 1000;
            if over(cpu_us / 1000, threshold) {
                add_sample(cpu_event, cpu_us / 1000);
            }
            if over(ms, threshold) {
                explain(self.event, ms, cpu_us, switched);
            }
        }
    }
}

/// Logs where an over-threshold step's `ms` went (`cpu_us` on the CPU; `at_start`: the
/// thread's switches when it began), at most `MAX_EXPLAINED` a second.
#[cold]
fn explain(event: &'static CStr, ms: u64, cpu_us: u64, at_start: Switches) {
    let second = crate::clock::monotonic_ms() / 1000;
    let logged = EXPLAINED.with(|e| {
        let (at, n) = e.get();
        let n = if at == second { n + 1 } else { 1 };
        e.set((second, n));
        n
    });
    if logged > MAX_EXPLAINED {
        return;
    }
    let (slept, preempted) = switches();
    redis_module::logging::log_verbose(format!(
        "shard: step {} took {ms} ms: {}.{:03} ms on the CPU, preempted {} times, slept {} times",
        event.to_string_lossy(),
        cpu_us / 1000,
        cpu_us % 1000,
        preempted - at_start.1,
        slept - at_start.0,
    ));
}

/// Records `ms` under `event` in the server's latency monitor (a server without the call:
/// nothing).
#[cold]
fn add_sample(event: &'static CStr, ms: u64) {
    // SAFETY: an optional API pointer, checked for null; `event` is a NUL-terminated string
    // that lives for ever (the server copies it into its own table); main thread only, as the
    // latency monitor's table is the main thread's.
    unsafe {
        if let Some(add) = raw::RedisModule_LatencyAddSample {
            add(event.as_ptr(), i64::try_from(ms).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_threads_cpu_time_goes_forward() {
        let a = super::thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(super::thread_cpu_ns() > a);
    }

    use super::*;

    #[test]
    fn a_step_is_reported_at_or_over_the_threshold_and_never_while_it_is_off() {
        assert!(!over(100, 0));
        assert!(!over(4, 5));
        assert!(over(5, 5));
        assert!(over(6, 5));
    }

    #[test]
    fn a_step_while_the_monitor_is_off_reads_no_clock() {
        THRESHOLD_MS.store(0, Ordering::Relaxed);
        assert!(step(c"shard-test").started.is_none());
        let step = step_with_cpu(c"shard-test", c"shard-test-cpu");
        assert!(step.started.is_none() && step.cpu.is_none());
    }
}
