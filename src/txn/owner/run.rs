//! `SHARD.TXN WATCH|UNWATCH|APPLY|PREPARE|COMMIT|ABORT` carried out at an owner
//! (docs/transactions.md), and a part committed or aborted by this node alone once its
//! coordinator answered (`doubt`).
//!
//! Atomic and durable: `APPLY` and `COMMIT` run their commands through `RedisModule_Call`,
//! replicated (`!`), inside the one `SHARD.TXN` command, so the server propagates them to
//! replicas and the AOF as one `MULTI`/`EXEC`; `COMMIT` ends that block with `SHARD.TXN
//! COMMIT txid` (no parts), which removes the record and remembers the txid as done where it is
//! replayed. `PREPARE` and `ABORT` are replicated as they came. A replica, or a server loading
//! its AOF, runs the same commands and only records: it checks nothing and runs no part; a
//! replica passes each record on to its own AOF (`relay`).
//! The replies to `APPLY` and `COMMIT` wait for a replica of this server when it has one
//! (`acked`).

use redis_module::{Context, ContextFlags};

use crate::host::caller;
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::host::replicate::replicate_args;
use crate::net::resp::{read_reply, ReplyResp, Resp};
use crate::txn::owner::owned::{self, held};
use crate::txn::owner::parse::{self, Command};
use crate::txn::owner::table::Prepared;
use crate::txn::owner::{acked, waiters, with};

/// The longest watch ttl and lock a coordinator may ask for (ms).
const MAX_MS: i64 = 86_400_000;

fn now() -> u64 {
    crate::clock::monotonic_ms()
}

/// Whether the command comes from the primary's replication stream or the AOF being loaded:
/// it then only records.
fn replayed(ctx: &Context) -> bool {
    let flags = ctx.get_flags();
    flags.contains(ContextFlags::REPLICATED) || flags.contains(ContextFlags::LOADING)
}

/// A record replayed from the primary's stream, passed on to this replica's own AOF: a module
/// command run from the stream is not written there unless it replicates itself (a replica's
/// own replicas get the primary's stream as it came), so a replica restarted from its AOF (or
/// promoted, then restarted) rebuilt its tables
/// without them, and a part its primary had committed came back prepared, to be applied a
/// second time. (Nothing is passed on while loading: the server propagates nothing then.)
fn relay(ctx: &Context) {
    let flags = ctx.get_flags();
    if flags.contains(ContextFlags::REPLICATED) && !flags.contains(ContextFlags::LOADING) {
        ctx.replicate_verbatim();
    }
}

fn args_of<'a>(call: &Call<'a>) -> Vec<&'a [u8]> {
    (0..call.args.len()).map(|i| call.args.get(i)).collect()
}

fn txid_of(call: &Call) -> Result<String, CmdError> {
    let t = call.args.get(2);
    if t.is_empty() {
        return Err(CmdError::err("the txid is empty"));
    }
    String::from_utf8(t.to_vec()).map_err(|_| CmdError::err("the txid is not UTF-8"))
}

fn ms_arg(call: &Call, i: usize, what: &str) -> Result<u64, CmdError> {
    crate::host::args::int_in(call.args.get(i), what, 1, MAX_MS).map(i64::unsigned_abs)
}

fn syntax(e: String) -> CmdError {
    CmdError::code("SYNTAX", e)
}

/// The key names of `cmds`, as the server's key specs give them.
fn keys_of(cmds: &[Command]) -> Result<Vec<Vec<u8>>, CmdError> {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for cmd in cmds {
        let positions = crate::host::command_keys::of_bytes(cmd).unwrap_or_default();
        for p in positions {
            if let Some(k) = cmd.get(p) {
                if !keys.contains(k) {
                    keys.push(k.clone());
                }
            }
        }
    }
    Ok(keys)
}

/// Refuses a key of `keys` locked by another txid than `txid` (`LOCKED other-txid`).
fn refuse_locked(db: i32, keys: &[Vec<u8>], txid: &str) -> CmdResult {
    with(|t| {
        for k in keys {
            if let Some(other) = t.locked_by(db, k).filter(|o| *o != txid) {
                return Err(CmdError::code("LOCKED", other));
            }
        }
        Ok(())
    })
}

/// `SHARD.TXN WATCH txid ttl-ms key [key ...]`.
pub fn watch(call: &Call) -> CmdResult {
    watch_args(call, "shard.txn|watch")?;
    call.reply.ok();
    Ok(())
}

/// `SHARD.TXN WATCH`'s and `READ`'s arguments (`txid ttl-ms key [key ...]`, `name` for the
/// refusal), the keys watched: the keys.
fn watch_args(call: &Call, name: &str) -> Result<Vec<Vec<u8>>, CmdError> {
    if call.args.len() < 5 {
        return Err(CmdError::wrong_arity(name));
    }
    let txid = txid_of(call)?;
    let ttl = ms_arg(call, 3, "ttl-ms")?;
    let keys: Vec<Vec<u8>> = (4..call.args.len())
        .map(|i| call.args.get(i).to_vec())
        .collect();
    watch_here(call, &txid, ttl, &keys);
    Ok(keys)
}

/// `SHARD.TXN READ txid ttl-ms key [key ...]`: watches the keys as `WATCH` does, then reads
/// each as `DUMP` and `PEXPIRETIME` in the same command (no other command runs between the
/// watch and the reads): `[payload|nil, at-ms]` for each key, in order (at-ms -1: no expiry).
/// A gathered command's first step (`txn::coord::gather`), one request per owner.
pub fn read(call: &Call) -> CmdResult {
    let keys = watch_args(call, "shard.txn|read")?;
    let run = |args: &[Vec<u8>]| {
        caller::run_as_caller(call, args, |mut bytes| {
            read_reply(&mut bytes).map_err(|e| CmdError::err(e.to_string()))
        })
    };
    let refused = |line: &[u8]| {
        let text = String::from_utf8_lossy(line);
        let (code, rest) = text.split_once(' ').unwrap_or((&text, ""));
        CmdError::code(code, rest)
    };
    let mut out = Vec::with_capacity(2 * keys.len());
    for key in keys {
        let mut args = vec![b"DUMP".to_vec(), key];
        let value = run(&args)?;
        let at = match &value {
            Resp::Bulk(_) => {
                args[0] = b"PEXPIRETIME".to_vec();
                match run(&args)? {
                    Resp::Int(n) if n >= 0 => n,
                    Resp::Error(line) => return Err(refused(&line)),
                    _ => -1,
                }
            }
            Resp::Null => -1,
            Resp::Error(line) => return Err(refused(line)),
            other => return Err(CmdError::err(format!("DUMP replied {other:?}"))),
        };
        out.push(value);
        out.push(Resp::Int(at));
    }
    call.reply.resp(&Resp::Array(out));
    Ok(())
}

/// `SHARD.TXN WATCH`'s work, in the database of `call` (a coordinator of this very node calls
/// it from its client's `SHARD.WATCH`: `txn::coord::local`).
pub fn watch_here(call: &Call, txid: &str, ttl_ms: u64, keys: &[Vec<u8>]) {
    let db = caller::selected_db(call) as i32;
    let there = there(call, keys);
    with(|t| t.watch(txid, db, keys, ttl_ms, now(), there));
}

/// Which of `keys` are in the caller's database now (read before the tables are: a lookup may
/// expire a key, whose events must not find the tables borrowed).
fn there<'k>(call: &Call, keys: &'k [Vec<u8>]) -> impl Fn(&[u8]) -> bool + 'k {
    let found: Vec<&'k [u8]> = keys
        .iter()
        .filter(|k| crate::host::keyspace::look_up(call.ctx, k).is_some())
        .map(Vec::as_slice)
        .collect();
    move |k| found.contains(&k)
}

/// `SHARD.TXN UNWATCH txid`.
pub fn unwatch(call: &Call) -> CmdResult {
    if call.args.len() != 3 {
        return Err(CmdError::wrong_arity("shard.txn|unwatch"));
    }
    let txid = txid_of(call)?;
    with(|t| t.unwatch(&txid));
    call.reply.ok();
    Ok(())
}

/// Runs `cmds` as the caller, in order, and gives each reply (an error is a reply).
fn run_all(call: &Call, cmds: &[Command]) -> Result<Vec<Resp>, CmdError> {
    cmds.iter()
        .map(|cmd| {
            caller::run_as_caller(call, cmd, |mut bytes| {
                read_reply(&mut bytes).map_err(|e| CmdError::err(e.to_string()))
            })
        })
        .collect()
}

/// `SHARD.TXN APPLY txid nwatched key... ncmds (argc arg...)...`: nil if a watched key was
/// written, else the commands' replies, atomically.
pub fn apply(call: &Call) -> CmdResult {
    if call.args.len() < 5 {
        return Err(CmdError::wrong_arity("shard.txn|apply"));
    }
    let txid = txid_of(call)?;
    let args = args_of(call);
    let (watched, next) = parse::watched(&args, 3).map_err(syntax)?;
    let cmds = parse::commands(&args, next).map_err(syntax)?;
    match apply_here(call, &txid, &watched, &cmds)? {
        ran @ Resp::Array(_) => acked::reply(call, &cmds, ran),
        watched => {
            call.reply.resp(&watched);
            Ok(())
        }
    }
}

/// `SHARD.TXN APPLY`'s work in the database of `call`, its commands run as its client (a
/// coordinator of this very node calls it from its client's `SHARD.EXEC`:
/// `txn::coord::local`): the null array if a watched key was written, else the commands'
/// replies; refused (nothing run) for a key not this node's, moving or locked.
pub fn apply_here(
    call: &Call,
    txid: &str,
    watched: &[Vec<u8>],
    cmds: &[Command],
) -> Result<Resp, CmdError> {
    let db = caller::selected_db(call) as i32;
    let keys = keys_of(cmds)?;
    owned::check_keys(&keys)?;
    refuse_locked(db, &keys, txid)?;
    let there = there(call, watched);
    let clean = with(|t| {
        let clean = t.watched_clean(txid, db, watched, now(), there);
        t.unwatch(txid);
        clean
    });
    if !clean {
        return Ok(Resp::NullArray);
    }
    Ok(Resp::Array(run_all(call, cmds)?))
}

/// `SHARD.TXN PREPARE txid lock-ms nwatched key... ncmds (argc arg...)... [FROM host:port]`.
pub fn prepare(call: &Call) -> CmdResult {
    if call.args.len() < 6 {
        return Err(CmdError::wrong_arity("shard.txn|prepare"));
    }
    let txid = txid_of(call)?;
    let lock_ms = ms_arg(call, 3, "lock-ms")?;
    let args = args_of(call);
    let (watched, next) = parse::watched(&args, 4).map_err(syntax)?;
    let (cmds, coordinator_at) = parse::commands_from(&args, next).map_err(syntax)?;
    let db = caller::selected_db(call) as i32;
    let keys = keys_of(&cmds)?;
    let part = Prepared {
        db,
        cmds,
        keys,
        lock_ms,
        since_ms: now(),
        coordinator_at,
    };
    if replayed(call.ctx) {
        with(|t| t.prepare(&txid, part));
        relay(call.ctx);
        call.reply.simple(b"PREPARED");
        return Ok(());
    }
    if with(|t| t.is_done(&txid) || t.forgot(&txid)) {
        return Err(CmdError::err(format!("{txid} was applied here already")));
    }
    if with(|t| t.prepared(&txid).is_some()) {
        // The same PREPARE again (a coordinator's retry): prepared already.
        call.reply.simple(b"PREPARED");
        return Ok(());
    }
    owned::check_keys(&part.keys)?;
    let there = there(call, &watched);
    if !with(|t| t.watched_clean(&txid, db, &watched, now(), there)) {
        return Err(CmdError::code(
            "WATCHED",
            "a watched key was written (or its watch timed out)",
        ));
    }
    refuse_locked(db, &part.keys, &txid)?;
    if let Some(key) = waiters::reserved(db, &part.keys) {
        // A client let go when a lock of this key ended has not run its command yet (it runs
        // before the server sleeps): `LOCKED`, which the coordinator waits on and retries.
        return Err(CmdError::code(
            "LOCKED",
            format!(
                "let-go: a command let go as a lock ended has yet to run on the key '{}'",
                crate::host::args::printable(key)
            ),
        ));
    }
    with(|t| t.prepare(&txid, part));
    call.ctx.replicate_verbatim();
    call.reply.simple(b"PREPARED");
    Ok(())
}

/// `SHARD.TXN COMMIT txid [ncmds (argc arg...)...]`.
pub fn commit(call: &Call) -> CmdResult {
    if call.args.len() < 3 {
        return Err(CmdError::wrong_arity("shard.txn|commit"));
    }
    let txid = txid_of(call)?;
    let args = args_of(call);
    let given = if args.len() > 3 {
        Some(parse::commands(&args, 3).map_err(syntax)?)
    } else {
        None
    };
    if replayed(call.ctx) {
        // The record's end, in the block that applied it (its commands came before).
        finish(&txid);
        relay(call.ctx);
        call.reply.ok();
        return Ok(());
    }
    if with(|t| t.is_done(&txid)) {
        // Applied here before: confirmed once a replica has it (what this server replicated
        // so far), as the first reply would have been.
        return acked::commit_reply(call, true, &txid, Resp::Simple(b"DONE".to_vec()));
    }
    let record = with(|t| t.prepared(&txid).cloned());
    if record.is_none() && with(|t| t.forgot(&txid)) {
        // Its coordinator sends it again (an owner that had not confirmed its part, or a
        // restart) after this owner applied it and dropped it from the done list: not again.
        redis_module::logging::log_warning(format!(
            "shard: transaction {txid}: a COMMIT came for a transaction older than the last one of its coordinator this node forgot (it keeps the last {}): answered DONE, not applied again",
            crate::txn::owner::table::DONE_KEPT
        ));
        call.reply.simple(b"DONE");
        return Ok(());
    }
    let (db, cmds) = match (record, given) {
        (Some(p), _) => (p.db, p.cmds),
        (None, Some(cmds)) => {
            redis_module::logging::log_warning(format!(
                "shard: transaction {txid}: no prepared part here, its part applied from the COMMIT ({})",
                printable_commands(&cmds)
            ));
            (caller::selected_db(call) as i32, cmds)
        }
        (None, None) => {
            return Err(CmdError::code(
                "NOPREPARED",
                format!("no prepared part of {txid} here: send COMMIT with its commands"),
            ))
        }
    };
    let selected = crate::host::keyspace::selected_db(call.ctx);
    if selected != db && !crate::host::keyspace::select_db(call.ctx, db) {
        return Err(CmdError::err(format!("cannot select database {db}")));
    }
    let replies = run_all(call, &cmds);
    replicate_args(call.ctx, c"SHARD.TXN", &[b"COMMIT", txid.as_bytes()]);
    if selected != db {
        crate::host::keyspace::select_db(call.ctx, selected);
    }
    finish(&txid);
    let replies = replies?;
    acked::commit_reply(call, acked::writes(&cmds), &txid, Resp::Array(replies))
}

/// The commands of a part as text, for the log (each at most 60 characters).
fn printable_commands(cmds: &[Command]) -> String {
    cmds.iter()
        .map(|c| {
            let text: Vec<String> = c
                .iter()
                .map(|a| String::from_utf8_lossy(a).into())
                .collect();
            text.join(" ").chars().take(60).collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The record of `txid` removed, its locks ended, its watches dropped, the txid done; the
/// clients waiting for its keys go on.
fn finish(txid: &str) {
    with(|t| {
        t.take_prepared(txid);
        t.unwatch(txid);
        t.add_done(txid);
    });
    waiters::release();
}

/// `SHARD.TXN ABORT txid`: idempotent.
pub fn abort(call: &Call) -> CmdResult {
    if call.args.len() != 3 {
        return Err(CmdError::wrong_arity("shard.txn|abort"));
    }
    let txid = txid_of(call)?;
    let had = with(|t| {
        t.unwatch(&txid);
        t.take_prepared(&txid).is_some()
    });
    if had && !replayed(call.ctx) {
        call.ctx.replicate_verbatim();
    } else if had {
        relay(call.ctx);
    }
    waiters::release();
    call.reply.ok();
    Ok(())
}

/// Commits a prepared part on this node's own (its coordinator answered `commit`), from a
/// timer: the commands run with no user, replicated with the record's end as one block.
pub fn commit_alone(ctx: &Context, txid: &str) {
    let Some(part) = with(|t| t.prepared(txid).cloned()) else {
        return;
    };
    redis_module::logging::log_warning(format!(
        "shard: transaction {txid}: its coordinator answered commit, the part applied here ({})",
        printable_commands(&part.cmds)
    ));
    let selected = crate::host::keyspace::selected_db(ctx);
    crate::host::keyspace::select_db(ctx, part.db);
    for cmd in &part.cmds {
        let _ = caller::run_own(ctx, cmd, |_| Ok(()));
    }
    replicate_args(ctx, c"SHARD.TXN", &[b"COMMIT", txid.as_bytes()]);
    crate::host::keyspace::select_db(ctx, selected);
    finish(txid);
}

/// Aborts a prepared part on this node's own (its coordinator answered `abort`), from a timer.
pub fn abort_alone(ctx: &Context, txid: &str) {
    if with(|t| t.take_prepared(txid)).is_some() {
        replicate_args(ctx, c"SHARD.TXN", &[b"ABORT", txid.as_bytes()]);
    }
    waiters::release();
}

/// `SHARD.LOCKED command arg ...` (what the filter makes of a command of a locked key): runs
/// the command now when its keys are free in the client's database; else waits for them
/// (refused at once inside `MULTI` or a script).
pub fn locked(call: &Call) -> CmdResult {
    if call.args.len() < 2 {
        return Err(CmdError::wrong_arity("shard.locked"));
    }
    let db = caller::selected_db(call) as i32;
    // The command's keys; a routed call's (`SHARD.CALL [WAIT n t] cmd ...`) are its carried
    // command's.
    let start = 1 + crate::txn::owner::marks::carried_start(|i| {
        (i + 1 < call.args.len()).then(|| call.args.get(i + 1))
    });
    let keys: Vec<Vec<u8>> = crate::host::command_keys::of_call(call, start)
        .unwrap_or_default()
        .into_iter()
        .map(|p| call.args.get(p + start).to_vec())
        .collect();
    let holder = with(|t| {
        keys.iter()
            .find_map(|k| t.locked_by(db, k).map(|txid| (k.clone(), txid.to_string())))
    });
    let Some((key, txid)) = holder else {
        return caller::pass_through(call, call.args.get(1), 2);
    };
    let flags = call.ctx.get_flags();
    if flags.contains(ContextFlags::MULTI)
        || flags.contains(ContextFlags::DENY_BLOCKING)
        || flags.contains(ContextFlags::LUA)
    {
        return Err(held(
            &key,
            &txid,
            "a command in MULTI or a script cannot wait",
        ));
    }
    waiters::wait(call, db, keys)
}
