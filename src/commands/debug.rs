//! `SHARD.DEBUG PANIC`: proves the panic guard on a live server; `SHARD.DEBUG KEYINDEX db`:
//! every name the key index holds for database `db`, with its bucket (the tests compare it with
//! a full scan); `SHARD.DEBUG FLEET-HOLD phase n | OFF`: holds this node's fleet coordinator in
//! `phase` once the plan's first `n` nodes have that phase's rings (the tests act between two
//! nodes of a phase), or, in a phase that installs no rings (`copy`), once its jobs are done; `SHARD.DEBUG TXN-HOLD read|scratch|prepared|decided|committed-one|kill-after-commit|OFF|HELD`: holds this
//! node's transactions at that step of the two-phase commit (`txn::coord::hold`; `HELD`: how
//! many wait there), so that a test kills or fails over a node at that exact step;
//! `SHARD.DEBUG RING-CHECK HOLD | GO`: holds the check of this node's rings after a load or a
//! promotion (its writes refused meanwhile), or lets it go on (a hold at start:
//! `SHARD_DEBUG_HOLD_RING_CHECK=yes` in the server's environment); `SHARD.DEBUG COPY-CHILD-END
//! ms`: a copy's child waits `ms` before it exits and the job leaves reaping it to the server's
//! cron (0: off; `reshard::copy_child`). Refused unless redis-server
//! runs with `enable-debug-command yes` (or
//! `local`, from a local connection), like Redis's own DEBUG command.

use crate::command;
use crate::host::register::CommandSpec;
use redis_module::RedisValue;

use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::{int_in, is};

pub fn debug(call: &Call) -> CmdResult {
    let panic = call.args.len() == 2 && is(call.args.get(1), "PANIC");
    let index = call.args.len() == 3 && is(call.args.get(1), "KEYINDEX");
    let forget = call.args.len() == 4 && is(call.args.get(1), "KEYINDEX-FORGET");
    let gone_limit = call.args.len() == 3 && is(call.args.get(1), "KEYINDEX-GONE-LIMIT");
    let hold = (3..=4).contains(&call.args.len()) && is(call.args.get(1), "FLEET-HOLD");
    let txn_hold = call.args.len() == 3 && is(call.args.get(1), "TXN-HOLD");
    let ring_check = call.args.len() == 3 && is(call.args.get(1), "RING-CHECK");
    let child_end = call.args.len() == 3 && is(call.args.get(1), "COPY-CHILD-END");
    if !panic && !index && !forget && !gone_limit && !hold && !txn_hold && !ring_check && !child_end
    {
        return Err(CmdError::err(
            "usage: SHARD.DEBUG PANIC | KEYINDEX db | KEYINDEX-FORGET db key | KEYINDEX-GONE-LIMIT n | FLEET-HOLD phase n | FLEET-HOLD OFF | TXN-HOLD read|scratch|prepared|decided|committed-one|kill-after-commit|OFF|HELD | RING-CHECK HOLD|GO | COPY-CHILD-END ms",
        ));
    }
    let setting = call
        .ctx
        .call("CONFIG", &["GET", "enable-debug-command"])
        .map_err(|e| CmdError::err(format!("CONFIG GET failed: {e}")))?;
    let enabled = match setting {
        RedisValue::Array(v) => v.iter().any(|x| {
            matches!(x, RedisValue::BulkString(s) | RedisValue::SimpleString(s) if s == "yes" || s == "local")
        }),
        _ => false,
    };
    if !enabled {
        return Err(CmdError::err(
            "SHARD.DEBUG is disabled: start redis-server with enable-debug-command yes",
        ));
    }
    if index {
        return key_index(call);
    }
    if forget {
        return key_index_forget(call);
    }
    if hold {
        return fleet_hold(call);
    }
    if txn_hold {
        return txn_hold_step(call);
    }
    if ring_check {
        let on = match String::from_utf8_lossy(call.args.get(2))
            .to_ascii_uppercase()
            .as_str()
        {
            "HOLD" => true,
            "GO" => false,
            _ => return Err(CmdError::err("usage: SHARD.DEBUG RING-CHECK HOLD|GO")),
        };
        crate::reshard::fleet::repair::hold(on);
        call.reply.ok();
        return Ok(());
    }
    if child_end {
        let ms = int_in(call.args.get(2), "ms", 0, 60_000)?;
        crate::reshard::copy_child::hold_end(ms.unsigned_abs());
        call.reply.ok();
        return Ok(());
    }
    if gone_limit {
        // How many names deleted during a build are remembered before the build looks names
        // up as they arrive instead (1 000 000 by default; the tests lower it).
        let n = int_in(call.args.get(2), "n", 0, 1 << 40)?;
        crate::index::set_gone_limit(n.unsigned_abs() as usize);
        call.reply.ok();
        return Ok(());
    }
    panic!("SHARD.DEBUG PANIC was called");
}

/// `FLEET-HOLD phase n`: this node's coordinator installs `phase`'s rings on the plan's first
/// `n` nodes only, then waits (`n` at least the plan's nodes: on every node, then it waits
/// before the phase's jobs; in a phase that installs no rings, `copy`: once its jobs are done);
/// `FLEET-HOLD OFF` lets it go on.
fn fleet_hold(call: &Call) -> CmdResult {
    use crate::reshard::fleet::{coordinator, plan::Phase};
    if call.args.len() == 3 && is(call.args.get(2), "OFF") {
        coordinator::set_hold(None);
        call.reply.ok();
        return Ok(());
    }
    if call.args.len() != 4 {
        return Err(CmdError::err(
            "usage: SHARD.DEBUG FLEET-HOLD phase n | FLEET-HOLD OFF",
        ));
    }
    let name = String::from_utf8_lossy(call.args.get(2)).to_ascii_lowercase();
    let phase = Phase::named(&name)
        .ok_or_else(|| CmdError::err(format!("no fleet phase is named '{name}'")))?;
    let n = int_in(call.args.get(3), "n", 0, 1 << 16)?;
    coordinator::set_hold(Some((phase, n.unsigned_abs() as usize)));
    call.reply.ok();
    Ok(())
}

/// `TXN-HOLD step`: this node's transactions wait at `step` of the two-phase commit; `OFF`
/// lets them go on; `HELD`: how many wait there now.
fn txn_hold_step(call: &Call) -> CmdResult {
    use crate::txn::coord::hold::{self, Step};
    let word = String::from_utf8_lossy(call.args.get(2)).to_ascii_lowercase();
    match word.as_str() {
        "held" => {
            call.reply.int(hold::held() as i64);
            return Ok(());
        }
        "off" => hold::set(None),
        name => hold::set(Some(Step::named(name).ok_or_else(|| {
            CmdError::err(format!(
                "no transaction step is named '{name}': read, scratch, prepared, decided, committed-one or kill-after-commit"
            ))
        })?)),
    }
    call.reply.ok();
    Ok(())
}

/// A database number argument.
fn db_arg(arg: &[u8]) -> Result<i32, CmdError> {
    // (Within i32 by its range.)
    int_in(arg, "db", 0, i64::from(i32::MAX)).map(|db| db as i32)
}

/// `KEYINDEX-FORGET db key`: takes `key` out of the index as if its event had been missed (the
/// tests prove that a copy then does not trust the index); 1 if it was there.
fn key_index_forget(call: &Call) -> CmdResult {
    let db = db_arg(call.args.get(2))?;
    let ring = crate::state::lock().current_ring()?.clone();
    let key = call.args.get(3);
    let gone = crate::index::forget_for_test(&ring, db, key)
        .ok_or_else(|| CmdError::code("NOTREADY", "the key index is not ready"))?;
    call.reply.int(i64::from(gone));
    Ok(())
}

/// `KEYINDEX db`: `[bucket, name, ...]` of database `db`, once the index is ready.
fn key_index(call: &Call) -> CmdResult {
    let db = db_arg(call.args.get(2))?;
    let ring = crate::state::lock().current_ring()?.clone();
    let pairs = crate::index::with_ready(&ring, |index| {
        index
            .buckets(db)
            .flat_map(|(bucket, _)| index.names(db, bucket).map(move |n| (bucket, n.to_vec())))
            .collect::<Vec<_>>()
    })
    .ok_or_else(|| {
        CmdError::code(
            "NOTREADY",
            format!(
                "the key index is {} for the current ring",
                crate::index::status().phase.name()
            ),
        )
    })?;
    let reply = &call.reply;
    reply.array(pairs.len() * 2);
    for (bucket, name) in pairs {
        reply.int(i64::from(bucket));
        reply.bulk(&name);
    }
    Ok(())
}

/// `SHARD.DEBUG`: how Redis registers and documents it.
pub static COMMAND: CommandSpec = command! {
    name: "shard.debug",
    handler: debug,
    flags: "admin",
    arity: -2,
    summary: "Debugging: PANIC proves the panic guard; KEYINDEX db lists the key index; KEYINDEX-FORGET db key drops a name from it; FLEET-HOLD phase n holds the fleet coordinator in a phase after n nodes (copy: after its jobs); TXN-HOLD step holds transactions at a step of the two-phase commit; RING-CHECK HOLD|GO holds the check of rings after a load or a promotion; COPY-CHILD-END ms holds a copy's child at its end and leaves reaping it to the server (needs enable-debug-command)",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};
