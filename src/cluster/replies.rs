//! A fleet of plain servers seen as a Redis Cluster: the replies of `CLUSTER SLOTS`, `SHARDS`,
//! `NODES`, `MYID` and `INFO` rendered from a `slots` ring, in the formats of Redis 7.0's cluster
//! mode, so that every cluster client library can route itself over the fleet.
//!
//! Node IDs are 40 hex digits derived from the ring node's name (its SHA-1), so every node of
//! the fleet reports the same map. During a resharding the map shows the current owners.
//! Pure: `commands::cluster` writes these values as replies.

use sha1::{Digest, Sha1};

use crate::net::resp::Resp;
use crate::ring::{NodeSpec, Ring};

/// A node as the cluster protocol shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewNode {
    pub id: String,
    pub name: String,
    pub host: String,
    pub port: u16,
    /// Inclusive slot ranges it owns.
    pub ranges: Vec<(u16, u16)>,
    pub is_self: bool,
}

/// The cluster as the nodes report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    pub nodes: Vec<ViewNode>,
    /// The ring's epoch, shown as the cluster's configuration epoch.
    pub epoch: u64,
}

/// The node ID of a ring node: the SHA-1 of its name, in hex.
pub fn node_id(name: &str) -> String {
    let digest = Sha1::digest(name.as_bytes());
    let mut out = String::with_capacity(40);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

impl ClusterView {
    /// The view of a `slots` ring; `None` for another algo.
    pub fn of(ring: &Ring, self_name: &str, epoch: u64) -> Option<ClusterView> {
        let ranges = ring.slot_ranges()?;
        let nodes = ring
            .spec()
            .nodes
            .iter()
            .zip(ranges)
            .map(|(n, r)| view_node(n, r.clone(), self_name))
            .collect();
        Some(ClusterView { nodes, epoch })
    }

    pub fn myself(&self) -> Option<&ViewNode> {
        self.nodes.iter().find(|n| n.is_self)
    }

    /// `CLUSTER SLOTS`: per range, its first and last slot and its master (ip, port, id, and
    /// the networking metadata map Redis 7.0 adds, empty here).
    pub fn slots(&self) -> Resp {
        let mut out = Vec::new();
        for n in &self.nodes {
            for &(first, last) in &n.ranges {
                out.push(Resp::Array(vec![
                    Resp::Int(i64::from(first)),
                    Resp::Int(i64::from(last)),
                    Resp::Array(vec![
                        Resp::Bulk(n.host.clone().into_bytes()),
                        Resp::Int(i64::from(n.port)),
                        Resp::Bulk(n.id.clone().into_bytes()),
                        Resp::Map(Vec::new()),
                    ]),
                ]));
            }
        }
        Resp::Array(out)
    }

    /// `CLUSTER SHARDS` (Redis 7.0): per shard its slots and its nodes.
    pub fn shards(&self) -> Resp {
        let text = |s: &str| Resp::Bulk(s.as_bytes().to_vec());
        Resp::Array(
            self.nodes
                .iter()
                .map(|n| {
                    let slots = n
                        .ranges
                        .iter()
                        .flat_map(|&(a, b)| [Resp::Int(i64::from(a)), Resp::Int(i64::from(b))])
                        .collect();
                    Resp::Map(vec![
                        (text("slots"), Resp::Array(slots)),
                        (
                            text("nodes"),
                            Resp::Array(vec![Resp::Map(vec![
                                (text("id"), text(&n.id)),
                                (text("port"), Resp::Int(i64::from(n.port))),
                                (text("ip"), text(&n.host)),
                                (text("endpoint"), text(&n.host)),
                                (text("role"), text("master")),
                                (text("replication-offset"), Resp::Int(0)),
                                (text("health"), text("online")),
                            ])]),
                        ),
                    ])
                })
                .collect(),
        )
    }

    /// `CLUSTER NODES`: one line per node, as cluster mode writes them (the bus port shown as
    /// the data port plus 10000; no bus runs).
    pub fn nodes_text(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let flags = if n.is_self { "myself,master" } else { "master" };
            out.push_str(&format!(
                "{} {}:{}@{} {} - 0 0 {} connected",
                n.id,
                n.host,
                n.port,
                u32::from(n.port) + 10000,
                flags,
                self.epoch
            ));
            for &(a, b) in &n.ranges {
                if a == b {
                    out.push_str(&format!(" {a}"));
                } else {
                    out.push_str(&format!(" {a}-{b}"));
                }
            }
            out.push('\n');
        }
        out
    }

    /// `CLUSTER INFO`.
    pub fn info_text(&self) -> String {
        let assigned: usize = self
            .nodes
            .iter()
            .flat_map(|n| n.ranges.iter())
            .map(|&(a, b)| usize::from(b) - usize::from(a) + 1)
            .sum();
        let state = if assigned == 16384 { "ok" } else { "fail" };
        let masters = self.nodes.iter().filter(|n| !n.ranges.is_empty()).count();
        [
            "cluster_enabled:1".to_string(),
            format!("cluster_state:{state}"),
            format!("cluster_slots_assigned:{assigned}"),
            format!("cluster_slots_ok:{assigned}"),
            "cluster_slots_pfail:0".to_string(),
            "cluster_slots_fail:0".to_string(),
            format!("cluster_known_nodes:{}", self.nodes.len()),
            format!("cluster_size:{masters}"),
            format!("cluster_current_epoch:{}", self.epoch),
            format!("cluster_my_epoch:{}", self.epoch),
            "cluster_stats_messages_sent:0".to_string(),
            "cluster_stats_messages_received:0".to_string(),
            "total_cluster_links_buffer_limit_exceeded:0".to_string(),
        ]
        .join("\r\n")
            + "\r\n"
    }
}

fn view_node(n: &NodeSpec, ranges: Vec<(u16, u16)>, self_name: &str) -> ViewNode {
    // A `sentinel` node's address is Sentinel's now.
    let at = crate::topology::nodes::endpoint_of(n, "");
    ViewNode {
        id: node_id(&n.name),
        name: n.name.clone(),
        host: at.host,
        port: at.port,
        ranges,
        is_self: !self_name.is_empty() && n.name == self_name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::RingSpec;

    fn ring(algo: &str, names: &[&str]) -> Ring {
        let fields: Vec<String> = names
            .iter()
            .enumerate()
            .flat_map(|(i, n)| [n.to_string(), format!("10.0.0.{}:6379", i + 1), "1".into()])
            .collect();
        let fields: Vec<&[u8]> = fields.iter().map(|f| f.as_bytes()).collect();
        let spec = RingSpec::from_args(algo.as_bytes(), None, &fields).expect("spec");
        Ring::build(&spec).expect("ring")
    }

    #[test]
    fn ids_are_sha1_of_the_name() {
        assert_eq!(node_id("n0").len(), 40);
        // sha1("abc")
        assert_eq!(node_id("abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_ne!(node_id("n0"), node_id("n1"));
    }

    #[test]
    fn three_nodes_split_like_redis_cli() {
        let view = ClusterView::of(&ring("slots", &["a", "b", "c"]), "b", 7).expect("slots");
        let ranges: Vec<_> = view.nodes.iter().map(|n| n.ranges[0]).collect();
        assert_eq!(ranges, [(0, 5460), (5461, 10922), (10923, 16383)]);
        assert_eq!(view.myself().map(|n| n.name.as_str()), Some("b"));
        let nodes = view.nodes_text();
        let lines: Vec<&str> = nodes.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[1].contains(" 10.0.0.2:6379@16379 myself,master - 0 0 7 connected 5461-10922")
        );
        assert!(view
            .info_text()
            .contains("cluster_state:ok\r\ncluster_slots_assigned:16384\r\n"));
        let Resp::Array(slots) = view.slots() else {
            panic!()
        };
        assert_eq!(slots.len(), 3);
        assert_eq!(
            slots[0],
            Resp::Array(vec![
                Resp::Int(0),
                Resp::Int(5460),
                Resp::Array(vec![
                    Resp::Bulk(b"10.0.0.1".to_vec()),
                    Resp::Int(6379),
                    Resp::Bulk(node_id("a").into_bytes()),
                    Resp::Map(vec![]),
                ])
            ])
        );
    }

    #[test]
    fn a_node_with_several_ranges_shows_them_all() {
        let fields: Vec<&[u8]> = vec![
            b"a",
            b"10.0.0.1:6379",
            b"1",
            b"SLOTS",
            b"0-4095,8192-9000",
            b"b",
            b"10.0.0.2:6379",
            b"1",
            b"SLOTS",
            b"4096-8191,9001-16382",
            b"c",
            b"10.0.0.3:6379",
            b"1",
            b"SLOTS",
            b"16383",
        ];
        let spec = RingSpec::from_args(b"slots", None, &fields).expect("spec");
        let view = ClusterView::of(&Ring::build(&spec).expect("ring"), "a", 3).expect("slots");
        let Resp::Array(slots) = view.slots() else {
            panic!()
        };
        let firsts: Vec<(Resp, Resp)> = slots
            .iter()
            .map(|e| match e {
                Resp::Array(v) => (v[0].clone(), v[1].clone()),
                _ => panic!("{e:?}"),
            })
            .collect();
        let int = |a: i64, b: i64| (Resp::Int(a), Resp::Int(b));
        assert_eq!(
            firsts,
            [
                int(0, 4095),
                int(8192, 9000),
                int(4096, 8191),
                int(9001, 16382),
                int(16383, 16383)
            ]
        );
        let nodes = view.nodes_text();
        let lines: Vec<&str> = nodes.lines().collect();
        assert!(lines[0].ends_with(" myself,master - 0 0 3 connected 0-4095 8192-9000"));
        assert!(lines[1].ends_with(" master - 0 0 3 connected 4096-8191 9001-16382"));
        assert!(lines[2].ends_with(" connected 16383"));
        assert!(view
            .info_text()
            .contains("cluster_state:ok\r\ncluster_slots_assigned:16384\r\n"));
        let Resp::Array(shards) = view.shards() else {
            panic!()
        };
        let Resp::Map(first) = &shards[0] else {
            panic!()
        };
        assert_eq!(
            first[0].1,
            Resp::Array([0, 4095, 8192, 9000].map(Resp::Int).to_vec())
        );
    }

    #[test]
    fn only_slots_rings_have_a_view() {
        assert!(ClusterView::of(&ring("ketama", &["a"]), "a", 1).is_none());
    }
}
