//! What routing needs to know of a command, from the server's own command table (`COMMAND
//! INFO`): its arity, whether it only reads, whether it can block, and where its keys are when
//! the table fixes them (first key, last key, step). Commands whose keys move with their
//! arguments (`EVAL ... numkeys`, `XREAD ... STREAMS`, `SORT ... STORE`) are flagged
//! `movablekeys`; their keys come from the server's key specs for each call instead.
//!
//! The table is learnt whole at load (`learn_all`), then per command name the first time
//! `SHARD.CALL` meets one the server added later (the command handler has a context to ask
//! `COMMAND INFO`), and kept for the life of the server; the command filter, which has no
//! context, only reads it. Looked up on every command while `route-plain` is on, with a fast
//! word-wise table of the lower-cased names (`name_table`). The table
//! is published whole (`host::published`): the filter reads it with one atomic load, neither a
//! lock nor a thread-local (bench/findings.md, "Routing for unchanged clients").
//!
//! Also here: the command a routed call carries (`SHARD.CALL cmd key ...`, `SHARD.REDIRECT
//! cmd ...`) read from its arguments: its entry, learnt on a miss, and its key positions, from
//! the table when it fixes them, else from the server's key specs for these very arguments.

use std::sync::Mutex;

use redis_module::{Context, RedisValue};

use crate::host::args::printable;
use crate::host::command::Call;
use crate::host::command_keys::{self, NoKeys};
use crate::host::error::CmdError;
use crate::host::published::Published;
use crate::route::name_table::NameTable;

/// A command as the server's table describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandMeta {
    /// Redis's arity: `n` exactly n arguments (the name included), `-n` at least n.
    pub arity: i64,
    pub readonly: bool,
    pub blocking: bool,
    /// Keys at positions that depend on the arguments.
    pub movable: bool,
    /// A container command (`XGROUP`, `XINFO`, `OBJECT`, `MEMORY`, `CLIENT`, `CONFIG`...): its
    /// keys, if any, are its subcommands', found by the server's key specs for the arguments.
    /// Only route-plain's filter asks them (`filter::keys_local`); everything else treats a
    /// container as before (no fixed key).
    pub container: bool,
    /// The legacy key range: first key, last key (negative: from the end), step.
    pub first: i64,
    pub last: i64,
    pub step: i64,
    /// Keyed, but treated apart by route-plain's filter whatever its keys (`treated_apart`):
    /// the filter's quick way for a command of keys all here (`plain_keys`) skips it.
    pub apart: bool,
}

impl CommandMeta {
    /// Whether `argc` arguments (the name included) fit the arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        let argc = i64::try_from(argc).unwrap_or(i64::MAX);
        if self.arity >= 0 {
            argc == self.arity
        } else {
            argc >= -self.arity
        }
    }

    /// The key positions for `argc` arguments when the table fixes them (`args[0]` is the
    /// name); `None` for a command whose keys move, or a range the arguments do not fit.
    pub fn fixed_keys(&self, argc: usize) -> Option<KeyRange> {
        if !self.arity_ok(argc) {
            return None;
        }
        self.key_range(argc)
    }

    /// The key positions for `argc` arguments of a command route-plain's filter may leave
    /// untouched when they are all here: keys the table fixes, and none of the commands
    /// treated apart. The arity is not checked: the server refuses a wrong one itself, before
    /// the command runs (and a call handed on is refused by the handler).
    #[inline]
    pub fn plain_keys(&self, argc: usize) -> Option<KeyRange> {
        if self.apart {
            return None;
        }
        self.key_range(argc)
    }

    /// The table's key range for `argc` arguments, whatever the arity: `None` for keys that
    /// move, no key, or a range past the arguments.
    #[inline]
    fn key_range(&self, argc: usize) -> Option<KeyRange> {
        if self.movable || self.first <= 0 || self.step <= 0 {
            return None;
        }
        let argc = i64::try_from(argc).ok()?;
        let last = if self.last < 0 {
            argc + self.last
        } else {
            self.last
        };
        if last < self.first || last >= argc {
            return None;
        }
        Some(KeyRange {
            next: usize::try_from(self.first).ok()?,
            last: usize::try_from(last).ok()?,
            step: usize::try_from(self.step).ok()?,
        })
    }
}

/// The keyed commands route-plain's filter treats apart whatever their keys: `SORT_RO` (its
/// `BY`/`GET` patterns read keys it does not name), `SPUBLISH` (published at every node),
/// `SSUBSCRIBE`/`SUNSUBSCRIBE` (the connection's own), `WATCH` (the transactions across
/// nodes'), and the module's own commands.
fn treated_apart(name: &[u8]) -> bool {
    (name.len() > 6 && name[..6].eq_ignore_ascii_case(b"shard."))
        || [
            &b"sort"[..],
            b"sort_ro",
            b"spublish",
            b"ssubscribe",
            b"sunsubscribe",
            b"watch",
        ]
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n))
}

/// Key positions from the command table's range.
#[derive(Debug, Clone)]
pub struct KeyRange {
    next: usize,
    last: usize,
    step: usize,
}

impl Iterator for KeyRange {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.next > self.last {
            return None;
        }
        let at = self.next;
        self.next += self.step;
        Some(at)
    }
}

/// Reads a command's entry of `COMMAND INFO` given as (arity, flags, first, last, step).
pub fn meta_from_info(arity: i64, flags: &[&str], first: i64, last: i64, step: i64) -> CommandMeta {
    let has = |f: &str| flags.iter().any(|x| x.eq_ignore_ascii_case(f));
    CommandMeta {
        arity,
        readonly: has("readonly"),
        blocking: has("blocking"),
        movable: has("movablekeys"),
        container: false,
        first,
        last,
        step,
        apart: false,
    }
}

/// The table in force, by command name in any case: replaced whole on each learn (once at
/// load, then once per command the server added after load), each version kept alive
/// (`Published`).
static TABLE: Published<NameTable<CommandMeta>> = Published::new();

/// Held while a new table is made from the last one, so that two learns keep both entries.
static LEARNING: Mutex<()> = Mutex::new(());

/// The learnt entry of a command, by name in any case.
#[inline]
pub fn known(name: &[u8]) -> Option<CommandMeta> {
    TABLE.get()?.get(name)
}

/// Remembers a command's entry.
pub fn learn(name: &[u8], meta: CommandMeta) {
    learn_many(std::iter::once((name.to_vec(), meta)));
}

/// Remembers the entries given, published as one new table.
fn learn_many(entries: impl IntoIterator<Item = (Vec<u8>, CommandMeta)>) {
    let _learning = LEARNING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let entries = entries.into_iter().map(|(name, mut meta)| {
        meta.apart = treated_apart(&name);
        (name, meta)
    });
    let table = match TABLE.get() {
        Some(table) => table.with(entries),
        None => NameTable::default().with(entries),
    };
    if let Some(table) = table {
        TABLE.publish(table);
    }
}

/// Whether the command reads keys it does not name, which the fleet cannot place: `SORT` and
/// `SORT_RO` with a `BY` pattern (other than `nosort`) or a `GET` pattern (other than `#`).
/// `arg(i)` is its argument `i`, 0 its name.
pub fn reads_unnamed_keys<'a>(argc: usize, arg: impl Fn(usize) -> Option<&'a [u8]>) -> bool {
    let Some(name) = arg(0) else {
        return false;
    };
    if !name.eq_ignore_ascii_case(b"sort") && !name.eq_ignore_ascii_case(b"sort_ro") {
        return false;
    }
    (2..argc.saturating_sub(1)).any(|i| {
        let (Some(word), Some(next)) = (arg(i), arg(i + 1)) else {
            return false;
        };
        (word.eq_ignore_ascii_case(b"by") && !next.eq_ignore_ascii_case(b"nosort"))
            || (word.eq_ignore_ascii_case(b"get") && next != b"#")
    })
}

/// The refusal of a command that reads keys it does not name.
pub fn unnamed_keys_refusal(name: &str) -> CmdError {
    CmdError::err(format!(
        "'{name}' with a BY or GET pattern reads keys it does not name, whose owners the fleet cannot tell: use BY nosort and GET #, and read the other keys by name"
    ))
}

/// The command a call carries after its own name (`SHARD.CALL cmd ...`, `SHARD.REDIRECT
/// cmd ...`), or after a prefix (`SHARD.CALL WAIT n t cmd ...`).
pub struct Carried<'a> {
    /// The index of its name among the call's arguments.
    pub start: usize,
    pub name: &'a [u8],
    /// The name in lower case, printable, for messages.
    pub name_text: String,
    pub meta: CommandMeta,
    /// The positions of its keys, counted from its name (a key at position `p` is argument
    /// `p + start` of the call).
    pub positions: Vec<usize>,
}

impl<'a> Carried<'a> {
    /// Reads the carried command of `call` (which has at least two arguments).
    pub fn of(call: &Call<'a>) -> Result<Carried<'a>, CmdError> {
        Carried::at(call, 1)
    }

    /// Reads the command `call` carries from its argument `start` on (which exists).
    pub fn at(call: &Call<'a>, start: usize) -> Result<Carried<'a>, CmdError> {
        let carried = Carried::at_any(call, start)?;
        if carried.positions.is_empty() {
            return Err(no_key(&carried.name_text));
        }
        Ok(carried)
    }

    /// As `at`, and a command with no key in these arguments (`EVAL script 0`) is read too,
    /// with no position.
    pub fn at_any(call: &Call<'a>, start: usize) -> Result<Carried<'a>, CmdError> {
        let name = call.args.get(start);
        let name_text = printable(name).to_ascii_lowercase();
        let meta = meta_of(call, name, &name_text)?;
        // Keys at positions the command table fixes are read from it; the others (EVAL's
        // numkeys, XREAD's STREAMS, a wrong arity) are asked of the server's key specs.
        let positions = match meta.fixed_keys(call.args.len().saturating_sub(start)) {
            Some(range) => range.collect(),
            None => key_spec_positions(call, start, &name_text)?,
        };
        Ok(Carried {
            start,
            name,
            name_text,
            meta,
            positions,
        })
    }
}

/// The refusal of a command with no key where a key is needed.
fn no_key(name: &str) -> CmdError {
    CmdError::err(format!(
        "'{name}' has no key here: SHARD.CALL routes commands by their keys"
    ))
}

/// The positions of the keys of the command `call` carries after its own name, counted from
/// that command's name.
pub fn key_positions(call: &Call) -> Result<Vec<usize>, CmdError> {
    Carried::of(call).map(|c| c.positions)
}

/// The positions of the call's keys among the carried command's arguments (0 is its name, at
/// `start` in the call), as the server's key specs give them (none: no key in them).
fn key_spec_positions(call: &Call, start: usize, name: &str) -> Result<Vec<usize>, CmdError> {
    match command_keys::of_call(call, start) {
        Ok(keys) => Ok(keys),
        Err(NoKeys::UnknownCommand) => Err(CmdError::err(format!("unknown command '{name}'"))),
        Err(NoKeys::WrongArity) => Err(CmdError::wrong_arity(name)),
        Err(NoKeys::None) => Ok(Vec::new()),
    }
}

/// A command's entry, learnt from `COMMAND INFO` the first time it is asked for.
fn meta_of(call: &Call, name: &[u8], name_text: &str) -> Result<CommandMeta, CmdError> {
    if let Some(known) = known(name) {
        return Ok(known);
    }
    let info = call
        .ctx
        .call("COMMAND", &["INFO", name_text])
        .map_err(|e| CmdError::err(format!("COMMAND INFO {name_text} failed: {e}")))?;
    let entry = match info {
        RedisValue::Array(entries) => entries.into_iter().next(),
        _ => None,
    };
    entry
        .as_ref()
        .and_then(read_entry)
        .map(|(name, meta)| {
            learn(&name, meta);
            meta
        })
        .ok_or_else(|| CmdError::err(format!("unknown command '{name_text}'")))
}

/// Learns every command the server has now (at load, so that the command filter rewrites
/// even the first local call of each); commands added later are learnt when first called.
pub fn learn_all(ctx: &Context) -> Result<(), String> {
    match ctx.call("COMMAND", &["INFO"]) {
        Ok(RedisValue::Array(entries)) => {
            learn_many(entries.iter().filter_map(read_entry));
            Ok(())
        }
        Ok(_) => Err("COMMAND INFO replied something else than an array".into()),
        Err(e) => Err(format!("COMMAND INFO failed: {e}")),
    }
}

/// Reads one entry of `COMMAND INFO` (name, arity, flags, first, last, step, ...).
fn read_entry(entry: &RedisValue) -> Option<(Vec<u8>, CommandMeta)> {
    let RedisValue::Array(fields) = entry else {
        return None;
    };
    let text = |v: &RedisValue| match v {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s.clone()),
        RedisValue::SimpleStringStatic(s) => Some(s.to_string()),
        RedisValue::BulkRedisString(s) => Some(s.to_string_lossy()),
        _ => None,
    };
    let name = fields.first().and_then(text)?;
    let int = |v: Option<&RedisValue>| match v {
        Some(RedisValue::Integer(n)) => *n,
        _ => 0,
    };
    let flags: Vec<String> = match fields.get(2) {
        Some(RedisValue::Array(flags)) => flags.iter().filter_map(text).collect(),
        _ => Vec::new(),
    };
    let flag_refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut meta = meta_from_info(
        int(fields.get(1)),
        &flag_refs,
        int(fields.get(3)),
        int(fields.get(4)),
        int(fields.get(5)),
    );
    // A container command (`XGROUP`, `XINFO`, `OBJECT`, `MEMORY`...) has its keys in its
    // subcommands' entries (Redis 7's tenth field): route-plain asks the server's key specs,
    // which know the subcommand.
    if matches!(fields.get(9), Some(RedisValue::Array(subs)) if !subs.is_empty()) {
        meta.container = true;
    }
    Some((name.into_bytes(), meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(meta: CommandMeta, argc: usize) -> Option<Vec<usize>> {
        meta.fixed_keys(argc).map(Iterator::collect)
    }

    #[test]
    fn ranges_of_the_usual_commands() {
        let get = meta_from_info(2, &["readonly", "fast"], 1, 1, 1);
        assert!(get.readonly && !get.blocking);
        assert_eq!(keys(get, 2), Some(vec![1]));
        assert_eq!(keys(get, 3), None, "wrong arity");
        let mget = meta_from_info(-2, &["readonly", "fast"], 1, -1, 1);
        assert_eq!(keys(mget, 4), Some(vec![1, 2, 3]));
        let mset = meta_from_info(-3, &["write", "denyoom"], 1, -1, 2);
        assert_eq!(keys(mset, 5), Some(vec![1, 3]));
        let lmove = meta_from_info(5, &["write"], 1, 2, 1);
        assert_eq!(keys(lmove, 5), Some(vec![1, 2]));
        let eval = meta_from_info(-3, &["noscript", "movablekeys"], 0, 0, 0);
        assert_eq!(keys(eval, 5), None);
        let blpop = meta_from_info(-3, &["write", "blocking"], 1, -2, 1);
        assert!(blpop.blocking);
        assert_eq!(keys(blpop, 4), Some(vec![1, 2]));
        let ping = meta_from_info(-1, &["fast"], 0, 0, 0);
        assert_eq!(keys(ping, 1), None);
    }

    #[test]
    fn sort_patterns_read_unnamed_keys() {
        let reads = |words: &[&str]| {
            let args: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
            reads_unnamed_keys(args.len(), |i| args.get(i).copied())
        };
        assert!(reads(&["SORT", "l", "BY", "w_*"]));
        assert!(reads(&["sort_ro", "l", "GET", "o_*"]));
        assert!(reads(&[
            "SORT", "l", "LIMIT", "0", "1", "GET", "#", "GET", "x_*"
        ]));
        assert!(!reads(&["SORT", "l", "BY", "nosort", "GET", "#"]));
        assert!(!reads(&["SORT", "l", "ALPHA", "STORE", "dst"]));
        assert!(!reads(&["GET", "BY"]));
        assert!(!reads(&["SORT", "by"]));
    }

    #[test]
    fn learnt_by_name_in_any_case() {
        let get = meta_from_info(2, &["readonly"], 1, 1, 1);
        // Names no other test learns (the table is the process's).
        learn(b"TABLETEST.GET", get);
        assert_eq!(known(b"tabletest.get"), Some(get));
        assert_eq!(known(b"TableTest.GeT"), Some(get));
        assert_eq!(known(b"tabletest.set"), None);
        let set = meta_from_info(-3, &["write"], 1, 1, 1);
        learn(b"tabletest.set", set);
        assert_eq!(known(b"TABLETEST.SET"), Some(set));
        assert_eq!(known(b"tabletest.get"), Some(get), "kept by the next learn");
        assert_eq!(known(&[b'x'; 100]), None);
    }
}
