//! A fleet of plain servers seen as a Redis Cluster: the replies of `CLUSTER SLOTS`, `SHARDS`,
//! `NODES`, `MYID`, `MYSHARDID`, `INFO`, `LINKS` and `REPLICAS` rendered from a `slots` ring and
//! the replicas known of its nodes, in the formats of Redis 7.0's cluster mode, so that every
//! cluster client library can route itself over the fleet, and read from replicas.
//!
//! A primary's node ID is 40 hex digits derived from the ring node's name (its SHA-1); a
//! replica's, from its shard's name and its address (`replica_id`); a shard's ID
//! (`MYSHARDID`), from the ring node's name too (`shard_id`). A primary's config epoch is its
//! place in the ring (1 for the first node), a replica's its primary's, as a cluster that
//! `redis-cli --cluster create` made numbers them. Every node of the fleet learns the same
//! replica lists from the same source (Sentinel for a `sentinel` node, the primary's `ROLE` for
//! the others), so every node reports the same map. Replicas are listed after their primary,
//! sorted by address. During a resharding the map shows the current owners. No bus runs, so
//! `CLUSTER LINKS` shows the links a cluster node would hold (one each way with every other
//! node). Pure: `commands::cluster` writes these values as replies.

use sha1::{Digest, Sha1};

use crate::net::endpoint::split_address;
use crate::net::resp::Resp;
use crate::ring::{NodeSpec, Ring};

/// A primary (a ring node) as the cluster protocol shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewNode {
    pub id: String,
    pub name: String,
    pub host: String,
    pub port: u16,
    /// Inclusive slot ranges it owns.
    pub ranges: Vec<(u16, u16)>,
    pub is_self: bool,
    pub replicas: Vec<ViewReplica>,
    /// Its config epoch: its place in the ring, from 1.
    pub epoch: u64,
}

/// A replica of a ring node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewReplica {
    pub id: String,
    pub host: String,
    pub port: u16,
    pub is_self: bool,
}

/// Which node of the map this server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Me {
    /// A primary: the ring node of this name (none when empty or not in the ring).
    Primary(String),
    /// A replica of the ring node `shard`, listed at `address` (`None`: not listed yet).
    Replica {
        shard: String,
        address: Option<String>,
    },
    /// A replica of no ring node.
    Nobody,
}

/// The cluster as the nodes report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    pub nodes: Vec<ViewNode>,
    /// The ring node this server serves, as a primary or a replica (`None`: none).
    pub my_shard: Option<String>,
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

/// The node ID of the replica at `address` of the ring node `shard`.
pub fn replica_id(shard: &str, address: &str) -> String {
    node_id(&format!("{shard} replica {address}"))
}

/// The shard ID of the ring node `name` (`CLUSTER MYSHARDID` on its primary and replicas).
pub fn shard_id(name: &str) -> String {
    node_id(&format!("{name} shard"))
}

impl ClusterView {
    /// The view of a `slots` ring, with the replicas `replicas_of(node name)` gives (`host:port`
    /// each); `None` for another algo.
    pub fn of(
        ring: &Ring,
        me: &Me,
        replicas_of: impl Fn(&str) -> Vec<String>,
    ) -> Option<ClusterView> {
        let ranges = ring.slot_ranges()?;
        let nodes: Vec<ViewNode> = ring
            .spec()
            .nodes
            .iter()
            .zip(ranges)
            .zip(1..)
            .map(|((n, r), epoch)| view_node(n, r.clone(), me, replicas_of(&n.name), epoch))
            .collect();
        let serves = |name: &str| nodes.iter().any(|n| n.name == name);
        let my_shard = match me {
            Me::Primary(name) if serves(name) => Some(name.clone()),
            Me::Replica { shard, .. } if serves(shard) => Some(shard.clone()),
            _ => None,
        };
        Some(ClusterView { nodes, my_shard })
    }

    /// This server's shard ID (`CLUSTER MYSHARDID`), if it serves a ring node.
    pub fn my_shard_id(&self) -> Option<String> {
        self.my_shard.as_deref().map(shard_id)
    }

    /// The config epoch this server reports as its own: its shard's primary's (0: none).
    fn my_epoch(&self) -> u64 {
        let mine = |n: &&ViewNode| self.my_shard.as_deref() == Some(n.name.as_str());
        self.nodes.iter().find(mine).map_or(0, |n| n.epoch)
    }

    /// The highest config epoch, the cluster's current epoch.
    fn current_epoch(&self) -> u64 {
        self.nodes.iter().map(|n| n.epoch).max().unwrap_or(0)
    }

    /// `CLUSTER LINKS`: the links a cluster node holds, one to and one from every other node
    /// of the map, each as cluster mode describes it (created `created_ms`, reading, with
    /// nothing to send).
    pub fn links(&self, created_ms: u64) -> Resp {
        let text = |s: &str| Resp::Bulk(s.as_bytes().to_vec());
        let created = i64::try_from(created_ms).unwrap_or(i64::MAX);
        let others = self.nodes.iter().flat_map(|n| {
            std::iter::once((n.id.as_str(), n.is_self))
                .chain(n.replicas.iter().map(|r| (r.id.as_str(), r.is_self)))
        });
        let mut out = Vec::new();
        for (id, is_self) in others {
            if is_self {
                continue;
            }
            for direction in ["to", "from"] {
                out.push(Resp::Map(vec![
                    (text("direction"), text(direction)),
                    (text("node"), text(id)),
                    (text("create-time"), Resp::Int(created)),
                    (text("events"), text("r")),
                    (text("send-buffer-allocated"), Resp::Int(0)),
                    (text("send-buffer-used"), Resp::Int(0)),
                ]));
            }
        }
        Resp::Array(out)
    }

    /// Whether `id` is a node of the map.
    pub fn knows(&self, id: &[u8]) -> bool {
        self.nodes
            .iter()
            .any(|n| n.id.as_bytes() == id || n.replicas.iter().any(|r| r.id.as_bytes() == id))
    }

    /// `CLUSTER REPLICAS id`: the `CLUSTER NODES` line of each replica of the primary `id`, or
    /// cluster mode's refusal (an unknown node, or a replica).
    pub fn replicas_of(&self, id: &[u8]) -> Result<Vec<String>, String> {
        let Some(primary) = self.nodes.iter().find(|n| n.id.as_bytes() == id) else {
            return Err(if self.knows(id) {
                "The specified node is not a master".to_string()
            } else {
                format!("Unknown node {}", String::from_utf8_lossy(id))
            });
        };
        Ok(primary
            .replicas
            .iter()
            .map(|r| replica_line(primary, r))
            .collect())
    }

    /// This server's node ID, if it is in the map.
    pub fn my_id(&self) -> Option<&str> {
        self.nodes.iter().find_map(|n| {
            if n.is_self {
                return Some(n.id.as_str());
            }
            n.replicas.iter().find(|r| r.is_self).map(|r| r.id.as_str())
        })
    }

    /// `CLUSTER SLOTS`: per range, its first and last slot, its master and then its replicas
    /// (ip, port, id, and the networking metadata map Redis 7.0 adds, empty here).
    pub fn slots(&self) -> Resp {
        let mut out = Vec::new();
        for n in &self.nodes {
            let entry = |host: &str, port: u16, id: &str| {
                Resp::Array(vec![
                    Resp::Bulk(host.as_bytes().to_vec()),
                    Resp::Int(i64::from(port)),
                    Resp::Bulk(id.as_bytes().to_vec()),
                    Resp::Map(Vec::new()),
                ])
            };
            for &(first, last) in &n.ranges {
                let mut range = vec![
                    Resp::Int(i64::from(first)),
                    Resp::Int(i64::from(last)),
                    entry(&n.host, n.port, &n.id),
                ];
                range.extend(n.replicas.iter().map(|r| entry(&r.host, r.port, &r.id)));
                out.push(Resp::Array(range));
            }
        }
        Resp::Array(out)
    }

    /// `CLUSTER SHARDS` (Redis 7.0): per shard its slots and its nodes, the master first.
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
                    let node = |id: &str, host: &str, port: u16, role: &str| {
                        Resp::Map(vec![
                            (text("id"), text(id)),
                            (text("port"), Resp::Int(i64::from(port))),
                            (text("ip"), text(host)),
                            (text("endpoint"), text(host)),
                            (text("role"), text(role)),
                            (text("replication-offset"), Resp::Int(0)),
                            (text("health"), text("online")),
                        ])
                    };
                    let mut nodes = vec![node(&n.id, &n.host, n.port, "master")];
                    nodes.extend(
                        n.replicas
                            .iter()
                            .map(|r| node(&r.id, &r.host, r.port, "replica")),
                    );
                    Resp::Map(vec![
                        (text("slots"), Resp::Array(slots)),
                        (text("nodes"), Resp::Array(nodes)),
                    ])
                })
                .collect(),
        )
    }

    /// `CLUSTER NODES`: one line per node, as cluster mode writes them, each replica's
    /// (`slave <master id>`) after its master's (the bus port shown as the data port plus
    /// 10000; no bus runs).
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
                n.epoch
            ));
            for &(a, b) in &n.ranges {
                if a == b {
                    out.push_str(&format!(" {a}"));
                } else {
                    out.push_str(&format!(" {a}-{b}"));
                }
            }
            out.push('\n');
            for r in &n.replicas {
                out.push_str(&replica_line(n, r));
                out.push('\n');
            }
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
            format!(
                "cluster_known_nodes:{}",
                self.nodes
                    .iter()
                    .map(|n| 1 + n.replicas.len())
                    .sum::<usize>()
            ),
            format!("cluster_size:{masters}"),
            format!("cluster_current_epoch:{}", self.current_epoch()),
            format!("cluster_my_epoch:{}", self.my_epoch()),
            "cluster_stats_messages_sent:0".to_string(),
            "cluster_stats_messages_received:0".to_string(),
            "total_cluster_links_buffer_limit_exceeded:0".to_string(),
        ]
        .join("\r\n")
            + "\r\n"
    }
}

/// A replica's `CLUSTER NODES` line (no line break): its primary's config epoch, as cluster
/// mode shows a replica's.
fn replica_line(primary: &ViewNode, r: &ViewReplica) -> String {
    let flags = if r.is_self { "myself,slave" } else { "slave" };
    format!(
        "{} {}:{}@{} {} {} 0 0 {} connected",
        r.id,
        r.host,
        r.port,
        u32::from(r.port) + 10000,
        flags,
        primary.id,
        primary.epoch
    )
}

fn view_node(
    n: &NodeSpec,
    ranges: Vec<(u16, u16)>,
    me: &Me,
    listed: Vec<String>,
    epoch: u64,
) -> ViewNode {
    // A `sentinel` node's address is Sentinel's now.
    let at = crate::topology::nodes::endpoint_of(n, "");
    let my_address = match me {
        Me::Replica { shard, address } if *shard == n.name => address.as_deref(),
        _ => None,
    };
    let mut replicas: Vec<ViewReplica> = listed
        .iter()
        .filter(|a| **a != at.address)
        .filter_map(|a| {
            let (host, port) = split_address(a)?;
            Some(ViewReplica {
                id: replica_id(&n.name, a),
                host,
                port,
                is_self: my_address == Some(a.as_str()),
            })
        })
        .collect();
    replicas.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
    replicas.dedup_by(|a, b| a.id == b.id);
    ViewNode {
        id: node_id(&n.name),
        name: n.name.clone(),
        host: at.host,
        port: at.port,
        ranges,
        is_self: matches!(me, Me::Primary(name) if !name.is_empty() && *name == n.name),
        replicas,
        epoch,
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
        let view =
            ClusterView::of(&ring("slots", &["a", "b", "c"]), &primary("b"), none).expect("slots");
        let ranges: Vec<_> = view.nodes.iter().map(|n| n.ranges[0]).collect();
        assert_eq!(ranges, [(0, 5460), (5461, 10922), (10923, 16383)]);
        assert_eq!(view.my_id(), Some(node_id("b").as_str()));
        let nodes = view.nodes_text();
        let lines: Vec<&str> = nodes.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[1].contains(" 10.0.0.2:6379@16379 myself,master - 0 0 2 connected 5461-10922")
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
        let view = ClusterView::of(&Ring::build(&spec).expect("ring"), &primary("a"), none)
            .expect("slots");
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
        assert!(lines[0].ends_with(" myself,master - 0 0 1 connected 0-4095 8192-9000"));
        assert!(lines[1].ends_with(" master - 0 0 2 connected 4096-8191 9001-16382"));
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
        assert!(ClusterView::of(&ring("ketama", &["a"]), &primary("a"), none).is_none());
    }

    fn primary(name: &str) -> Me {
        Me::Primary(name.into())
    }

    fn none(_: &str) -> Vec<String> {
        Vec::new()
    }

    #[test]
    fn replicas_follow_their_primary_in_every_reply() {
        let listed = |name: &str| match name {
            // Unsorted, with the primary's own address and a duplicate: shown sorted, once.
            "a" => vec![
                "10.0.1.2:6380".to_string(),
                "10.0.0.1:6379".to_string(),
                "10.0.1.1:6380".to_string(),
                "10.0.1.1:6380".to_string(),
            ],
            _ => Vec::new(),
        };
        let me = Me::Replica {
            shard: "a".into(),
            address: Some("10.0.1.2:6380".into()),
        };
        let view = ClusterView::of(&ring("slots", &["a", "b"]), &me, listed).expect("slots");
        let r1 = replica_id("a", "10.0.1.1:6380");
        let r2 = replica_id("a", "10.0.1.2:6380");
        assert_eq!(view.my_id(), Some(r2.as_str()));
        assert_ne!(r1, r2);
        assert_ne!(r1, node_id("a"));
        let Resp::Array(slots) = view.slots() else {
            panic!()
        };
        let Resp::Array(first) = &slots[0] else {
            panic!()
        };
        let entry = |host: &str, port: i64, id: &str| {
            Resp::Array(vec![
                Resp::Bulk(host.as_bytes().to_vec()),
                Resp::Int(port),
                Resp::Bulk(id.as_bytes().to_vec()),
                Resp::Map(vec![]),
            ])
        };
        assert_eq!(
            first[2..],
            [
                entry("10.0.0.1", 6379, &node_id("a")),
                entry("10.0.1.1", 6380, &r1),
                entry("10.0.1.2", 6380, &r2),
            ]
        );
        let Resp::Array(second) = &slots[1] else {
            panic!()
        };
        assert_eq!(second.len(), 3);
        let nodes = view.nodes_text();
        let lines: Vec<&str> = nodes.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(
            lines[0].ends_with(" master - 0 0 1 connected 0-8191"),
            "{}",
            lines[0]
        );
        assert_eq!(
            lines[1],
            format!(
                "{r1} 10.0.1.1:6380@16380 slave {} 0 0 1 connected",
                node_id("a")
            )
        );
        assert!(lines[2].starts_with(&format!("{r2} 10.0.1.2:6380@16380 myself,slave ")));
        assert!(view
            .info_text()
            .contains("cluster_known_nodes:4\r\ncluster_size:2\r\n"));
        let Resp::Array(shards) = view.shards() else {
            panic!()
        };
        let Resp::Map(first) = &shards[0] else {
            panic!()
        };
        let Resp::Array(nodes) = &first[1].1 else {
            panic!()
        };
        let roles: Vec<Resp> = nodes
            .iter()
            .map(|n| match n {
                Resp::Map(fields) => fields[4].1.clone(),
                _ => panic!(),
            })
            .collect();
        let text = |s: &str| Resp::Bulk(s.as_bytes().to_vec());
        assert_eq!(roles, [text("master"), text("replica"), text("replica")]);
    }

    #[test]
    fn each_primary_has_its_own_epoch_and_shard_id() {
        let listed = |name: &str| match name {
            "b" => vec!["10.0.1.2:6380".to_string()],
            _ => Vec::new(),
        };
        let me = Me::Replica {
            shard: "b".into(),
            address: Some("10.0.1.2:6380".into()),
        };
        let view = ClusterView::of(&ring("slots", &["a", "b", "c"]), &me, listed).expect("slots");
        let nodes = view.nodes_text();
        let epochs: Vec<&str> = nodes
            .lines()
            .map(|l| l.split(' ').nth(6).unwrap_or(""))
            .collect();
        // a, b, b's replica (b's epoch), c.
        assert_eq!(epochs, ["1", "2", "2", "3"]);
        let info = view.info_text();
        assert!(
            info.contains("cluster_current_epoch:3\r\ncluster_my_epoch:2\r\n"),
            "{info}"
        );
        assert_eq!(view.my_shard_id(), Some(shard_id("b")));
        let ids = [
            shard_id("a"),
            shard_id("b"),
            node_id("a"),
            replica_id("b", "x:1"),
        ];
        assert!(ids.iter().all(|i| i.len() == 40));
        assert!(ids[0] != ids[1] && ids[0] != ids[2] && ids[1] != ids[3]);
        let nobody = ClusterView::of(&ring("slots", &["a"]), &Me::Nobody, none).expect("slots");
        assert_eq!(nobody.my_shard_id(), None);
        assert!(nobody.info_text().contains("cluster_my_epoch:0\r\n"));
    }

    #[test]
    fn links_go_both_ways_with_every_other_node() {
        let listed = |name: &str| match name {
            "a" => vec!["10.0.1.1:6380".to_string()],
            _ => Vec::new(),
        };
        let view =
            ClusterView::of(&ring("slots", &["a", "b"]), &primary("a"), listed).expect("slots");
        let Resp::Array(links) = view.links(1234) else {
            panic!()
        };
        let field = |l: &Resp, k: &str| match l {
            Resp::Map(f) => f
                .iter()
                .find(|(name, _)| *name == Resp::Bulk(k.as_bytes().to_vec()))
                .map(|(_, v)| v.clone()),
            _ => None,
        };
        let seen: Vec<(Resp, Resp)> = links
            .iter()
            .map(|l| (field(l, "node").unwrap(), field(l, "direction").unwrap()))
            .collect();
        let bulk = |s: &str| Resp::Bulk(s.as_bytes().to_vec());
        let (r, b) = (replica_id("a", "10.0.1.1:6380"), node_id("b"));
        assert_eq!(
            seen,
            [
                (bulk(&r), bulk("to")),
                (bulk(&r), bulk("from")),
                (bulk(&b), bulk("to")),
                (bulk(&b), bulk("from")),
            ]
        );
        assert_eq!(field(&links[0], "create-time"), Some(Resp::Int(1234)));
        assert_eq!(
            view.replicas_of(node_id("a").as_bytes()),
            Ok(vec![format!(
                "{r} 10.0.1.1:6380@16380 slave {} 0 0 1 connected",
                node_id("a")
            )])
        );
        assert_eq!(view.replicas_of(b.as_bytes()), Ok(vec![]));
        assert_eq!(
            view.replicas_of(r.as_bytes()),
            Err("The specified node is not a master".to_string())
        );
        assert_eq!(
            view.replicas_of(b"nope"),
            Err("Unknown node nope".to_string())
        );
    }
}
