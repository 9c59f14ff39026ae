//! `shard-cli info`: the fleet at a glance, one row per node: keys (DBSIZE), memory, operations
//! per second, its share of the ring (`SHARD.RING CHECK`'s `share`), its role and replicas with
//! their lag, the key index and the transactions in doubt (`INFO shard`). A table for humans,
//! `--json` for scripts; the same figures either way.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use serde_json::{json, Value as Json};

use crate::conn::{get, pairs, text, ConnOpts, Node};
use crate::fleet::Fleet;

/// A replica as its primary's `INFO replication` lists it.
pub struct Replica {
    pub address: String,
    pub state: String,
    pub lag_s: i64,
    pub lag_bytes: i64,
}

/// What `info` shows of one node; `error` when it did not answer.
pub struct NodeInfo {
    pub name: String,
    pub address: String,
    pub error: Option<String>,
    pub role: String,
    pub keys: i64,
    pub memory: i64,
    pub memory_human: String,
    pub ops_per_sec: i64,
    pub share: Option<f64>,
    pub replicas: Vec<Replica>,
    pub key_index: String,
    pub key_index_keys: i64,
    pub txn_in_doubt: i64,
    pub fleet_phase: String,
}

fn num(m: &std::collections::BTreeMap<String, String>, k: &str) -> i64 {
    m.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The replicas a primary's `INFO replication` lists (`slaveN:ip=..,port=..,state=..,offset=..,lag=..`).
pub fn replicas(m: &std::collections::BTreeMap<String, String>) -> Vec<Replica> {
    let master_offset = num(m, "master_repl_offset");
    let mut out = Vec::new();
    for i in 0..num(m, "connected_slaves") {
        let Some(line) = m.get(&format!("slave{i}")) else {
            continue;
        };
        let f = |k: &str| {
            line.split(',')
                .filter_map(|p| p.split_once('='))
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
                .unwrap_or_default()
        };
        out.push(Replica {
            address: format!("{}:{}", f("ip"), f("port")),
            state: f("state"),
            lag_s: f("lag").parse().unwrap_or(0),
            lag_bytes: (master_offset - f("offset").parse::<i64>().unwrap_or(0)).max(0),
        });
    }
    out
}

/// One node's figures.
pub fn node_info(node: &mut Node) -> Result<NodeInfo, String> {
    let keys = crate::conn::int(&node.call(&["DBSIZE"])?);
    let m = node.info("memory stats replication shard")?;
    Ok(NodeInfo {
        name: node.label.clone(),
        address: String::new(),
        error: None,
        role: m.get("role").cloned().unwrap_or_default(),
        keys,
        memory: num(&m, "used_memory"),
        memory_human: m.get("used_memory_human").cloned().unwrap_or_default(),
        ops_per_sec: num(&m, "instantaneous_ops_per_sec"),
        share: None,
        replicas: replicas(&m),
        key_index: m.get("shard_key_index").cloned().unwrap_or_default(),
        key_index_keys: num(&m, "shard_key_index_keys"),
        txn_in_doubt: num(&m, "shard_txn_in_doubt"),
        fleet_phase: m.get("shard_fleet_phase").cloned().unwrap_or_default(),
    })
}

/// Every node's figures, in the ring's order (unreachable nodes carry their error).
pub fn gather(opts: &ConnOpts, fleet: &Fleet) -> Vec<NodeInfo> {
    // Each node's share of the keyspace, as the module computes it for its ring.
    let mut shares = Vec::new();
    if let Ok(mut seed) = opts.connect(&opts.node, &opts.node) {
        if let Ok(check) = seed.call(&["SHARD.RING", "CHECK"]) {
            for (name, v) in pairs(&get(&pairs(&check), "nodes")) {
                let share = text(&get(&pairs(&v), "share")).parse::<f64>().ok();
                shares.push((name, share));
            }
        }
    }
    fleet
        .nodes
        .iter()
        .map(|n| {
            let got = fleet.connect(opts, n).and_then(|mut c| node_info(&mut c));
            let mut info = got.unwrap_or_else(|e| NodeInfo {
                name: n.name.clone(),
                address: String::new(),
                error: Some(e),
                role: String::new(),
                keys: 0,
                memory: 0,
                memory_human: String::new(),
                ops_per_sec: 0,
                share: None,
                replicas: Vec::new(),
                key_index: String::new(),
                key_index_keys: 0,
                txn_in_doubt: 0,
                fleet_phase: String::new(),
            });
            info.address = n.reach().to_string();
            info.share = shares
                .iter()
                .find(|(name, _)| *name == n.name)
                .and_then(|(_, s)| *s);
            info
        })
        .collect()
}

fn replicas_text(r: &[Replica]) -> String {
    if r.is_empty() {
        return "none".to_string();
    }
    r.iter()
        .map(|r| {
            format!(
                "{} {} lag {} s {} B",
                r.address, r.state, r.lag_s, r.lag_bytes
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn to_json(nodes: &[NodeInfo]) -> Json {
    Json::Array(
        nodes
            .iter()
            .map(|n| {
                json!({
                    "name": n.name, "address": n.address, "error": n.error,
                    "role": n.role, "keys": n.keys, "used_memory": n.memory,
                    "ops_per_sec": n.ops_per_sec, "share": n.share,
                    "replicas": n.replicas.iter().map(|r| json!({
                        "address": r.address, "state": r.state,
                        "lag_s": r.lag_s, "lag_bytes": r.lag_bytes})).collect::<Vec<_>>(),
                    "key_index": n.key_index, "key_index_keys": n.key_index_keys,
                    "txn_in_doubt": n.txn_in_doubt, "fleet_phase": n.fleet_phase,
                })
            })
            .collect(),
    )
}

pub fn table(fleet: &Fleet, nodes: &[NodeInfo]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "node",
        "address",
        "role",
        "keys",
        "memory",
        "ops/s",
        "share",
        "replicas",
        "key index",
        "txn in doubt",
    ]);
    for n in nodes {
        if let Some(e) = &n.error {
            t.add_row([
                n.name.as_str(),
                n.address.as_str(),
                "unreachable",
                e.as_str(),
            ]);
            continue;
        }
        let index = match n.key_index.as_str() {
            "ready" => format!("ready ({} keys)", n.key_index_keys),
            other => other.to_string(),
        };
        t.add_row([
            n.name.clone(),
            n.address.clone(),
            n.role.clone(),
            n.keys.to_string(),
            n.memory_human.clone(),
            n.ops_per_sec.to_string(),
            n.share
                .map_or("-".to_string(), |s| format!("{:.1}%", s * 100.0)),
            replicas_text(&n.replicas),
            index,
            n.txn_in_doubt.to_string(),
        ]);
    }
    let total: i64 = nodes.iter().map(|n| n.keys).sum();
    format!(
        "ring {} ({} nodes, epoch {}, digest {})\n{t}\n{total} keys in all\n",
        fleet.ring.algo,
        fleet.ring.nodes.len(),
        fleet.ring.epoch,
        fleet.ring.digest
    )
}

/// `shard-cli info [--json]`.
pub fn run(opts: &ConnOpts, json_out: bool) -> Result<i32, String> {
    let fleet = Fleet::discover(opts)?;
    let nodes = gather(opts, &fleet);
    if json_out {
        let out = json!({
            "ring": {"algo": fleet.ring.algo, "epoch": fleet.ring.epoch,
                     "digest": fleet.ring.digest, "resharding": fleet.ring.previous.is_some()},
            "nodes": to_json(&nodes),
        });
        println!("{out:#}");
    } else {
        print!("{}", table(&fleet, &nodes));
    }
    Ok(if nodes.iter().any(|n| n.error.is_some()) {
        1
    } else {
        0
    })
}
