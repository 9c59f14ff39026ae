//! The jobs a node runs on its own, outside a fleet operation: a `SHARD.RESHARD COPY` or
//! `CLEANUP` run by hand (or by `shard-cli fix`). `status` finds them (each node's own
//! `SHARD.RESHARD STATUS`: `state` copying or cleaning, `paused`), resumes a paused one with
//! `--resume`, and follows them as a fleet operation is followed: a bar (a line a second when
//! stdout is not a terminal) of the keys walked over the keys there were (`scanned` of
//! `keys_total`), keys per second and the time left as the node reports them, a summary at the
//! end. Ctrl-C stops the following only.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::conn::{get, int, pairs, text, ConnOpts, Node};
use crate::fleet::{Fleet, RingNode};

/// A node's own job as its `SHARD.RESHARD STATUS` gives it.
pub struct Job {
    pub node: RingNode,
    pub con: Node,
    pub kind: String,
    pub paused: bool,
    pub percent: i64,
}

fn read(con: &mut Node) -> Result<Vec<(String, redis::Value)>, String> {
    Ok(pairs(&con.call(&["SHARD.RESHARD", "STATUS"])?))
}

/// The nodes of the fleet whose own job runs (or is paused) now.
pub fn running(opts: &ConnOpts, fleet: &Fleet) -> Vec<Job> {
    let mut out = Vec::new();
    for n in &fleet.nodes {
        let Ok(mut con) = fleet.connect(opts, n) else {
            continue;
        };
        let Ok(st) = read(&mut con) else {
            continue;
        };
        let state = text(&get(&st, "state"));
        if state == "copying" || state == "cleaning" {
            out.push(Job {
                node: n.clone(),
                con,
                kind: text(&get(&st, "job")),
                paused: text(&get(&st, "paused")) == "yes",
                percent: int(&get(&st, "percent")),
            });
        }
    }
    out
}

/// Follows `jobs` to their end; the exit status (0 when every one ended done).
pub fn follow(mut jobs: Vec<Job>) -> Result<i32, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    let tty = std::io::stdout().is_terminal();
    let bar = if tty {
        ProgressBar::new(1)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:24} {pos}/{len} keys walked, {msg}",
        )
        .map_err(|e| e.to_string())?,
    );
    let mut last_line: Option<Instant> = None;
    let mut last: Vec<Vec<(String, redis::Value)>>;
    loop {
        last = Vec::new();
        for j in &mut jobs {
            last.push(read(&mut j.con)?);
        }
        let sum = |f: &str| last.iter().map(|st| int(&get(st, f))).sum::<i64>();
        let (walked, total, rate) = (sum("scanned"), sum("keys_total"), sum("keys_per_sec"));
        let eta = last
            .iter()
            .map(|st| int(&get(st, "eta_ms")))
            .max()
            .unwrap_or(0);
        let over = last.iter().all(|st| {
            let s = text(&get(st, "state"));
            s != "copying" && s != "cleaning"
        });
        let what = jobs
            .iter()
            .map(|j| format!("{} on {}", j.kind, j.node.name))
            .collect::<Vec<_>>()
            .join(", ");
        let left = if over {
            "0 s left".to_string()
        } else if rate > 0 {
            format!("{} s left", (eta + 999) / 1000)
        } else {
            "-".to_string()
        };
        bar.set_length(total.max(1) as u64);
        bar.set_position(walked.min(total).max(0) as u64);
        bar.set_message(format!("{rate} keys/s, {left}, {what}"));
        if !tty && (over || last_line.is_none_or(|t| t.elapsed() >= Duration::from_secs(1))) {
            println!(
                "progress: {:>3}% {walked}/{total} keys walked, {rate} keys/s, {left}, {what}",
                walked * 100 / total.max(1)
            );
            last_line = Some(Instant::now());
        }
        if over {
            bar.finish_and_clear();
            break;
        }
        if stop.load(Ordering::SeqCst) {
            bar.abandon();
            println!(
                "\nInterrupted: the job goes on ({what}); `shard-cli status` reattaches to it."
            );
            return Ok(130);
        }
        if last.iter().all(|st| text(&get(st, "paused")) == "yes") {
            bar.abandon();
            println!("The job was paused ({what}): `shard-cli status --resume` resumes it.");
            return Ok(1);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut code = 0;
    for (j, st) in jobs.iter().zip(&last) {
        let state = text(&get(st, "state"));
        let error = text(&get(st, "last_error"));
        if state != "done" {
            code = 1;
        }
        println!(
            "{} on {} ended {state} after {:.1} s: {} keys walked, {} copied, {} deleted, {} failed{}",
            j.kind,
            j.node.name,
            int(&get(st, "elapsed_ms")) as f64 / 1000.0,
            int(&get(st, "scanned")),
            int(&get(st, "copied")),
            int(&get(st, "deleted")),
            int(&get(st, "failed")),
            if error.is_empty() {
                String::new()
            } else {
                format!(" ({error})")
            }
        );
    }
    Ok(code)
}

/// `status` without a fleet operation: the jobs run by hand, resumed when paused and asked to.
pub fn status(opts: &ConnOpts, fleet: &Fleet, resume: bool) -> Result<Option<i32>, String> {
    let mut jobs = running(opts, fleet);
    if jobs.is_empty() {
        return Ok(None);
    }
    let paused: Vec<&Job> = jobs.iter().filter(|j| j.paused).collect();
    if !paused.is_empty() && !resume {
        for j in &paused {
            println!(
                "A {} on {} ({}) is paused at {}%.",
                j.kind,
                j.node.name,
                j.node.reach(),
                j.percent
            );
        }
        println!("`shard-cli status --resume` resumes it (SHARD.RESHARD RESUME on the node).");
        return Ok(Some(1));
    }
    for j in &mut jobs {
        if j.paused {
            j.con.call(&["SHARD.RESHARD", "RESUME"])?;
            println!("Resumed the {} on {}.", j.kind, j.node.name);
        }
        println!(
            "Following the {} on {} ({}), run by hand: {}% walked.",
            j.kind,
            j.node.name,
            j.node.reach(),
            j.percent
        );
    }
    follow(jobs).map(Some)
}
