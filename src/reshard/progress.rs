//! The bookkeeping of a background copy or cleanup: state, counters, passes.

use std::fmt;

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    Copy,
    Cleanup,
}

/// Where a job stands (`SHARD.RESHARD STATUS`'s `state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JobState {
    /// No job has run, or the last one was stopped.
    #[default]
    Idle,
    Copying,
    Cleaning,
    /// The last job finished with nothing failed.
    Done,
    /// The last job finished and some keys failed (they stay here; run COPY again).
    Failed,
}

impl JobState {
    pub fn name(self) -> &'static str {
        match self {
            JobState::Idle => "idle",
            JobState::Copying => "copying",
            JobState::Cleaning => "cleaning",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }

    pub fn is_running(self) -> bool {
        matches!(self, JobState::Copying | JobState::Cleaning)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The result of handling one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Copied to its owner (or deleted, in a cleanup).
    Moved,
    /// Already at the destination: left alone there.
    Skipped,
    /// Stays here: this node owns it, or it vanished before it was handled.
    Kept,
    /// Could not be copied; the reason.
    Failed(String),
}

/// A job's state and counters; the same figures show in `INFO shard`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Job {
    pub state: JobState,
    pub kind: Option<JobKind>,
    pub scanned: u64,
    /// Keys copied (a copy) or deleted (a cleanup).
    pub moved: u64,
    pub skipped: u64,
    pub failed: u64,
    pub last_error: String,
    pub passes: u64,
    pub elapsed_ms: u64,
    /// The longest single step, in microseconds: how long the job held the server at once.
    pub max_step_us: u64,
    /// How the job found its keys: `walk` (the keyspace, in a child or in steps) or `list` (a
    /// cleanup that read what the copy on the same ring found, `moved`).
    pub keys_from: &'static str,
    /// Keys in the database when the job started.
    pub keys_total: u64,
    /// A copy's passes run in a forked child, and run in steps on the main thread
    /// (`shard.copy-fork`).
    pub passes_forked: u64,
    pub passes_stepped: u64,
    /// Bytes of `RESTORE` commands sent, and those not answered yet.
    pub bytes_sent: u64,
    pub in_flight: u64,
    /// Keys walked per second over the last seconds, and the time left at that pace.
    pub keys_per_sec: u64,
    pub eta_ms: u64,
    /// Keys per second the job may handle (0: no limit), and whether it is paused.
    pub max_rate: u64,
    pub paused: bool,
    /// The pass under way in a copy's child, as it last reported: (scanned, copied, skipped,
    /// failed, bytes sent), not yet in the totals above.
    pub live: [u64; 5],
    /// Keys moved (copied or deleted) by database number, finished passes; and those the
    /// copy's child under way reported.
    pub moved_by_db: Vec<u64>,
    pub live_by_db: Vec<u64>,
    /// Keys moved in the pass under way.
    pass_moved: u64,
    /// Set by STOP: the job ends after its current batch.
    stop_requested: bool,
    /// The term of the fleet step that started it (`TERM`, `ring::lease`); 0 for a job started
    /// by hand, and once its server has become a replica: a coordinator counts a job for its
    /// step only when it carries the step's term, never one of an older step, or one run on
    /// the data a server had before it was demoted (`reshard::fleet::checks::job_verdict`).
    pub term: u64,
    /// The digests of the rings it ran on, current and previous ("" when none), set with
    /// `term`: a coordinator counts a job for its step only when it ran on the rings of the
    /// step's phase (`reshard::fleet::checks::job_verdict`). A server promoted after the
    /// phase's rings reached its old primary but not it runs the job on the rings before them:
    /// a cancel's copy back, run on the copy phase's rings, copied nothing back and counted
    /// done, and the cleanup then deleted what the new owners had been written meanwhile (the
    /// nemesis test, issue 33, `NEMESIS_SEED=819126060` on Valkey).
    pub rings: (String, String),
}

/// A copy stops after this many passes even if clients keep writing keys it must copy (they
/// are then copied by the write path's copy-before-write, or by another COPY).
pub const MAX_PASSES: u64 = 32;

/// What the runner does after a pass over the keyspace ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterPass {
    Again,
    Finished,
}

impl Job {
    /// A new job of `kind`, replacing whatever finished before.
    pub fn start(kind: JobKind) -> Job {
        Job {
            state: match kind {
                JobKind::Copy => JobState::Copying,
                JobKind::Cleanup => JobState::Cleaning,
            },
            kind: Some(kind),
            passes: 1,
            keys_from: "walk",
            ..Job::default()
        }
    }

    pub fn record(&mut self, outcome: Outcome) {
        self.scanned += 1;
        match outcome {
            Outcome::Moved => {
                self.moved += 1;
                self.pass_moved += 1;
            }
            Outcome::Skipped => self.skipped += 1,
            Outcome::Kept => {}
            Outcome::Failed(reason) => {
                self.failed += 1;
                self.last_error = reason;
            }
        }
    }

    /// Records keys handled in bulk: `scanned` walked, `moved` copied or deleted, `skipped`.
    /// Counts keys moved in database `db`, besides the totals.
    pub fn record_db(&mut self, db: i32, moved: u64) {
        add_at(&mut self.moved_by_db, db, moved);
    }

    /// Keys moved by database as text, `db0=750,db3=12` (databases with none left out).
    pub fn by_db_text(&self) -> String {
        self.by_db()
            .iter()
            .map(|(db, n)| format!("db{db}={n}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Keys moved by database: (database, keys), those with none left out.
    pub fn by_db(&self) -> Vec<(usize, u64)> {
        let len = self.moved_by_db.len().max(self.live_by_db.len());
        (0..len)
            .map(|db| {
                let at = |v: &Vec<u64>| v.get(db).copied().unwrap_or(0);
                (db, at(&self.moved_by_db) + at(&self.live_by_db))
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    pub fn record_many(&mut self, scanned: u64, moved: u64, skipped: u64) {
        self.scanned += scanned;
        self.moved += moved;
        self.pass_moved += moved;
        self.skipped += skipped;
    }

    /// Ends a pass. A copy repeats until a pass copies nothing (keys written meanwhile are
    /// picked up); a cleanup needs one pass.
    pub fn end_pass(&mut self) -> AfterPass {
        let again = self.kind == Some(JobKind::Copy) && self.pass_moved > 0;
        self.pass_moved = 0;
        if again && !self.stop_requested {
            self.passes += 1;
            AfterPass::Again
        } else {
            self.finish();
            AfterPass::Finished
        }
    }

    /// Adds a finished pass of a copy's child: `counts` are (scanned, copied, skipped, failed,
    /// bytes sent); `error` its last error, if any.
    pub fn add_pass(&mut self, counts: [u64; 5], by_db: &[u64], error: &str) {
        let [scanned, copied, skipped, failed, bytes] = counts;
        self.live = [0; 5];
        self.live_by_db.clear();
        for (db, n) in by_db.iter().enumerate() {
            add_at(&mut self.moved_by_db, i32::try_from(db).unwrap_or(0), *n);
        }
        self.scanned += scanned;
        self.moved += copied;
        self.pass_moved += copied;
        self.skipped += skipped;
        self.failed += failed;
        self.bytes_sent += bytes;
        self.in_flight = 0;
        if !error.is_empty() {
            self.last_error = error.to_string();
        }
    }

    /// Ends a pass of a copy's child: another pass runs while keys were written here during
    /// this one (`written`: how many; `None`, too many to count), up to `MAX_PASSES`.
    pub fn end_fork_pass(&mut self, written: Option<usize>) -> AfterPass {
        self.pass_moved = 0;
        if written != Some(0) && !self.stop_requested && self.passes < MAX_PASSES {
            self.passes += 1;
            AfterPass::Again
        } else {
            self.finish();
            AfterPass::Finished
        }
    }

    /// Ends a pass of a copy's child while a destination lost to a failover is waited for:
    /// the job goes on, whatever was written (its keys are sent again once it is followed).
    pub fn hold_for_failover(&mut self) {
        self.pass_moved = 0;
        self.passes += 1;
    }

    /// How far the job is, 0 to 100: keys walked over the keys there were at the start.
    pub fn percent(&self) -> u64 {
        match self.state {
            JobState::Done | JobState::Failed => 100,
            _ if self.keys_total == 0 => 0,
            _ => (self.scanned().saturating_mul(100) / self.keys_total).min(99),
        }
    }

    /// Keys walked, the pass under way included.
    pub fn scanned(&self) -> u64 {
        self.scanned + self.live[0]
    }

    pub fn skipped(&self) -> u64 {
        self.skipped + self.live[2]
    }

    pub fn failed(&self) -> u64 {
        self.failed + self.live[3]
    }

    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent + self.live[4]
    }

    /// Keys copied, when the job is a copy.
    pub fn copied(&self) -> u64 {
        if self.kind == Some(JobKind::Copy) {
            self.moved + self.live[1]
        } else {
            0
        }
    }

    /// Keys deleted, when the job is a cleanup.
    pub fn deleted(&self) -> u64 {
        if self.kind == Some(JobKind::Cleanup) {
            self.moved
        } else {
            0
        }
    }

    /// Records how long one step held the server.
    pub fn record_step(&mut self, micros: u64) {
        self.max_step_us = self.max_step_us.max(micros);
    }

    /// Asks the job to stop after its current batch.
    pub fn request_stop(&mut self) {
        self.stop_requested = true;
    }

    pub fn stop_requested(&self) -> bool {
        self.stop_requested
    }

    /// Ends the job: stopped jobs go back to idle, finished ones report done or failed.
    pub fn finish(&mut self) {
        self.state = if self.stop_requested {
            JobState::Idle
        } else if self.failed > 0 {
            JobState::Failed
        } else {
            JobState::Done
        };
    }
}

/// Adds `n` at index `db`, growing `counts` as needed.
fn add_at(counts: &mut Vec<u64>, db: i32, n: u64) {
    let db = usize::try_from(db).unwrap_or(0);
    if counts.len() <= db {
        counts.resize(db + 1, 0);
    }
    counts[db] += n;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_repeats_until_a_pass_copies_nothing() {
        let mut job = Job::start(JobKind::Copy);
        assert_eq!(job.state, JobState::Copying);
        job.record(Outcome::Moved);
        job.record(Outcome::Kept);
        assert_eq!(job.end_pass(), AfterPass::Again);
        job.record(Outcome::Skipped);
        assert_eq!(job.end_pass(), AfterPass::Finished);
        assert_eq!(
            (job.state, job.scanned, job.moved, job.skipped, job.passes),
            (JobState::Done, 3, 1, 1, 2)
        );
    }

    #[test]
    fn failures_end_in_failed_with_the_last_error() {
        let mut job = Job::start(JobKind::Copy);
        job.record(Outcome::Failed("IOERR a".into()));
        job.record(Outcome::Failed("IOERR b".into()));
        assert_eq!(job.end_pass(), AfterPass::Finished);
        assert_eq!(
            (job.state, job.failed, job.last_error.as_str()),
            (JobState::Failed, 2, "IOERR b")
        );
    }

    #[test]
    fn a_forked_copy_runs_again_while_keys_were_written_during_a_pass() {
        let mut job = Job::start(JobKind::Copy);
        job.keys_total = 10;
        job.add_pass([10, 6, 1, 0, 600], &[4, 0, 0, 2], "");
        assert_eq!(job.percent(), 99);
        assert_eq!(job.end_fork_pass(Some(2)), AfterPass::Again);
        job.add_pass([2, 1, 0, 1, 100], &[1], "d (h:1): OOM");
        assert_eq!(job.end_fork_pass(None), AfterPass::Again);
        job.add_pass([0, 0, 0, 0, 0], &[], "");
        assert_eq!(job.by_db(), vec![(0, 5), (3, 2)]);
        assert_eq!(job.end_fork_pass(Some(0)), AfterPass::Finished);
        assert_eq!(
            (
                job.state,
                job.moved,
                job.skipped,
                job.failed,
                job.bytes_sent,
                job.passes
            ),
            (JobState::Failed, 7, 1, 1, 700, 3)
        );
        assert_eq!(
            (job.last_error.as_str(), job.percent()),
            ("d (h:1): OOM", 100)
        );
        let mut busy = Job::start(JobKind::Copy);
        for _ in 0..MAX_PASSES + 5 {
            if busy.end_fork_pass(Some(1)) == AfterPass::Finished {
                break;
            }
        }
        assert_eq!((busy.passes, busy.state), (MAX_PASSES, JobState::Done));
    }

    #[test]
    fn stop_and_cleanup() {
        let mut job = Job::start(JobKind::Copy);
        job.record(Outcome::Moved);
        job.request_stop();
        assert_eq!(job.end_pass(), AfterPass::Finished);
        assert_eq!(job.state, JobState::Idle);
        let mut clean = Job::start(JobKind::Cleanup);
        assert!(clean.state.is_running());
        clean.record(Outcome::Moved);
        assert_eq!(clean.end_pass(), AfterPass::Finished);
        assert_eq!(clean.state, JobState::Done);
    }
}
