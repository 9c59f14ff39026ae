//! Where the ring's nodes are right now, and their replicas: what `topology::watcher` learns
//! from Sentinel and from the primaries' `ROLE`, kept on the main thread for everything that
//! talks to other nodes.
//!
//! - A node whose ring address is `sentinel` gets the address its Sentinel master has at the
//!   time: `endpoint_of` asks `address_of`. A change of that address is a failover followed:
//!   counted, logged, and the connections to the old address are closed at once, so calls in
//!   flight to it fail naming the node instead of waiting for their timeout, and the next call
//!   goes to the new primary. A name whose address is not known yet waits in the connection
//!   pool (`net::pool`) for the watcher's first answer. A known address is kept when every
//!   sentinel is down: Sentinel being away says nothing about the primary.
//! - Replicas (`shard.read-from`): per node, those Sentinel lists as up and linked, or those its
//!   primary's `ROLE` shows; picked in turn.
//! - Whether this server is itself a replica (the server's role events): a replica never runs a
//!   routed write for its own shard; it forwards it to its primary.
//! - Whether the address Sentinel gives a node is this server's own (`Node::me`, worked out
//!   when the watcher's answer is applied, read by `acts_as` on the hot path with no round
//!   trip): a server whose `self` is a `sentinel` node acts as that node only while Sentinel
//!   names it and it is a primary. A restarted old primary (its `self` unchanged, its data
//!   and role what its AOF said) or one Sentinel has failed over away from runs no routed call
//!   of its shard as the owner: it forwards it to the address Sentinel names, as any other node
//!   of the fleet does, and while Sentinel has named nobody yet the call waits for its answer.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use crate::net::endpoint::{split_address, Endpoint};
use crate::net::pool::TopologyChange;

/// Where `SHARD.CALL` reads go (`shard.read-from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    Primary,
    Replica,
    ReplicaPreferred,
}

impl ReadFrom {
    pub fn parse(text: &str) -> Option<ReadFrom> {
        match text {
            "primary" => Some(ReadFrom::Primary),
            "replica" => Some(ReadFrom::Replica),
            "replica-preferred" => Some(ReadFrom::ReplicaPreferred),
            _ => None,
        }
    }
}

static READ_FROM: AtomicU8 = AtomicU8::new(0);
static IS_REPLICA: AtomicBool = AtomicBool::new(false);

/// Sets where reads go (from the configuration).
pub fn set_read_from(mode: ReadFrom) {
    READ_FROM.store(mode as u8, Ordering::Relaxed);
}

pub fn read_from() -> ReadFrom {
    match READ_FROM.load(Ordering::Relaxed) {
        1 => ReadFrom::Replica,
        2 => ReadFrom::ReplicaPreferred,
        _ => ReadFrom::Primary,
    }
}

/// Records whether this server is a replica (at load and on every role change).
pub fn set_replica(replica: bool) {
    IS_REPLICA.store(replica, Ordering::Relaxed);
}

/// Whether this server is a replica: it then owns no key for routed writes.
pub fn is_replica() -> bool {
    IS_REPLICA.load(Ordering::Relaxed)
}

/// What the watcher learned in one look.
#[derive(Debug, Clone)]
pub enum Update {
    /// A Sentinel master's address, or why no sentinel gave it.
    Master {
        name: String,
        address: Result<String, String>,
    },
    /// A node's replicas that can serve reads, or why they could not be learned.
    Replicas {
        name: String,
        replicas: Result<Vec<String>, String>,
        /// How many replicas Sentinel could promote (`None`: as many as `replicas`, a
        /// primary's `ROLE`).
        promotable: Option<Promotable>,
    },
    /// The `+switch-master` subscription is up (`None`) or down (why).
    Subscription(Option<String>),
}

/// How many replicas of a node Sentinel could promote (`topology::sentinel`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Promotable {
    /// Now: up, linked to the primary or not.
    pub now: usize,
    /// Ever: down ones too, which may be promoted once back, before they have synced.
    pub ever: usize,
}

#[derive(Default)]
struct Node {
    address: Option<String>,
    /// `address` is this server's own (Sentinel names it the node's primary).
    me: bool,
    /// Why the address is not known (the last look's error).
    error: String,
    replicas: Option<Vec<String>>,
    /// How many servers could be promoted for this node (`Update::Replicas`).
    promotable: Promotable,
    replicas_error: String,
    next_replica: usize,
}

/// The main thread's picture of the fleet.
#[derive(Default)]
struct Table {
    nodes: HashMap<String, Node>,
    failovers: u64,
    subscribed: bool,
    sentinel_error: String,
}

thread_local! {
    static TABLE: RefCell<Table> = RefCell::new(Table::default());
}

/// The address a Sentinel node has now, if known.
pub fn address_of(name: &str) -> Option<String> {
    read_node(name, |n| n.address.clone())
}

/// Whether Sentinel names this server as the primary of the node called `name` (the address it
/// gives is one of this server's). False while no address is known.
pub fn names_me(name: &str) -> bool {
    read_node(name, |n| Some(n.me)).unwrap_or(false)
}

/// Whether this server is a primary that Sentinel positively names another server for, as
/// the node called `name` (its own): an old primary failed over away from, or restarted, that
/// Sentinel has not turned into a replica yet. Fleet steps go to the primary Sentinel names, so
/// its rings may be older than the fleet's. False while Sentinel's answer is not known, for a
/// node not behind Sentinel, and on a replica.
pub fn passed_over(name: &str) -> bool {
    !is_replica() && read_node(name, |n| Some(n.address.is_some() && !n.me)).unwrap_or(false)
}

/// Whether this server acts as the ring's node `node`, whose `self` is `self_name`: the node
/// is its own, the server is a primary, and for a `sentinel` node Sentinel names this server
/// as its primary. Cheap: an atomic load and, for a `sentinel` node, one look in the table.
pub fn acts_as(node: &crate::ring::NodeSpec, self_name: &str) -> bool {
    !self_name.is_empty()
        && node.name == self_name
        && !is_replica()
        && (!node.via_sentinel() || names_me(&node.name))
}

/// Whether `at` is the address in use of a ring's node, as `endpoint_of` gives it, without
/// building the endpoint (a replica asks on each read it serves).
pub fn address_in_use_is(node: &crate::ring::NodeSpec, at: &str) -> bool {
    if node.via_sentinel() {
        let known = read_node(&node.name, |n| {
            n.address
                .as_deref()
                .filter(|a| split_address(a).is_some())
                .map(|a| a == at)
        });
        if let Some(same) = known {
            return same;
        }
    }
    node.address == at
}

/// What `read` takes from the node called `name`, if the table has it.
fn read_node<T>(name: &str, read: impl FnOnce(&Node) -> Option<T>) -> Option<T> {
    TABLE.with(|t| t.borrow().nodes.get(name).and_then(read))
}

/// Why a Sentinel node's address is not known (empty if it is, or if nobody asked yet).
pub fn address_error(name: &str) -> String {
    read_node(name, |n| Some(n.error.clone())).unwrap_or_default()
}

/// The replicas known of a node.
pub fn replicas_of(name: &str) -> Vec<String> {
    read_node(name, |n| n.replicas.clone()).unwrap_or_default()
}

/// How many servers Sentinel (or the primary's `ROLE`) lists as replicas of the node called
/// `name` that could be promoted, linked to the primary or not: 0 when not looked up.
pub fn promotable_replicas(name: &str) -> usize {
    read_node(name, |n| Some(n.promotable.now)).unwrap_or(0)
}

/// How many servers Sentinel lists as replicas of the node called `name` that it may ever
/// promote: those it could promote now and those down now (`Promotable::ever`); 0 when not
/// looked up.
pub fn replicas_it_may_promote(name: &str) -> usize {
    read_node(name, |n| Some(n.promotable.ever)).unwrap_or(0)
}

/// Whether the replicas of the node called `name` have not been looked up yet (no answer and
/// no error so far).
pub fn replicas_pending(name: &str) -> bool {
    read_node(name, |n| {
        Some(n.replicas.is_none() && n.replicas_error.is_empty())
    })
    .unwrap_or(true)
}

/// Whether data only the primary of the node called `name` holds may be lost to a failover:
/// a `sentinel` node (`sentinel`) of which Sentinel lists a replica it may promote (up or down
/// now), or whose replicas are not looked up yet. The rule for a resharding's copies
/// (`reshard::fleet::durable::least_for_data`) and a transaction's applied part
/// (`txn::owner::acked`); a node with no replica configured expects none.
pub fn replica_expected(name: &str, sentinel: bool) -> bool {
    sentinel && (replicas_pending(name) || replicas_it_may_promote(name) > 0)
}

/// A replica of `primary` to read from (each in turn), or why there is none.
pub fn pick_replica(primary: &Endpoint) -> Result<Endpoint, String> {
    TABLE.with(|t| {
        let mut t = t.borrow_mut();
        let Some(node) = t.nodes.get_mut(&primary.name) else {
            return Err("its replicas are not known yet".into());
        };
        let replicas = match &node.replicas {
            Some(r) if !r.is_empty() => r,
            Some(_) => return Err("it has no replica that is up".into()),
            None if node.replicas_error.is_empty() => {
                return Err("its replicas are not known yet".into())
            }
            None => return Err(format!("its replicas are unknown: {}", node.replicas_error)),
        };
        let i = node.next_replica % replicas.len();
        node.next_replica = node.next_replica.wrapping_add(1);
        let address = replicas[i].clone();
        let (host, port) =
            split_address(&address).ok_or("a replica address that does not parse")?;
        Ok(Endpoint {
            name: format!("{} replica", primary.name),
            host,
            port,
            address,
            is_self: false,
        })
    })
}

/// (failovers followed, subscription up, the last sentinel error) for INFO.
pub fn summary() -> (u64, bool, String) {
    TABLE.with(|t| {
        let t = t.borrow();
        (t.failovers, t.subscribed, t.sentinel_error.clone())
    })
}

/// Applies what the watcher learned, on the main thread. Returns the connections to close
/// (node, old address, new address) and the names whose address became known or failed, for
/// the connection layer. `is_me` tells whether an address Sentinel gives is this server's
/// (`topology::me::is_own_address`).
pub fn apply(updates: Vec<Update>, is_me: impl Fn(&str) -> bool) -> TopologyChange {
    let mut applied = TopologyChange::default();
    // A look that found every master, with no error: the last error is history.
    let clean = updates.iter().any(|u| matches!(u, Update::Master { .. }))
        && !updates.iter().any(|u| {
            matches!(
                u,
                Update::Master {
                    address: Err(_),
                    ..
                } | Update::Subscription(Some(_))
            )
        });
    TABLE.with(|t| {
        let mut t = t.borrow_mut();
        if clean && t.subscribed {
            t.sentinel_error.clear();
        }
        for u in updates {
            match u {
                Update::Master { name, address } => {
                    let node = t.nodes.entry(name.clone()).or_default();
                    match address {
                        Ok(address) => {
                            node.error.clear();
                            node.me = is_me(&address);
                            match node.address.replace(address.clone()) {
                                Some(old) if old != address => {
                                    t.failovers += 1;
                                    applied.moved.push((name.clone(), old, address.clone()));
                                }
                                Some(_) => {}
                                None => applied.known.push((name, Ok(address))),
                            }
                        }
                        Err(e) => {
                            node.error = e.clone();
                            if node.address.is_none() {
                                applied.known.push((name, Err(e.clone())));
                            }
                            t.sentinel_error = e;
                        }
                    }
                }
                Update::Replicas {
                    name,
                    replicas,
                    promotable,
                } => {
                    let node = t.nodes.entry(name).or_default();
                    match replicas {
                        Ok(r) => {
                            node.promotable = promotable.unwrap_or(Promotable {
                                now: r.len(),
                                ever: r.len(),
                            });
                            node.replicas = Some(r);
                            node.replicas_error.clear();
                        }
                        Err(e) => {
                            node.replicas = None;
                            node.replicas_error = e;
                        }
                    }
                }
                Update::Subscription(None) => {
                    t.subscribed = true;
                }
                Update::Subscription(Some(e)) => {
                    t.subscribed = false;
                    t.sentinel_error = e;
                }
            }
        }
    });
    applied
}

/// The endpoint of a ring's node; `self_name` is this server's. A node whose address is
/// `sentinel` gets the address Sentinel gives now (`topology`); while none is known its
/// port is 0 and the connection layer waits for one. A server that is a replica is no
/// ring node's self: what its shard owns is run by its primary; nor is a primary that
/// Sentinel does not name (`acts_as`): the node's calls go to the one it names.
pub fn endpoint_of(node: &crate::ring::NodeSpec, self_name: &str) -> Endpoint {
    let is_self = acts_as(node, self_name);
    if node.via_sentinel() {
        if let Some((address, (host, port))) = address_of(&node.name)
            .and_then(|a| crate::net::endpoint::split_address(&a).map(|hp| (a, hp)))
        {
            return Endpoint {
                name: node.name.clone(),
                host,
                port,
                address,
                is_self,
            };
        }
    }
    Endpoint {
        name: node.name.clone(),
        host: node.host.clone(),
        port: node.port,
        address: node.address.clone(),
        is_self,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(name: &str) -> Endpoint {
        Endpoint {
            name: name.into(),
            host: String::new(),
            port: 0,
            address: "sentinel".into(),
            is_self: false,
        }
    }

    #[test]
    fn a_failover_is_a_changed_address() {
        let a = apply(
            vec![Update::Master {
                name: "n0".into(),
                address: Ok("127.0.0.1:7000".into()),
            }],
            |_| false,
        );
        assert_eq!(a.known.len(), 1);
        assert!(a.moved.is_empty());
        assert_eq!(address_of("n0").as_deref(), Some("127.0.0.1:7000"));
        // Sentinels down: the address stays.
        let a = apply(
            vec![Update::Master {
                name: "n0".into(),
                address: Err("no sentinel answers".into()),
            }],
            |_| false,
        );
        assert!(a.known.is_empty() && a.moved.is_empty());
        assert_eq!(address_of("n0").as_deref(), Some("127.0.0.1:7000"));
        let a = apply(
            vec![Update::Master {
                name: "n0".into(),
                address: Ok("127.0.0.1:7001".into()),
            }],
            |_| false,
        );
        assert_eq!(
            a.moved,
            vec![(
                "n0".into(),
                "127.0.0.1:7000".into(),
                "127.0.0.1:7001".into()
            )]
        );
        assert_eq!(summary().0, 1);
        // Never known, and no sentinel answers: the waiting calls are told.
        let a = apply(
            vec![Update::Master {
                name: "n9".into(),
                address: Err("no sentinel answers".into()),
            }],
            |_| false,
        );
        assert_eq!(
            a.known,
            vec![("n9".into(), Err("no sentinel answers".into()))]
        );
        assert_eq!(address_error("n9"), "no sentinel answers");
        assert_eq!(summary().2, "no sentinel answers");
        // Subscribed, and a look that finds every master: the error is cleared.
        apply(vec![Update::Subscription(None)], |_| false);
        apply(
            vec![Update::Master {
                name: "n9".into(),
                address: Ok("127.0.0.1:7009".into()),
            }],
            |_| false,
        );
        assert_eq!(summary().2, "");
    }

    #[test]
    fn a_sentinel_node_is_this_server_only_while_sentinel_names_it() {
        let n0 = crate::ring::NodeSpec::parse(b"m0", b"sentinel", b"1").unwrap();
        let mine = |a: &str| a == "127.0.0.1:7000";
        // Nothing known yet: not this server's to run.
        assert!(!acts_as(&n0, "m0") && !endpoint_of(&n0, "m0").is_self);
        apply(
            vec![Update::Master {
                name: "m0".into(),
                address: Ok("127.0.0.1:7000".into()),
            }],
            mine,
        );
        assert!(names_me("m0") && acts_as(&n0, "m0"));
        assert!(endpoint_of(&n0, "m0").is_self);
        assert!(!acts_as(&n0, "m1") && !acts_as(&n0, ""));
        // Failed over to another server: its calls go there.
        apply(
            vec![Update::Master {
                name: "m0".into(),
                address: Ok("127.0.0.1:7100".into()),
            }],
            mine,
        );
        let at = endpoint_of(&n0, "m0");
        assert!(!names_me("m0") && !at.is_self);
        assert_eq!((at.host.as_str(), at.port), ("127.0.0.1", 7100));
        // A plain node is this server's by its name alone.
        let plain = crate::ring::NodeSpec::parse(b"p", b"127.0.0.1:7200", b"1").unwrap();
        assert!(acts_as(&plain, "p") && endpoint_of(&plain, "p").is_self);
    }

    #[test]
    fn replicas_are_picked_in_turn() {
        assert!(pick_replica(&ep("r0"))
            .unwrap_err()
            .contains("not known yet"));
        apply(
            vec![Update::Replicas {
                name: "r0".into(),
                replicas: Ok(vec!["127.0.0.1:1".into(), "[::1]:2".into()]),
                promotable: Some(Promotable { now: 3, ever: 4 }),
            }],
            |_| false,
        );
        let a = pick_replica(&ep("r0")).unwrap();
        let b = pick_replica(&ep("r0")).unwrap();
        let c = pick_replica(&ep("r0")).unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 1));
        assert_eq!(
            (b.host.as_str(), b.port, b.address.as_str()),
            ("::1", 2, "[::1]:2")
        );
        assert_eq!(c.address, a.address);
        assert_eq!(a.name, "r0 replica");
        assert_eq!(promotable_replicas("r0"), 3);
        assert_eq!(replicas_it_may_promote("r0"), 4);
        apply(
            vec![Update::Replicas {
                name: "r0".into(),
                replicas: Ok(vec![]),
                promotable: None,
            }],
            |_| false,
        );
        assert!(pick_replica(&ep("r0")).unwrap_err().contains("no replica"));
    }
}
