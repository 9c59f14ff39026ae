//! The cluster protocol's part of the module's command filter: its verdict on each command a
//! client sends while the protocol is on, and that verdict applied to the filtered command.
//!
//! - `CLUSTER ...`, `READONLY`, `READWRITE`, `ASKING`, and `INFO` where it shows the cluster
//!   section, become `SHARD.EMULATE command ...`, answered from the `slots` ring (INFO: the
//!   server's own, as a cluster node shows it) and authorised as the plain command (`auth`);
//!   where the filter cannot tell that the client has authenticated, `SHARD.CLUSTER ...` and
//!   `SHARD.INFO ...` instead, which the server checks as usual (or `INFO` stays its own).
//! - A keyed command whose keys are in a slot this node owns, with no resharding step pending
//!   for it (or with every key brought here already, or the resharding settled: its copies are
//!   done), passes untouched: the server runs it as always. A delete (`DEL`, `UNLINK`) of a
//!   slot being moved here does not, nor, until the resharding settles, any other write of it
//!   (`GETDEL`, `EXPIRE 0` or a pop may remove the key), outside `MULTI` and scripts (which
//!   cannot wait for it): the removal must reach the previous owner too, or that owner's copy
//!   would be read (or copied back) by a node that still falls back to it.
//!   Any other keyed command becomes `SHARD.REDIRECT command ...`, whose handler has
//!   the context the filter lacks (who sent it, whether the key is here; `redirect`).
//! - Keyless commands and the module's own commands are never redirected. `PUBLISH` on a
//!   primary becomes `SHARD.PLAIN PUBLISH ...`, published at every node of the ring, as Redis
//!   Cluster's bus delivers it to every node's subscribers (the module's own connections'
//!   `PUBLISH`, one node's part of it, is published there only); `SPUBLISH` too, wherever its
//!   channel's slot is, so that a shard subscriber whose channel a resharding moved still
//!   hears it.
//! - A key of this server's own `sentinel` node while Sentinel does not name this server as
//!   its primary (a restarted old primary, before Sentinel makes it a replica): `MOVED` to the
//!   primary Sentinel names, `TRYAGAIN` while it names none; never run here as the owner's.
//! - On a replica, its primary's replication stream and the module's own connections pass
//!   untouched, and so does a read of its shard's keys by a client that sent `READONLY`
//!   (cluster mode's replica reads). Every other keyed command goes to `SHARD.REDIRECT`, whose
//!   handler tells them apart where the filter cannot (on Redis 7.0 the filter never knows the
//!   client): `MOVED` to the primary for a client's write or a read without `READONLY`, the
//!   command run for the replication stream. Never refused when queued in `MULTI`: the
//!   stream's own transactions come that way.
//! - Inside `MULTI`, a command that must leave is refused when it is queued, so `EXEC` aborts
//!   and nothing of the transaction runs: the filter replaces it by an unknown command named
//!   after the redirect (`MOVED slot host:port`), the only queue-time refusal whose text a
//!   module can choose. This needs the filter to know the client (Valkey, Redis 7.2+).
//!
//! Redis 7.0's command filters cannot tell which client sent a command: there, a redirected
//! command in `MULTI` is refused only when `EXEC` runs it, and the `ASKING` flag is kept per
//! client by `SHARD.CLUSTER ASKING` and used by that client's next redirected command (not by
//! its next command of any kind, as in cluster mode).
//!
//! The verdict (`decide`) reads the command through `FilterEnv`, so that it can be driven
//! without a server.

use std::sync::Arc;

use crate::cluster::auth::{self, Emulated, Route};
use crate::cluster::clients;
use crate::cluster::protocol::{address_in_use, eligible, not_named};
use crate::host::filter::FilterArgs;
use crate::ring::key_slot;
use crate::ring::placement::Placement;
use crate::route::command_table;
use crate::route::steps::CommandKind;
use crate::state;

/// What the filter does with a command while the protocol is on.
pub enum Rewrite {
    None,
    /// `CLUSTER sub ...`, `READONLY` (and READWRITE, ASKING), `INFO` showing the cluster
    /// section: `SHARD.EMULATE command ...`, or the checked `SHARD.CLUSTER`/`SHARD.INFO`
    /// (`auth::route`).
    Emulate(Emulated),
    /// Anything that needs the redirect handler: `SHARD.REDIRECT command ...`, or inside
    /// `MULTI` a refusal when the command is queued (`Leave::refusal`).
    Redirect(Leave),
    /// On a replica, a command only the redirect handler can judge: `SHARD.REDIRECT command
    /// ...`, in `MULTI` too.
    Judge,
    /// `PUBLISH` on a primary: `SHARD.PLAIN PUBLISH ...`, which publishes at every node of the
    /// ring (Redis Cluster's bus carries a `PUBLISH` to every node's subscribers).
    Publish,
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
    /// Its slot is this server's own `sentinel` node's, and Sentinel does not name this server
    /// as that node's primary (`protocol::not_named`).
    NotNamed { slot: u16, node: NodeOf },
    /// A keyed command while this node's rings are unchecked (`route::gate`).
    Unchecked,
}

/// A node of a ring, named by its index: its address is written out only if a refusal needs
/// it (the filter's usual answer, a redirect, does not).
#[derive(Debug)]
pub struct NodeOf {
    placement: Arc<Placement>,
    index: usize,
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
            Leave::Unchecked => format!("TRYAGAIN {}", crate::route::gate::text()),
            Leave::NotNamed { slot, node } => match node.placement.spec.nodes.get(node.index) {
                Some(n) => {
                    let (code, text) = not_named(*slot, n);
                    format!("{code} {text}")
                }
                None => "TRYAGAIN this node is not the slot's primary".into(),
            },
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
    /// The id of the client that sent the command (`None` on Redis 7.0).
    fn client_id(&self) -> Option<u64>;
    /// Whether the client that sent the command is inside `MULTI` (always `false` on Redis
    /// 7.0, whose command filters cannot tell which client sent a command).
    fn in_transaction(&self) -> bool;
    /// Whether a script sent the command.
    fn in_script(&self) -> bool;
}

/// The filter's decision for a command of `argc` arguments.
///
/// A command that must leave this node is `Redirect`: the filter makes it `SHARD.REDIRECT`, or
/// inside `MULTI` an unknown command named after the redirect (`Leave::refusal`), which the
/// server refuses when it is queued so that `EXEC` aborts. Keys of this node, including keys
/// a resharding has already brought here, pass untouched and queue as always. On a replica,
/// what the filter cannot tell apart is the redirect handler's to judge (`on_replica`).
pub fn decide<'a>(argc: usize, env: &impl FilterEnv<'a>) -> Rewrite {
    let Some(name) = env.arg(0) else {
        return Rewrite::None;
    };
    if name.eq_ignore_ascii_case(b"cluster") {
        return Rewrite::Emulate(Emulated::Cluster);
    }
    if name.eq_ignore_ascii_case(b"readonly")
        || name.eq_ignore_ascii_case(b"readwrite")
        || name.eq_ignore_ascii_case(b"asking")
    {
        return Rewrite::Emulate(Emulated::Connection);
    }
    if name.eq_ignore_ascii_case(b"info") {
        let sections = (1..argc).map_while(|i| env.arg(i));
        return if crate::cluster::emulate::shows_cluster(sections) {
            Rewrite::Emulate(Emulated::Info)
        } else {
            Rewrite::None
        };
    }
    if name.len() > 6 && name[..6].eq_ignore_ascii_case(b"shard.") {
        return Rewrite::None;
    }
    if name.eq_ignore_ascii_case(b"publish") || name.eq_ignore_ascii_case(b"spublish") {
        // The module's own connections' PUBLISH is another node's, published here only. A
        // SPUBLISH too is published at every node: a shard subscriber stays at the node it
        // subscribed at when a resharding moves its channel (Redis Cluster would send it
        // SUNSUBSCRIBE; a module cannot end another client's subscription), and still hears it.
        let internal = env.client_id().is_some_and(clients::is_internal);
        return if env.is_replica() || internal || env.in_transaction() {
            Rewrite::None
        } else {
            Rewrite::Publish
        };
    }
    let Some(meta) = command_table::known(name) else {
        return Rewrite::None;
    };
    let kind = CommandKind::of(name, meta.readonly);
    match meta.fixed_keys(argc) {
        Some(range) => verdict(range, kind, env),
        None if meta.movable => match env.movable_keys() {
            Some(keys) => verdict(keys.into_iter(), kind, env),
            None => Rewrite::None,
        },
        None => Rewrite::None,
    }
}

/// The verdict on a keyed command whose keys are at `positions`.
fn verdict<'a>(
    positions: impl Iterator<Item = usize> + Clone,
    kind: CommandKind,
    env: &impl FilterEnv<'a>,
) -> Rewrite {
    if env.is_replica() {
        return on_replica(positions, kind == CommandKind::Read, env);
    }
    // Rings unchecked after a load or a promotion (`route::gate`): the redirect handler
    // refuses the command, a read as a write (its slot's owner by them may be out of date).
    if crate::route::gate::closed()
        && (kind != CommandKind::Read || positions.clone().next().is_some())
    {
        return Rewrite::Redirect(Leave::Unchecked);
    }
    match runs_here(positions, env, Some(kind)) {
        Err(leave) => Rewrite::Redirect(leave),
        Ok(()) => Rewrite::None,
    }
}

/// On a replica: untouched for its primary's replication stream, the module's own
/// connections (a write from one is refused by the server itself, as without the protocol) and
/// a `READONLY` client's read of its shard's keys; everything else to the redirect handler.
fn on_replica<'a>(
    positions: impl Iterator<Item = usize> + Clone,
    readonly: bool,
    env: &impl FilterEnv<'a>,
) -> Rewrite {
    match env.client_id() {
        Some(id) if clients::is_primary_link(id) || clients::is_internal(id) => Rewrite::None,
        Some(id)
            if readonly && clients::is_readonly(id) && runs_here(positions, env, None).is_ok() =>
        {
            Rewrite::None
        }
        _ => Rewrite::Judge,
    }
}

/// `Ok` when the keys at `positions` are in one slot this node owns, with no resharding step
/// pending for it, with every key brought here already or the resharding settled (or there is
/// no key). `kind`: the command's on a primary; `None` on a replica (its shard's slots, a read).
/// A delete of a slot being moved here (and, before it settles, any write of it) leaves outside
/// `MULTI` and scripts, to reach both owners.
fn runs_here<'a>(
    positions: impl Iterator<Item = usize> + Clone,
    env: &impl FilterEnv<'a>,
    kind: Option<CommandKind>,
) -> Result<(), Leave> {
    let replica = kind.is_none();
    let (arriving, settled) = {
        let st = state::lock();
        let Some(current) = st.rings.current.as_ref() else {
            return Ok(());
        };
        let Some(ring) = current.ring.as_ref().filter(|_| eligible(current)) else {
            return Ok(());
        };
        let self_name = if replica {
            crate::topology::me::shard(ring.spec(), &st.config.ring.self_name).unwrap_or_default()
        } else {
            st.config.ring.self_name.as_str()
        };
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
                if !replica && !crate::topology::nodes::acts_as(owner, self_name) {
                    let node = NodeOf {
                        placement: Arc::clone(current),
                        index,
                    };
                    return Err(Leave::NotNamed { slot: s, node });
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
        (arriving, st.rings.settled)
    };
    // A delete, and before the resharding settles any write (it may remove the key: GETDEL,
    // EXPIRE 0, popping the last element), go the routed way, which removes the previous
    // owner's copy too, outside `MULTI` and scripts (which cannot wait for it).
    let removes = match kind {
        Some(CommandKind::Delete) => true,
        Some(CommandKind::Write) => !settled,
        _ => false,
    };
    let removes = removes && !env.in_transaction() && !env.in_script();
    // The state lock is released: looking a key up may expire it.
    match arriving {
        Some((slot, from)) if removes => Err(Leave::Arriving { slot, from }),
        Some(_) if settled => Ok(()),
        Some((slot, from)) if !positions.into_iter().all(|p| env.exists(p)) => {
            Err(Leave::Arriving { slot, from })
        }
        _ => Ok(()),
    }
}

/// The filtered command as the verdict reads it: the arguments' bytes live as long as this
/// shared borrow of them, so none can be rewritten while the verdict holds one.
struct Env<'a>(&'a FilterArgs);

impl<'a> FilterEnv<'a> for Env<'a> {
    fn arg(&self, i: usize) -> Option<&'a [u8]> {
        self.0.arg(i)
    }

    fn movable_keys(&self) -> Option<Vec<usize>> {
        self.0.command_keys(0)
    }

    fn exists(&self, pos: usize) -> bool {
        self.0.key_exists(pos)
    }

    fn is_replica(&self) -> bool {
        // The role the server's events gave: an atomic load on the hot path.
        crate::topology::nodes::is_replica()
    }

    fn client_id(&self) -> Option<u64> {
        self.0.client_id()
    }

    fn in_transaction(&self) -> bool {
        self.0.client_in_multi()
    }

    fn in_script(&self) -> bool {
        crate::host::context::script_running()
    }
}

/// Applies the cluster protocol's rewrite to the filtered command.
pub fn rewrite(args: &mut FilterArgs) {
    let insert: &[u8] = match decide(args.len(), &Env(args)) {
        Rewrite::None => return,
        Rewrite::Redirect(leave) if args.client_in_multi() => {
            refuse(args, &leave.refusal());
            return;
        }
        Rewrite::Emulate(kind) => {
            emulate(args, kind);
            return;
        }
        Rewrite::Redirect(_) | Rewrite::Judge => b"shard.redirect",
        Rewrite::Publish => crate::route::plain::COMMAND,
    };
    args.insert(0, insert);
}

/// An emulated command becomes `SHARD.EMULATE command ...` when the client is known to have
/// authenticated; else the command the server checks as usual: `CLUSTER sub` →
/// `SHARD.CLUSTER sub`, `READONLY` → `SHARD.CLUSTER READONLY`, `INFO ...` → `SHARD.INFO ...`
/// (or left alone: `auth::route`).
fn emulate(args: &mut FilterArgs, kind: Emulated) {
    let user = args.client_user();
    match (auth::route(kind, user.as_deref()), kind) {
        (Route::Emulate, _) => args.insert(0, b"shard.emulate"),
        (Route::Checked, Emulated::Cluster) => args.replace(0, b"shard.cluster"),
        (Route::Checked, Emulated::Connection) => args.insert(0, b"shard.cluster"),
        (Route::Checked, Emulated::Info) => args.replace(0, b"shard.info"),
        (Route::Untouched, _) => {}
    }
}

/// Makes the filtered command an unknown command named `text`, with no argument: the server
/// refuses it (`ERR unknown command 'text'`) and, inside `MULTI`, flags the transaction so that
/// `EXEC` aborts.
fn refuse(args: &mut FilterArgs, text: &str) {
    for pos in (1..args.len()).rev() {
        args.delete(pos);
    }
    args.replace(0, text.as_bytes());
}
