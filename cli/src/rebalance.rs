//! `shard-cli rebalance`: the same nodes, new weights (all 1 by default: an even split; `--weight
//! NAME=W` for others, as `redis-cli --cluster rebalance --cluster-weight` takes them), moved to
//! by `SHARD.RESHARD START` and followed like a grow. Before it starts (and alone with
//! `--dry-run`) it prints the plan: each node's weight, its share of the keyspace now (`SHARD.RING
//! CHECK`'s `share`) and after, and the keys it gains or loses. On a `slots` ring the shares
//! after are exact: START goes to the map that moves the fewest slots, where every node keeps
//! its slots up to its target, the contiguous split of the new weights (computed here as the
//! module computes it); on a hashed ring they are the weight shares, which the ring's points
//! approach. The keys are estimates from each node's key count, as the keys are spread evenly.

use crate::conn::{get, int, pairs, text, ConnOpts};
use crate::fleet::{Fleet, RingNode};
use crate::follow::follow;

const SLOTS: usize = 16384;

/// Each node's slot count in the contiguous split of `weights` (as the module's
/// `ring::slots::contiguous` rounds it: single-precision shares, the last node to the end).
pub fn slot_targets(weights: &[i64]) -> Vec<i64> {
    let total = weights.iter().sum::<i64>() as f32;
    let (mut first, mut cursor) = (0i64, 0f32);
    let mut out = Vec::new();
    for (i, w) in weights.iter().enumerate() {
        let share = (SLOTS as f32 * *w as f32) / total;
        let mut last = f64::from(cursor + share - 1.0).round() as i64;
        if last > SLOTS as i64 - 1 || i == weights.len() - 1 {
            last = SLOTS as i64 - 1;
        }
        last = last.max(first);
        out.push(last - first + 1);
        first = last + 1;
        cursor += share;
    }
    out
}

/// `NAME=W` pairs applied to the ring's nodes: every node weight 1 unless given.
fn new_weights(nodes: &[RingNode], given: &[String]) -> Result<Vec<RingNode>, String> {
    let mut out: Vec<RingNode> = nodes
        .iter()
        .map(|n| RingNode {
            weight: 1,
            ..n.clone()
        })
        .collect();
    for g in given {
        let (name, w) = g
            .split_once('=')
            .ok_or_else(|| format!("--weight takes NAME=WEIGHT, got '{g}'"))?;
        let w: i64 = w
            .parse()
            .ok()
            .filter(|w| (1..=1000).contains(w))
            .ok_or_else(|| format!("--weight {g}: the weight must be an integer from 1 to 1000"))?;
        let node = out.iter_mut().find(|n| n.name == name).ok_or_else(|| {
            format!(
                "--weight {g}: {name} is not a node of the ring ({})",
                nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        })?;
        node.weight = w;
    }
    Ok(out)
}

/// One node's line of the plan.
struct Row {
    name: String,
    old_weight: i64,
    weight: i64,
    share: f64,
    after: f64,
    keys: i64,
    delta: i64,
}

/// The plan: per node, its share now and after, and the keys it gains (+) or loses (-).
fn plan(opts: &ConnOpts, fleet: &Fleet, nodes: &[RingNode]) -> Result<Vec<Row>, String> {
    let mut seed = opts.connect(&opts.node, &opts.node)?;
    let check = pairs(&seed.call(&["SHARD.RING", "CHECK"])?);
    let per = pairs(&get(&check, "nodes"));
    let total_w: i64 = nodes.iter().map(|n| n.weight).sum();
    let slots = fleet.ring.algo == "slots";
    let targets = slot_targets(&nodes.iter().map(|n| n.weight).collect::<Vec<_>>());
    let mut rows = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let m = pairs(&get(&per, &n.name));
        let share = text(&get(&m, "share")).parse::<f64>().unwrap_or(0.0);
        let keys = int(&get(&m, "keys"));
        let after = if slots {
            targets[i] as f64 / SLOTS as f64
        } else {
            n.weight as f64 / total_w.max(1) as f64
        };
        let old_weight = fleet.ring.node(&n.name).map_or(0, |o| o.weight);
        rows.push(Row {
            name: n.name.clone(),
            old_weight,
            weight: n.weight,
            share,
            after,
            keys,
            delta: 0,
        });
    }
    let total: i64 = rows.iter().map(|r| r.keys).sum();
    for r in &mut rows {
        r.delta = if r.after < r.share {
            // It loses the part of its keys its share shrinks by.
            -((r.keys as f64) * (r.share - r.after) / r.share.max(f64::EPSILON)).round() as i64
        } else {
            ((total as f64) * (r.after - r.share)).round() as i64
        };
    }
    Ok(rows)
}

fn print_plan(fleet: &Fleet, rows: &[Row]) {
    let slots = fleet.ring.algo == "slots";
    let unit = |share: f64| {
        if slots {
            format!("{} slots", (share * SLOTS as f64).round() as i64)
        } else {
            format!("{:.1}%", share * 100.0)
        }
    };
    println!(
        "  {:<8} {:>8} {:>14} {:>14} {:>10} {:>10}",
        "node", "weight", "now", "after", "keys", "moving"
    );
    for r in rows {
        println!(
            "  {:<8} {:>8} {:>14} {:>14} {:>10} {:>+10}",
            r.name,
            format!("{}->{}", r.old_weight, r.weight),
            unit(r.share),
            unit(r.after),
            r.keys,
            r.delta
        );
    }
}

/// `shard-cli rebalance [--weight NAME=W ...] [--dry-run] [--maxrate n]`.
pub fn run(
    opts: &ConnOpts,
    weights: &[String],
    dry_run: bool,
    json_out: bool,
    maxrate: Option<u64>,
) -> Result<i32, String> {
    if json_out && !dry_run {
        return Err(
            "--json goes with --dry-run: a rebalance that runs is followed, as a grow".into(),
        );
    }
    let fleet = Fleet::discover(opts)?;
    if fleet.ring.previous.is_some() {
        return Err("a resharding is open in the fleet: `shard-cli status` follows it".into());
    }
    let nodes = new_weights(&fleet.ring.nodes, weights)?;
    let rows = plan(opts, &fleet, &nodes)?;
    let moving: i64 = rows.iter().map(|r| r.delta.max(0)).sum();
    let total: i64 = rows.iter().map(|r| r.keys).sum();
    let what = if fleet.ring.algo == "slots" {
        "slots"
    } else {
        "shares"
    };
    let weights_text = nodes
        .iter()
        .map(|n| format!("{}={}", n.name, n.weight))
        .collect::<Vec<_>>()
        .join(" ");
    let unchanged = if fleet.ring.algo == "slots" {
        rows.iter()
            .all(|r| (r.share * SLOTS as f64).round() == (r.after * SLOTS as f64).round())
            && rows.iter().all(|r| r.old_weight == r.weight)
    } else {
        rows.iter().all(|r| r.old_weight == r.weight)
    };
    if json_out {
        let slots = fleet.ring.algo == "slots";
        let per: Vec<_> = rows
            .iter()
            .map(|r| {
                let mut m = serde_json::json!({
                    "name": r.name, "weight_before": r.old_weight, "weight": r.weight,
                    "share": r.share, "share_after": r.after, "keys": r.keys, "keys_moving": r.delta,
                });
                if slots {
                    m["slots"] = ((r.share * SLOTS as f64).round() as i64).into();
                    m["slots_after"] = ((r.after * SLOTS as f64).round() as i64).into();
                }
                m
            })
            .collect();
        let out = serde_json::json!({
            "algo": fleet.ring.algo, "balanced": unchanged, "nodes": per,
            "keys_moving": if unchanged { 0 } else { moving }, "keys_total": total,
        });
        println!("{out:#}");
        return Ok(0);
    }
    if unchanged {
        println!(
            "The fleet is balanced already: the {} ring has weights {weights_text}{}.",
            fleet.ring.algo,
            if fleet.ring.algo == "slots" {
                ", and every node holds its slots of them"
            } else {
                ""
            }
        );
        return Ok(0);
    }
    println!(
        "Rebalancing the {} ring of {} nodes to weights {weights_text} ({what} after: {}):",
        fleet.ring.algo,
        nodes.len(),
        if fleet.ring.algo == "slots" {
            "the map that moves the fewest slots"
        } else {
            "the weight shares, which the ring's points approach"
        }
    );
    print_plan(&fleet, &rows);
    println!("About {moving} of {total} keys move.");
    if dry_run {
        println!("Dry run: nothing moved. Without --dry-run, SHARD.RESHARD START moves them.");
        return Ok(0);
    }
    let coord = fleet
        .ring
        .nodes
        .iter()
        .find(|n| n.reach() == opts.node || n.address == opts.node)
        .or_else(|| fleet.ring.nodes.first())
        .ok_or("the ring has no node")?;
    let mut args = fleet.ring.args_with(&nodes);
    if let Some(r) = maxrate {
        args.extend(["MAXRATE".to_string(), r.to_string()]);
    }
    let mut c = fleet.connect(opts, coord)?;
    let mut cmd = vec!["SHARD.RESHARD", "START"];
    cmd.extend(args.iter().map(String::as_str));
    match c.call(&cmd) {
        Err(e) if e.contains("on this ring already") => {
            println!("The fleet is on this ring already: nothing to move.");
            return Ok(0);
        }
        other => other?,
    };
    println!("{} coordinates.", coord.name);
    follow(opts, c, coord, Some(moving))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_targets_split_as_the_module_does() {
        // redis-cli's and the module's even split of 3: 5461, 5462, 5461.
        assert_eq!(slot_targets(&[1, 1, 1]), vec![5461, 5462, 5461]);
        assert_eq!(slot_targets(&[1, 1, 1, 1]), vec![4096; 4]);
        assert_eq!(slot_targets(&[1, 3]), vec![4096, 12288]);
        assert_eq!(slot_targets(&[2, 1, 1]).iter().sum::<i64>(), 16384);
    }

    #[test]
    fn weights_are_checked_and_say_what_is_wrong() {
        let n = |name: &str, w| RingNode {
            name: name.into(),
            address: "127.0.0.1:1".into(),
            resolved: String::new(),
            weight: w,
        };
        let ring = [n("a", 3), n("b", 1)];
        let even = new_weights(&ring, &[]).unwrap();
        assert_eq!(even.iter().map(|n| n.weight).collect::<Vec<_>>(), [1, 1]);
        let got = new_weights(&ring, &["b=5".into()]).unwrap();
        assert_eq!(got.iter().map(|n| n.weight).collect::<Vec<_>>(), [1, 5]);
        assert!(new_weights(&ring, &["c=2".into()])
            .unwrap_err()
            .contains("c is not a node of the ring (a b)"));
        assert!(new_weights(&ring, &["a=0".into()])
            .unwrap_err()
            .contains("from 1 to 1000"));
        assert!(new_weights(&ring, &["a".into()])
            .unwrap_err()
            .contains("NAME=WEIGHT"));
    }
}
