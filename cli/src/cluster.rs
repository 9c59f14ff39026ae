//! `check`'s cluster-protocol part: with `shard.cluster-protocol yes` on any node, whether every
//! node has it on and answers the same `CLUSTER SLOTS` map, which cluster clients route by (or,
//! when fewer nodes have it on than off, which few have it on). Apart from `check` for its
//! length; its findings carry their mends as the others do.

use crate::check::{redis_cli, run_on, Finding, Seen};
use crate::conn::{get, items, pairs, text, ConnOpts};

/// With the cluster protocol on (`shard.cluster-protocol yes` on any node), every node must
/// have it on and answer the same `CLUSTER SLOTS` map, which cluster clients route by. When
/// fewer nodes have it on than off, those are named instead (their mend turns it off: `fix`
/// does not turn on a protocol most of the fleet runs without).
pub fn cluster_map(opts: &ConnOpts, seen: &mut [Seen], out: &mut Vec<Finding>) {
    let mut on = Vec::new();
    for s in seen.iter_mut() {
        let reply = s.con.call(&["CONFIG", "GET", "shard.cluster-protocol"]);
        let value = reply.map(|v| text(&get(&pairs(&v), "shard.cluster-protocol")));
        on.push(value.unwrap_or_default() == "yes");
    }
    let count = on.iter().filter(|o| **o).count();
    if count == 0 {
        return;
    }
    // Fewer nodes with it on than off: those few are the odd ones, turned off by the mend.
    if count * 2 < on.len() {
        for (_, s) in seen.iter().enumerate().filter(|(i, _)| on[*i]) {
            out.push(Finding {
                check: "cluster",
                ok: false,
                detail: format!(
                    "{} has shard.cluster-protocol on, most nodes off: cluster clients that reach it find a fleet whose other nodes do not answer them",
                    s.node.name
                ),
                mend: format!(
                    "{} CONFIG SET shard.cluster-protocol no   # or yes on every other node",
                    redis_cli(opts, s.node.reach())
                ),
                action: run_on(&s.node, &["CONFIG", "SET", "shard.cluster-protocol", "no"]),
            });
        }
        return;
    }
    let mut maps: Vec<(usize, String)> = Vec::new();
    for (i, s) in seen.iter_mut().enumerate() {
        if !on[i] {
            out.push(Finding {
                check: "cluster",
                ok: false,
                detail: format!(
                    "{} has shard.cluster-protocol off, other nodes on: cluster clients that reach it get no map",
                    s.node.name
                ),
                mend: format!(
                    "{} CONFIG SET shard.cluster-protocol yes",
                    redis_cli(opts, s.node.reach())
                ),
                action: run_on(&s.node, &["CONFIG", "SET", "shard.cluster-protocol", "yes"]),
            });
            continue;
        }
        match s.con.call(&["CLUSTER", "SLOTS"]) {
            Ok(v) => maps.push((i, format!("{v:?}"))),
            Err(e) => out.push(Finding {
                check: "cluster",
                ok: false,
                detail: e,
                mend: String::new(),
                ..Default::default()
            }),
        }
    }
    let Some((first, map)) = maps.first().cloned() else {
        return;
    };
    let odd: Vec<usize> = maps
        .iter()
        .filter(|(_, m)| *m != map)
        .map(|(i, _)| *i)
        .collect();
    if odd.is_empty() {
        let ranges = match seen[first].con.call(&["CLUSTER", "SLOTS"]) {
            Ok(v) => items(&v).len(),
            Err(_) => 0,
        };
        out.push(Finding {
            check: "cluster",
            ok: true,
            detail: format!(
                "{} answers the same CLUSTER SLOTS map ({ranges} ranges)",
                if on.iter().all(|o| *o) {
                    "every node"
                } else {
                    "every node with it on"
                }
            ),
            mend: String::new(),
            ..Default::default()
        });
    }
    for i in odd {
        out.push(Finding {
            check: "cluster",
            ok: false,
            detail: format!(
                "{}'s CLUSTER SLOTS differs from {}'s",
                seen[i].node.name, seen[first].node.name
            ),
            mend: format!(
                "{} SHARD.RING PUSH   # the map follows the ring",
                redis_cli(opts, seen[first].node.reach())
            ),
            action: run_on(&seen[first].node, &["SHARD.RING", "PUSH"]),
        });
    }
}
