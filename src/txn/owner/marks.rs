//! What marks a watched key written at its owner, and the command filter's rewrite of a
//! command of a locked key:
//!
//! - the command filter (clients, scripts, other modules, commands queued in `MULTI`, at queue
//!   time): a command that is not read-only marks its keys, in every database (the filter does
//!   not know the client's); a command with a locked key becomes `SHARD.LOCKED command ...`,
//!   which waits for the lock (`run::locked`), or inside `MULTI`, where the filter can tell
//!   (Valkey, Redis 7.2+), an unknown command named after the refusal (`TRYAGAIN ...`), which
//!   the server refuses when it is queued so that `EXEC` aborts;
//! - the module's own `RedisModule_Call` writes (`host::writes`), in their database;
//! - expiries and evictions (`host::keyspace_events::subscribe_to_expiry`);
//! - flushes, `SWAPDB` and loads (`owner::on_keyspace_change`).
//!
//! What a command pays while no key is watched or locked: one load of a flag. Otherwise, the
//! command's key positions (the command table) and one probe of the tables' bit filter per
//! key; only a key that may be watched or locked reaches the tables.

use crate::host::filter::FilterArgs;
use crate::host::keyspace_events::KeyspaceEvent;
use crate::host::writes::OwnCommand;
use crate::route::command_table;
use crate::txn::owner::{active, read, with};

/// What the keys of a command are to the tables.
#[derive(Default)]
struct Seen {
    locked: bool,
}

/// Where the command a call carries begins among its arguments: after `SHARD.CALL` or
/// `SHARD.REDIRECT` (1), after `SHARD.CALL WAIT n t` (4); 0 for any other command. A routed
/// call that the filter did not turn into the plain command (its keys move, a `SHARD.MULTI` is
/// open on this node, a cluster client's redirect) runs here through the module, so its keys
/// are looked at here as the plain command's would be.
pub fn carried_start<'a>(arg: impl Fn(usize) -> Option<&'a [u8]>) -> usize {
    let Some(name) = arg(0) else {
        return 0;
    };
    if name.eq_ignore_ascii_case(b"shard.redirect") {
        return 1;
    }
    if !name.eq_ignore_ascii_case(b"shard.call") {
        return 0;
    }
    match arg(1) {
        Some(next) if next.eq_ignore_ascii_case(b"wait") => 4,
        _ => 1,
    }
}

/// Marks the keys of a command (read through `arg`) written unless it only reads, and says
/// whether one is locked (in some database). `movable` gives the key positions of a command
/// whose keys move with its arguments (not asked for a carried command: its positions would
/// be the call's). No allocation for a command whose key positions the table fixes.
fn look<'a>(
    argc: usize,
    arg: impl Fn(usize) -> Option<&'a [u8]> + Copy,
    movable: impl FnOnce() -> Option<Vec<usize>>,
    db: Option<i32>,
) -> Seen {
    let mut seen = Seen::default();
    let start = carried_start(arg);
    let Some(name) = arg(start) else {
        return seen;
    };
    let Some(meta) = command_table::known(name) else {
        return seen;
    };
    // A routed call while a client of this node is inside SHARD.MULTI may only be queued there
    // (the filter cannot tell whose it is on every server): it marks nothing now; a write it
    // makes when it runs is marked where the module runs it (`host::writes`).
    let queued_maybe = start > 0 && db.is_none() && crate::route::filter::any_queueing();
    let mut one = |pos: usize| {
        let Some(key) = arg(pos) else {
            return;
        };
        if !read(|t| t.may_hold(key)) {
            return;
        }
        if !meta.readonly && !queued_maybe {
            with(|t| t.mark(db, key));
        }
        if read(|t| t.locked_in_any(key)) {
            seen.locked = true;
        }
    };
    match meta.fixed_keys(argc.saturating_sub(start)) {
        Some(range) => range.for_each(|pos| one(pos + start)),
        None if meta.movable && start == 0 => {
            movable().unwrap_or_default().into_iter().for_each(one)
        }
        None => {}
    }
    seen
}

/// The transactions' part of the module's command filter.
pub fn on_command(args: &mut FilterArgs) {
    if !active() {
        return;
    }
    let seen = look(args.len(), |i| args.arg(i), || args.command_keys(), None);
    if !seen.locked || crate::topology::nodes::is_replica() {
        return;
    }
    if args.client_in_multi() {
        let refusal = "TRYAGAIN a transaction holds a key of this command";
        for pos in (1..args.len()).rev() {
            args.delete(pos);
        }
        args.replace(0, refusal.as_bytes());
        return;
    }
    args.insert(0, b"shard.locked");
}

/// A command the module runs itself (`host::writes`).
pub fn on_own_command(command: &OwnCommand) {
    if !active() {
        return;
    }
    let db = command.db();
    look(
        command.len(),
        |i| command.arg(i),
        || command.key_positions(),
        Some(db),
    );
}

/// A key expired or evicted.
pub fn on_expiry(event: &KeyspaceEvent) {
    if !active() {
        return;
    }
    let key = event.key();
    if read(|t| t.may_hold(key)) {
        let db = event.db();
        with(|t| t.mark(Some(db), key));
    }
}
