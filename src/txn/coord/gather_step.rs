//! The main-thread step of a gathered command (`gather`): in one timer callback, so no other
//! command runs between its parts, the copies of the command's keys (read from their owners
//! as `DUMP` and `PEXPIRETIME`) are restored in the scratch database with their absolute
//! expiry, the command runs there as the calling user (`host::scratch`: not replicated, no
//! command filter), every key of the command is read back as `DUMP` and `PEXPIRETIME`, and
//! every key of the scratch database is deleted before the callback returns. What changed
//! (the value, or the expiry, or the key's being there) is what the transaction then writes at
//! the owners.
//!
//! The scratch database is the server's last (`databases` - 1): a fixed index needs no setting
//! that every node would have to agree on, any server with two databases or more has one, and
//! applications use the low ones. It must stay empty: a step that finds keys there refuses
//! (someone uses it), and a client whose own database is the scratch one cannot gather. Keys
//! the command writes that it did not declare (a script's) are deleted too, and the command is
//! refused: they belong to no owner the transaction knows.

use std::sync::OnceLock;

use redis_module::Context;

use crate::host::error::CmdError;
use crate::host::scratch::Scratch;
use crate::net::pool::Waiter;
use crate::net::resp::{read_reply, Resp};
use crate::txn::coord::hold::{self, Step};

/// One key as read at its owner, or as the command left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyCopy {
    pub key: Vec<u8>,
    /// `DUMP`'s payload; `None`: no such key.
    pub value: Option<Vec<u8>>,
    /// `PEXPIRETIME`: unix ms, or -1 for none.
    pub at_ms: i64,
}

/// What the step is given.
pub struct Job {
    pub copies: Vec<KeyCopy>,
    /// The commands, each its name first, run one after another.
    pub commands: Vec<Vec<Vec<u8>>>,
    /// A transaction's commands: the reply is an array of each one's (`EXEC`'s); else the one
    /// command's own.
    pub multi: bool,
    pub user: Vec<u8>,
    pub resp3: bool,
}

/// What the command came to: its reply, and the keys whose value or expiry it changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    pub reply: Resp,
    pub changed: Vec<KeyCopy>,
}

/// The scratch database's index: the server's last; refused when the server has only one.
pub fn scratch_db() -> Result<i32, CmdError> {
    static DATABASES: OnceLock<i32> = OnceLock::new();
    let n = match DATABASES.get() {
        Some(n) => *n,
        None => {
            let n = crate::host::context::server_config("databases")
                .parse::<i32>()
                .unwrap_or(0);
            if n > 0 {
                let _ = DATABASES.set(n);
            }
            n
        }
    };
    if n < 2 {
        return Err(CmdError::err(format!(
            "a command over keys of several owners is gathered in a scratch database, the server's last, and this server has {n}: set databases to 2 or more"
        )));
    }
    Ok(n - 1)
}

/// Runs `job` on a timer at once; `waiter` is given the step's outcome (`encode`). `false`
/// when no timer could be set.
pub fn start(waiter: Waiter, job: Job) -> bool {
    crate::host::context::after(std::time::Duration::ZERO, on_timer, (waiter, job))
}

fn on_timer(ctx: &Context, (waiter, job): (Waiter, Job)) {
    if hold::holds(Step::Scratch) {
        // A test's hold (`SHARD.DEBUG TXN-HOLD scratch`): the copies restored, then kept in
        // the scratch database (the rest of the step on a later timer) until it is lifted.
        if let Err(e) = restored_for_hold(ctx, &job) {
            let outcome = encode(Err(e));
            crate::route::forward::deliver_all(vec![(waiter, Ok(outcome))]);
            return;
        }
        held(ctx, (waiter, job, hold::Waiting::start()));
        return;
    }
    let outcome = encode(run(ctx, &job, false));
    crate::route::forward::deliver_all(vec![(waiter, Ok(outcome))]);
}

/// A step held at `scratch` with its copies restored: checked again every 10 ms; once the
/// hold is lifted the command runs on them and the step ends as any other.
fn held(ctx: &Context, (waiter, job, waiting): (Waiter, Job, hold::Waiting)) {
    if hold::holds(Step::Scratch) {
        let delay = std::time::Duration::from_millis(10);
        if crate::host::context::after(delay, held, (waiter, job, waiting)) {
            return;
        }
        let outcome = encode(Err(CmdError::err("no timer could be set")));
        crate::route::forward::deliver_all(vec![(waiter, Ok(outcome))]);
        return;
    }
    drop(waiting);
    let outcome = encode(run(ctx, &job, true));
    crate::route::forward::deliver_all(vec![(waiter, Ok(outcome))]);
}

/// The first half of a held step: the scratch database checked empty, the copies restored.
fn restored_for_hold(ctx: &Context, job: &Job) -> Result<(), CmdError> {
    let db = scratch_db()?;
    let scratch = Scratch::enter(ctx, db, Some(&job.user))?;
    check_empty(&scratch, db)?;
    if let Err(e) = restore(&scratch, job) {
        empty(&scratch)?;
        return Err(e);
    }
    Ok(())
}

/// Refused when the scratch database holds keys.
fn check_empty(scratch: &Scratch, db: i32) -> Result<(), CmdError> {
    match int(&scratch.own(&[b"DBSIZE"])?) {
        Some(0) => Ok(()),
        n => Err(CmdError::err(format!(
            "database {db}, the scratch database of commands over keys of several owners, holds {} keys: it must stay empty (the server's last database is kept for this)",
            n.unwrap_or(-1)
        ))),
    }
}

/// Deletes every key of the scratch database (unreplicated); how many there were.
fn empty(scratch: &Scratch) -> Result<usize, CmdError> {
    let Resp::Array(names) = reply_of(&scratch.own(&[b"KEYS", b"*"])?)? else {
        return Ok(0);
    };
    if names.is_empty() {
        return Ok(0);
    }
    let mut del: Vec<&[u8]> = vec![b"DEL"];
    del.extend(names.iter().filter_map(|n| match n {
        Resp::Bulk(b) => Some(b.as_slice()),
        _ => None,
    }));
    scratch.own(&del)?;
    Ok(names.len())
}

/// After a load (a restart, a replica's full sync): whatever the loaded data holds in the
/// scratch database is deleted. It is empty between two turns of the event loop, so a
/// snapshot never has keys there, but for a test's hold (`TXN-HOLD scratch`), which leaves
/// copies there across turns: a snapshot then, loaded later, brought back copies that are no
/// one's data, and every gather after would be refused.
pub fn empty_after_load() {
    crate::host::context::after(std::time::Duration::ZERO, emptied, ());
}

fn emptied(ctx: &Context, (): ()) {
    if crate::host::context::writes_paused() {
        crate::host::context::after(std::time::Duration::from_millis(1000), emptied, ());
        return;
    }
    let Ok(db) = scratch_db() else { return };
    let done = Scratch::enter(ctx, db, None).and_then(|scratch| empty(&scratch));
    match done {
        Ok(0) => {}
        Ok(n) => redis_module::logging::log_notice(format!(
            "shard: the scratch database ({db}) held {n} keys after the load (copies of a command over keys of several owners, saved while it was held): deleted"
        )),
        Err(e) => redis_module::logging::log_warning(format!(
            "shard: the scratch database ({db}) could not be emptied after the load: {}",
            e.message()
        )),
    }
}

/// The step itself; `restored`: the copies are in the scratch database already (a held step).
fn run(ctx: &Context, job: &Job, restored: bool) -> Result<Ran, CmdError> {
    if crate::host::context::writes_paused() {
        // A key expiring in the scratch database would have its deletion propagated.
        return Err(CmdError::code(
            "TRYAGAIN",
            "the server's writes are paused: a command over keys of several owners waits until they resume",
        ));
    }
    let db = scratch_db()?;
    let scratch = Scratch::enter(ctx, db, Some(&job.user))?;
    if !restored {
        check_empty(&scratch, db)?;
    }
    let ran = match restored {
        true => run_read(&scratch, job),
        false => restore(&scratch, job).and_then(|()| run_read(&scratch, job)),
    };
    // Every copy goes, whatever happened; and what the command wrote undeclared.
    let mut del: Vec<&[u8]> = vec![b"DEL"];
    del.extend(job.copies.iter().map(|c| c.key.as_slice()));
    scratch.own(&del)?;
    let left = reply_of(&scratch.own(&[b"KEYS", b"*"])?)?;
    if let Resp::Array(names) = left {
        if !names.is_empty() {
            let mut del: Vec<&[u8]> = vec![b"DEL"];
            del.extend(names.iter().filter_map(|n| match n {
                Resp::Bulk(b) => Some(b.as_slice()),
                _ => None,
            }));
            scratch.own(&del)?;
            return Err(CmdError::err(format!(
                "'{}' wrote {} keys it did not declare: a command over keys of several owners may write only its declared keys; nothing was written",
                job.commands
                    .iter()
                    .map(|c| String::from_utf8_lossy(c.first().map_or(&[][..], Vec::as_slice)).to_lowercase())
                    .collect::<Vec<_>>()
                    .join("', '"),
                names.len()
            )));
        }
    }
    ran
}

/// The copies restored in the scratch database with their absolute expiry.
fn restore(scratch: &Scratch, job: &Job) -> Result<(), CmdError> {
    for copy in &job.copies {
        let Some(value) = &copy.value else { continue };
        let at = copy.at_ms.max(0).to_string();
        let done = scratch.own(&[
            b"RESTORE",
            &copy.key,
            at.as_bytes(),
            value,
            b"REPLACE",
            b"ABSTTL",
        ])?;
        if let Resp::Error(line) = reply_of(&done)? {
            return Err(CmdError::err(format!(
                "the copy of key '{}' could not be restored here: {}",
                crate::host::args::printable(&copy.key),
                String::from_utf8_lossy(&line)
            )));
        }
    }
    Ok(())
}

/// The commands run on the copies, every key read back.
fn run_read(scratch: &Scratch, job: &Job) -> Result<Ran, CmdError> {
    let mut replies = Vec::with_capacity(job.commands.len());
    for command in &job.commands {
        let args: Vec<&[u8]> = command.iter().map(Vec::as_slice).collect();
        replies.push(reply_of(&scratch.as_user(&args, job.resp3)?)?);
    }
    let reply = match (job.multi, replies.pop()) {
        (false, Some(one)) if replies.is_empty() => one,
        (_, last) => {
            replies.extend(last);
            Resp::Array(replies)
        }
    };
    let mut changed = Vec::new();
    for copy in &job.copies {
        let after = read_back(scratch, &copy.key)?;
        if after != *copy {
            changed.push(after);
        }
    }
    Ok(Ran { reply, changed })
}

fn read_back(scratch: &Scratch, key: &[u8]) -> Result<KeyCopy, CmdError> {
    let value = match reply_of(&scratch.own(&[b"DUMP", key])?)? {
        Resp::Bulk(v) => Some(v),
        Resp::Null => None,
        other => {
            return Err(CmdError::err(format!(
                "DUMP of key '{}' replied {other:?}",
                crate::host::args::printable(key)
            )))
        }
    };
    let at_ms = match value {
        Some(_) => int(&scratch.own(&[b"PEXPIRETIME", key])?).unwrap_or(-1),
        None => -1,
    };
    let at_ms = if at_ms < 0 { -1 } else { at_ms };
    Ok(KeyCopy {
        key: key.to_vec(),
        value,
        at_ms,
    })
}

fn reply_of(bytes: &[u8]) -> Result<Resp, CmdError> {
    read_reply(&mut &bytes[..])
        .map_err(|e| CmdError::err(format!("a reply could not be read: {e}")))
}

fn int(bytes: &[u8]) -> Option<i64> {
    match reply_of(bytes) {
        Ok(Resp::Int(n)) => Some(n),
        _ => None,
    }
}

/// The step's outcome as the waiter is given it: `[reply, [key, value|nil, at-ms]...]`, or an
/// error line.
fn encode(ran: Result<Ran, CmdError>) -> Resp {
    match ran {
        Err(e) => Resp::Error(e.message().as_bytes().to_vec()),
        Ok(Ran { reply, changed }) => {
            let changed = changed
                .into_iter()
                .flat_map(|c| {
                    [
                        Resp::Bulk(c.key),
                        c.value.map_or(Resp::Null, Resp::Bulk),
                        Resp::Int(c.at_ms),
                    ]
                })
                .collect();
            Resp::Array(vec![reply, Resp::Array(changed)])
        }
    }
}

/// Reads back what `encode` made; the error line when the step failed.
pub fn decode(outcome: Resp) -> Result<Ran, String> {
    let Resp::Array(mut two) = outcome else {
        return match outcome {
            Resp::Error(line) => Err(String::from_utf8_lossy(&line).into_owned()),
            other => Err(format!("ERR the gathered command's step gave {other:?}")),
        };
    };
    let (Some(Resp::Array(flat)), Some(reply), true) = (two.pop(), two.pop(), two.is_empty())
    else {
        return Err("ERR the gathered command's step gave a malformed outcome".into());
    };
    let mut changed = Vec::with_capacity(flat.len() / 3);
    for c in flat.chunks(3) {
        match c {
            [Resp::Bulk(key), value, Resp::Int(at_ms)] => changed.push(KeyCopy {
                key: key.clone(),
                value: match value {
                    Resp::Bulk(v) => Some(v.clone()),
                    _ => None,
                },
                at_ms: *at_ms,
            }),
            _ => return Err("ERR the gathered command's step gave a malformed key".into()),
        }
    }
    Ok(Ran { reply, changed })
}
