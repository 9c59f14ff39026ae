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
//! - (expiries and evictions follow no event, whose subscription would cost every command of
//!   the server a walk of the module's subscribers: a key that was there when watched and is
//!   gone at the check counts as written, `table::Tables::watched_clean`);
//! - flushes, `SWAPDB` and loads (`owner::on_keyspace_change`).
//!
//! What a command pays while no key is watched or locked: one load of a flag. Otherwise, first
//! a length check per argument, in the filter's quick look (`may_matter`: no call, no hash); a
//! command none of whose arguments is as long as some watched or locked name, the usual case,
//! stops there, without looking its name up. Then a hash and a probe of the tables' filter for
//! each argument of such a length, and only then the command's key positions (the command
//! table the module learnt at load, else the server's key specs for these arguments) and the
//! tables themselves.
//!
//! Marks are made in the database the command runs in: the module's own commands and expiries
//! say it; the filter asks the server for the client's (Valkey, Redis 7.2+). Where the filter
//! cannot tell (Redis 7.0, a script's command), the write is marked in every database (a
//! watch failed for nothing is retried; a write missed would break isolation). It is not
//! turned into `SHARD.LOCKED` to learn the database: every write of a watched name would run
//! through the module, and be refused to a user whose ACL does not allow that command.

use crate::host::filter::FilterArgs;
use crate::host::writes::OwnCommand;
use crate::route::command_table::{self, KeyRange};
use crate::txn::owner::{active, mark, may_hold, name_lengths, read};

/// What the keys of a command are to the tables.
#[derive(Default)]
struct Seen {
    /// A key is locked (in the command's database, or in some database when it is not known).
    locked: bool,
    /// A key it writes is watched in some database, and the command's database is not known:
    /// not marked yet.
    unplaced: bool,
}

/// The positions of a command's keys.
enum Positions {
    Range(KeyRange),
    List(Vec<usize>),
}

/// Where the command a call carries begins among its arguments: after `SHARD.CALL` or
/// `SHARD.REDIRECT` or `SHARD.PLAIN` or `SHARD.PLAINAS` (1), after `SHARD.CALL WAIT n t` (4);
/// 0 for any other command. A routed
/// call that the filter did not turn into the plain command (its keys move, a `SHARD.MULTI` is
/// open on this node, a cluster client's redirect) runs here through the module, so its keys
/// are looked at here as the plain command's would be.
pub fn carried_start<'a>(arg: impl Fn(usize) -> Option<&'a [u8]>) -> usize {
    let Some(name) = arg(0) else {
        return 0;
    };
    if name.eq_ignore_ascii_case(b"shard.redirect")
        || name.eq_ignore_ascii_case(b"shard.plain")
        || name.eq_ignore_ascii_case(b"shard.plainas")
    {
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

/// Whether any argument after the first may be a watched or locked name (a hash and a probe of
/// the tables' filter for each argument as long as some name).
fn any_may_hold<'a>(argc: usize, arg: impl Fn(usize) -> Option<&'a [u8]>) -> bool {
    (1..argc).any(|i| arg(i).is_some_and(may_hold))
}

/// Marks the keys of a command (read through `arg`) written unless it only reads, in database
/// `db` (`None`: not known: in every database when `everywhere`, else left to the caller,
/// `Seen::unplaced`), and says whether one is locked. `filtered`: the command filter's look (a
/// client's command), not the module's own command. `keys_from`
/// gives the server's key positions of the command carried from an argument on (counted from
/// that command's name), for a command whose keys move with its arguments, or that is not in
/// the command table the module learnt (a command added after load, a renamed one: its keys
/// counted as written).
fn look<'a>(
    argc: usize,
    arg: impl Fn(usize) -> Option<&'a [u8]> + Copy,
    keys_from: impl FnOnce(usize) -> Option<Vec<usize>>,
    db: Option<i32>,
    everywhere: bool,
    filtered: bool,
) -> Seen {
    let mut seen = Seen::default();
    let start = carried_start(arg);
    let Some(name) = arg(start) else {
        return seen;
    };
    let inner_argc = argc.saturating_sub(start);
    let (readonly, blocking, positions) = match command_table::known(name) {
        Some(meta) => match meta.fixed_keys(inner_argc) {
            Some(range) => (meta.readonly, meta.blocking, Positions::Range(range)),
            None if meta.movable => (
                meta.readonly,
                meta.blocking,
                Positions::List(keys_from(start).unwrap_or_default()),
            ),
            None => return seen,
        },
        None => (
            false,
            false,
            Positions::List(keys_from(start).unwrap_or_default()),
        ),
    };
    // A routed call while a client of this node is inside SHARD.MULTI may only be queued there
    // (the filter cannot tell whose it is on every server): it marks nothing now; a write it
    // makes when it runs is marked where the module runs it (`host::writes`).
    let queued_maybe = start > 0 && filtered && crate::route::filter::any_queueing();
    let mut one = |pos: usize| {
        let Some(key) = arg(pos + start) else {
            return;
        };
        if !may_hold(key) {
            return;
        }
        if !readonly && !queued_maybe {
            match db {
                Some(_) => mark(db, key),
                // A blocking command cannot run through the module: marked everywhere.
                None if blocking || everywhere => mark(None, key),
                None => seen.unplaced |= read(|t| t.watched_in_any(key)),
            }
        }
        seen.locked |= read(|t| match db {
            Some(db) => t.locked_by(db, key).is_some(),
            None => t.locked_in_any(key),
        });
    };
    match positions {
        Positions::Range(range) => range.for_each(&mut one),
        Positions::List(list) => list.into_iter().for_each(&mut one),
    }
    seen
}

/// The first look at a command: whether a key is watched or locked, and an argument after the
/// first may be as long as one of their names (`table::length_bit`: a length check per
/// argument, no hash, no call). What every other command pays.
#[inline(always)]
pub fn may_matter(args: &FilterArgs) -> bool {
    active() && args.any_length_in(name_lengths())
}

/// The transactions' part of the module's command filter.
pub fn on_command(args: &mut FilterArgs) {
    if active() {
        on_candidate(args);
    }
}

/// A command an argument of which may be a watched or locked name.
fn on_candidate(args: &mut FilterArgs) {
    if !any_may_hold(args.len(), |i| args.arg(i)) {
        return;
    }
    let client = args.client();
    let db = client.map(|c| c.db);
    // The database not known (Redis 7.0's filter does not see the client; on Valkey and Redis
    // 7.2+ a script's or a module's client): the write is marked in every database. Turning it
    // into `SHARD.LOCKED` to learn the database would put every write of a watched name through
    // the module, refused (`NOPERM`) for a user whose ACL does not allow that command; a watch
    // failed for nothing is only retried.
    let everywhere = db.is_none();
    let seen = look(
        args.len(),
        |i| args.arg(i),
        |from| args.command_keys(from),
        db,
        everywhere,
        true,
    );
    if !(seen.locked || seen.unplaced) || crate::topology::nodes::is_replica() {
        return;
    }
    if client.is_some_and(|c| c.in_multi) {
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
        |from| command.key_positions(from),
        Some(db),
        false,
        false,
    );
}
