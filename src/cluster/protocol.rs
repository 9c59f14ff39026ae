//! The cluster protocol on a fleet of plain servers (`shard.cluster-protocol yes`): every Redis
//! Cluster client library can then route itself over the fleet.
//!
//! - The command filter turns `CLUSTER ...`, `READONLY`, `READWRITE` and `ASKING` into
//!   `SHARD.CLUSTER ...`, answered from the `slots` ring (`cluster_view`).
//! - A keyed command whose keys are in a slot this node owns, with no resharding step pending
//!   for it, passes untouched: the server runs it as always. Any other keyed command becomes
//!   `SHARD.REDIRECT command ...`, whose handler has the context the filter lacks (who sent
//!   it, whether the key is here) and replies `-MOVED slot host:port`, `-ASK slot host:port`
//!   or `-CROSSSLOT`, or runs it here: for the primary's replication stream, the AOF, the
//!   module's own connections between nodes, an `ASKING` client at the previous owner, or a
//!   key the current owner already holds. A write of a key not yet copied in a resharding is
//!   made safe by SHARD.CALL's copy-before-write plan.
//! - Keyless commands and the module's own commands are never redirected, and a replica
//!   redirects nothing (it runs what its primary sends it).
//! - Inside `MULTI`, a command that must leave is refused when it is queued, so `EXEC` aborts
//!   and nothing of the transaction runs: the filter replaces it by an unknown command named
//!   after the redirect (`MOVED slot host:port`), the only queue-time refusal whose text a
//!   module can choose. This needs the filter to know the client (Valkey, Redis 7.2+).
//!
//! Redis 7.0's command filters cannot tell which client sent a command: there, a redirected
//! command in `MULTI` is refused only when `EXEC` runs it, and the `ASKING` flag is kept per
//! client by `SHARD.CLUSTER ASKING` and used by that client's next redirected command (not by
//! its next command of any kind, as in cluster mode).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use redis_module::{raw, ContextFlags};

use crate::cluster::replies::ClusterView;
use crate::commands::{Call, CmdError, CmdResult};
use crate::net::resp::ReplyResp;
use crate::net::resp::Resp;
use crate::ring::placement::Placement;
use crate::ring::{key_slot, HashTag};
use crate::route::command_table;
use crate::state;
use crate::state::Config;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Client ids of the module's own connections from other nodes, and of clients that sent
/// `ASKING` and have not used it yet.
static INTERNAL: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
static ASKING: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the protocol is on (and so the filter must look at every command).
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A ring cluster clients can follow: 16384 slots, CRC16, Redis Cluster's hash tags.
pub fn eligible(p: &Placement) -> bool {
    p.ring
        .as_ref()
        .is_some_and(|r| r.slot_ranges().is_some() && r.spec().hashtag == HashTag::Cluster)
}

/// Checks `cluster-protocol` against the current ring (`None`: at load, before any ring).
pub fn check_config(next: &Config, current: Option<&Placement>) -> Result<(), String> {
    match next.cluster_protocol.as_str() {
        "no" => Ok(()),
        "yes" => match current {
            Some(p) if eligible(p) => Ok(()),
            _ => Err("cluster-protocol yes needs a current ring of the slots algo with the cluster hash-tag rule (SHARD.RING SET slots name host:port weight ...)".into()),
        },
        other => Err(format!("cluster-protocol is yes or no, not '{other}'")),
    }
}

/// Refuses a ring change that would leave the protocol on over a ring clients cannot follow.
pub fn check_ring_change(call: &Call, next_current: &Placement) -> CmdResult {
    let replicated = call.ctx.get_flags().contains(ContextFlags::REPLICATED);
    if enabled() && !replicated && !eligible(next_current) {
        return Err(CmdError::err(
            "cluster-protocol is yes: the current ring must stay a slots ring with the cluster hash-tag rule; CONFIG SET shard.cluster-protocol no first",
        ));
    }
    Ok(())
}

/// What the filter does with a command while the protocol is on.
pub enum Rewrite {
    None,
    /// `CLUSTER sub ...` → `SHARD.CLUSTER sub ...`.
    Cluster,
    /// `READONLY` → `SHARD.CLUSTER READONLY` (and READWRITE, ASKING).
    Connection,
    /// Anything that needs the redirect handler: `SHARD.REDIRECT command ...`, or inside
    /// `MULTI` a refusal when the command is queued (`Leave::refusal`).
    Redirect(Leave),
}

/// Why a command cannot run on this node as it is.
#[derive(Debug)]
pub enum Leave {
    /// Its slot is another node's: `MOVED slot host:port`.
    Moved { slot: u16, to: NodeOf },
    /// Its keys are in several slots.
    CrossSlot,
    /// Its slot is being moved here and not every key has arrived: `ASK slot host:port` of
    /// the previous owner.
    Arriving { slot: u16, from: NodeOf },
    /// A key the filter could not read.
    Unreadable,
}

/// A node of a ring, named by its index: its address is written out only if a refusal needs
/// it (the filter's usual answer, a redirect, does not).
#[derive(Debug)]
pub struct NodeOf {
    placement: Arc<Placement>,
    index: usize,
}

/// `host:port` of a node as a redirect names it: Sentinel's address now for a `sentinel` node.
fn address_in_use(n: &crate::ring::NodeSpec) -> String {
    let at = crate::topology::nodes::endpoint_of(n, "");
    format!("{}:{}", at.host, at.port)
}

impl std::fmt::Display for NodeOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.placement.spec.nodes.get(self.index) {
            Some(n) => f.write_str(&address_in_use(n)),
            None => f.write_str("?"),
        }
    }
}

impl Leave {
    /// The name of the unknown command the filter puts in place of a command that must leave
    /// inside `MULTI`: the server refuses it when it is queued (`ERR unknown command '...'`),
    /// and `EXEC` then aborts, as cluster mode's `MOVED` at queue time does.
    pub fn refusal(&self) -> String {
        match self {
            Leave::Moved { slot, to } => format!("MOVED {slot} {to}"),
            Leave::CrossSlot => "CROSSSLOT Keys in request don't hash to the same slot".into(),
            Leave::Arriving { slot, from } => format!("ASK {slot} {from}"),
            Leave::Unreadable => "TRYAGAIN a key of the command could not be read".into(),
        }
    }
}

/// What the filter can ask the server about the command it holds.
pub trait FilterEnv<'a> {
    /// The `i`-th argument (0 is the command's name).
    fn arg(&self, i: usize) -> Option<&'a [u8]>;
    /// The key positions the server's key specs give, for a command whose keys move with its
    /// arguments (`EVAL`'s numkeys, `XREAD`'s `STREAMS`); `None` when the server finds none or
    /// refuses the arguments (it then replies to the command itself).
    fn movable_keys(&self) -> Option<Vec<usize>>;
    /// Whether the key at position `pos` is in this node's database 0.
    fn exists(&self, pos: usize) -> bool;
    /// Whether this server is a replica.
    fn is_replica(&self) -> bool;
    /// Whether the client that sent the command is inside `MULTI` (always `false` on Redis
    /// 7.0, whose command filters cannot tell which client sent a command).
    fn in_transaction(&self) -> bool;
}

/// The filter's decision for a command of `argc` arguments.
///
/// A command that must leave this node is `Redirect`: the filter makes it `SHARD.REDIRECT`, or
/// inside `MULTI` an unknown command named after the redirect (`Leave::refusal`), which the
/// server refuses when it is queued so that `EXEC` aborts. Keys of this node, including keys
/// a resharding has already brought here, pass untouched and queue as always. A replica
/// redirects nothing: it runs what its primary sends it, `MULTI` blocks included.
pub fn decide<'a>(argc: usize, env: &impl FilterEnv<'a>) -> Rewrite {
    let Some(name) = env.arg(0) else {
        return Rewrite::None;
    };
    if name.eq_ignore_ascii_case(b"cluster") {
        return Rewrite::Cluster;
    }
    if name.eq_ignore_ascii_case(b"readonly")
        || name.eq_ignore_ascii_case(b"readwrite")
        || name.eq_ignore_ascii_case(b"asking")
    {
        return Rewrite::Connection;
    }
    if name.len() > 6 && name[..6].eq_ignore_ascii_case(b"shard.") {
        return Rewrite::None;
    }
    let Some(meta) = command_table::known(name) else {
        return Rewrite::None;
    };
    let here = match meta.fixed_keys(argc) {
        Some(range) => runs_here(range, env),
        None if meta.movable => match env.movable_keys() {
            Some(keys) => runs_here(keys.into_iter(), env),
            None => return Rewrite::None,
        },
        None => return Rewrite::None,
    };
    match here {
        Err(leave) if !env.is_replica() => Rewrite::Redirect(leave),
        _ => Rewrite::None,
    }
}

/// `Ok` when the keys at `positions` are in one slot this node owns, with no resharding step
/// pending for it or with every key brought here already (or there is no key).
fn runs_here<'a>(
    positions: impl Iterator<Item = usize> + Clone,
    env: &impl FilterEnv<'a>,
) -> Result<(), Leave> {
    let arriving = {
        let st = state::lock();
        let Some(current) = st.rings.current.as_ref() else {
            return Ok(());
        };
        let Some(ring) = current.ring.as_ref().filter(|_| eligible(current)) else {
            return Ok(());
        };
        let self_name = st.config.ring.self_name.as_str();
        let previous = st.rings.previous.as_ref();
        let mut slot = None;
        let mut arriving = None;
        for pos in positions.clone() {
            let Some(key) = env.arg(pos) else {
                return Err(Leave::Unreadable);
            };
            let s = key_slot(key);
            if slot.is_some_and(|x| x != s) {
                return Err(Leave::CrossSlot);
            }
            if slot.is_none() {
                let index = ring.owner(key);
                let Some(owner) = ring.spec().nodes.get(index) else {
                    return Ok(());
                };
                if owner.name != self_name {
                    let to = NodeOf {
                        placement: Arc::clone(current),
                        index,
                    };
                    return Err(Leave::Moved { slot: s, to });
                }
                arriving = previous.and_then(|p| {
                    let index = p.ring.as_ref()?.owner(key);
                    (p.spec.nodes.get(index)?.name != owner.name).then(|| {
                        let from = NodeOf {
                            placement: Arc::clone(p),
                            index,
                        };
                        (s, from)
                    })
                });
            }
            slot = Some(s);
        }
        arriving
    };
    // The state lock is released: looking a key up may expire it.
    match arriving {
        Some((slot, from)) if !positions.into_iter().all(|p| env.exists(p)) => {
            Err(Leave::Arriving { slot, from })
        }
        _ => Ok(()),
    }
}

/// The view of the current ring, for SHARD.CLUSTER.
fn view() -> Result<ClusterView, CmdError> {
    let st = state::lock();
    let current = st
        .rings
        .current
        .as_ref()
        .filter(|p| eligible(p))
        .ok_or_else(|| CmdError::err("cluster-protocol needs a slots ring"))?;
    let ring = current
        .ring
        .as_ref()
        .ok_or_else(|| CmdError::err("cluster-protocol needs a slots ring"))?;
    ClusterView::of(ring, &st.config.ring.self_name, st.rings.epoch)
        .ok_or_else(|| CmdError::err("cluster-protocol needs a slots ring"))
}

fn client_id(call: &Call) -> u64 {
    // SAFETY: the context of this call.
    unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(call.ctx.ctx)) }
}

fn mark(set: &Mutex<Option<HashSet<u64>>>, id: u64) {
    set.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get_or_insert_with(HashSet::new)
        .insert(id);
}

fn take(set: &Mutex<Option<HashSet<u64>>>, id: u64) -> bool {
    set.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_mut()
        .is_some_and(|s| s.remove(&id))
}

fn contains(set: &Mutex<Option<HashSet<u64>>>, id: u64) -> bool {
    set.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .is_some_and(|s| s.contains(&id))
}

/// `SHARD.CLUSTER sub ...`: what a cluster node answers to `CLUSTER sub ...`, `READONLY`,
/// `READWRITE` and `ASKING`.
pub fn cluster(call: &Call) -> CmdResult {
    let args = &call.args;
    if args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.cluster"));
    }
    let sub = String::from_utf8_lossy(args.get(1)).to_ascii_lowercase();
    let reply = call.reply;
    match sub.as_str() {
        // The module's own connections say who they are; they are never redirected.
        "internal" => {
            mark(&INTERNAL, client_id(call));
            reply.ok();
        }
        "asking" => {
            mark(&ASKING, client_id(call));
            reply.ok();
        }
        "readonly" | "readwrite" => reply.ok(),
        "keyslot" if args.len() == 3 => reply.int(i64::from(key_slot(args.get(2)))),
        "myid" => reply.bulk(view()?.myself().map_or("", |n| n.id.as_str()).as_bytes()),
        "slots" => reply.resp(&view()?.slots()),
        "shards" => reply.resp(&view()?.shards()),
        // Verbatim text under RESP3, a bulk string under RESP2, as cluster mode replies.
        "nodes" => reply.resp(&Resp::Verbatim(*b"txt", view()?.nodes_text().into_bytes())),
        "info" => reply.resp(&Resp::Verbatim(*b"txt", view()?.info_text().into_bytes())),
        "countkeysinslot" if args.len() == 3 => {
            let slot = slot_arg(args.get(2))?;
            reply.int(
                i64::try_from(keys_in_slot(call, slot, usize::MAX)?.len()).unwrap_or(i64::MAX),
            );
        }
        "getkeysinslot" if args.len() == 4 => {
            let slot = slot_arg(args.get(2))?;
            let count = std::str::from_utf8(args.get(3))
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .ok_or_else(|| CmdError::err("Invalid number of keys"))?;
            let keys = keys_in_slot(call, slot, count)?;
            reply.array(keys.len());
            for k in keys {
                reply.bulk(&k);
            }
        }
        _ => {
            return Err(CmdError::err(format!(
                "unknown subcommand or wrong number of arguments for '{sub}'. Try CLUSTER HELP."
            )))
        }
    }
    Ok(())
}

fn slot_arg(arg: &[u8]) -> Result<u16, CmdError> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|s| *s < 16384)
        .ok_or_else(|| CmdError::err("Invalid or out of range slot"))
}

/// Keys of database 0 in `slot` (up to `max`): a plain server keeps no index by slot, so this
/// walks the keyspace (`SCAN`): O(N), like `KEYS`.
fn keys_in_slot(call: &Call, slot: u16, max: usize) -> Result<Vec<Vec<u8>>, CmdError> {
    let mut out = Vec::new();
    let mut cursor = "0".to_string();
    loop {
        let reply = call
            .ctx
            .call("SCAN", &[cursor.as_str(), "COUNT", "1000"])
            .map_err(|e| CmdError::err(format!("SCAN failed: {e}")))?;
        let redis_module::RedisValue::Array(parts) = reply else {
            return Err(CmdError::err("SCAN replied something else"));
        };
        let mut parts = parts.into_iter();
        cursor = match parts.next() {
            Some(redis_module::RedisValue::BulkString(s)) => s,
            Some(redis_module::RedisValue::SimpleString(s)) => s,
            Some(redis_module::RedisValue::BulkRedisString(s)) => s.to_string_lossy(),
            _ => return Err(CmdError::err("SCAN replied no cursor")),
        };
        if let Some(redis_module::RedisValue::Array(keys)) = parts.next() {
            for k in keys {
                let bytes = match k {
                    redis_module::RedisValue::BulkRedisString(s) => s.as_slice().to_vec(),
                    redis_module::RedisValue::StringBuffer(b) => b,
                    redis_module::RedisValue::BulkString(s) => s.into_bytes(),
                    _ => continue,
                };
                if key_slot(&bytes) == slot && out.len() < max {
                    out.push(bytes);
                }
            }
        }
        if cursor == "0" || out.len() >= max {
            return Ok(out);
        }
    }
}

/// `SHARD.REDIRECT command arg ...`: a keyed command the filter could not let through.
pub fn redirect(call: &Call) -> CmdResult {
    let args = &call.args;
    if args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.redirect"));
    }
    let flags = call.ctx.get_flags();
    let id = client_id(call);
    let obey = flags.contains(ContextFlags::REPLICATED)
        || flags.contains(ContextFlags::LOADING)
        || contains(&INTERNAL, id);
    if obey {
        return run_here(call);
    }
    let asking = take(&ASKING, id);
    let positions = crate::commands::call::key_positions(call)?;
    let keys: Vec<&[u8]> = positions.iter().map(|&p| args.get(p + 1)).collect();
    let Some(first) = keys.first() else {
        return run_here(call);
    };
    let slot = key_slot(first);
    if keys.iter().any(|k| key_slot(k) != slot) {
        return Err(CmdError::code(
            "CROSSSLOT",
            "Keys in request don't hash to the same slot",
        ));
    }
    let (current, previous, previous_in_map, self_name, returning) = {
        let st = state::lock();
        let owner = |p: &Placement| {
            p.ring
                .as_ref()
                .and_then(|r| r.spec().nodes.get(r.owner(first)).cloned())
        };
        let current = st.rings.current.as_deref().and_then(owner);
        let previous = st.rings.previous.as_deref().and_then(owner);
        // Whether clients can reach the previous owner from the map (a node that is leaving
        // the fleet is not in it).
        let in_map = previous.as_ref().is_some_and(|p| {
            st.rings
                .current
                .as_ref()
                .is_some_and(|c| c.spec.node_index(&p.name).is_some())
        });
        (
            current,
            previous,
            in_map,
            st.config.ring.self_name.clone(),
            st.rings.returning,
        )
    };
    let Some(current) = current else {
        return run_here(call);
    };
    let previous = previous.filter(|p| p.name != current.name);
    if returning && previous.is_some() {
        // A cancelled resharding brings this slot's keys back (`commands::call`): clients
        // retry on TRYAGAIN, as during a cluster's multi-key migration.
        return Err(CmdError::code(
            "TRYAGAIN",
            "a cancelled resharding is bringing this slot's keys back to their owner: retry in a moment",
        ));
    }
    if current.name != self_name {
        // A read of a key still at its previous owner, asked for after an ASK.
        let readonly = command_table::known(args.get(1)).is_some_and(|m| m.readonly);
        if asking && readonly && previous.as_ref().is_some_and(|p| p.name == self_name) {
            return run_here(call);
        }
        return Err(CmdError::code(
            "MOVED",
            format!("{slot} {}", address_in_use(&current)),
        ));
    }
    let Some(previous) = previous else {
        return run_here(call);
    };
    // This node is the new owner of a slot being moved here. It holds the key already, or
    // this is the copy arriving (MIGRATE's RESTORE from the previous owner).
    let name = args.get(1);
    let restore =
        name.eq_ignore_ascii_case(b"restore") || name.eq_ignore_ascii_case(b"restore-asking");
    if restore || keys.iter().all(|k| exists(call, k)) {
        return run_here(call);
    }
    let readonly = command_table::known(args.get(1)).is_some_and(|m| m.readonly);
    if readonly && previous_in_map {
        return Err(CmdError::code(
            "ASK",
            format!("{slot} {}", address_in_use(&previous)),
        ));
    }
    // A write of a key not copied yet: SHARD.CALL's copy-before-write, then the write here. A
    // read of a key still at a node that is leaving the fleet (not in the map, so cluster
    // clients cannot follow an ASK there): SHARD.CALL's fallback reads it there for them.
    crate::commands::call::call(call)
}

fn exists(call: &Call, key: &[u8]) -> bool {
    let key = call.ctx.create_string(key);
    matches!(
        call.ctx.call("EXISTS", &[&key]),
        Ok(redis_module::RedisValue::Integer(1))
    )
}

/// Runs the redirected command itself here, as the calling user, replicated like itself (the
/// arguments after `SHARD.REDIRECT` are laid out as after `SHARD.CALL`).
fn run_here(call: &Call) -> CmdResult {
    crate::commands::call::call_here(call, call.args.get(1))
}
