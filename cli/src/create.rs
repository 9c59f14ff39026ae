//! `shard-cli create`: a ring over the servers given, pushed to every one of them. Each server
//! is told its name (`shard.self`, which fleet operations need) and gets the same ring by
//! `SHARD.RING SET`; the digests are then compared. Servers that already hold keys or a ring
//! are refused (`--force` takes them as they are), as `redis-cli --cluster create` refuses
//! non-empty nodes. Replicas and Sentinel are named as the module takes them
//! (docs/failover.md): a replica (`--replica NAME=HOST:PORT`) carries its primary's name in
//! `shard.self`, follows it (`REPLICAOF`) and gets the ring by replication; with sentinels
//! (`--sentinel HOST:PORT`) every node is written `sentinel` in the ring (its name is Sentinel's
//! master name), every server gets `shard.sentinels`, and each address given is checked
//! against the one Sentinel gives first (`crate::sentinel`).

use crate::conn::{get, int, pairs, split_addr, text, ConnOpts};
use crate::fleet::{ring_of, Ring, RingNode};

/// `NAME=HOST:PORT` or `HOST:PORT` (named `n<i>`).
pub fn parse_node(arg: &str, i: usize) -> Result<RingNode, String> {
    let (name, address) = match arg.split_once('=') {
        Some((n, a)) => (n.to_string(), a.to_string()),
        None => (format!("n{i}"), arg.to_string()),
    };
    if name.is_empty() || name.contains(char::is_whitespace) || name.contains('#') {
        return Err(format!(
            "bad node name '{name}' in '{arg}': no spaces or '#'"
        ));
    }
    split_addr(&address)?;
    Ok(RingNode {
        name,
        resolved: address.clone(),
        address,
        weight: 1,
    })
}

/// What `create` is asked for besides the nodes: replicas and sentinels.
pub struct Extra<'a> {
    pub replicas: &'a [String],
    pub sentinels: &'a [String],
    pub sentinel_user: Option<&'a str>,
    pub sentinel_password: Option<&'a str>,
}

/// `shard-cli create [--algo a] [--force] [--replica NAME=HOST:PORT ...] [--sentinel HOST:PORT
/// ...] NODE...`.
pub fn run(
    opts: &ConnOpts,
    algo: &str,
    force: bool,
    args: &[String],
    extra: &Extra,
) -> Result<i32, String> {
    let nodes = args
        .iter()
        .enumerate()
        .map(|(i, a)| parse_node(a, i))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, n) in nodes.iter().enumerate() {
        if nodes[..i].iter().any(|m| m.name == n.name) {
            return Err(format!("node name '{}' is given twice", n.name));
        }
    }
    let mut replicas = Vec::new();
    for r in extra.replicas {
        let (name, address) = r
            .split_once('=')
            .ok_or_else(|| format!("--replica takes NAME=HOST:PORT, got '{r}'"))?;
        if !nodes.iter().any(|n| n.name == name) {
            return Err(format!(
                "--replica {r}: {name} is not one of the nodes given"
            ));
        }
        split_addr(address)?;
        replicas.push((name.to_string(), address.to_string()));
    }
    let sentinels = extra.sentinels.join(" ");
    let ring_nodes: Vec<RingNode> = if sentinels.is_empty() {
        nodes.clone()
    } else {
        crate::sentinel::check_masters(opts, extra, &nodes)?;
        nodes
            .iter()
            .map(|n| RingNode {
                address: "sentinel".to_string(),
                ..n.clone()
            })
            .collect()
    };
    let ring = Ring {
        algo: algo.to_string(),
        hashtag: String::new(),
        epoch: 0,
        digest: String::new(),
        nodes: ring_nodes.clone(),
        previous: None,
    };
    let args = ring.args_with(&ring_nodes);
    // Sentinel's settings, on every server (primaries and replicas) before the ring.
    let mut sentinel_config = Vec::new();
    if !sentinels.is_empty() {
        sentinel_config.push(("shard.sentinels", sentinels.clone()));
        if let Some(u) = extra.sentinel_user {
            sentinel_config.push(("shard.sentinel-user", u.to_string()));
        }
        if let Some(p) = extra.sentinel_password {
            sentinel_config.push(("shard.sentinel-password", p.to_string()));
        }
    }
    let mut cons = Vec::new();
    for n in &nodes {
        let mut c = opts.connect(&n.name, &n.address)?;
        let keys = int(&c.call(&["DBSIZE"])?);
        let held = ring_of(&mut c)?;
        if !force && keys > 0 {
            return Err(format!(
                "{} ({}) holds {keys} keys: empty it (FLUSHALL) or give --force",
                n.name, n.address
            ));
        }
        if !force {
            if let Some(r) = held {
                return Err(format!("{} ({}) already holds a ring ({} nodes, digest {}): give --force to replace it", n.name, n.address, r.nodes.len(), r.digest));
            }
        }
        cons.push(c);
    }
    let mut replica_cons = Vec::new();
    for (name, address) in &replicas {
        let mut c = opts.connect(&format!("{name}'s replica"), address)?;
        if !force && int(&c.call(&["DBSIZE"])?) > 0 {
            return Err(format!(
                "{name}'s replica ({address}) holds keys: empty it (FLUSHALL) or give --force"
            ));
        }
        replica_cons.push(c);
    }
    println!(
        "Creating a {algo} ring of {} nodes{}:",
        nodes.len(),
        if sentinels.is_empty() {
            String::new()
        } else {
            format!(", their addresses from Sentinel ({sentinels})")
        }
    );
    let mut digests = Vec::new();
    for (n, c) in nodes.iter().zip(cons.iter_mut()) {
        for (k, v) in &sentinel_config {
            c.call(&["CONFIG", "SET", k, v])?;
        }
        c.call(&["CONFIG", "SET", "shard.self", &n.name])?;
        let mut cmd = vec!["SHARD.RING", "SET"];
        cmd.extend(args.iter().map(String::as_str));
        c.call(&cmd)?;
        let r = ring_of(c)?.ok_or_else(|| format!("{}: no ring after SHARD.RING SET", n.name))?;
        println!(
            "  {} {} (shard.self {}): ring set",
            n.name, n.address, n.name
        );
        digests.push(r.digest);
    }
    digests.dedup();
    if digests.len() != 1 {
        return Err(format!(
            "the nodes hold different rings after SET: {}",
            digests.join(" ")
        ));
    }
    println!(
        "Every node holds ring {} ({} nodes).",
        digests[0],
        nodes.len()
    );
    for ((name, address), c) in replicas.iter().zip(replica_cons.iter_mut()) {
        let primary = nodes
            .iter()
            .find(|n| &n.name == name)
            .ok_or_else(|| format!("{name} is not one of the nodes given"))?;
        let (host, port) = split_addr(&primary.resolved)?;
        for (k, v) in &sentinel_config {
            c.call(&["CONFIG", "SET", k, v])?;
        }
        c.call(&["CONFIG", "SET", "shard.self", name])?;
        c.call(&["REPLICAOF", &host, &port.to_string()])?;
        let digest = wait_synced(c, &digests[0])?;
        println!(
            "  {name}'s replica {address} (shard.self {name}): replicaof {host} {port}, in sync, ring {digest}"
        );
    }
    if !sentinels.is_empty() {
        let mut servers: Vec<(String, String)> = nodes
            .iter()
            .map(|n| (n.name.clone(), n.resolved.clone()))
            .collect();
        servers.extend(
            replicas
                .iter()
                .map(|(n, a)| (format!("{n}'s replica"), a.clone())),
        );
        crate::sentinel::wait_resolved(opts, &servers)?;
        println!("Every server resolves every ring node's address through Sentinel.");
    }
    Ok(0)
}

/// Waits (up to 30 s) until a replica's link is up and it holds the ring `digest` (which comes
/// by replication); its digest.
fn wait_synced(c: &mut crate::conn::Node, digest: &str) -> Result<String, String> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let up = c
            .info("replication")?
            .get("master_link_status")
            .is_some_and(|s| s == "up");
        let held = match c.call(&["SHARD.RING", "GET"]) {
            Ok(v) => text(&get(&pairs(&v), "digest")),
            Err(_) => String::new(),
        };
        if up && held == digest {
            return Ok(held);
        }
        if std::time::Instant::now() > until {
            return Err(format!(
                "{}: not in sync with its primary after 30 s (link {}, ring '{held}'): see its log",
                c.label,
                if up { "up" } else { "down" }
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_named_by_position_or_as_given() {
        let n = parse_node("127.0.0.1:7000", 2).unwrap();
        assert_eq!(
            (n.name.as_str(), n.address.as_str()),
            ("n2", "127.0.0.1:7000")
        );
        let n = parse_node("cache=10.0.0.1:6379", 0).unwrap();
        assert_eq!(
            (n.name.as_str(), n.address.as_str()),
            ("cache", "10.0.0.1:6379")
        );
        assert!(parse_node("a#b=10.0.0.1:6379", 0).is_err());
        assert!(parse_node("x=10.0.0.1", 0).is_err());
    }
}
