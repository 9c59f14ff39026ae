//! `shard-cli add-node`, `del-node` and `status`: a grow or a shrink started by
//! `SHARD.RESHARD START` on a node of the fleet (the coordinator), then followed with
//! `crate::follow`; `status` finds the coordinator of the fleet's operation again (after a
//! Ctrl-C, or from another terminal) and reattaches, or resumes one that stopped; without one,
//! it follows the copies and cleanups run by hand (`crate::jobs`).

use crate::conn::{get, int, pairs, text, ConnOpts, Node};
use crate::create::parse_node;
use crate::fleet::{Fleet, RingNode};
use crate::follow::follow;

/// The coordinator: the node of `--node` if it stays in the ring, else the first that stays.
fn coordinator<'a>(
    opts: &ConnOpts,
    fleet: &'a Fleet,
    leaving: Option<&str>,
) -> Result<&'a RingNode, String> {
    let stays = |n: &&RingNode| Some(n.name.as_str()) != leaving;
    fleet
        .ring
        .nodes
        .iter()
        .filter(stays)
        .find(|n| n.reach() == opts.node || n.address == opts.node)
        .or_else(|| fleet.ring.nodes.iter().find(stays))
        .ok_or_else(|| "no node would be left in the ring".to_string())
}

fn refuse_open(fleet: &Fleet) -> Result<(), String> {
    if fleet.ring.previous.is_some() {
        return Err("a resharding is open in the fleet: `shard-cli status` follows it".into());
    }
    Ok(())
}

fn start(
    opts: &ConnOpts,
    fleet: &Fleet,
    coord: &RingNode,
    nodes: &[RingNode],
    maxrate: Option<u64>,
) -> Result<Node, String> {
    let mut args = fleet.ring.args_with(nodes);
    if let Some(r) = maxrate {
        args.extend(["MAXRATE".to_string(), r.to_string()]);
    }
    let mut c = fleet.connect(opts, coord)?;
    let mut cmd = vec!["SHARD.RESHARD", "START"];
    cmd.extend(args.iter().map(String::as_str));
    c.call(&cmd)?;
    Ok(c)
}

/// `shard-cli add-node NAME=HOST:PORT [--weight w] [--maxrate n]`.
pub fn add(opts: &ConnOpts, arg: &str, weight: i64, maxrate: Option<u64>) -> Result<i32, String> {
    let fleet = Fleet::discover(opts)?;
    refuse_open(&fleet)?;
    let mut new = parse_node(arg, fleet.ring.nodes.len())?;
    new.weight = weight;
    if fleet.ring.node(&new.name).is_some() {
        return Err(format!("{} is already a node of the ring", new.name));
    }
    let mut joining = opts.connect(&new.name, &new.address)?;
    joining.call(&["CONFIG", "SET", "shard.self", &new.name])?;
    let mut nodes = fleet.ring.nodes.clone();
    nodes.push(new.clone());
    let coord = coordinator(opts, &fleet, None)?;
    println!(
        "Growing the fleet from {} to {} nodes: {} ({}) joins; {} coordinates.",
        fleet.ring.nodes.len(),
        nodes.len(),
        new.name,
        new.address,
        coord.name
    );
    let c = start(opts, &fleet, coord, &nodes, maxrate)?;
    follow(opts, c, coord, None)
}

/// `shard-cli del-node NAME [--maxrate n]`.
pub fn del(opts: &ConnOpts, name: &str, maxrate: Option<u64>) -> Result<i32, String> {
    let fleet = Fleet::discover(opts)?;
    refuse_open(&fleet)?;
    let leaving = fleet.ring.node(name).ok_or_else(|| {
        format!(
            "{name} is not a node of the ring ({})",
            fleet
                .ring
                .nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        )
    })?;
    let nodes: Vec<RingNode> = fleet
        .ring
        .nodes
        .iter()
        .filter(|n| n.name != name)
        .cloned()
        .collect();
    let coord = coordinator(opts, &fleet, Some(name))?;
    println!(
        "Shrinking the fleet from {} to {} nodes: {} ({}) leaves; {} coordinates.",
        fleet.ring.nodes.len(),
        nodes.len(),
        name,
        leaving.reach(),
        coord.name
    );
    let c = start(opts, &fleet, coord, &nodes, maxrate)?;
    follow(opts, c, coord, None)
}

/// `shard-cli status [--resume]`: the fleet's operation, followed to its end.
pub fn status(opts: &ConnOpts, resume: bool, json_out: bool) -> Result<i32, String> {
    let fleet = Fleet::discover(opts)?;
    // Each node's plan: its phase, whether it is driven, its term.
    let mut plans = Vec::new();
    for n in &fleet.nodes {
        let Ok(mut c) = fleet.connect(opts, n) else {
            continue;
        };
        let Ok(st) = c.call(&["SHARD.RESHARD", "STATUS"]) else {
            continue;
        };
        let st = pairs(&st);
        let f = pairs(&get(&st, "fleet"));
        if f.is_empty() {
            continue;
        }
        let phase = text(&get(&f, "phase"));
        let over = phase == "done" || phase == "cancelled";
        plans.push((
            over,
            int(&get(&st, "term")).max(int(&get(&f, "term"))),
            n.clone(),
            c,
            phase,
            text(&get(&f, "running")) == "yes",
        ));
    }
    // An unfinished plan first, then the newest term.
    plans.sort_by_key(|p| (p.0, -p.1));
    if json_out {
        let plan = match plans.first_mut() {
            Some(p) => plan_json(&p.2, &mut p.3)?,
            None => serde_json::Value::Null,
        };
        let jobs: Vec<_> = crate::jobs::running(opts, &fleet)
            .iter()
            .map(|j| serde_json::json!({"node": j.node.name, "job": j.kind, "paused": j.paused, "percent": j.percent}))
            .collect();
        let out = serde_json::json!({"resharding_open": fleet.ring.previous.is_some(), "operation": plan, "jobs": jobs});
        println!("{out:#}");
        return Ok(0);
    }
    let open = plans.first().is_some_and(|p| !p.0);
    if !open {
        // No fleet operation runs: a copy or cleanup run by hand may.
        if let Some(code) = crate::jobs::status(opts, &fleet, resume)? {
            return Ok(code);
        }
    }
    let Some((over, _, node, mut c, phase, running)) = plans.into_iter().next() else {
        if fleet.ring.previous.is_some() && resume {
            // RESUME on a node without the plan adopts the operation whose rings the fleet holds.
            let node = coordinator(opts, &fleet, None)?;
            let mut c = fleet.connect(opts, node)?;
            c.call(&["SHARD.RESHARD", "RESUME"])?;
            println!(
                "{} adopted the open resharding (SHARD.RESHARD RESUME).",
                node.name
            );
            return follow(opts, c, node, None);
        }
        if fleet.ring.previous.is_some() {
            println!("A resharding is open but no node holds its plan: SHARD.RESHARD RESUME on any node adopts it (`shard-cli status --resume`).");
            return Ok(1);
        }
        println!(
            "No fleet operation: the fleet holds ring {} ({} nodes).",
            fleet.ring.digest,
            fleet.ring.nodes.len()
        );
        return Ok(0);
    };
    if over {
        println!(
            "No fleet operation open; the last one, coordinated by {}, ended {phase}.",
            node.name
        );
        return Ok(0);
    }
    if !running {
        if !resume {
            let f = pairs(&get(
                &pairs(&c.call(&["SHARD.RESHARD", "STATUS"])?),
                "fleet",
            ));
            println!(
                "The operation coordinated by {} stopped in phase {phase}: {}",
                node.name,
                text(&get(&f, "error"))
            );
            println!(
                "`shard-cli status --resume` resumes it (SHARD.RESHARD RESUME on {}).",
                node.name
            );
            return Ok(1);
        }
        c.call(&["SHARD.RESHARD", "RESUME"])?;
        println!("Resumed the operation on {} (phase {phase}).", node.name);
    }
    println!(
        "Reattached to the operation coordinated by {} ({}), phase {phase}.",
        node.name,
        node.reach()
    );
    follow(opts, c, &node, None)
}

/// The coordinator's plan (`SHARD.RESHARD STATUS`'s `fleet`) as JSON: its fields as text, and
/// `nodes` as a map of each node's fields.
fn plan_json(node: &RingNode, c: &mut Node) -> Result<serde_json::Value, String> {
    let f = pairs(&get(
        &pairs(&c.call(&["SHARD.RESHARD", "STATUS"])?),
        "fleet",
    ));
    let mut out = serde_json::Map::new();
    out.insert("coordinator".into(), node.name.clone().into());
    out.insert("coordinator_address".into(), node.reach().into());
    for (k, v) in &f {
        let value = if k == "nodes" {
            let nodes = pairs(v).into_iter().map(|(name, fields)| {
                let fields: serde_json::Map<String, serde_json::Value> = pairs(&fields)
                    .iter()
                    .map(|(k, v)| (k.clone(), scalar(k, v)))
                    .collect();
                (name, serde_json::Value::Object(fields))
            });
            serde_json::Value::Object(nodes.collect())
        } else {
            scalar(k, v)
        };
        out.insert(k.clone(), value);
    }
    Ok(serde_json::Value::Object(out))
}

/// The plan's counters as JSON numbers (sent as integers or as text), anything else as text.
fn scalar(field: &str, v: &redis::Value) -> serde_json::Value {
    const NUMBERS: [&str; 4] = ["copied", "percent", "attempts", "term"];
    match (v, text(v).parse::<i64>()) {
        (redis::Value::Int(i), _) => (*i).into(),
        (_, Ok(i)) if NUMBERS.contains(&field) => i.into(),
        (other, _) => text(other).into(),
    }
}
