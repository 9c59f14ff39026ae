//! A command over keys of several owners that does not split (`RENAME a b`, `LMOVE`, `SMOVE`,
//! `SUNIONSTORE`, `COPY`, `MSETNX`, `BITOP`, `PFMERGE`, `EVAL` with keys of two owners...),
//! run all or nothing and isolated as an optimistic transaction across the owners, with the
//! command's own reply. Routing decides that a call is gathered (`route::decide`'s
//! `Route::Gather`: several owners, no split, no key moving in a resharding, a client that may
//! be blocked); the glue (`commands::call`) hands it here. Each attempt:
//!
//! 1. every key is watched at its owner, as `SHARD.WATCH` watches it, and
//! 2. read there, as `DUMP` and `PEXPIRETIME`, in the client's database: both in one request
//!    per owner, `SHARD.TXN READ` (an owner of an older build: `WATCH`, then the reads);
//! 3. in one main-thread step at this node (`gather_step`) the copies are restored in the
//!    scratch database, the command runs there as the calling user, unreplicated, and every
//!    key is read back; the copies are gone before the step returns. A pure move or copy
//!    (`RENAME`, `RENAMENX`, `COPY` without `DB`) is worked out from the copies instead
//!    (`moves`: the same writes, no scratch run; the user's ACL was checked for the command
//!    and its keys when it was routed);
//! 4. the keys the command changed are written at their owners (`RESTORE key at value REPLACE
//!    ABSTTL`, or `DEL key`) as one transaction across the owners conditioned on the watches:
//!    the coordinator's own path (`exec::drive`: `PREPARE` at every owner, the decision
//!    recorded durably, `COMMIT`s carried out again after a crash or a failover);
//! 5. the reply is the command's, from step 3.
//!
//! A watched key written meanwhile (or locked by another transaction) aborts the attempt; after
//! `ATTEMPTS` the client gets `TRYAGAIN` naming the keys. Isolation is the watches': the reads
//! of step 2 are the values at the commit, since none of them changed between the watch and the
//! `PREPARE`, and the `PREPARE` locks them until the `COMMIT`.
//!
//! Why not a lock first and the read under it: the owner side locks keys only with the
//! prepared writes, which are known only after the command ran; an optimistic attempt uses the
//! protocol as it is, and a conflict costs one more round. Why every key is read back rather
//! than only those the key specs call written: a script's keys have no specs (`EVAL`'s are all
//! "may write"), and comparing each key with its copy writes only what really changed (a
//! `SMOVE` of a missing member writes nothing). Expiry is absolute (`PEXPIRETIME`, `ABSTTL`),
//! so a commit carried out late (after a crash) does not extend a key's life; the nodes' clocks
//! must agree as they must for Redis's own replication of expiries.
//!
//! Limits: `DUMP`s over `MAX_BYTES` in all are refused (the step restores them in one go on the
//! main thread); the keys must not be moving in a resharding; not inside `MULTI`, a script or
//! `SHARD.MULTI`; not with `SHARD.CALL WAIT`. A command that writes keys it did not declare
//! (a script) is refused, nothing written.

use futures_util::future::join_all;

use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::host::{acl, caller};
use crate::net::endpoint::Endpoint;
use crate::net::resp::Resp;
use crate::route::command_table::Carried;
use crate::route::forward::{self, CallReply, NetSteps};
use crate::txn::coord::exec::{self, WATCH_TTL_MS};
use crate::txn::coord::fleet::NetFleet;
use crate::txn::coord::gather_step::{self, Job, KeyCopy, Ran};
use crate::txn::coord::hold::Step;
use crate::txn::coord::phases::{Fleet, Outcome};
use crate::txn::coord::plan::{Part, Txn};
use crate::txn::coord::queue::Entry;
use crate::txn::coord::wire::Command;
use crate::txn::coord::{clients, moves, queue, wire};

/// How many times a gathered command is tried when a watched key was written meanwhile.
pub const ATTEMPTS: usize = 8;
/// The most bytes of `DUMP` a gathered command reads (restored in one main-thread step).
pub const MAX_BYTES: usize = 16 << 20;

/// Each owner and its keys.
type Groups = Vec<(Endpoint, Vec<Vec<u8>>)>;

/// Gathers the command `call` carries (its keys of several owners) and replies once it
/// committed, or why not.
pub fn gather(call: &Call, command: &Carried) -> CmdResult {
    let start = command.start;
    let args: Vec<Vec<u8>> = (start..call.args.len())
        .map(|i| call.args.get(i).to_vec())
        .collect();
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(command.positions.len());
    for &p in &command.positions {
        if let Some(k) = args.get(p) {
            if !keys.contains(k) {
                keys.push(k.clone());
            }
        }
    }
    check_db(call, &format!("'{}'", command.name_text))?;
    let groups = group(&keys)?;
    let user =
        acl::caller_name(call).ok_or_else(|| CmdError::err("cannot tell the calling user"))?;
    let txids = exec::new_txids(call, ATTEMPTS as u64)?;
    launch(
        call,
        |resp3| Gathered {
            name: format!("'{}'", command.name_text),
            commands: vec![args],
            exec: None,
            keys,
            groups,
            user,
            resp3,
        },
        txids,
    )
}

/// Blocks the client of `call` and runs the gather `job` makes (given whether the client
/// speaks RESP3) over the network, trying the txids `txids` in turn; its reply is the client's.
fn launch(call: &Call, job: impl FnOnce(bool) -> Gathered, txids: Vec<String>) -> CmdResult {
    let link = exec::link(Some(call));
    let job = job(link.resp3);
    let lock_ms = exec::lock_ms();
    forward::run(call, link, move |steps| async move {
        let fleet = NetFleet { steps };
        job.run(&fleet, &txids, lock_ms).await
    })
    .map_err(CmdError::err)
}

/// `SHARD.EXEC` of a transaction one of whose queued commands has keys of several owners and
/// does not split (`queue::Entry::placed` is `None`): the whole transaction is gathered, as
/// one such command is. Every key of every queued command is watched and read at its owner
/// (under the client's txid when it watched keys, beside its watches); the queued commands run
/// one after another, in queue order, on the copies in one main-thread step (or, all pure
/// moves, are worked out from them); the keys they changed are written at their owners by
/// one two-phase commit whose parts check the client's watched keys and the keys read. The
/// reply is each command's own, in queue order, as `EXEC`'s. A watched key written (or another
/// transaction's lock met) when the client watched keys: nil, as `EXEC`; without watches the
/// attempt is tried again, as a gathered command is, then `TRYAGAIN`.
pub fn exec_gathered(
    call: &Call,
    txid: Option<String>,
    watched: Groups,
    entries: Vec<Entry>,
) -> CmdResult {
    let prepared = (|| {
        check_db(call, "a transaction")?;
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for e in &entries {
            for k in &e.keys {
                if !keys.contains(k) {
                    keys.push(k.clone());
                }
            }
        }
        let groups = group(&keys)?;
        let user =
            acl::caller_name(call).ok_or_else(|| CmdError::err("cannot tell the calling user"))?;
        // With watched keys the client's txid holds them at their owners: one attempt under
        // it (its watches are dropped by any abort). Without: a fresh txid per attempt.
        let txids = match &txid {
            Some(t) if !watched.is_empty() => vec![t.clone()],
            _ => exec::new_txids(call, ATTEMPTS as u64)?,
        };
        Ok::<_, CmdError>((keys, groups, user, txids))
    })();
    let (keys, groups, user, txids) = match prepared {
        Ok(p) => p,
        Err(e) => {
            if let Some(t) = &txid {
                exec::unwatch_later(t, &watched);
            }
            clients::count(&clients::ABORTED_ERROR);
            return Err(e);
        }
    };
    launch(
        call,
        |resp3| Gathered {
            name: "the transaction".into(),
            commands: entries.into_iter().map(|e| e.command).collect(),
            exec: Some(watched),
            keys,
            groups,
            user,
            resp3,
        },
        txids,
    )
}

/// Refuses a gather from the scratch database itself (`what` is gathered).
fn check_db(call: &Call, what: &str) -> Result<(), CmdError> {
    let scratch = gather_step::scratch_db()?;
    let db = caller::selected_db(call);
    if i64::from(db) == i64::from(scratch) {
        return Err(CmdError::err(format!(
            "database {scratch} is the scratch database of commands over keys of several owners: run {what} from another database, or give its keys one hash tag"
        )));
    }
    Ok(())
}

/// The keys grouped by owner (in the order owners first appear).
fn group(keys: &[Vec<u8>]) -> Result<Groups, CmdError> {
    let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let owners = queue::owners_of(&key_refs)?;
    let mut groups: Groups = Vec::new();
    for (owner, key) in owners.into_iter().zip(keys) {
        match groups.iter_mut().find(|(o, _)| o.name == owner.name) {
            Some((_, ks)) => ks.push(key.clone()),
            None => groups.push((owner, vec![key.clone()])),
        }
    }
    Ok(groups)
}

/// A gathered command (or transaction) on its way.
struct Gathered {
    /// How messages name it: `'rename'`, or `the transaction`.
    name: String,
    /// The commands, each its name first: one, or a transaction's in queue order.
    commands: Vec<Command>,
    /// Inside `SHARD.EXEC`: the client's watched keys by owner; the reply is an array of each
    /// command's reply, counted as `SHARD.EXEC`'s.
    exec: Option<Groups>,
    /// Every key read.
    keys: Vec<Vec<u8>>,
    /// Each owner and its keys read.
    groups: Groups,
    user: Vec<u8>,
    resp3: bool,
}

/// How one attempt ended.
enum Attempt {
    Done(CallReply),
    /// A watched key was written, or locked: try again (`Outcome` says which, for nil).
    Again(Outcome),
}

impl Gathered {
    async fn run(&self, fleet: &NetFleet, txids: &[String], lock_ms: u64) -> CallReply {
        let watching = self.exec.as_ref().is_some_and(|w| !w.is_empty());
        for (tried, txid) in txids.iter().enumerate() {
            match self.attempt(fleet, txid, lock_ms).await {
                Attempt::Done(reply) => return reply,
                // The client's watches are gone with the abort: nil, as EXEC (the client
                // reads again and retries).
                Attempt::Again(outcome) if watching => return exec::reply(outcome),
                Attempt::Again(_) => {
                    let most = (5 * (tried as u64 + 1)).min(50);
                    fleet.pause(1 + fleet.random(most)).await;
                }
            }
        }
        let keys: Vec<String> = self
            .keys
            .iter()
            .map(|k| format!("'{}'", crate::host::args::printable(k)))
            .collect();
        let line = format!(
            "TRYAGAIN {} was tried {ATTEMPTS} times, and each time another client wrote one of its keys ({}) first: retry",
            self.name,
            keys.join(", ")
        );
        match self.exec {
            Some(_) => exec::reply(Outcome::Locked(line)),
            None => CallReply::Error(line),
        }
    }

    /// The client's watches and the keys read, by owner: who takes part in the commit.
    fn owners(&self) -> Groups {
        let mut all = self.groups.clone();
        for (owner, ks) in self.exec.iter().flatten() {
            match all.iter_mut().find(|(o, _)| o.name == owner.name) {
                Some((_, have)) => {
                    for k in ks {
                        if !have.contains(k) {
                            have.push(k.clone());
                        }
                    }
                }
                None => all.push((owner.clone(), ks.clone())),
            }
        }
        all
    }

    /// The reply of a run that ended in `line` (an error before any write).
    fn failed(&self, txid: &str, line: String) -> Attempt {
        exec::unwatch_later(txid, &self.owners());
        Attempt::Done(match self.exec {
            Some(_) => exec::reply(Outcome::Failed(line)),
            None => CallReply::Error(line),
        })
    }

    async fn attempt(&self, fleet: &NetFleet, txid: &str, lock_ms: u64) -> Attempt {
        let steps = &fleet.steps;
        let copies = match self.watch_read(steps, txid).await {
            Ok(c) => c,
            Err(line) => return self.failed(txid, line),
        };
        fleet.wait_at(Step::Read).await;
        let ran = match moved_all(&self.commands, &copies, self.exec.is_some()) {
            Some(ran) => Ok(ran),
            None => self.run_here(steps, copies).await,
        };
        let ran = match ran {
            Ok(r) => r,
            Err(line) => return self.failed(txid, line),
        };
        let txn = self.writes(txid, &ran.changed);
        let outcome = exec::drive(&txn, fleet, lock_ms).await;
        match (outcome, &self.exec) {
            (Outcome::Committed(Ok(_)), None) => Attempt::Done(CallReply::Reply(ran.reply)),
            (Outcome::Committed(Ok(_)), Some(_)) => {
                let replies = match ran.reply {
                    Resp::Array(r) => r,
                    other => vec![other],
                };
                Attempt::Done(exec::reply(Outcome::Committed(Ok(replies))))
            }
            (o @ (Outcome::Committed(Err(_)) | Outcome::Failed(_)), Some(_)) => {
                Attempt::Done(exec::reply(o))
            }
            (Outcome::Committed(Err(line)) | Outcome::Failed(line), None) => {
                Attempt::Done(CallReply::Error(line))
            }
            (o @ (Outcome::Watched | Outcome::Locked(_) | Outcome::LockedWatched(_)), _) => {
                Attempt::Again(o)
            }
        }
    }

    /// Step 3: the command run here on the copies (`gather_step`).
    async fn run_here(&self, steps: &NetSteps, copies: Vec<KeyCopy>) -> Result<Ran, String> {
        let (waiter, told) = steps.expect();
        let job = Job {
            copies,
            commands: self.commands.clone(),
            multi: self.exec.is_some(),
            user: self.user.clone(),
            resp3: self.resp3,
        };
        if !gather_step::start(waiter, job) {
            return Err("ERR the module's context is not ready: retry".into());
        }
        match told.await {
            Ok(outcome) => gather_step::decode(outcome),
            Err(e) => Err(format!("ERR shard.txn: {e}")),
        }
    }

    /// Steps 1 and 2: `SHARD.TXN READ` at every owner at once (the keys watched and read in
    /// one command there). An owner of an older build, which has no `READ`, is sent `WATCH`,
    /// then `DUMP` and `PEXPIRETIME` of each key.
    async fn watch_read(&self, steps: &NetSteps, txid: &str) -> Result<Vec<KeyCopy>, String> {
        let sent = self
            .groups
            .iter()
            .map(|(owner, ks)| steps.send_control(owner, &wire::read(txid, WATCH_TTL_MS, ks)));
        let mut copies = Vec::with_capacity(self.keys.len());
        for ((owner, ks), reply) in self.groups.iter().zip(join_all(sent).await) {
            match reply {
                Ok(Resp::Array(items)) if items.len() == 2 * ks.len() => {
                    for (key, pair) in ks.iter().zip(items.chunks(2)) {
                        copies.push(copy_of(key, &pair[0], &pair[1])?);
                    }
                }
                Ok(Resp::Error(line)) if unknown_subcommand(&line) => {
                    copies.extend(self.watch_then_read(steps, txid, owner, ks).await?);
                }
                Ok(Resp::Error(line)) => return Err(String::from_utf8_lossy(&line).into_owned()),
                Ok(other) => return Err(format!("ERR SHARD.TXN READ replied {other:?}")),
                Err(e) => return Err(format!("ERR shard.txn: {e}")),
            }
        }
        let bytes: usize = copies
            .iter()
            .map(|c| c.value.as_ref().map_or(0, Vec::len))
            .sum();
        if bytes > MAX_BYTES {
            return Err(format!(
                "ERR the keys of {} hold {bytes} bytes (as DUMP): a command over keys of several owners gathers at most {MAX_BYTES} bytes, restored here in one step; give its keys one hash tag",
                self.name
            ));
        }
        Ok(copies)
    }

    /// `watch_read` at an owner of an older build: `WATCH`, then each key's `DUMP` and
    /// `PEXPIRETIME`.
    async fn watch_then_read(
        &self,
        steps: &NetSteps,
        txid: &str,
        owner: &Endpoint,
        ks: &[Vec<u8>],
    ) -> Result<Vec<KeyCopy>, String> {
        match steps
            .send_control(owner, &wire::watch(txid, WATCH_TTL_MS, ks))
            .await
        {
            Ok(Resp::Error(line)) => return Err(String::from_utf8_lossy(&line).into_owned()),
            Ok(_) => {}
            Err(e) => return Err(format!("ERR shard.txn: {e}")),
        }
        let asked = ks.iter().map(|k| {
            let dump = steps.send(owner, &[b"DUMP".to_vec(), k.clone()]);
            let at = steps.send(owner, &[b"PEXPIRETIME".to_vec(), k.clone()]);
            async move { (dump.await, at.await) }
        });
        let mut copies = Vec::with_capacity(ks.len());
        for (key, (dump, at)) in ks.iter().zip(join_all(asked).await) {
            let dump = dump.map_err(|e| format!("ERR shard.call: {e}"))?;
            let at = at.map_err(|e| format!("ERR shard.call: {e}"))?;
            copies.push(copy_of(key, &dump, &at)?);
        }
        Ok(copies)
    }

    /// Step 4's transaction: one part per owner, its keys (and the client's watched keys
    /// there) watched, the changed ones written.
    fn writes(&self, txid: &str, changed: &[KeyCopy]) -> Txn {
        let parts = self
            .owners()
            .iter()
            .map(|(owner, ks)| Part {
                owner: owner.clone(),
                watched: ks.clone(),
                commands: changed
                    .iter()
                    .filter(|c| ks.contains(&c.key))
                    .map(write_of)
                    .collect(),
            })
            .collect();
        Txn {
            txid: txid.to_string(),
            parts,
            slots: Vec::new(),
        }
    }
}

/// What `commands` do to `copies`, one after another, when every one is a pure move or copy
/// (`moves`): each one's reply (in an array when `multi`, else the only one's), and the keys
/// changed in the end.
fn moved_all(commands: &[Command], copies: &[KeyCopy], multi: bool) -> Option<Ran> {
    let mut now = copies.to_vec();
    let mut replies = Vec::with_capacity(commands.len());
    for command in commands {
        let ran = moves::moved(command, &now)?;
        replies.push(ran.reply);
        for c in ran.changed {
            if let Some(at) = now.iter_mut().find(|n| n.key == c.key) {
                *at = c;
            }
        }
    }
    let changed = now
        .into_iter()
        .zip(copies)
        .filter(|(after, before)| after != *before)
        .map(|(after, _)| after)
        .collect();
    let reply = match (multi, replies.pop()) {
        (false, Some(one)) if replies.is_empty() => one,
        (_, last) => {
            replies.extend(last);
            Resp::Array(replies)
        }
    };
    Some(Ran { reply, changed })
}

/// A key as read at its owner: its `DUMP` reply and its `PEXPIRETIME` reply.
fn copy_of(key: &[u8], dump: &Resp, at: &Resp) -> Result<KeyCopy, String> {
    let value = match dump {
        Resp::Bulk(v) => Some(v.clone()),
        Resp::Null => None,
        Resp::Error(line) => return Err(String::from_utf8_lossy(line).into_owned()),
        other => return Err(format!("ERR DUMP replied {other:?}")),
    };
    let at_ms = match at {
        Resp::Int(n) if *n >= 0 => *n,
        Resp::Int(_) => -1,
        Resp::Error(line) => return Err(String::from_utf8_lossy(line).into_owned()),
        other => return Err(format!("ERR PEXPIRETIME replied {other:?}")),
    };
    Ok(KeyCopy {
        key: key.to_vec(),
        value,
        at_ms,
    })
}

/// Whether an owner's error says it has no such subcommand (an older build).
fn unknown_subcommand(line: &[u8]) -> bool {
    String::from_utf8_lossy(line)
        .to_ascii_lowercase()
        .contains("unknown subcommand")
}

/// The write that leaves `copy` at its owner.
fn write_of(copy: &KeyCopy) -> Vec<Vec<u8>> {
    match &copy.value {
        Some(value) => vec![
            b"RESTORE".to_vec(),
            copy.key.clone(),
            copy.at_ms.max(0).to_string().into_bytes(),
            value.clone(),
            b"REPLACE".to_vec(),
            b"ABSTTL".to_vec(),
        ],
        None => vec![b"DEL".to_vec(), copy.key.clone()],
    }
}
