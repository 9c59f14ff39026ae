//! Keyless commands answered for the whole fleet (issue 43): which ones, and how the nodes'
//! replies are merged into the one reply a single server holding every key would give.
//!
//! A Redis Cluster client sends a keyless command to the nodes its server's command tips name
//! (`COMMAND INFO`: `request_policy:all_shards` / `all_nodes`) and merges their replies by the
//! tip's `response_policy` (`agg_sum`, `all_succeeded`, `agg_logical_and`, `special`). A client
//! of one node of a `shard` fleet (through `SHARD.CALL` or `shard.route-plain`) gets the same
//! answer from the node it asked, which sends the command to every node of its rings and merges
//! here. Which commands: those of the data, whose answer a single server gives over all its
//! keys (`DBSIZE`, `KEYS`, `SCAN`, `RANDOMKEY`, the flushes), the scripts and functions every
//! node must hold alike (`SCRIPT LOAD|FLUSH|EXISTS`, `FUNCTION LOAD|DELETE|FLUSH|RESTORE`), and
//! `PUBLISH` (every node's subscribers, as Redis Cluster's bus carries it) and `SPUBLISH`
//! (keyed by its channel, but a plain client subscribes at the node it is connected to, so the
//! message goes to every node's shard subscribers of the channel). The commands about
//! the server a client is connected to (`PING`, `ECHO`, `TIME`, `INFO`, `CONFIG`, `CLIENT`,
//! `SLOWLOG`, `LATENCY`, `MEMORY`...) stay that server's own, although some of their tips say
//! `all_shards`: a client of one server asks that server, as a cluster client does on a
//! connection to one node.
//!
//! `KEYS` and `SCAN` keep, of a node's keys, those its rings say it owns (now, or before a
//! resharding still open), so a key seen at two nodes while it moves is listed once by `KEYS`
//! (the merge removes the second) and a key left where no ring places it (a stray) is not
//! listed, as a routed `GET` would not find it. `DBSIZE` sums the nodes' own counts (what
//! Redis Cluster clients do), a key copied and not yet cleaned up counted at both.
//!
//! `SHARD.HOTKEYS` is merged here too (`hot_keys`): every node's own hottest keys by their LFU
//! counters (`route::hot_sample`), the fleet's top over them.
//!
//! Pure: arguments in, the fan-out and the merged reply out; the I/O is `keyless_call`'s.

use crate::net::resp::Resp;

/// A keyless command the fleet answers, by how its replies merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyless {
    /// `DBSIZE`: the sum of every node's (`agg_sum`).
    Sum,
    /// `KEYS pattern`: the union of every node's keys that node owns.
    Keys,
    /// `SCAN cursor ...`: one cursor over the nodes, one after the other (`scan_cursor`).
    Scan,
    /// `RANDOMKEY`: a key of a node chosen by its share of the keys.
    RandomKey,
    /// Run on every node; the first node's reply if every node succeeded, else the first
    /// error, naming its node (`all_succeeded`): the flushes, `SCRIPT LOAD|FLUSH`, `FUNCTION
    /// LOAD|DELETE|FLUSH|RESTORE`.
    AllSucceeded,
    /// `SCRIPT EXISTS sha ...`: 1 where every node has it (`agg_logical_and`).
    LogicalAnd,
    /// `PUBLISH channel message`: the subscribers reached, summed over the nodes.
    Publish,
}

/// Whether the command `name` (with its first argument `sub`, for a container command) is
/// answered for the fleet, and how.
pub fn of(name: &[u8], sub: Option<&[u8]>) -> Option<Keyless> {
    let is = |word: &str| name.eq_ignore_ascii_case(word.as_bytes());
    let sub_is = |word: &str| sub.is_some_and(|s| s.eq_ignore_ascii_case(word.as_bytes()));
    if is("dbsize") {
        Some(Keyless::Sum)
    } else if is("keys") {
        Some(Keyless::Keys)
    } else if is("scan") {
        Some(Keyless::Scan)
    } else if is("randomkey") {
        Some(Keyless::RandomKey)
    } else if is("flushdb") || is("flushall") {
        Some(Keyless::AllSucceeded)
    } else if is("publish") || is("spublish") {
        Some(Keyless::Publish)
    } else if is("script") {
        if sub_is("load") || sub_is("flush") {
            Some(Keyless::AllSucceeded)
        } else if sub_is("exists") {
            Some(Keyless::LogicalAnd)
        } else {
            None
        }
    } else if is("function") {
        (sub_is("load") || sub_is("delete") || sub_is("flush") || sub_is("restore"))
            .then_some(Keyless::AllSucceeded)
    } else {
        None
    }
}

/// Whether the command subscribes or unsubscribes its connection (`SUBSCRIBE`, `SSUBSCRIBE`
/// ...): a subscription is the connection's own, so it stays at the node the client is
/// connected to, and `PUBLISH`/`SPUBLISH` reach it there (they are published at every node).
pub fn subscribes(name: &[u8]) -> bool {
    [
        &b"subscribe"[..],
        b"psubscribe",
        b"ssubscribe",
        b"unsubscribe",
        b"punsubscribe",
        b"sunsubscribe",
    ]
    .iter()
    .any(|n| name.eq_ignore_ascii_case(n))
}

/// Whether a command with no key in its arguments, not answered for the fleet, runs here
/// through `SHARD.CALL` (as the calling user, through the module's call of the server): the
/// harmless ones a client may send to any node (`PING`, `ECHO`, `TIME`, a script or function
/// with no key, reading the functions). Any other (`CLIENT KILL`, `CONFIG SET`, `SHUTDOWN`,
/// `DEBUG` ...) is refused: it is about the server a client talks to, and some of them must not
/// run inside another command (a `CLIENT KILL` of the calling client would free it under the
/// server's feet); the client sends it to the node directly.
pub fn runs_here(name: &[u8], sub: Option<&[u8]>) -> bool {
    let is = |word: &str| name.eq_ignore_ascii_case(word.as_bytes());
    let sub_is = |word: &str| sub.is_some_and(|s| s.eq_ignore_ascii_case(word.as_bytes()));
    [
        "ping",
        "echo",
        "time",
        "lolwut",
        "eval",
        "evalsha",
        "eval_ro",
        "evalsha_ro",
        "fcall",
        "fcall_ro",
    ]
    .iter()
    .any(|w| is(w))
        || (is("function") && (sub_is("list") || sub_is("dump") || sub_is("stats")))
}

/// One node's reply, and the node's name for an error.
pub struct NodeReply {
    pub node: String,
    pub reply: Resp,
}

/// The first error among the replies, naming its node.
fn first_error(replies: &[NodeReply]) -> Option<Resp> {
    replies.iter().find_map(|r| match &r.reply {
        Resp::Error(line) => Some(Resp::Error(at_node(line, &r.node))),
        _ => None,
    })
}

/// An error line with the node that gave it: `CODE text (at node n1)`.
pub fn at_node(line: &[u8], node: &str) -> Vec<u8> {
    let mut out = line.to_vec();
    out.extend_from_slice(format!(" (at node {node})").as_bytes());
    out
}

fn unexpected(r: &NodeReply) -> Resp {
    Resp::Error(at_node(
        b"ERR a node's reply is not the command's kind",
        &r.node,
    ))
}

/// `agg_sum`: the nodes' integers added up.
pub fn sum(replies: &[NodeReply]) -> Resp {
    if let Some(e) = first_error(replies) {
        return e;
    }
    let mut total: i64 = 0;
    for r in replies {
        match r.reply {
            Resp::Int(n) => total = total.saturating_add(n),
            _ => return unexpected(r),
        }
    }
    Resp::Int(total)
}

/// `all_succeeded`: the first node's reply when every node succeeded.
pub fn all_succeeded(mut replies: Vec<NodeReply>) -> Resp {
    if let Some(e) = first_error(&replies) {
        return e;
    }
    if replies.is_empty() {
        return Resp::Simple(b"OK".to_vec());
    }
    replies.swap_remove(0).reply
}

/// `agg_logical_and`: element by element, 1 only where every node replied 1.
pub fn logical_and(replies: &[NodeReply]) -> Resp {
    if let Some(e) = first_error(replies) {
        return e;
    }
    let mut out: Option<Vec<i64>> = None;
    for r in replies {
        let Resp::Array(items) = &r.reply else {
            return unexpected(r);
        };
        let mut these = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Resp::Int(n) => these.push(*n),
                Resp::Bool(b) => these.push(i64::from(*b)),
                _ => return unexpected(r),
            }
        }
        out = Some(match out {
            None => these,
            Some(acc) if acc.len() == these.len() => acc
                .iter()
                .zip(&these)
                .map(|(a, b)| i64::from(*a != 0 && *b != 0))
                .collect(),
            Some(_) => return unexpected(r),
        });
    }
    Resp::Array(out.unwrap_or_default().into_iter().map(Resp::Int).collect())
}

/// The key names of a node's `KEYS` reply, or of the second element of its `SCAN` reply.
pub fn names(reply: Resp) -> Option<Vec<Vec<u8>>> {
    let items = match reply {
        Resp::Array(items) | Resp::Set(items) => items,
        _ => return None,
    };
    items
        .into_iter()
        .map(|item| match item {
            Resp::Bulk(name) | Resp::Simple(name) => Some(name),
            _ => None,
        })
        .collect()
}

/// The union of the nodes' keys, each node's filtered by `owns(node, key)`, each name once,
/// in the order met.
pub fn union_keys(replies: Vec<NodeReply>, owns: impl Fn(&str, &[u8]) -> bool) -> Resp {
    if let Some(e) = first_error(&replies) {
        return e;
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for r in replies {
        let node = r.node.clone();
        let Some(keys) = names(r.reply) else {
            return Resp::Error(at_node(b"ERR a node's KEYS reply is not a list", &node));
        };
        for key in keys {
            if owns(&node, &key) && seen.insert(key.clone()) {
                out.push(Resp::Bulk(key));
            }
        }
    }
    Resp::Array(out)
}

/// `RANDOMKEY`'s node: given each node's key count, the node whose share of the keys covers
/// `pick` (a number below the total); `None` when no node has a key.
pub fn weighted_pick(counts: &[u64], pick: u64) -> Option<usize> {
    let mut acc: u64 = 0;
    for (i, &c) in counts.iter().enumerate() {
        acc = acc.saturating_add(c);
        if pick < acc {
            return Some(i);
        }
    }
    None
}

/// One of the fleet's hot keys: its name, its LFU counter (`OBJECT FREQ`), the node holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotKey {
    pub key: Vec<u8>,
    pub freq: u64,
    pub node: String,
}

/// A node's `SHARD.HOTKEYS LOCAL` reply, `[[key, freq] ...]`: its keys and counters.
pub fn hot_pairs(reply: Resp) -> Option<Vec<(Vec<u8>, u64)>> {
    let Resp::Array(items) = reply else {
        return None;
    };
    items
        .into_iter()
        .map(|item| match item {
            Resp::Array(pair) => match <[Resp; 2]>::try_from(pair).ok()? {
                [Resp::Bulk(key) | Resp::Simple(key), Resp::Int(freq)] => {
                    Some((key, u64::try_from(freq).ok()?))
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// `SHARD.HOTKEYS`: the nodes' local tops merged into the fleet's `count` hottest keys, by
/// counter (highest first; equal counters by key name, then node name, so the order is the
/// same whichever node merges). A node's key its rings do not place there (`owns(node, key)`
/// false: a stray, or a key copied and not yet cleaned up) is left out, and a key listed by two
/// nodes is kept once, at its higher counter, as `union_keys` keeps it once. The first error
/// of a node (an LFU policy not set there) is the reply, naming its node.
pub fn hot_keys(
    replies: Vec<NodeReply>,
    owns: impl Fn(&str, &[u8]) -> bool,
    count: usize,
) -> Result<Vec<HotKey>, Resp> {
    if let Some(e) = first_error(&replies) {
        return Err(e);
    }
    let mut all = Vec::new();
    for r in replies {
        let Some(pairs) = hot_pairs(r.reply) else {
            return Err(Resp::Error(at_node(
                b"ERR a node's SHARD.HOTKEYS LOCAL reply is not a list of [key, frequency]",
                &r.node,
            )));
        };
        all.extend(
            pairs
                .into_iter()
                .filter(|(key, _)| owns(&r.node, key))
                .map(|(key, freq)| HotKey {
                    key,
                    freq,
                    node: r.node.clone(),
                }),
        );
    }
    all.sort_by(|a, b| {
        b.freq
            .cmp(&a.freq)
            .then_with(|| a.key.cmp(&b.key))
            .then_with(|| a.node.cmp(&b.node))
    });
    let mut seen = std::collections::HashSet::new();
    all.retain(|h| seen.insert(h.key.clone()));
    all.truncate(count);
    Ok(all)
}

/// The client's reply to `SHARD.HOTKEYS`: `[[key, freq, node] ...]`, hottest first (an array
/// under RESP3 too: the order is the answer, as `ZRANGE ... WITHSCORES` keeps it).
pub fn hot_reply(hot: Vec<HotKey>) -> Resp {
    Resp::Array(
        hot.into_iter()
            .map(|h| {
                Resp::Array(vec![
                    Resp::Bulk(h.key),
                    Resp::Int(i64::try_from(h.freq).unwrap_or(i64::MAX)),
                    Resp::Bulk(h.node.into_bytes()),
                ])
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(node: &str, reply: Resp) -> NodeReply {
        NodeReply {
            node: node.into(),
            reply,
        }
    }

    #[test]
    fn the_commands_answered_for_the_fleet() {
        assert_eq!(of(b"DBSIZE", None), Some(Keyless::Sum));
        assert_eq!(of(b"keys", Some(b"*")), Some(Keyless::Keys));
        assert_eq!(of(b"Scan", Some(b"0")), Some(Keyless::Scan));
        assert_eq!(of(b"flushall", Some(b"ASYNC")), Some(Keyless::AllSucceeded));
        assert_eq!(of(b"script", Some(b"LOAD")), Some(Keyless::AllSucceeded));
        assert_eq!(of(b"script", Some(b"exists")), Some(Keyless::LogicalAnd));
        assert_eq!(of(b"script", Some(b"kill")), None);
        assert_eq!(of(b"function", Some(b"list")), None);
        assert_eq!(
            of(b"function", Some(b"restore")),
            Some(Keyless::AllSucceeded)
        );
        assert_eq!(of(b"publish", Some(b"ch")), Some(Keyless::Publish));
        assert_eq!(of(b"SPUBLISH", Some(b"ch")), Some(Keyless::Publish));
        assert!(subscribes(b"SSUBSCRIBE") && subscribes(b"psubscribe"));
        assert!(!subscribes(b"publish") && !subscribes(b"pubsub"));
        for local in [
            &b"ping"[..],
            b"info",
            b"config",
            b"client",
            b"time",
            b"echo",
        ] {
            assert_eq!(of(local, None), None);
        }
        assert!(runs_here(b"PING", None) && runs_here(b"eval", Some(b"return 1")));
        assert!(runs_here(b"FUNCTION", Some(b"LIST")));
        for refused in [
            &b"client"[..],
            b"config",
            b"shutdown",
            b"debug",
            b"swapdb",
            b"select",
        ] {
            assert!(!runs_here(refused, Some(b"kill")));
        }
        assert!(!runs_here(b"function", Some(b"kill")) && !runs_here(b"script", Some(b"kill")));
    }

    #[test]
    fn sums_and_errors_name_their_node() {
        let r = sum(&[reply("n0", Resp::Int(3)), reply("n1", Resp::Int(4))]);
        assert_eq!(r, Resp::Int(7));
        let r = sum(&[
            reply("n0", Resp::Int(3)),
            reply("n1", Resp::Error(b"ERR boom".to_vec())),
        ]);
        assert_eq!(r, Resp::Error(b"ERR boom (at node n1)".to_vec()));
        assert!(sum(&[reply("n0", Resp::Null)]).is_error());
        assert_eq!(sum(&[]), Resp::Int(0));
    }

    #[test]
    fn all_succeeded_is_the_first_reply() {
        let ok = || Resp::Simple(b"OK".to_vec());
        assert_eq!(
            all_succeeded(vec![
                reply("n0", Resp::Bulk(b"sha".to_vec())),
                reply("n1", ok())
            ]),
            Resp::Bulk(b"sha".to_vec())
        );
        let r = all_succeeded(vec![
            reply("n0", ok()),
            reply("n2", Resp::Error(b"NOSCRIPT x".to_vec())),
        ]);
        assert_eq!(r, Resp::Error(b"NOSCRIPT x (at node n2)".to_vec()));
    }

    #[test]
    fn logical_and_element_by_element() {
        let a = reply(
            "n0",
            Resp::Array(vec![Resp::Int(1), Resp::Int(1), Resp::Int(0)]),
        );
        let b = reply(
            "n1",
            Resp::Array(vec![Resp::Int(1), Resp::Int(0), Resp::Int(1)]),
        );
        assert_eq!(
            logical_and(&[a, b]),
            Resp::Array(vec![Resp::Int(1), Resp::Int(0), Resp::Int(0)])
        );
        let short = reply("n1", Resp::Array(vec![Resp::Int(1)]));
        let a = reply("n0", Resp::Array(vec![Resp::Int(1), Resp::Int(1)]));
        assert!(logical_and(&[a, short]).is_error());
    }

    #[test]
    fn keys_union_filtered_and_once() {
        let bulk = |s: &str| Resp::Bulk(s.as_bytes().to_vec());
        let r = union_keys(
            vec![
                reply("n0", Resp::Array(vec![bulk("a"), bulk("b"), bulk("stray")])),
                reply("n1", Resp::Array(vec![bulk("b"), bulk("c")])),
            ],
            |_, k| k != b"stray",
        );
        assert_eq!(r, Resp::Array(vec![bulk("a"), bulk("b"), bulk("c")]));
    }

    #[test]
    fn randomkey_node_by_share() {
        assert_eq!(weighted_pick(&[0, 0], 0), None);
        assert_eq!(weighted_pick(&[2, 0, 3], 0), Some(0));
        assert_eq!(weighted_pick(&[2, 0, 3], 1), Some(0));
        assert_eq!(weighted_pick(&[2, 0, 3], 2), Some(2));
        assert_eq!(weighted_pick(&[2, 0, 3], 4), Some(2));
        assert_eq!(weighted_pick(&[2, 0, 3], 5), None);
    }
}
