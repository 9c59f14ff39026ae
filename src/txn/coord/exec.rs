//! The client's commands carried out (`commands::multi` parses and calls these):
//! `SHARD.WATCH` (the keys placed, `SHARD.TXN WATCH` at each owner at once, the client
//! blocked until all replied), `SHARD.UNWATCH`, `SHARD.MULTI`, a `SHARD.CALL` queued,
//! `SHARD.DISCARD` and `SHARD.EXEC` (the phases run over the module's connections, the
//! client blocked until its reply). Also the txid, from this node's generator, and the
//! commits carried out again after a restart or a promotion (`resume`).

use futures_util::future::join_all;

use crate::host::caller;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::net::endpoint::Endpoint;
use crate::net::pool::{link_timeout, Link};
use crate::net::resp::Resp;
use crate::route::forward::{self, CallReply};
use crate::state;
use crate::txn::coord::clients::{self, Queue};
use crate::txn::coord::fleet::NetFleet;
use crate::txn::coord::phases::{self, Fleet, Outcome};
use crate::txn::coord::plan::{Part, Txn};
use crate::txn::coord::wire::Prepared;
use crate::txn::coord::{book, local, queue, wire};
use crate::txn::owner::acked;

/// How long an owner keeps a watch that is not used (then it counts as written).
pub const WATCH_TTL_MS: u64 = 60_000;

/// How the coordinator reaches the owners for the client of `call`: its database and RESP
/// version.
pub(crate) fn link(call: Option<&Call>) -> Link {
    let st = state::lock();
    let resp3 = call.is_some_and(|c| {
        c.ctx
            .get_flags()
            .contains(redis_module::ContextFlags::FLAGS_RESP3)
    });
    Link {
        timeout: link_timeout(st.config.call_timeout_ms),
        auth: st.config.auth(),
        resp3,
        db: call.map_or(0, caller::selected_db),
    }
}

/// A new txid: `<node name>/<hex>`, the number from this node's generator (never repeated
/// through restarts and failovers: its high-water mark goes to replicas and the AOF as
/// `SHARD.GENKEY`'s does).
pub(crate) fn new_txid(call: &Call) -> Result<String, CmdError> {
    new_txids(call, 1)?
        .pop()
        .ok_or_else(|| CmdError::err("the generator issued no number"))
}

/// `n` new txids (`new_txid`'s), reserved from the generator at once: a gathered command's
/// attempts take theirs in one reservation, one lock of the state.
pub(crate) fn new_txids(call: &Call, n: u64) -> Result<Vec<String>, CmdError> {
    let now_ms =
        crate::clock::now_ms().ok_or_else(|| CmdError::err("the wall clock cannot be read"))?;
    if crate::topology::nodes::is_replica() {
        return Err(CmdError::code(
            "READONLY",
            "transactions are coordinated by primaries: connect to a primary",
        ));
    }
    let mut st = state::lock();
    let st = &mut *st;
    if st.config.ring.self_name.is_empty() {
        return Err(CmdError::err(
            "transactions need this node's name in the ring: set shard.self",
        ));
    }
    let name = &st.config.ring.self_name;
    let keys = &st.keys;
    let request = crate::keys::Request {
        now_ms,
        count: n.max(1),
        node: keys.node_id,
        key_type: keys.layout.default_type(),
        max_drift_ms: keys.max_drift_ms,
    };
    let txids: Vec<String> = st
        .generator
        .reserve(&keys.layout, &keys.layout, &keys.shape, &request)
        .map_err(CmdError::err)?
        .map(|fields| {
            let number = match keys.layout.pack(&fields) {
                0 => (fields.tick << 24) | (fields.seq & 0xff_ffff),
                n => n,
            };
            format!("{name}/{number:x}")
        })
        .collect();
    if txids.len() as u64 != n.max(1) {
        return Err(CmdError::err("the generator issued too few numbers"));
    }
    let mark = st
        .generator
        .high_water_ms(&keys.layout)
        .filter(|m| Some(*m) != st.propagated_high_water);
    if let Some(mark) = mark {
        crate::host::replicate::replicate_with_int(call.ctx, c"shard.advance", mark);
        st.propagated_high_water = Some(mark);
    }
    Ok(txids)
}

/// `SHARD.WATCH key [key ...]`.
pub fn watch(call: &Call, keys: &[&[u8]]) -> CmdResult {
    let id = caller::client_id(call);
    if clients::queueing(id) {
        return Err(CmdError::err(
            "SHARD.WATCH inside SHARD.MULTI is not allowed",
        ));
    }
    let owners = queue::owners_of(keys)?;
    let mut groups: Vec<(Endpoint, Vec<Vec<u8>>)> = Vec::with_capacity(2);
    for (owner, key) in owners.into_iter().zip(keys) {
        match groups.iter_mut().find(|(o, _)| o.name == owner.name) {
            Some((_, ks)) => ks.push(key.to_vec()),
            None => groups.push((owner, vec![key.to_vec()])),
        }
    }
    let txid = match clients::with(id, |c| c.txid.clone()) {
        Some(t) => t,
        None => new_txid(call)?,
    };
    clients::with(id, |c| {
        c.txid = Some(txid.clone());
        for (owner, ks) in &groups {
            match c.watched.iter_mut().find(|(o, _)| o.name == owner.name) {
                Some((_, have)) => have.extend(ks.iter().cloned()),
                None => c.watched.push((owner.clone(), ks.clone())),
            }
        }
    });
    // This node's own keys are watched here, now; the client waits only for other owners.
    let here = local::get().watch;
    groups.retain(|(owner, ks)| {
        !(owner.is_self && !is_replica() && here(call, &txid, WATCH_TTL_MS, ks).is_some())
    });
    if groups.is_empty() {
        call.reply.ok();
        return Ok(());
    }
    forward::run(call, link(Some(call)), move |steps| async move {
        let sent = groups
            .iter()
            .map(|(owner, ks)| steps.send_control(owner, &wire::watch(&txid, WATCH_TTL_MS, ks)));
        for reply in join_all(sent).await {
            match reply {
                Ok(Resp::Error(line)) => {
                    return CallReply::Error(String::from_utf8_lossy(&line).into_owned())
                }
                Ok(_) => {}
                Err(e) => return CallReply::Error(format!("ERR shard.txn: {e}")),
            }
        }
        CallReply::Reply(Resp::Simple(b"OK".to_vec()))
    })
    .map_err(CmdError::err)
}

/// `SHARD.UNWATCH`.
pub fn unwatch(call: &Call) -> CmdResult {
    let id = caller::client_id(call);
    if clients::queueing(id) {
        return Err(CmdError::err(
            "SHARD.UNWATCH inside SHARD.MULTI is not allowed",
        ));
    }
    let (txid, watched) = clients::with(id, |c| (c.txid.take(), std::mem::take(&mut c.watched)));
    if let Some(txid) = txid {
        unwatch_later(&txid, &watched);
    }
    call.reply.ok();
    Ok(())
}

/// Drops `txid`'s watches at their owners, in the background.
pub fn unwatch_later(txid: &str, watched: &[(Endpoint, Vec<Vec<u8>>)]) {
    let here = local::get().unwatch;
    let owners: Vec<Endpoint> = watched
        .iter()
        .map(|(o, _)| o)
        .filter(|o| !(o.is_self && here(txid).is_some()))
        .cloned()
        .collect();
    if owners.is_empty() {
        return;
    }
    let request = wire::unwatch(txid);
    forward::spawn(link(None), move |steps| async move {
        let _ = join_all(owners.iter().map(|o| steps.send_control(o, &request))).await;
        CallReply::Reply(Resp::Null)
    });
}

/// `SHARD.MULTI`.
pub fn multi(call: &Call) -> CmdResult {
    let id = caller::client_id(call);
    let opened = clients::with(id, |c| {
        if c.queue.is_some() {
            return false;
        }
        c.queue = Some(Queue::default());
        true
    });
    if !opened {
        return Err(CmdError::err("SHARD.MULTI calls can not be nested"));
    }
    call.reply.ok();
    Ok(())
}

/// Whether the client of `call` is inside `SHARD.MULTI` (its `SHARD.CALL` is queued).
pub fn queueing(call: &Call) -> bool {
    crate::route::filter::any_queueing() && clients::queueing(caller::client_id(call))
}

/// A `SHARD.CALL` inside `SHARD.MULTI`: `QUEUED`, or the refusal (the transaction then ends
/// in `EXECABORT`).
pub fn queue_call(call: &Call) -> CmdResult {
    let id = caller::client_id(call);
    let (queued, refused) = match queue::queue(call) {
        Ok(entry) => (Some(entry), None),
        Err(e) => (None, Some(e)),
    };
    clients::with(id, |c| {
        if let Some(q) = c.queue.as_mut() {
            match queued {
                Some(entry) => {
                    match &entry.placed {
                        Some(placed) => q.commands.push(placed.clone()),
                        None => q.gathered = true,
                    }
                    q.entries.push(entry);
                }
                None => q.refused = true,
            }
        }
    });
    if let Some(e) = refused {
        return Err(e);
    }
    call.reply.simple(b"QUEUED");
    Ok(())
}

/// `SHARD.DISCARD`.
pub fn discard(call: &Call) -> CmdResult {
    let id = caller::client_id(call);
    if !clients::queueing(id) {
        return Err(CmdError::err("SHARD.DISCARD without SHARD.MULTI"));
    }
    let gone = clients::take(id);
    if let Some(txid) = gone.txid {
        unwatch_later(&txid, &gone.watched);
    }
    call.reply.ok();
    Ok(())
}

/// `SHARD.EXEC`.
pub fn exec(call: &Call) -> CmdResult {
    let id = caller::client_id(call);
    if !clients::queueing(id) {
        return Err(CmdError::err("SHARD.EXEC without SHARD.MULTI"));
    }
    let client = clients::take(id);
    let queue = client.queue.unwrap_or_default();
    if queue.refused {
        if let Some(txid) = &client.txid {
            unwatch_later(txid, &client.watched);
        }
        clients::count(&clients::ABORTED_ERROR);
        return Err(CmdError::code(
            "EXECABORT",
            "Transaction discarded because of previous errors.",
        ));
    }
    if queue.gathered {
        return crate::txn::coord::gather::exec_gathered(
            call,
            client.txid,
            client.watched,
            queue.entries,
        );
    }
    let mut txn = Txn::build(
        client.txid.unwrap_or_default(),
        &client.watched,
        queue.commands,
    );
    // One owner without watches runs a plain block there: no txid to take.
    if txn.txid.is_empty() && txn.parts.len() > 1 {
        txn.txid = new_txid(call)?;
    }
    if let Some(outcome) = run_here(call, &txn) {
        reply_here(call, &txn, outcome);
        return Ok(());
    }
    let lock_ms = lock_ms();
    forward::run(call, link(Some(call)), move |steps| async move {
        let fleet = NetFleet { steps };
        reply(drive(&txn, &fleet, lock_ms).await)
    })
    .map_err(CmdError::err)
}

/// Runs `txn` at its owners to its outcome (`phases::run`), as `SHARD.EXEC` does and as a
/// gathered command's writes do (`gather`).
pub(crate) async fn drive(txn: &Txn, fleet: &NetFleet, lock_ms: u64) -> Outcome {
    // While its own EXEC drives it, `resume` leaves this transaction alone: a COMMIT sent
    // again by another client's EXEC could reach an owner first, and this one's replies
    // would come back `DONE`, lost.
    let driven = !txn.txid.is_empty();
    if driven {
        RESUMING.with(|r| r.borrow_mut().push(txn.txid.clone()));
    }
    let outcome = phases::run(txn, fleet, lock_ms).await;
    if driven {
        RESUMING.with(|r| r.borrow_mut().retain(|t| *t != txn.txid));
    }
    book::with(|b| b.prepared(&txn.txid));
    // A commit decided but not confirmed by every owner (one down, or failing over) is
    // sent again until each confirms, as after a restart: an owner that lost its
    // prepared record (promoted before it reached its replica) would never ask. (A
    // confirmed one is still in the book until its FORGET, sent without waiting, lands.)
    let unconfirmed = matches!(outcome, phases::Outcome::Committed(Err(_)));
    if unconfirmed && book::with(|b| matches!(b.record(&txn.txid), Some(book::Record::Commit(_)))) {
        resume();
    }
    outcome
}

fn is_replica() -> bool {
    crate::topology::nodes::is_replica()
}

/// A transaction with nothing to send, or whose only part is this node's, run inside the
/// client's `SHARD.EXEC` (`local`): its outcome, replied at once. `None` runs it as any other:
/// the owner side did not register, this server is a replica, or a key is locked by another
/// transaction (the phases wait that out, over the connection to this node).
fn run_here(call: &Call, txn: &Txn) -> Option<Outcome> {
    let one = match txn.parts.as_slice() {
        [] => return Some(Outcome::Committed(Ok(Vec::new()))),
        [one] if one.watched.is_empty() && one.commands.is_empty() => {
            return Some(Outcome::Committed(Ok(Vec::new())))
        }
        [one] if one.owner.is_self && !is_replica() => one,
        _ => return None,
    };
    let txid = if txn.txid.is_empty() { "-" } else { &txn.txid };
    let done = (local::get().apply)(call, txid, &one.watched, &one.commands)?;
    Some(match done {
        Ok(reply) => phases::replied(txn, reply),
        Err(e) => match wire::refusal(e.message().as_bytes()) {
            Prepared::Locked => return None,
            Prepared::Watched => Outcome::Watched,
            _ => Outcome::Failed(e.message().to_string()),
        },
    })
}

/// The client's reply to a block run here (`run_here`): once a replica of this server has it,
/// when it wrote and the server has one (`txn::owner::acked`, as `APPLY`'s reply at another
/// owner waits), else at once; the `NOREPLICAS` error instead when no replica has it though
/// one may be promoted here (`acked::single`).
fn reply_here(call: &Call, txn: &Txn, outcome: Outcome) {
    let ack = match (&outcome, txn.parts.as_slice()) {
        (Outcome::Committed(Ok(_)), [one]) => acked::single(call, &one.commands),
        _ => acked::Ack::AtOnce,
    };
    let me = match ack {
        acked::Ack::AtOnce => {
            crate::host::blocked::BlockedReply::write(&reply(outcome), &call.reply);
            return;
        }
        acked::Ack::Unconfirmed(line) => {
            let outcome = Outcome::Committed(Err(line));
            crate::host::blocked::BlockedReply::write(&reply(outcome), &call.reply);
            return;
        }
        acked::Ack::Wait(me) => me,
    };
    let name = me.name.clone();
    let blocked = forward::run(call, acked::link(), move |steps| async move {
        match acked::confirmed(&steps, &me).await {
            Ok(()) => reply(outcome),
            Err(line) => reply(Outcome::Committed(Err(line))),
        }
    });
    if blocked.is_err() {
        // Not blocked, nothing sent: the block is applied, no replica known to have it.
        let line = acked::unconfirmed(&name, "the wait for a replica could not start");
        let outcome = Outcome::Committed(Err(line));
        crate::host::blocked::BlockedReply::write(&reply(outcome), &call.reply);
    }
}

/// How long a transaction waits out other transactions' locks (`shard.txn-lock-ms`).
pub(crate) fn lock_ms() -> u64 {
    state::lock().config.txn_lock_ms.unsigned_abs()
}

/// The client's reply to `SHARD.EXEC`, counted.
pub(crate) fn reply(outcome: Outcome) -> CallReply {
    match outcome {
        Outcome::Committed(replies) => {
            clients::count(&clients::COMMITTED);
            match replies {
                Ok(r) => CallReply::Reply(Resp::Array(r)),
                Err(line) => CallReply::Error(line),
            }
        }
        Outcome::Watched => {
            clients::count(&clients::ABORTED_WATCH);
            CallReply::Reply(Resp::NullArray)
        }
        Outcome::Locked(line) => {
            clients::count(&clients::ABORTED_LOCK);
            CallReply::Error(line)
        }
        // Nil, as for a watched key written: the watches were dropped (a client's optimistic
        // loop retries it); counted as the lock it met.
        Outcome::LockedWatched(_) => {
            clients::count(&clients::ABORTED_LOCK);
            CallReply::Reply(Resp::NullArray)
        }
        Outcome::Failed(line) => {
            clients::count(&clients::ABORTED_ERROR);
            CallReply::Error(line)
        }
    }
}

thread_local! {
    /// The commits being carried out now: again (`resume`), or by their own `SHARD.EXEC`.
    static RESUMING: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Carries out again every commit this node's book holds (after a load, or when this server
/// becomes a primary): `COMMIT` with its part to each owner until each confirmed, then the
/// decision is forgotten. One still unconfirmed is tried again a second later. Does nothing
/// on a replica.
pub fn resume() {
    if crate::topology::nodes::is_replica() {
        return;
    }
    for (txid, decision) in book::with(|b| b.commits()) {
        let fresh = RESUMING.with(|r| {
            let mut r = r.borrow_mut();
            let fresh = !r.contains(&txid);
            if fresh {
                r.push(txid.clone());
            }
            fresh
        });
        if !fresh {
            continue;
        }
        let (wanted, db) = (decision.parts.len(), decision.db);
        let mut owners = Vec::with_capacity(wanted);
        for (i, (name, commands)) in decision.parts.into_iter().enumerate() {
            // An owner no ring names now (a shrink took it out before its confirmation came)
            // is asked where it was when the commit was decided: it still answers there, and
            // applies nothing twice (its done list, or its dropped-txid mark).
            let recorded = decision
                .addresses
                .get(i)
                .and_then(|a| crate::net::endpoint::Endpoint::remote(&name, a));
            match queue::node_named(&name).or(recorded) {
                Some(owner) => owners.push(Part {
                    owner,
                    watched: Vec::new(),
                    commands,
                }),
                None => {
                    redis_module::logging::log_warning(format!(
                        "shard: transaction {txid} commits at node {name}, which no ring names now and whose address was not recorded (a decision of an older build): it waits"
                    ));
                    break;
                }
            }
        }
        if owners.len() != wanted {
            RESUMING.with(|r| r.borrow_mut().retain(|t| *t != txid));
            continue;
        }
        redis_module::logging::log_notice(format!(
            "shard: transaction {txid}: its commit is sent again to {}",
            owners
                .iter()
                .map(|p| p.owner.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let txn = Txn {
            txid,
            parts: owners,
            slots: Vec::new(),
        };
        let link = Link { db, ..link(None) };
        forward::spawn(link, move |steps| async move {
            let fleet = NetFleet { steps };
            let done = phases::commit_all(&txn, &fleet).await.is_ok();
            RESUMING.with(|r| r.borrow_mut().retain(|t| *t != txn.txid));
            if !done {
                fleet.pause(1000).await;
                resume();
            }
            CallReply::Reply(Resp::Null)
        });
    }
}
