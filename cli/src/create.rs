//! `shard-cli create`: a ring over the servers given, pushed to every one of them. Each server
//! is told its name (`shard.self`, which fleet operations need) and gets the same ring by
//! `SHARD.RING SET`; the digests are then compared. Servers that already hold keys or a ring
//! are refused (`--force` takes them as they are), as `redis-cli --cluster create` refuses
//! non-empty nodes.

use crate::conn::{int, split_addr, ConnOpts};
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

/// `shard-cli create [--algo a] [--force] NODE...`.
pub fn run(opts: &ConnOpts, algo: &str, force: bool, args: &[String]) -> Result<i32, String> {
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
    let ring = Ring {
        algo: algo.to_string(),
        hashtag: String::new(),
        epoch: 0,
        digest: String::new(),
        nodes: nodes.clone(),
        previous: None,
    };
    let args = ring.args_with(&nodes);
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
    println!("Creating a {algo} ring of {} nodes:", nodes.len());
    let mut digests = Vec::new();
    for (n, c) in nodes.iter().zip(cons.iter_mut()) {
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
    Ok(0)
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
