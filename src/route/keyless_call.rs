//! Keyless commands answered for the fleet, carried out (`keyless` says which and how their
//! replies merge): the nodes of this server's rings (the current ring's, and the previous
//! one's while a resharding is open), each asked over the module's connections in the
//! client's database and protocol, this node's part run here as the calling user; the client
//! blocked until every node answered, then given the merged reply. `SCAN` asks one node per
//! step (`scan_cursor`). `SHARD.HOTKEYS` asks every node for its own hottest keys, this node's
//! sampled here in steps (`hot_sample`) while the others answer.

use std::sync::Arc;

use crate::host::acl;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::net::endpoint::Endpoint;
use crate::net::pool::Link;
use crate::net::resp::{ReplyResp, Resp};
use crate::ring::placement::{Mark, Placement};
use crate::route::forward::{self, CallReply, NetSteps};
use crate::route::hot_sample;
use crate::route::keyless::{self, Keyless, NodeReply};
use crate::route::scan_cursor::{self, Cursor};
use crate::route::stats;
use crate::state;

/// The nodes a keyless command goes to, sorted by name, and what places keys on them.
struct Walk {
    nodes: Vec<Endpoint>,
    current: Arc<Placement>,
    previous: Option<Arc<Placement>>,
    epoch: u16,
    link: Link,
}

impl Walk {
    fn of(call: &Call) -> Result<Walk, CmdError> {
        let st = state::lock();
        let current = Arc::clone(st.current_ring()?);
        if current.ring.is_none() {
            return Err(CmdError::err(
                "keyless commands are answered for the fleet on a ring of shard's own; with the cluster algo use a cluster client",
            ));
        }
        let previous = st.rings.previous.clone();
        let self_name = st.config.ring.self_name.as_str();
        let mut specs: Vec<&crate::ring::NodeSpec> = current.spec.nodes.iter().collect();
        if let Some(p) = &previous {
            specs.extend(p.spec.nodes.iter());
        }
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        specs.dedup_by(|a, b| a.name == b.name);
        if specs.len() > scan_cursor::MAX_NODES {
            return Err(CmdError::err(format!(
                "the rings name {} nodes: keyless commands are answered for at most {}",
                specs.len(),
                scan_cursor::MAX_NODES
            )));
        }
        let nodes = specs
            .into_iter()
            .map(|n| crate::topology::nodes::endpoint_of(n, self_name))
            .collect();
        let mark = match st.rings.mark() {
            Mark::Open => 0,
            Mark::Returning => 1,
            Mark::Fence => 2,
            Mark::Settled => 3,
        };
        let epoch = scan_cursor::epoch_of(
            &current.digest,
            previous.as_ref().map(|p| p.digest.as_str()),
            mark,
        );
        let link = crate::route::call::link_for(call, &st);
        drop(st);
        Ok(Walk {
            nodes,
            current,
            previous,
            epoch,
            link,
        })
    }

    /// This node's place in the walk, if its rings name it.
    fn self_at(&self) -> Option<usize> {
        self.nodes.iter().position(|n| n.is_self)
    }

    /// This node's part of a command every node runs: its reply, run here now as the calling
    /// user, with its place in the walk (none when the rings do not name this node).
    fn run_here(&self, call: &Call, args: &[Vec<u8>]) -> Result<Vec<(usize, Resp)>, CmdError> {
        self.self_at()
            .map(|i| Ok((i, crate::route::call::run_here(call, args)?)))
            .into_iter()
            .collect()
    }

    /// Whether the rings place `key` at the node `name` (now, or before the open resharding).
    fn owns(&self, name: &str, key: &[u8]) -> bool {
        let at = |p: &Placement| {
            p.ring
                .as_ref()
                .is_some_and(|r| r.owner_spec(key).name == name)
        };
        at(&self.current) || self.previous.as_deref().is_some_and(at)
    }
}

/// Answers the keyless command the call carries from argument `start` on, for the fleet.
pub fn route(call: &Call, start: usize, kind: Keyless) -> CmdResult {
    let name_text = crate::host::args::printable(call.args.get(start)).to_ascii_lowercase();
    acl::check_caller(call, start, &name_text)?;
    if crate::route::gate::closed() {
        return Err(crate::route::gate::refusal());
    }
    let walk = Walk::of(call)?;
    let args: Vec<Vec<u8>> = (start..call.args.len())
        .map(|i| call.args.get(i).to_vec())
        .collect();
    match kind {
        Keyless::Scan => scan(call, walk, args),
        Keyless::RandomKey => random_key(call, walk),
        _ => every_node(call, walk, args, kind),
    }
}

/// Runs `args` at every node (this one's part here, now) and merges the replies by `kind`.
fn every_node(call: &Call, walk: Walk, args: Vec<Vec<u8>>, kind: Keyless) -> CmdResult {
    let here = walk.run_here(call, &args)?;
    let link = walk.link.clone();
    forward::run(call, link, move |steps| async move {
        let replies = match ask_all(&steps, &walk.nodes, &args, here).await {
            Ok(r) => r,
            Err(e) => return e,
        };
        stats::count(|s| s.forwarded += 1);
        CallReply::Reply(match kind {
            Keyless::Sum | Keyless::Publish => keyless::sum(&replies),
            Keyless::Keys => keyless::union_keys(replies, |n, k| walk.owns(n, k)),
            Keyless::LogicalAnd => keyless::logical_and(&replies),
            _ => keyless::all_succeeded(replies),
        })
    })
    .map_err(CmdError::err)
}

/// Every node's reply to `args` (the ones run here given), in the walk's order.
async fn ask_all(
    steps: &NetSteps,
    nodes: &[Endpoint],
    args: &[Vec<u8>],
    here: Vec<(usize, Resp)>,
) -> Result<Vec<NodeReply>, CallReply> {
    let here = here
        .into_iter()
        .map(|(i, reply)| (i, futures_util::future::ready(reply)))
        .collect();
    ask_all_with(steps, nodes, args, here).await
}

/// `ask_all`, this node's part a future of its own, run alongside the others' requests.
async fn ask_all_with<H: std::future::Future<Output = Resp>>(
    steps: &NetSteps,
    nodes: &[Endpoint],
    args: &[Vec<u8>],
    here: Vec<(usize, H)>,
) -> Result<Vec<NodeReply>, CallReply> {
    use futures_util::FutureExt;
    let mut here = here.into_iter().peekable();
    let mut pending = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        match here.next_if(|(at, _)| *at == i) {
            Some((_, reply)) => pending.push(futures_util::future::Either::Left(reply.map(Ok))),
            None => pending.push(futures_util::future::Either::Right(steps.send(node, args))),
        }
    }
    let outcomes = futures_util::future::join_all(pending).await;
    let mut replies = Vec::with_capacity(outcomes.len());
    for (node, outcome) in nodes.iter().zip(outcomes) {
        match outcome {
            Ok(reply) => replies.push(NodeReply {
                node: node.name.clone(),
                reply,
            }),
            Err(e) => return Err(CallReply::failed(&e)),
        }
    }
    Ok(replies)
}

/// `SHARD.HOTKEYS [COUNT n] [SAMPLES m]`: every node's own top `count` (`SHARD.HOTKEYS LOCAL
/// COUNT n SAMPLES m` at the others, this node's sampled here alongside), merged into the
/// fleet's (`keyless::hot_keys`). This node's policy is checked first, so a fleet that keeps no
/// counters is refused at once; another node's refusal is the reply, naming that node.
pub fn hot_keys(call: &Call, count: usize, samples: u64) -> CmdResult {
    let walk = Walk::of(call)?;
    if walk.self_at().is_some() {
        hot_sample::check_policy()?;
    }
    let args: Vec<Vec<u8>> = [
        &b"SHARD.HOTKEYS"[..],
        b"LOCAL",
        b"COUNT",
        count.to_string().as_bytes(),
        b"SAMPLES",
        samples.to_string().as_bytes(),
    ]
    .iter()
    .map(|a| a.to_vec())
    .collect();
    let db = i32::try_from(walk.link.db).unwrap_or(0);
    let limit = hot_sample::Limit::of(samples);
    forward::run(call, walk.link.clone(), move |steps| async move {
        let here: Vec<_> = walk
            .self_at()
            .map(|i| {
                let steps = steps.clone();
                (i, async move {
                    match hot_sample::sample(&steps, db, count, limit).await {
                        Ok(top) => hot_sample::local_reply(top),
                        Err(e) => Resp::Error(e.into_bytes()),
                    }
                })
            })
            .into_iter()
            .collect();
        let replies = match ask_all_with(&steps, &walk.nodes, &args, here).await {
            Ok(r) => r,
            Err(e) => return e,
        };
        stats::count(|s| s.forwarded += 1);
        CallReply::Reply(
            match keyless::hot_keys(replies, |n, k| walk.owns(n, k), count) {
                Ok(hot) => keyless::hot_reply(hot),
                Err(e) => e,
            },
        )
    })
    .map_err(CmdError::err)
}

/// `RANDOMKEY`: every node's `DBSIZE`, then a key of the node the draw falls on.
fn random_key(call: &Call, walk: Walk) -> CmdResult {
    let dbsize = vec![b"DBSIZE".to_vec()];
    let random = vec![b"RANDOMKEY".to_vec()];
    let here = walk.run_here(call, &dbsize)?;
    let draw = draw();
    let self_at = walk.self_at();
    // This node's key, drawn now in case the draw falls here (no context once blocked).
    let random_here = match self_at {
        Some(_) => Some(crate::route::call::run_here(call, &random)?),
        None => None,
    };
    forward::run(call, walk.link.clone(), move |steps| async move {
        let counts = match ask_all(&steps, &walk.nodes, &dbsize, here).await {
            Ok(r) => r,
            Err(e) => return e,
        };
        let sizes: Vec<u64> = counts
            .iter()
            .map(|r| {
                r.reply
                    .as_int()
                    .and_then(|n| u64::try_from(n).ok())
                    .unwrap_or(0)
            })
            .collect();
        let total: u64 = sizes.iter().sum();
        let Some(at) = (total > 0)
            .then(|| keyless::weighted_pick(&sizes, draw % total))
            .flatten()
        else {
            return CallReply::Reply(Resp::Null);
        };
        if Some(at) == self_at {
            return CallReply::Reply(random_here.unwrap_or(Resp::Null));
        }
        match steps.send(&walk.nodes[at], &random).await {
            Ok(reply) => CallReply::Reply(reply),
            Err(e) => CallReply::failed(&e),
        }
    })
    .map_err(CmdError::err)
}

/// A random number for `RANDOMKEY`'s draw: from the OS (`getrandom`, one call per
/// `RANDOMKEY`); the clock's nanoseconds if that fails.
fn draw() -> u64 {
    use rand::TryRng;
    rand::rngs::SysRng.try_next_u64().unwrap_or_else(|_| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    })
}

/// `SCAN cursor [MATCH p] [COUNT n] [TYPE t]`: one step of the walk at the node the cursor
/// names, its keys kept where the rings place them there; when that node is done and fewer
/// keys than `COUNT` (10 by default) came, the same call goes on into the next nodes, so that
/// a small keyspace is walked in one call, as one server walks it.
fn scan(call: &Call, walk: Walk, args: Vec<Vec<u8>>) -> CmdResult {
    let Some(text) = args.get(1) else {
        return Err(CmdError::wrong_arity("scan"));
    };
    let client = scan_cursor::decode(text).map_err(|_| CmdError::err("invalid cursor"))?;
    let at = scan_cursor::step(client, walk.epoch, walk.nodes.len());
    if walk.nodes.is_empty() {
        call.reply.resp(&scan_reply(0, Vec::new()));
        return Ok(());
    }
    let count = scan_count(&args);
    let mut walked = Walked {
        at,
        next: 0,
        keys: Vec::new(),
    };
    let node = walk.nodes[at.node].clone();
    if node.is_self {
        // This node's part runs here at once; the call goes on only if it must.
        let reply = crate::route::call::run_here(call, &with_cursor(&args, at.inner))?;
        if let Err(e) = walked.take(&walk, &node, reply) {
            call.reply.resp(&e);
            return Ok(());
        }
        if !walked.goes_on(count) {
            call.reply.resp(&scan_reply(walked.next, walked.keys));
            return Ok(());
        }
    }
    forward::run(call, walk.link.clone(), move |steps| async move {
        loop {
            if walked.next != 0 || walked.keys.is_empty() {
                let node = walk.nodes[walked.at.node].clone();
                let reply = match steps
                    .send(&node, &with_cursor(&args, walked.at.inner))
                    .await
                {
                    Ok(reply) => reply,
                    Err(e) => return CallReply::failed(&e),
                };
                if let Err(e) = walked.take(&walk, &node, reply) {
                    return CallReply::Reply(e);
                }
            }
            if !walked.goes_on(count) {
                return CallReply::Reply(scan_reply(walked.next, walked.keys));
            }
        }
    })
    .map_err(CmdError::err)
}

/// Where a call's walk is: the step to run, the client's cursor after the last step run (0:
/// the walk is over, or nothing ran yet), the keys kept so far.
struct Walked {
    at: Cursor,
    next: u64,
    keys: Vec<Vec<u8>>,
}

impl Walked {
    /// Takes a node's reply to the step at `self.at`.
    fn take(&mut self, walk: &Walk, node: &Endpoint, reply: Resp) -> Result<(), Resp> {
        let (inner, keys) = scan_parts(node, reply)?;
        let next = scan_cursor::after(self.at, inner, walk.nodes.len()).ok_or_else(|| {
            Resp::Error(keyless::at_node(
                b"ERR the node's SCAN cursor is too large for the fleet's cursor",
                &node.name,
            ))
        })?;
        self.keys
            .extend(keys.into_iter().filter(|k| walk.owns(&node.name, k)));
        self.next = next;
        if next != 0 {
            if let Ok(Some(c)) = scan_cursor::decode(next.to_string().as_bytes()) {
                self.at = c;
            }
        }
        Ok(())
    }

    /// Whether the call goes on into the next node: the last node run is done (its next step
    /// is another node's first), the walk is not over, and fewer than `count` keys came.
    fn goes_on(&self, count: usize) -> bool {
        self.next != 0 && self.at.inner == 0 && self.keys.len() < count
    }
}

/// `SCAN`'s `COUNT` (10 when not given or not a number: the node refuses a bad one itself).
fn scan_count(args: &[Vec<u8>]) -> usize {
    args.windows(2)
        .skip(2)
        .find(|w| w[0].eq_ignore_ascii_case(b"count"))
        .and_then(|w| std::str::from_utf8(&w[1]).ok()?.parse().ok())
        .unwrap_or(10)
}

/// The arguments of a node's step: the client's, its cursor replaced by the node's.
fn with_cursor(args: &[Vec<u8>], inner: u64) -> Vec<Vec<u8>> {
    let mut out = args.to_vec();
    if let Some(c) = out.get_mut(1) {
        *c = inner.to_string().into_bytes();
    }
    out
}

/// A node's `SCAN` reply: its cursor and its keys, or the error for the client.
fn scan_parts(node: &Endpoint, reply: Resp) -> Result<(u64, Vec<Vec<u8>>), Resp> {
    let Resp::Array(mut parts) = reply else {
        return Err(match reply {
            Resp::Error(line) => Resp::Error(keyless::at_node(&line, &node.name)),
            _ => Resp::Error(keyless::at_node(
                b"ERR a node's SCAN reply is not a list",
                &node.name,
            )),
        });
    };
    let keys = parts.pop();
    let inner = parts.pop().and_then(|c| match c {
        Resp::Bulk(b) | Resp::Simple(b) => std::str::from_utf8(&b).ok()?.parse::<u64>().ok(),
        _ => None,
    });
    match (inner, keys.and_then(keyless::names)) {
        (Some(inner), Some(keys)) => Ok((inner, keys)),
        _ => Err(Resp::Error(keyless::at_node(
            b"ERR a node's SCAN reply is not a cursor and keys",
            &node.name,
        ))),
    }
}

fn scan_reply(cursor: u64, keys: Vec<Vec<u8>>) -> Resp {
    Resp::Array(vec![
        Resp::Bulk(cursor.to_string().into_bytes()),
        Resp::Array(keys.into_iter().map(Resp::Bulk).collect()),
    ])
}
