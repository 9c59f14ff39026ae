//! Sentinel, as `create` meets it: before a ring of `sentinel` nodes is set, every sentinel
//! given that answers is asked where each node's master is (`SENTINEL
//! get-master-addr-by-name`, the node's name being its master name), and the address given for
//! the node must be the one Sentinel gives; afterwards, `create` waits until every server
//! (replicas included) has resolved every ring node (`SHARD.RING GET`'s `resolved`), so that the commands that follow
//! find the fleet. The sentinels are reached with their own credentials (`--sentinel-user`,
//! `--sentinel-password`, as the module's `shard.sentinel-*` settings take them), and the TLS
//! options of every command.

use std::time::{Duration, Instant};

use crate::conn::{get, items, pairs, text, ConnOpts};
use crate::create::Extra;
use crate::fleet::RingNode;

/// Checks that the sentinels monitor every node under its name, at the address given.
pub fn check_masters(opts: &ConnOpts, extra: &Extra, nodes: &[RingNode]) -> Result<(), String> {
    let as_sentinel = ConnOpts {
        user: extra.sentinel_user.map(str::to_string),
        password: extra.sentinel_password.map(str::to_string),
        ..opts.clone()
    };
    let mut answered = 0;
    let mut down = Vec::new();
    for s in extra.sentinels {
        let mut c = match as_sentinel.connect(&format!("sentinel {s}"), s) {
            Ok(c) => c,
            Err(e) => {
                down.push(e);
                continue;
            }
        };
        answered += 1;
        for n in nodes {
            let reply = c.call(&["SENTINEL", "get-master-addr-by-name", &n.name])?;
            let parts = items(&reply);
            if parts.len() != 2 {
                return Err(format!(
                    "sentinel {s} does not monitor a master named {}: add `sentinel monitor {} {} 2` to the sentinels' config (a node's name is its master name)",
                    n.name,
                    n.name,
                    n.resolved.replace(':', " ")
                ));
            }
            let at = format!("{}:{}", text(&parts[0]), text(&parts[1]));
            if at != n.resolved {
                return Err(format!(
                    "sentinel {s} gives master {} at {at}, not at {} as given: give the primary's address",
                    n.name, n.resolved
                ));
            }
        }
    }
    if answered == 0 {
        return Err(format!("no sentinel answers: {}", down.join("; ")));
    }
    Ok(())
}

/// Waits (up to 10 s) until every server (`(label, address)`: the primaries and their
/// replicas) has resolved every ring node through Sentinel.
pub fn wait_resolved(opts: &ConnOpts, servers: &[(String, String)]) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(10);
    for (label, address) in servers {
        let mut c = opts.connect(label, address)?;
        loop {
            let ring = pairs(&c.call(&["SHARD.RING", "GET"])?);
            let unresolved: Vec<String> = items(&get(&ring, "nodes"))
                .iter()
                .map(pairs)
                .filter(|m| text(&get(m, "resolved")).is_empty())
                .map(|m| text(&get(&m, "name")))
                .collect();
            if unresolved.is_empty() {
                break;
            }
            if Instant::now() > until {
                return Err(format!(
                    "{label} ({address}) has not resolved {} through Sentinel after 10 s: see its log (shard.sentinels)",
                    unresolved.join(" ")
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}
