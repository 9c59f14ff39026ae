//! `shard-cli top`: the fleet's figures refreshed in place, as `redis-cli --stat` refreshes a
//! server's: every `--interval` seconds the ring is read again (a grow changes it) and every
//! node's row redrawn, with the keys gained or lost since the last refresh. On a terminal the
//! screen is redrawn; when stdout is not a terminal, or with `--once`, each refresh is printed
//! below the last, so a script or a log reads them; `--json` prints one JSON object a line per
//! refresh (for monitoring). `--count N` stops after N refreshes; Ctrl-C stops it (exit 0).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::json;

use crate::conn::ConnOpts;
use crate::fleet::Fleet;
use crate::info::{gather, to_json, NodeInfo};

fn row(n: &NodeInfo, before: Option<i64>) -> Vec<String> {
    if let Some(e) = &n.error {
        return vec![
            n.name.clone(),
            n.address.clone(),
            "unreachable".into(),
            e.clone(),
        ];
    }
    let delta = before.map_or("-".to_string(), |b| format!("{:+}", n.keys - b));
    let replicas = if n.replicas.is_empty() {
        "0".to_string()
    } else {
        let lag = n.replicas.iter().map(|r| r.lag_s).max().unwrap_or(0);
        let bytes = n.replicas.iter().map(|r| r.lag_bytes).max().unwrap_or(0);
        let online = n.replicas.iter().filter(|r| r.state == "online").count();
        format!(
            "{}/{} online, lag {lag} s {bytes} B",
            online,
            n.replicas.len()
        )
    };
    vec![
        n.name.clone(),
        n.address.clone(),
        n.role.clone(),
        n.keys.to_string(),
        delta,
        n.memory_human.clone(),
        n.ops_per_sec.to_string(),
        n.share
            .map_or("-".to_string(), |s| format!("{:.1}%", s * 100.0)),
        replicas,
        n.key_index.clone(),
        n.txn_in_doubt.to_string(),
        n.fleet_phase.clone(),
    ]
}

/// The table; `every`: the refresh's period, said on a terminal redrawn in place.
fn screen(
    fleet: &Fleet,
    nodes: &[NodeInfo],
    before: &BTreeMap<String, i64>,
    every: Option<f64>,
) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "node",
        "address",
        "role",
        "keys",
        "+/-",
        "memory",
        "ops/s",
        "share",
        "replicas",
        "key index",
        "txn in doubt",
        "fleet",
    ]);
    for n in nodes {
        t.add_row(row(n, before.get(&n.name).copied()));
    }
    let keys: i64 = nodes.iter().map(|n| n.keys).sum();
    let ops: i64 = nodes.iter().map(|n| n.ops_per_sec).sum();
    format!(
        "ring {} ({} nodes, epoch {}{}){}\n{t}\n{keys} keys, {ops} ops/s in all\n",
        fleet.ring.algo,
        fleet.ring.nodes.len(),
        fleet.ring.epoch,
        if fleet.ring.previous.is_some() {
            ", resharding"
        } else {
            ""
        },
        every.map_or(String::new(), |e| format!(", every {e} s, Ctrl-C quits"))
    )
}

/// `shard-cli top [--interval S] [--count N] [--once] [--json]`.
pub fn run(
    opts: &ConnOpts,
    interval: f64,
    count: Option<u64>,
    once: bool,
    json_out: bool,
) -> Result<i32, String> {
    if !(interval.is_finite() && interval >= 0.1) {
        return Err(format!(
            "--interval must be at least 0.1 seconds, got {interval}"
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    let redraw = std::io::stdout().is_terminal() && !once && !json_out;
    let count = if once { Some(1) } else { count };
    let mut before: BTreeMap<String, i64> = BTreeMap::new();
    let mut shown = 0u64;
    loop {
        let fleet = Fleet::discover(opts)?;
        let nodes = gather(opts, &fleet);
        let mut out = std::io::stdout().lock();
        let written = if json_out {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let line = json!({
                "time": now,
                "ring": {"algo": fleet.ring.algo, "epoch": fleet.ring.epoch,
                         "digest": fleet.ring.digest, "resharding": fleet.ring.previous.is_some()},
                "nodes": to_json(&nodes),
            });
            writeln!(out, "{line}")
        } else if redraw {
            // Home, clear the screen, then the table: refreshed in place.
            write!(
                out,
                "\x1b[H\x1b[2J{}",
                screen(&fleet, &nodes, &before, Some(interval))
            )
        } else {
            writeln!(out, "{}", screen(&fleet, &nodes, &before, None))
        };
        written
            .and_then(|_| out.flush())
            .map_err(|e| format!("writing the output: {e}"))?;
        drop(out);
        before = nodes.iter().map(|n| (n.name.clone(), n.keys)).collect();
        shown += 1;
        if count.is_some_and(|c| shown >= c) {
            return Ok(0);
        }
        // Sleep in short steps, so that Ctrl-C ends at once.
        let until = std::time::Instant::now() + Duration::from_secs_f64(interval);
        while std::time::Instant::now() < until {
            if stop.load(Ordering::SeqCst) {
                return Ok(0);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
