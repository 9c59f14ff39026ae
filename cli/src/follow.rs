//! Following a fleet operation to its end: the coordinator's `SHARD.RESHARD STATUS` polled five
//! times a second and drawn as a progress bar of keys sent over the keys that move (the
//! leaving nodes' keys, and the joining nodes' weight share of the rest, estimated when the
//! following begins), keys per second and the time left; a line a second instead when stdout
//! is not a terminal. A source's keys sent are its job's `copied` plus `in_flight` (sent, not
//! yet acknowledged): `copied` alone moves only when a job ends. Ctrl-C stops the following
//! only: the operation goes on in the fleet, and `shard-cli status` reattaches. At the end, a
//! summary.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::conn::{get, int, pairs, text, ConnOpts, Node};
use crate::fleet::{ring_of, RingNode};

/// One node as the coordinator reports it, with a connection of our own to it.
struct Part {
    name: String,
    role: String,
    sent: i64,
    con: Option<Node>,
}

/// One look at the operation.
struct Look {
    phase: String,
    running: bool,
    error: String,
    old_digest: String,
    new_digest: String,
    sent: i64,
}

fn look(c: &mut Node, parts: &mut Vec<Part>, opts: &ConnOpts) -> Result<Look, String> {
    let st = pairs(&c.call(&["SHARD.RESHARD", "STATUS"])?);
    let f = pairs(&get(&st, "fleet"));
    if f.is_empty() {
        return Err(format!("{} coordinates no fleet operation", c.label));
    }
    let mut l = Look {
        phase: text(&get(&f, "phase")),
        running: text(&get(&f, "running")) == "yes",
        error: text(&get(&f, "error")),
        old_digest: text(&get(&f, "old_digest")),
        new_digest: text(&get(&f, "new_digest")),
        sent: 0,
    };
    for (name, v) in pairs(&get(&f, "nodes")) {
        let n = pairs(&v);
        if !parts.iter().any(|p| p.name == name) {
            let con = opts.connect(&name, &text(&get(&n, "address"))).ok();
            let role = text(&get(&n, "role"));
            parts.push(Part {
                name: name.clone(),
                role,
                sent: 0,
                con,
            });
        }
        let Some(p) = parts.iter_mut().find(|p| p.name == name) else {
            continue;
        };
        let mut sent = int(&get(&n, "copied"));
        if text(&get(&n, "state")).starts_with("copying") {
            if let Some(Ok(own)) = p.con.as_mut().map(|c| c.call(&["SHARD.RESHARD", "STATUS"])) {
                let own = pairs(&own);
                sent = sent.max(int(&get(&own, "copied")) + int(&get(&own, "in_flight")));
            }
        }
        p.sent = p.sent.max(sent);
        l.sent += p.sent;
    }
    Ok(l)
}

/// The keys the operation moves: the leaving nodes' keys, and the joining nodes' weight share
/// of the keys of the nodes that were there (each of those holds its keys until the cleanup).
fn estimate(c: &mut Node, parts: &mut [Part], new_digest: &str) -> i64 {
    let keys = |p: &mut Part| {
        p.con
            .as_mut()
            .and_then(|c| c.call(&["DBSIZE"]).ok())
            .map_or(0, |v| int(&v))
    };
    let mut had = 0;
    let mut leaving = 0;
    for p in parts.iter_mut().filter(|p| p.role != "new") {
        let k = keys(p);
        had += k;
        if p.role == "old" {
            leaving += k;
        }
    }
    let Ok(Some(ring)) = ring_of(c) else {
        return leaving;
    };
    let new = match &ring.previous {
        Some(prev) if prev.digest == new_digest => prev.as_ref().clone(),
        _ => ring,
    };
    let total_w: i64 = new.nodes.iter().map(|n| n.weight).sum();
    let joining_w: i64 = new
        .nodes
        .iter()
        .filter(|n| parts.iter().any(|p| p.name == n.name && p.role == "new"))
        .map(|n| n.weight)
        .sum();
    leaving + had.saturating_mul(joining_w) / total_w.max(1)
}

/// Follows the operation `c` (connected to the coordinator `coord`) coordinates; the exit status.
/// `expected`: the keys the operation moves, when the caller knows better than the estimate
/// (a rebalance, where no node joins or leaves).
pub fn follow(
    opts: &ConnOpts,
    mut c: Node,
    coord: &RingNode,
    expected: Option<i64>,
) -> Result<i32, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // Installed once per process; a second install (never made here) would only fail.
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    let tty = std::io::stdout().is_terminal();
    let began = Instant::now();
    let mut parts = Vec::new();
    let mut l = look(&mut c, &mut parts, opts)?;
    let guess = |c: &mut Node, parts: &mut Vec<Part>, new_digest: &str| {
        expected.unwrap_or_else(|| estimate(c, parts, new_digest))
    };
    let mut moving = guess(&mut c, &mut parts, &l.new_digest).max(l.sent).max(1);
    let bar = if tty {
        ProgressBar::new(moving as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:24} {pos}/{len} keys, {msg}",
        )
        .map_err(|e| e.to_string())?,
    );
    let first = l.sent;
    let mut last_line: Option<Instant> = None;
    loop {
        if stop.load(Ordering::SeqCst) {
            bar.abandon();
            println!("\nInterrupted: the operation goes on in the fleet (phase {}, coordinated by {} at {}).", l.phase, coord.name, coord.reach());
            println!("`shard-cli status` reattaches to it.");
            return Ok(130);
        }
        // Until the copy begins, the plan's nodes and rings may still be filling in.
        if matches!(l.phase.as_str(), "fence" | "begin") || moving <= 1 {
            moving = guess(&mut c, &mut parts, &l.new_digest).max(l.sent).max(1);
        }
        let copied_all = !matches!(
            l.phase.as_str(),
            "fence" | "begin" | "copy" | "cancel-stop" | "cancel-return"
        );
        let len = moving.max(l.sent);
        let pos = if copied_all { len } else { l.sent.min(len) };
        let secs = began.elapsed().as_secs_f64();
        let rate = if secs > 0.3 {
            ((l.sent - first) as f64 / secs) as i64
        } else {
            0
        };
        bar.set_length(len as u64);
        bar.set_position(pos as u64);
        let left = match (copied_all, rate) {
            (false, r) if r > 0 => format!("{} s left", (len - pos + r - 1) / r),
            _ => "-".to_string(),
        };
        bar.set_message(format!("{rate} keys/s, {left}, phase {}", l.phase));
        if !tty && last_line.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            println!(
                "progress: {:>3}% {pos}/{len} keys, {rate} keys/s, {left}, phase {}",
                pos * 100 / len.max(1),
                l.phase
            );
            last_line = Some(Instant::now());
        }
        if l.phase == "done" || l.phase == "cancelled" {
            bar.finish_and_clear();
            break;
        }
        if !l.running {
            bar.abandon();
            println!(
                "The coordinator {} stopped driving in phase {}: {}",
                coord.name, l.phase, l.error
            );
            println!("Once the cause is mended, `shard-cli status --resume` resumes it.");
            return Ok(1);
        }
        std::thread::sleep(Duration::from_millis(200));
        l = look(&mut c, &mut parts, opts).map_err(|e| {
            bar.abandon();
            format!("{e}\nLost the coordinator {}: the operation may go on without this tool; `shard-cli status` finds it (`--resume` once its coordinator is back)", coord.name)
        })?;
    }
    let took = began.elapsed().as_secs_f64();
    println!(
        "Operation {} after {took:.1} s followed here: {} keys copied.",
        l.phase, l.sent
    );
    println!("Ring {} -> {}", l.old_digest, l.new_digest);
    for p in &mut parts {
        let what = match p.role.as_str() {
            "new" => "joined",
            "old" => "left",
            _ => "stayed",
        };
        let keys = p
            .con
            .as_mut()
            .and_then(|c| c.call(&["DBSIZE"]).ok())
            .map_or("?".to_string(), |v| int(&v).to_string());
        println!(
            "  {:<8} {what:<7} sent {:>8} keys, holds {keys:>8} keys",
            p.name, p.sent
        );
    }
    Ok(if l.phase == "done" { 0 } else { 1 })
}
