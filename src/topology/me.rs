//! This server as its fleet sees it when it is a replica: which shard it serves (whose keys it
//! may answer reads of) and which entry of that shard's replica list is itself. The cluster
//! protocol needs both to show a replica in the maps and to let a `READONLY` client read there.
//!
//! The shard a replica serves is the primary it replicates from: the ring node whose address
//! in use (Sentinel's now, for a `sentinel` node) is the server's own `replicaof` address. The
//! replication link says whose data the server holds, so it wins; when that address names no
//! ring node (a host name in one place and an IP in the other, a chained replica), the
//! server's `shard.self` names the shard, as the failover guide already asks of replicas.
//!
//! Whether an address Sentinel names is this server's own (`is_own_address`): its port is one
//! the server listens on or announces, and its host the announced IP or an address of this
//! machine. Worked out when the watcher's answer is applied, never per command.
//!
//! The `replicaof` address is read when the server becomes a replica or its link to a primary
//! comes up (`refresh`, on the main thread from the server's events), never on a hot path.
//! Main thread only.

use std::cell::RefCell;

use crate::ring::RingSpec;
use crate::topology::nodes::{address_in_use_is, is_replica};

thread_local! {
    /// The `replicaof` address (`host:port`) while the server is a replica.
    static PRIMARY: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Reads the server's `replicaof` setting again (when it becomes a replica or a primary, and
/// when its link to its primary comes up).
pub fn refresh() {
    let text = crate::host::context::server_config("replicaof");
    PRIMARY.with(|p| *p.borrow_mut() = primary_address(&text));
}

/// `host:port` of `replicaof`'s value (`host port`; empty on a primary).
fn primary_address(text: &str) -> Option<String> {
    let mut words = text.split_whitespace();
    let (host, port) = (words.next()?, words.next()?.parse::<u16>().ok()?);
    (port != 0).then(|| crate::topology::sentinel::join_address(host, port))
}

/// The address this server replicates from, while it is a replica.
pub fn primary() -> Option<String> {
    PRIMARY
        .with(|p| p.borrow().clone())
        .filter(|_| is_replica())
}

/// The shard whose keys this server serves: its own node (`self_name`) on a primary; on a
/// replica, the node whose address in use is its primary's, else `self_name`. `None` when it
/// serves no node of `spec`.
pub fn shard<'a>(spec: &'a RingSpec, self_name: &str) -> Option<&'a str> {
    if is_replica() {
        let served = PRIMARY.with(|p| {
            let p = p.borrow();
            let at = p.as_deref()?;
            spec.nodes.iter().find(|n| address_in_use_is(n, at))
        });
        if let Some(n) = served {
            return Some(&n.name);
        }
    }
    spec.node_index(self_name)
        .and_then(|i| spec.nodes.get(i))
        .map(|n| n.name.as_str())
}

/// Which of `listed` (a shard's replicas, `host:port` as its primary or Sentinel gives them)
/// is this server: the one with its port (`replica-announce-port`, else `port`, else
/// `tls-port`) and, when several have it, its announced IP or an address of this machine.
pub fn find_self(listed: &[String]) -> Option<String> {
    let config = crate::host::context::server_config;
    let port = ["replica-announce-port", "port", "tls-port"]
        .iter()
        .filter_map(|name| config(name).parse::<u16>().ok())
        .find(|p| *p != 0)?;
    let announced = config("replica-announce-ip");
    pick_self(listed, port, &announced, is_local)
}

/// Whether `address` (`host:port`, as Sentinel names a primary) is this server's: its port is
/// the server's `port`, `tls-port` or `replica-announce-port`, and its host the
/// `replica-announce-ip` or an address of this machine. A host name is never taken for this
/// server (the call then goes over the network, to whichever server that is).
pub fn is_own_address(address: &str) -> bool {
    let config = crate::host::context::server_config;
    let ports: Vec<u16> = ["replica-announce-port", "port", "tls-port"]
        .iter()
        .filter_map(|name| config(name).parse::<u16>().ok())
        .filter(|p| *p != 0)
        .collect();
    is_own(address, &ports, &config("replica-announce-ip"), is_local)
}

/// `is_own_address`'s answer, with the facts given (pure, for the tests).
fn is_own(address: &str, ports: &[u16], announced_ip: &str, local: impl Fn(&str) -> bool) -> bool {
    let Some((host, port)) = crate::net::endpoint::split_address(address) else {
        return false;
    };
    ports.contains(&port) && ((!announced_ip.is_empty() && host == announced_ip) || local(&host))
}

/// `find_self`'s choice, with the facts given (pure, for the tests).
fn pick_self(
    listed: &[String],
    port: u16,
    announced_ip: &str,
    local: impl Fn(&str) -> bool,
) -> Option<String> {
    let with_port: Vec<(&String, String)> = listed
        .iter()
        .filter_map(|a| {
            let (host, p) = crate::net::endpoint::split_address(a)?;
            (p == port).then_some((a, host))
        })
        .collect();
    if let [(only, _)] = with_port.as_slice() {
        return Some((*only).clone());
    }
    with_port
        .iter()
        .find(|(_, host)| {
            if announced_ip.is_empty() {
                local(host)
            } else {
                host == announced_ip
            }
        })
        .map(|(a, _)| (*a).clone())
}

/// Whether `ip` is an address of this machine (a socket binds to it).
fn is_local(ip: &str) -> bool {
    ip.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| std::net::TcpListener::bind((ip, 0)).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicaof_is_read_into_an_address() {
        assert_eq!(
            primary_address("127.0.0.1 7000").as_deref(),
            Some("127.0.0.1:7000")
        );
        assert_eq!(primary_address("::1 7000").as_deref(), Some("[::1]:7000"));
        assert_eq!(primary_address(""), None);
        assert_eq!(primary_address("host x"), None);
    }

    #[test]
    fn own_address_by_port_and_host() {
        let local = |h: &str| h == "127.0.0.1" || h == "::1";
        assert!(is_own("127.0.0.1:7000", &[7000], "", local));
        assert!(is_own("[::1]:7000", &[7000], "", local));
        assert!(!is_own("127.0.0.1:7100", &[7000], "", local));
        assert!(!is_own("10.0.0.9:7000", &[7000], "", local));
        // Announced (NAT): the announced IP and port are this server's.
        assert!(is_own("10.0.0.9:17000", &[17000, 7000], "10.0.0.9", local));
        assert!(!is_own("redis-0:7000", &[7000], "", local));
        assert!(!is_own("sentinel", &[7000], "", local));
        assert!(!is_own("127.0.0.1:7000", &[], "", local));
        assert!(!is_own(":7000", &[7000], "", |_| false));
    }

    #[test]
    fn self_is_found_by_port_then_address() {
        let listed: Vec<String> = ["10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:7000"]
            .map(String::from)
            .to_vec();
        let none = |_: &str| false;
        assert_eq!(
            pick_self(&listed, 7000, "", none).as_deref(),
            Some("10.0.0.3:7000")
        );
        assert_eq!(pick_self(&listed, 6379, "", none), None);
        assert_eq!(
            pick_self(&listed, 6379, "", |h| h == "10.0.0.2").as_deref(),
            Some("10.0.0.2:6379")
        );
        assert_eq!(
            pick_self(&listed, 6379, "10.0.0.1", |_| true).as_deref(),
            Some("10.0.0.1:6379")
        );
        assert_eq!(pick_self(&listed, 1, "", |_| true), None);
    }
}
