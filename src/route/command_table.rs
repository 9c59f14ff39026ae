//! What routing needs to know of a command, from the server's own command table (`COMMAND
//! INFO`): its arity, whether it only reads, whether it can block, and where its keys are when
//! the table fixes them (first key, last key, step). Commands whose keys move with their
//! arguments (`EVAL ... numkeys`, `XREAD ... STREAMS`, `SORT ... STORE`) are flagged
//! `movablekeys`; their keys come from the server's key specs for each call instead.
//!
//! The table is learnt per command name the first time `SHARD.CALL` meets it (the command
//! handler has a context to ask `COMMAND INFO`) and kept for the life of the server; the
//! command filter, which has no context, only reads it. Looked up on every routed call, with
//! a fast non-cryptographic hash (rustc-hash): the names come from the server's own table.

use std::cell::RefCell;

use rustc_hash::FxHashMap;

/// A command as the server's table describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandMeta {
    /// Redis's arity: `n` exactly n arguments (the name included), `-n` at least n.
    pub arity: i64,
    pub readonly: bool,
    pub blocking: bool,
    /// Keys at positions that depend on the arguments.
    pub movable: bool,
    /// The legacy key range: first key, last key (negative: from the end), step.
    pub first: i64,
    pub last: i64,
    pub step: i64,
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
        if self.movable || self.first <= 0 || self.step <= 0 || !self.arity_ok(argc) {
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
        first,
        last,
        step,
    }
}

thread_local! {
    /// Learnt entries, by lower-case command name. The main thread's only.
    static TABLE: RefCell<FxHashMap<Vec<u8>, CommandMeta>> = RefCell::new(FxHashMap::default());
}

/// The learnt entry of a command, by name in any case.
pub fn known(name: &[u8]) -> Option<CommandMeta> {
    let mut lower = [0u8; 64];
    let key = lower.get_mut(..name.len())?;
    key.copy_from_slice(name);
    key.make_ascii_lowercase();
    TABLE.with(|t| t.borrow().get(&*key).copied())
}

/// Remembers a command's entry.
pub fn learn(name: &[u8], meta: CommandMeta) {
    TABLE.with(|t| t.borrow_mut().insert(name.to_ascii_lowercase(), meta));
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
    fn learnt_by_name_in_any_case() {
        let get = meta_from_info(2, &["readonly"], 1, 1, 1);
        learn(b"GET", get);
        assert_eq!(known(b"get"), Some(get));
        assert_eq!(known(b"GeT"), Some(get));
        assert_eq!(known(b"set"), None);
        assert_eq!(known(&[b'x'; 100]), None);
    }
}
