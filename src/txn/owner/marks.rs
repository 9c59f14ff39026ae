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

/// Marks the keys of a command (read through `arg`) written unless it only reads, and says
/// whether one is locked (in some database). `movable` gives the key positions of a command
/// whose keys move with its arguments.
fn look<'a>(
    argc: usize,
    arg: impl Fn(usize) -> Option<&'a [u8]>,
    movable: impl FnOnce() -> Option<Vec<usize>>,
    db: Option<i32>,
) -> Seen {
    let mut seen = Seen::default();
    let Some(name) = arg(0) else {
        return seen;
    };
    let Some(meta) = command_table::known(name) else {
        return seen;
    };
    let positions: Vec<usize> = match meta.fixed_keys(argc) {
        Some(range) => range.collect(),
        None if meta.movable => movable().unwrap_or_default(),
        None => return seen,
    };
    for pos in positions {
        let Some(key) = arg(pos) else {
            continue;
        };
        if !read(|t| t.may_hold(key)) {
            continue;
        }
        if !meta.readonly {
            with(|t| t.mark(db, key));
        }
        if read(|t| t.locked_in_any(key)) {
            seen.locked = true;
        }
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
