//! The fleet as the module describes it: `SHARD.RING GET` on the node given, its nodes' names,
//! ring addresses and the addresses in use (Sentinel's for a `sentinel` node), and the ring's
//! arguments as `SHARD.RING SET` and `SHARD.RESHARD START` take them. The ring's own logic
//! (points, digests, slot maps) stays in the module: the tool compares the digests the nodes
//! reply and lets START compute the new ring.

use redis::Value;

use crate::conn::{get, int, items, pairs, text, ConnOpts, Node};

/// One node of a ring.
#[derive(Clone, Debug)]
pub struct RingNode {
    pub name: String,
    /// The address in the ring (`sentinel` for a node Sentinel resolves).
    pub address: String,
    /// The address in use: Sentinel's for a `sentinel` node, empty while it is unknown.
    pub resolved: String,
    pub weight: i64,
}

impl RingNode {
    /// The address to connect to.
    pub fn reach(&self) -> &str {
        if self.resolved.is_empty() {
            &self.address
        } else {
            &self.resolved
        }
    }
}

/// A ring as `SHARD.RING GET` replies it.
#[derive(Clone, Debug)]
pub struct Ring {
    pub algo: String,
    pub hashtag: String,
    pub epoch: i64,
    pub digest: String,
    pub nodes: Vec<RingNode>,
    /// The previous ring while a resharding is open.
    pub previous: Option<Box<Ring>>,
}

fn parse_ring(v: &Value) -> Ring {
    let m = pairs(v);
    let nodes = items(&get(&m, "nodes"))
        .iter()
        .map(|n| {
            let n = pairs(n);
            RingNode {
                name: text(&get(&n, "name")),
                address: text(&get(&n, "address")),
                resolved: text(&get(&n, "resolved")),
                weight: int(&get(&n, "weight")),
            }
        })
        .collect();
    let previous = match get(&m, "previous") {
        Value::Nil => None,
        p => Some(Box::new(parse_ring(&p))),
    };
    Ring {
        algo: text(&get(&m, "algo")),
        hashtag: text(&get(&m, "hashtag")),
        epoch: int(&get(&m, "epoch")),
        digest: text(&get(&m, "digest")),
        nodes,
        previous,
    }
}

/// `SHARD.RING GET` on a node: its ring, or None when it holds none.
pub fn ring_of(node: &mut Node) -> Result<Option<Ring>, String> {
    match node.call(&["SHARD.RING", "GET"]) {
        Ok(v) => Ok(Some(parse_ring(&v))),
        Err(e) if e.contains("NORING") => Ok(None),
        Err(e) => Err(e),
    }
}

impl Ring {
    /// The arguments of `SHARD.RING SET` / `SHARD.RESHARD START` for this ring's algo and
    /// hash tag with `nodes` (weights alone: START computes a `slots` ring's map).
    pub fn args_with(&self, nodes: &[RingNode]) -> Vec<String> {
        let mut args = vec![self.algo.clone()];
        if !self.hashtag.is_empty() {
            args.extend(["HASHTAG".to_string(), self.hashtag.clone()]);
        }
        for n in nodes {
            args.extend([n.name.clone(), n.address.clone(), n.weight.to_string()]);
        }
        args
    }

    pub fn node(&self, name: &str) -> Option<&RingNode> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

/// The fleet found from one node: its ring, and every node of it (and of the previous ring
/// while a resharding is open).
pub struct Fleet {
    pub ring: Ring,
    pub nodes: Vec<RingNode>,
}

impl Fleet {
    /// Asks the node of `--node` for its ring.
    pub fn discover(opts: &ConnOpts) -> Result<Fleet, String> {
        let mut seed = opts.connect(&opts.node, &opts.node)?;
        let ring = ring_of(&mut seed)?.ok_or_else(|| {
            format!(
                "the node at {} holds no ring: make one with `shard-cli create HOST:PORT ...`",
                opts.node
            )
        })?;
        let mut nodes = ring.nodes.clone();
        if let Some(prev) = &ring.previous {
            for n in &prev.nodes {
                if !nodes.iter().any(|m| m.name == n.name) {
                    nodes.push(n.clone());
                }
            }
        }
        Ok(Fleet { ring, nodes })
    }

    /// A connection to the node called `name`.
    pub fn connect(&self, opts: &ConnOpts, node: &RingNode) -> Result<Node, String> {
        opts.connect(&node.name, node.reach())
    }
}
