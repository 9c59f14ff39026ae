//! The command filter that makes a local routed call cost what the plain command costs.
//!
//! Redis runs command filters on every command a client sends, before it looks the command up.
//! `SHARD.CALL cmd key ...` whose keys this node owns, with no resharding step pending for any
//! of them, loses its first argument here and becomes `cmd key ...`: the server then runs the
//! plain command with its own dispatch, ACL check, keyspace notifications, replication, AOF
//! and `MULTI` queueing, and no module code runs at all. Everything else (other commands, a
//! call that goes elsewhere, a command whose key positions move with its arguments or that
//! `SHARD.CALL` has not met yet) passes untouched, to the `SHARD.CALL` command or to the
//! server. The filter does not see the commands the module itself runs (`NOSELF`); commands a
//! replica receives from its primary or a server loads from its AOF are plain commands already
//! (a rewritten call is replicated as the plain command), so nothing of theirs is rewritten.
//!
//! What it costs other commands: a count of arguments, then the first argument's length and
//! first letter (`bench/findings.md`, "Plain GET/SET while transactions run").

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::host::command_keys::NoKeys;
use crate::host::filter::FilterArgs;
use crate::ring::placement::Placement;
use crate::route::command_table;
use crate::state;

/// Calls the filter turned into plain local commands.
pub static REWRITTEN: AtomicU64 = AtomicU64::new(0);

/// Clients of this node inside `SHARD.MULTI` (`txn::coord::clients`): while there is one, no
/// call is rewritten, since its `SHARD.CALL` must reach the handler that queues it, and the
/// filter cannot tell the client on every server.
static QUEUEING: AtomicU64 = AtomicU64::new(0);

/// Whether any client of this node is inside `SHARD.MULTI`.
pub fn any_queueing() -> bool {
    QUEUEING.load(Ordering::Relaxed) > 0
}

/// A client entered `SHARD.MULTI` (`true`) or left it (`false`).
pub fn hold_rewrites(on: bool) {
    if on {
        QUEUEING.fetch_add(1, Ordering::Relaxed);
    } else {
        let _ = QUEUEING.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// What the filter found for the first key of the `SHARD.CALL` it let through: the command
/// handler, which runs right after it for the same arguments, need not hash the key again.
/// Valid for the command just filtered only: every command through the filter clears it (one
/// store: statics, not a thread-local, which a shared library reaches through a
/// `__tls_get_addr` call). Only the main thread, which runs the filter and the handler, uses it.
///
/// The key's bytes (the argument object the handler gets too; null: no verdict) and their
/// length, the ring they were placed on, and the owner found (an index in that ring).
static LAST_KEY: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static LAST_LEN: AtomicUsize = AtomicUsize::new(0);
static LAST_RING: AtomicPtr<Placement> = AtomicPtr::new(std::ptr::null_mut());
static LAST_OWNER: AtomicUsize = AtomicUsize::new(0);

/// The owner (index in `ring`) the filter computed for `key`, if it just did, for this very
/// argument and ring.
pub fn owner_found(key: &[u8], ring: &Placement) -> Option<usize> {
    let found = LAST_KEY.load(Ordering::Relaxed);
    (!found.is_null()
        && std::ptr::eq(found, key.as_ptr())
        && LAST_LEN.load(Ordering::Relaxed) == key.len()
        && std::ptr::eq(LAST_RING.load(Ordering::Relaxed), ring))
    .then(|| LAST_OWNER.load(Ordering::Relaxed))
}

/// A new command reaches the filter: the last verdict no longer holds (one store).
#[inline(always)]
pub fn new_command() {
    LAST_KEY.store(std::ptr::null_mut(), Ordering::Relaxed);
}

/// The first look at a command: whether it may be a `SHARD.CALL` to rewrite (enough arguments,
/// no `SHARD.MULTI` open here, a name of its length and first letter, or a name not read
/// without a call). What every other command pays.
#[inline(always)]
pub fn may_be_local_call(args: &FilterArgs) -> bool {
    args.len() >= 3
        && QUEUEING.load(Ordering::Relaxed) == 0
        && args
            .quick_arg(0)
            .is_none_or(|first| first.len() == 10 && first[0] | 0x20 == b's')
}

/// Whether the command is a `SHARD.CALL` to rewrite, at a first look.
fn may_be_call(args: &FilterArgs) -> bool {
    args.len() >= 3
        && QUEUEING.load(Ordering::Relaxed) == 0
        && args
            .arg(0)
            .is_some_and(|first| first.len() == 10 && first[0] | 0x20 == b's')
}

/// The part of the module's command filter that is SHARD.CALL's: a call whose keys are all
/// here, with no resharding step pending, loses its `SHARD.CALL` (true when it did).
pub fn rewrite_local_call(args: &mut FilterArgs) -> bool {
    new_command();
    if may_be_call(args) && local_call(args) && args.delete(0) {
        REWRITTEN.fetch_add(1, Ordering::Relaxed);
        return true;
    }
    false
}

/// Whether the command is `SHARD.CALL` of a known command with fixed key positions, every key
/// owned here now and before (no resharding step pending for it), this server acting as its
/// node (`topology::nodes::acts_as`).
fn local_call(args: &FilterArgs) -> bool {
    if args.len() < 3 {
        return false;
    }
    let Some(first) = args.arg(0) else {
        return false;
    };
    if first.len() != 10 || !first.eq_ignore_ascii_case(b"shard.call") {
        return false;
    }
    keys_local(args, 1) == Local::All
}

/// What the filter found of the keys of the command carried from argument `start` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// Every key is owned here now and before, the command runs as it is.
    All,
    /// A key is another node's, or one is being moved, or the filter cannot tell (a command
    /// not in the table, keys that move with the arguments, rings unchecked, a replica, the
    /// field dictionary): the module must look.
    NotAll,
    /// The command has no key at all (by the command table: first key 0, keys not movable).
    Keyless,
    /// The command is not in the table the module learnt (the server does not know it, or it
    /// was added after load and `SHARD.CALL` has not met it yet).
    Unknown,
}

/// Key positions: the command table's range (no allocation), or the server's key specs'.
enum Positions {
    Range(command_table::KeyRange),
    List(std::vec::IntoIter<usize>),
}

impl Iterator for Positions {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match self {
            Positions::Range(r) => r.next(),
            Positions::List(l) => l.next(),
        }
    }
}

/// Whether the keys of the known command carried from argument `start` on are all this node's
/// now and before (`route-plain` carries it from 0, `SHARD.CALL` from 1).
pub fn keys_local(args: &FilterArgs, start: usize) -> Local {
    let argc = args.len();
    let Some(name) = args.arg(start) else {
        return Local::NotAll;
    };
    let Some(meta) = command_table::known(name) else {
        return Local::Unknown;
    };
    if !meta.movable && !meta.container && meta.first <= 0 {
        return Local::Keyless;
    }
    // A hash command whose field names the dictionary translates: SHARD.CALL's own work.
    if crate::route::fields::translates(name) {
        return Local::NotAll;
    }
    let inner_argc = argc - start;
    // While this node's rings are unchecked, every call goes to SHARD.CALL, which refuses it.
    // (A blocking command of keys all here runs as the server's own, and blocks as it does.)
    if crate::route::gate::closed() {
        return Local::NotAll;
    }
    // A replica runs no routed call itself (its primary does), and reads that go to replicas
    // are SHARD.CALL's to send.
    if crate::topology::nodes::is_replica()
        || (meta.readonly
            && crate::topology::nodes::read_from() != crate::topology::nodes::ReadFrom::Primary)
    {
        return Local::NotAll;
    }
    // Keys that move with the arguments (`EVAL ... numkeys`, `XREAD ... STREAMS`) are asked of
    // the server's key specs for a plain command (route-plain), so that one of keys all here
    // runs as the server's own: a blocking `XREAD ... BLOCK` another node forwarded here must
    // block as the server's command does. A `SHARD.CALL` of such a command goes to its
    // handler, as before.
    let positions = match meta.fixed_keys(inner_argc) {
        Some(range) => Positions::Range(range),
        None if (meta.movable || meta.container) && start == 0 => {
            match args.command_key_positions(0) {
                Ok(keys) if !keys.is_empty() => Positions::List(keys.into_iter()),
                // No key in these arguments (`EVAL script 0`, `CONFIG GET`, a container's keyless
                // subcommand): as a keyless command.
                Ok(_) | Err(NoKeys::None) => return Local::Keyless,
                // The server refuses it itself, with its own message.
                Err(NoKeys::UnknownCommand | NoKeys::WrongArity) => return Local::Unknown,
            }
        }
        None => return Local::NotAll,
    };
    let st = state::lock();
    let self_name = st.config.ring.self_name.as_str();
    if self_name.is_empty() {
        return Local::NotAll;
    }
    let Some(placement) = st.rings.current.as_ref() else {
        return Local::NotAll;
    };
    let Some(current) = placement.ring.as_ref() else {
        return Local::NotAll;
    };
    let previous = st.rings.previous.as_ref().map(|p| p.ring.as_ref());
    let mut any = false;
    for pos in positions {
        let Some(key) = args.arg(pos + start) else {
            return Local::NotAll;
        };
        let owner = current.owner(key);
        // Its own node, and (a `sentinel` node) the primary Sentinel names: a restarted old
        // primary's calls go to the one it names, through SHARD.CALL.
        if !current
            .spec()
            .nodes
            .get(owner)
            .is_some_and(|n| crate::topology::nodes::acts_as(n, self_name))
        {
            if !any {
                LAST_LEN.store(key.len(), Ordering::Relaxed);
                LAST_RING.store(
                    std::sync::Arc::as_ptr(placement).cast_mut(),
                    Ordering::Relaxed,
                );
                LAST_OWNER.store(owner, Ordering::Relaxed);
                LAST_KEY.store(key.as_ptr().cast_mut(), Ordering::Relaxed);
            }
            return Local::NotAll;
        }
        match previous {
            None => {}
            Some(Some(before)) if before.owner_spec(key).name == self_name => {}
            Some(_) => return Local::NotAll,
        }
        any = true;
    }
    if any {
        Local::All
    } else {
        Local::NotAll
    }
}
