//! An owner's block acknowledged by a replica (docs/transactions.md, "Durable at the owner"):
//! the reply to `SHARD.TXN COMMIT` and `SHARD.TXN APPLY`, and to a client's `SHARD.EXEC` whose
//! only part ran here (`txn::coord::local`), waits until one replica of this server has the
//! block, when the server has a replica online; a failover right after the reply then keeps
//! it. The same mechanism as the coordinator's decision (`txn::coord::fleet`): the replicas
//! online are `host::context::connected_replicas` (kept from the server's replica events, not
//! read per block), and the wait is `WAIT 1` on a connection of its own to this server's own
//! address (`route::forward::NetSteps::send_waited`), behind `SHARD.TXN SYNC` (`sync`), which
//! replicates a `PING`: `WAIT` waits for the replication offset of its own client's last
//! command that replicated something (Valkey moves a client's offset only then; Redis 7.0 at
//! every command), and `SYNC`, run after the block, puts it past the block (a module cannot run
//! `WAIT` itself). The client is blocked meanwhile, never the main thread.
//!
//! A block of read-only commands wrote nothing to wait for (as `WAIT` after a read returns at
//! once). A client that cannot be blocked (inside `MULTI`, a script) is answered at once. No
//! replica within `REPLICA_WAIT_MS`: the block
//! stays applied (as with `WAIT`), and the reply is the error `NOREPLICAS the transaction is applied ...` (`single`,
//! `unconfirmed`), counted in `INFO shard`'s `txn_unacked`, as it is at once when no replica is
//! linked while Sentinel lists one, or when this server is not its node's primary now: a
//! client never takes a block a failover may lose for one a replica has (a `COMMIT` of several
//! owners answers `APPLIED` in these cases, and its coordinator sends it again: `commit_reply`).

use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::ContextFlags;

use crate::host::command::Call;
use crate::host::error::CmdResult;
use crate::net::endpoint::Endpoint;
use crate::net::pool::{link_timeout, Link};
use crate::net::resp::{ReplyResp, Resp};
use crate::route::forward::{self, CallReply, NetSteps};
use crate::route::wait::Wait;
use crate::txn::owner::parse::Command;

/// How long a block waits for a replica (the coordinator's decision waits as long).
pub const REPLICA_WAIT_MS: i64 = 2000;

/// Blocks replied without a replica's acknowledgement within `REPLICA_WAIT_MS`.
static UNACKED: AtomicU64 = AtomicU64::new(0);

/// `INFO shard`'s `txn_unacked`.
pub fn unacked() -> u64 {
    UNACKED.load(Ordering::Relaxed)
}

/// Whether `cmds` may write (a command the table does not know counts as a write).
pub fn writes(cmds: &[Command]) -> bool {
    cmds.iter().any(|cmd| {
        cmd.first()
            .and_then(|name| crate::route::command_table::known(name))
            .is_none_or(|meta| !meta.readonly)
    })
}

/// What the reply to a single owner's block waits for (`single`).
pub enum Ack {
    /// Nothing: the reply at once.
    AtOnce,
    /// No replica can have the block now, though one may be promoted in this server's place:
    /// the `NOREPLICAS` error (`unconfirmed`) at once, counted.
    Unconfirmed(String),
    /// One replica of this server (its own address, to send `WAIT` to).
    Wait(Endpoint),
}

/// Whether the client of `call` cannot be blocked (inside `MULTI`, a script).
fn unblockable(call: &Call) -> bool {
    let flags = call.ctx.get_flags();
    flags.contains(ContextFlags::MULTI)
        || flags.contains(ContextFlags::LUA)
        || flags.contains(ContextFlags::DENY_BLOCKING)
}

/// What the reply to a block of `cmds` just run in the command of `call` waits for (`APPLY`,
/// or a client's `SHARD.EXEC` whose only part ran here): nothing when the block wrote nothing,
/// no ring names this node, or no replica is linked and none expected (a node with no replica
/// configured); `Unconfirmed` when this server is not its node's primary now, or no replica is
/// linked while one may be promoted (`replica_expected`, the rule of a `COMMIT`'s `APPLIED`);
/// else a replica of this server, when the client can be blocked (one that cannot is
/// answered at once, as before).
pub fn single(call: &Call, cmds: &[Command]) -> Ack {
    if !writes(cmds) {
        return Ack::AtOnce;
    }
    // This server as its node (Sentinel's address, `acts_as`): a server no longer its node's
    // primary would count another server's replicas.
    let Some(me) = crate::txn::coord::queue::this_node() else {
        return Ack::AtOnce;
    };
    if !me.is_self {
        UNACKED.fetch_add(1, Ordering::Relaxed);
        return Ack::Unconfirmed(unconfirmed(&me.name, "this server is not its primary now"));
    }
    if crate::host::context::connected_replicas() == 0 {
        if !replica_expected(&me.name) {
            return Ack::AtOnce;
        }
        UNACKED.fetch_add(1, Ordering::Relaxed);
        return Ack::Unconfirmed(unconfirmed(
            &me.name,
            "it has no replica linked while Sentinel lists one it may promote",
        ));
    }
    if unblockable(call) {
        return Ack::AtOnce;
    }
    Ack::Wait(me)
}

/// The start of the error of a single owner's block applied but at no replica
/// (docs/errors.md): `SHARD.CALL WAIT`'s code for a write applied that too few replicas
/// acknowledged, so that a client tells it from a refusal (`ERR`, `TRYAGAIN`) and from an
/// acknowledgement; the words after it tell it from Redis's own `NOREPLICAS` (a write refused
/// by `min-replicas-to-write`, not applied).
pub const UNCONFIRMED: &str = "NOREPLICAS the transaction is applied at node ";

/// The `NOREPLICAS` error of a block applied at `node`, at no replica of it because `why`.
pub fn unconfirmed(node: &str, why: &str) -> String {
    format!(
        "{UNCONFIRMED}{node}, but {why}: it stays applied, as after WAIT, but a failover of {node} now may lose it"
    )
}

/// Waits for a replica of `me` (`replica_has_it`): `Err` with the `NOREPLICAS` line when
/// none acknowledged the block within `REPLICA_WAIT_MS`.
pub async fn confirmed(steps: &NetSteps, me: &Endpoint) -> Result<(), String> {
    if replica_has_it(steps, me).await {
        Ok(())
    } else {
        Err(unconfirmed(
            &me.name,
            &format!("no replica acknowledged it within {REPLICA_WAIT_MS} ms"),
        ))
    }
}

/// The link of the wait (its own connection to this server, database 0).
pub fn link() -> Link {
    let st = crate::state::lock();
    Link {
        timeout: link_timeout(st.config.call_timeout_ms),
        auth: st.config.auth(),
        resp3: false,
        db: 0,
    }
}

/// Waits until one replica of this server acknowledged everything replicated so far, at most
/// `REPLICA_WAIT_MS`; false (and counted) when none did.
pub async fn replica_has_it(steps: &NetSteps, me: &Endpoint) -> bool {
    let wait = Wait {
        replicas: 1,
        timeout_ms: REPLICA_WAIT_MS,
    };
    let sync = [b"SHARD.TXN".to_vec(), b"SYNC".to_vec()];
    let (synced, waited) = steps.send_waited(me, &sync, wait);
    let _ = synced.await;
    let acked = matches!(waited.await, Ok(Resp::Int(n)) if n >= 1);
    if !acked {
        UNACKED.fetch_add(1, Ordering::Relaxed);
    }
    acked
}

/// Replies `reply` to the client of `call` once a replica has the block of `cmds` just run
/// (at once when there is nothing to wait for), or the `NOREPLICAS` error (`single`).
pub fn reply(call: &Call, cmds: &[Command], reply: Resp) -> CmdResult {
    let me = match single(call, cmds) {
        Ack::AtOnce => {
            call.reply.resp(&reply);
            return Ok(());
        }
        Ack::Unconfirmed(line) => {
            call.reply.resp(&Resp::Error(line.into_bytes()));
            return Ok(());
        }
        Ack::Wait(me) => me,
    };
    let name = me.name.clone();
    let blocked = forward::run(call, link(), move |steps| async move {
        match confirmed(&steps, &me).await {
            Ok(()) => CallReply::Reply(reply),
            Err(line) => CallReply::Error(line),
        }
    });
    if blocked.is_err() {
        // Not blocked (nothing was sent): the block is applied, no replica known to have it.
        UNACKED.fetch_add(1, Ordering::Relaxed);
        let line = unconfirmed(&name, "the wait for a replica could not start");
        call.reply.resp(&Resp::Error(line.into_bytes()));
    }
    Ok(())
}

/// The code of `COMMIT`'s reply when the part is applied here but no replica has it
/// (`commit_reply`): the coordinator keeps its decision and sends the `COMMIT` again.
pub const APPLIED: &str = "APPLIED";

/// Whether this node (`name`) should have a replica that could be promoted in its place
/// though none is linked now (`topology::nodes::replica_expected`, the fleet steps' rule for
/// data only a primary holds), looking up whether the rings name it a `sentinel` node.
pub fn replica_expected(name: &str) -> bool {
    let sentinel = crate::state::lock().rings.via_sentinel(name);
    crate::topology::nodes::replica_expected(name, sentinel)
}

/// The `APPLIED` refusal: `txid` applied, `why` not confirmed.
fn not_at_a_replica(txid: &str, why: &str) -> String {
    format!(
        "{APPLIED} {txid} is applied here, but {why}: not confirmed, send COMMIT again (it is not applied twice)"
    )
}

/// The reply to `SHARD.TXN COMMIT` of `txid` once its part is applied here (`writes`: the part
/// may have written; `ok`: the replies, or `DONE` for a part applied before): `ok` only once
/// a replica of this server has it, when one may be promoted in this server's place (a replica
/// online, or one expected: `replica_expected`); else the error `APPLIED ...`, counted in
/// `txn_unacked`, on which the coordinator keeps its decision and sends the `COMMIT` again
/// until it gets `ok` (docs/transactions.md, "Durable at the owners"): a confirmation counts
/// only once the part would survive a failover of this owner. A server that is not its node's
/// primary now (Sentinel names another) answers `APPLIED` too. Without a replica, online or
/// expected, `ok` at once.
pub fn commit_reply(call: &Call, writes: bool, txid: &str, ok: Resp) -> CmdResult {
    let me = crate::txn::coord::queue::this_node();
    let me = match me {
        Some(me) if writes && !unblockable(call) => me,
        // Nothing written, a client that cannot wait, or a server no ring of which names
        // this node (it left): as before, at once.
        _ => {
            call.reply.resp(&ok);
            return Ok(());
        }
    };
    if !me.is_self {
        let line = not_at_a_replica(txid, "this server is not its node's primary now");
        UNACKED.fetch_add(1, Ordering::Relaxed);
        call.reply.resp(&Resp::Error(line.into_bytes()));
        return Ok(());
    }
    if crate::host::context::connected_replicas() == 0 {
        if replica_expected(&me.name) {
            let line = not_at_a_replica(
                txid,
                &format!(
                    "node {} has no replica linked now while Sentinel lists one it may promote",
                    me.name
                ),
            );
            UNACKED.fetch_add(1, Ordering::Relaxed);
            call.reply.resp(&Resp::Error(line.into_bytes()));
        } else {
            call.reply.resp(&ok);
        }
        return Ok(());
    }
    let (txid, at_once) = (txid.to_string(), txid.to_string());
    let blocked = forward::run(call, link(), move |steps| async move {
        if replica_has_it(&steps, &me).await {
            CallReply::Reply(ok)
        } else {
            CallReply::Error(not_at_a_replica(
                &txid,
                &format!("no replica acknowledged it within {REPLICA_WAIT_MS} ms"),
            ))
        }
    });
    if blocked.is_err() {
        let line = not_at_a_replica(&at_once, "the wait for a replica could not start");
        UNACKED.fetch_add(1, Ordering::Relaxed);
        call.reply.resp(&Resp::Error(line.into_bytes()));
    }
    Ok(())
}

/// `SHARD.TXN SYNC`: replicates a `PING` (nothing else), so that a `WAIT` after it on the same
/// connection waits for everything this server replicated before it.
pub fn sync(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(crate::host::error::CmdError::wrong_arity("shard.txn|sync"));
    }
    crate::host::replicate::replicate_args(call.ctx, c"PING", &[]);
    call.reply.ok();
    Ok(())
}
