//! Multi-key commands over several owners, as twemproxy splits them: `MGET`, `MSET`, `DEL`,
//! `UNLINK`, `EXISTS`, `TOUCH` become one command per owner with that owner's keys, sent at
//! once, and the replies are merged in the caller's order (`MGET` an array in key order, the
//! counting ones the sum, `MSET` OK only when every part succeeded, else the first error).
//! Any other command whose keys have several owners is refused by the caller.

use crate::net::resp::Resp;

/// How the replies of the parts become one reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// `MGET`: the values, in the order the caller gave the keys.
    InKeyOrder,
    /// `DEL`, `UNLINK`, `EXISTS`, `TOUCH`: the sum of the counts.
    Sum,
    /// `MSET`: OK when every part said OK.
    AllOk,
}

/// A command that splits by key: how to merge, and how many arguments each key carries
/// (`MSET key value`: 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Splittable {
    pub merge: Merge,
    pub per_key: usize,
}

/// `shard.atomic-mset yes`: an `MSET` over keys of several owners is not split but gathered,
/// all or nothing, as one transaction (`txn::coord::gather`): no reader sees some of its keys
/// written and others not. Off by default: the split is one round trip per owner, the gather
/// a transaction (watch, read, write: `docs/one-server.md`).
static ATOMIC_MSET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Puts `shard.atomic-mset` in force.
pub fn set_atomic_mset(on: bool) {
    ATOMIC_MSET.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether (and how) a command splits when routed (the split `MSET` but under
/// `shard.atomic-mset yes`).
pub fn splittable_routed(name: &[u8]) -> Option<Splittable> {
    if ATOMIC_MSET.load(std::sync::atomic::Ordering::Relaxed) && name.eq_ignore_ascii_case(b"mset")
    {
        return None;
    }
    splittable(name)
}

/// Whether (and how) a command splits, by its name (in any case; nothing allocated).
pub fn splittable(name: &[u8]) -> Option<Splittable> {
    let of = |merge, per_key| Some(Splittable { merge, per_key });
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    if is(b"mget") {
        of(Merge::InKeyOrder, 1)
    } else if is(b"del") || is(b"unlink") || is(b"exists") || is(b"touch") {
        of(Merge::Sum, 1)
    } else if is(b"mset") {
        of(Merge::AllOk, 2)
    } else {
        None
    }
}

/// One owner's share of a split command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The owner, as an index into the caller's list of owners.
    pub owner: usize,
    /// The command for that owner: the name, then its keys (with their values for MSET).
    pub args: Vec<Vec<u8>>,
    /// For each key of this part, its place among the caller's keys.
    pub positions: Vec<usize>,
}

/// Splits `args` (`args[0]` the command name, then `per_key` arguments per key) by the owner
/// of each key (`owners[i]` for the i-th key), keeping the caller's order within a part and
/// listing the parts in the order their first key appears.
pub fn split(args: &[&[u8]], how: Splittable, owners: &[usize]) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    for (i, &owner) in owners.iter().enumerate() {
        let at = 1 + i * how.per_key;
        let Some(key_args) = args.get(at..at + how.per_key) else {
            break;
        };
        let index = match parts.iter().position(|p| p.owner == owner) {
            Some(p) => p,
            None => {
                parts.push(Part {
                    owner,
                    args: vec![args[0].to_vec()],
                    positions: Vec::new(),
                });
                parts.len() - 1
            }
        };
        let part = &mut parts[index];
        part.args.extend(key_args.iter().map(|a| a.to_vec()));
        part.positions.push(i);
    }
    parts
}

/// Merges the parts' replies (in the order of `parts`) into the reply of the whole command.
/// An error reply of any part (the first one, in part order) is the reply.
pub fn merge(how: Merge, parts: &[Part], replies: Vec<Resp>, keys: usize) -> Resp {
    if let Some(e) = replies.iter().find(|r| r.is_error()) {
        return e.clone();
    }
    match how {
        Merge::Sum => Resp::Int(replies.iter().filter_map(Resp::as_int).sum()),
        Merge::AllOk => replies
            .into_iter()
            .find(|r| !matches!(r, Resp::Simple(s) if s == b"OK"))
            .unwrap_or_else(|| Resp::Simple(b"OK".to_vec())),
        Merge::InKeyOrder => {
            let mut out = vec![Resp::Null; keys];
            for (part, reply) in parts.iter().zip(replies) {
                let Resp::Array(values) = reply else {
                    return Resp::Error(
                        format!("ERR shard.call: a part of MGET replied {reply:?}").into_bytes(),
                    );
                };
                for (&pos, value) in part.positions.iter().zip(values) {
                    if let Some(slot) = out.get_mut(pos) {
                        *slot = value;
                    }
                }
            }
            Resp::Array(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn the_commands_that_split() {
        assert_eq!(
            splittable(b"MGET").map(|s| s.merge),
            Some(Merge::InKeyOrder)
        );
        assert_eq!(splittable(b"mset").map(|s| s.per_key), Some(2));
        for name in ["del", "UNLINK", "exists", "Touch"] {
            assert_eq!(
                splittable(name.as_bytes()).map(|s| s.merge),
                Some(Merge::Sum)
            );
        }
        for name in ["msetnx", "rename", "sunionstore", "eval", "get"] {
            assert_eq!(splittable(name.as_bytes()), None, "{name}");
        }
    }

    #[test]
    fn mget_splits_by_owner_and_merges_in_key_order() {
        let args: Vec<&[u8]> = vec![b"MGET", b"a", b"b", b"c", b"d"];
        let how = splittable(b"MGET").unwrap();
        let parts = split(&args, how, &[1, 0, 1, 2]);
        assert_eq!(
            parts,
            vec![
                Part {
                    owner: 1,
                    args: vec![b("MGET"), b("a"), b("c")],
                    positions: vec![0, 2]
                },
                Part {
                    owner: 0,
                    args: vec![b("MGET"), b("b")],
                    positions: vec![1]
                },
                Part {
                    owner: 2,
                    args: vec![b("MGET"), b("d")],
                    positions: vec![3]
                },
            ]
        );
        let replies = vec![
            Resp::Array(vec![Resp::Bulk(b("A")), Resp::Null]),
            Resp::Array(vec![Resp::Bulk(b("B"))]),
            Resp::Array(vec![Resp::Bulk(b("D"))]),
        ];
        assert_eq!(
            merge(how.merge, &parts, replies, 4),
            Resp::Array(vec![
                Resp::Bulk(b("A")),
                Resp::Bulk(b("B")),
                Resp::Null,
                Resp::Bulk(b("D"))
            ])
        );
    }

    #[test]
    fn mset_keeps_values_with_their_keys_and_needs_every_ok() {
        let args: Vec<&[u8]> = vec![b"MSET", b"a", b"1", b"b", b"2", b"c", b"3"];
        let how = splittable(b"MSET").unwrap();
        let parts = split(&args, how, &[0, 1, 0]);
        assert_eq!(
            parts[0].args,
            vec![b("MSET"), b("a"), b("1"), b("c"), b("3")]
        );
        assert_eq!(parts[1].args, vec![b("MSET"), b("b"), b("2")]);
        let ok = || Resp::Simple(b("OK"));
        assert_eq!(merge(how.merge, &parts, vec![ok(), ok()], 3), ok());
        let oom = Resp::Error(b("OOM command not allowed"));
        assert_eq!(merge(how.merge, &parts, vec![ok(), oom.clone()], 3), oom);
    }

    #[test]
    fn counts_add_up_and_the_first_error_wins() {
        let args: Vec<&[u8]> = vec![b"DEL", b"a", b"b", b"c"];
        let how = splittable(b"DEL").unwrap();
        let parts = split(&args, how, &[0, 1, 0]);
        assert_eq!(
            merge(how.merge, &parts, vec![Resp::Int(2), Resp::Int(1)], 3),
            Resp::Int(3)
        );
        let e1 = Resp::Error(b("ERR one"));
        let e2 = Resp::Error(b("ERR two"));
        assert_eq!(merge(how.merge, &parts, vec![e1.clone(), e2], 3), e1);
    }
}
