//! A transaction as the coordinator runs it, pure: the commands queued in the client's order
//! (each whole at one owner, or split per owner as `SHARD.CALL` splits `MGET`/`MSET`/`DEL`...),
//! gathered into one part per owner (its watched keys and its commands, in queue order), and
//! the replies of the parts merged back into one reply per queued command.

use crate::net::endpoint::Endpoint;
use crate::net::resp::Resp;
use crate::route::split::{self, Merge};
use crate::txn::coord::wire::Command;

/// One queued command.
#[derive(Debug, Clone, PartialEq)]
pub enum Queued {
    /// Every key at one owner: the command as it came.
    Whole { owner: Endpoint, command: Command },
    /// A splittable command over several owners: one piece per owner, merged as `SHARD.CALL`
    /// merges them.
    Split {
        merge: Merge,
        pieces: Vec<(Endpoint, split::Part)>,
        keys: usize,
    },
}

/// One owner's part of the transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub owner: Endpoint,
    /// The keys watched at this owner.
    pub watched: Vec<Vec<u8>>,
    pub commands: Vec<Command>,
}

/// Where a queued command's reply comes from: (part, index of the command in that part).
#[derive(Debug, Clone, PartialEq)]
pub enum Slot {
    Whole(usize, usize),
    Split {
        merge: Merge,
        pieces: Vec<(usize, usize, split::Part)>,
        keys: usize,
    },
}

/// A transaction ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Txn {
    pub txid: String,
    pub parts: Vec<Part>,
    pub slots: Vec<Slot>,
}

impl Txn {
    /// Gathers the watched keys (by owner) and the queued commands into one part per owner,
    /// in the order owners first appear (watches first).
    pub fn build(txid: String, watched: &[(Endpoint, Vec<Vec<u8>>)], queue: Vec<Queued>) -> Txn {
        let mut parts: Vec<Part> = Vec::new();
        let part_of = |owner: &Endpoint, parts: &mut Vec<Part>| -> usize {
            match parts.iter().position(|p| p.owner.name == owner.name) {
                Some(at) => at,
                None => {
                    parts.push(Part {
                        owner: owner.clone(),
                        watched: Vec::new(),
                        commands: Vec::new(),
                    });
                    parts.len() - 1
                }
            }
        };
        for (owner, keys) in watched {
            let at = part_of(owner, &mut parts);
            for k in keys {
                if !parts[at].watched.contains(k) {
                    parts[at].watched.push(k.clone());
                }
            }
        }
        let mut slots = Vec::with_capacity(queue.len());
        for queued in queue {
            match queued {
                Queued::Whole { owner, command } => {
                    let at = part_of(&owner, &mut parts);
                    parts[at].commands.push(command);
                    slots.push(Slot::Whole(at, parts[at].commands.len() - 1));
                }
                Queued::Split {
                    merge,
                    pieces,
                    keys,
                } => {
                    let mut placed = Vec::with_capacity(pieces.len());
                    for (owner, piece) in pieces {
                        let at = part_of(&owner, &mut parts);
                        parts[at].commands.push(piece.args.clone());
                        placed.push((at, parts[at].commands.len() - 1, piece));
                    }
                    slots.push(Slot::Split {
                        merge,
                        pieces: placed,
                        keys,
                    });
                }
            }
        }
        Txn { txid, parts, slots }
    }

    /// The reply of each queued command, in queue order, from each part's replies (in the
    /// order of its commands); an error when a part's replies do not match its commands.
    pub fn merge(&self, mut replies: Vec<Vec<Resp>>) -> Result<Vec<Resp>, String> {
        for (part, got) in self.parts.iter().zip(&replies) {
            if got.len() != part.commands.len() {
                return Err(format!(
                    "ERR node {} replied {} replies to {} commands",
                    part.owner.name,
                    got.len(),
                    part.commands.len()
                ));
            }
        }
        if replies.len() != self.parts.len() {
            return Err("ERR a part of the transaction has no replies".into());
        }
        let mut take = |part: usize, index: usize| -> Resp {
            std::mem::replace(&mut replies[part][index], Resp::Null)
        };
        let mut out = Vec::with_capacity(self.slots.len());
        for slot in &self.slots {
            match slot {
                Slot::Whole(part, index) => out.push(take(*part, *index)),
                Slot::Split {
                    merge,
                    pieces,
                    keys,
                } => {
                    let got: Vec<Resp> = pieces.iter().map(|(p, i, _)| take(*p, *i)).collect();
                    let parts: Vec<split::Part> =
                        pieces.iter().map(|(_, _, s)| s.clone()).collect();
                    out.push(split::merge(*merge, &parts, got, *keys));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) fn endpoint(name: &str) -> Endpoint {
    Endpoint {
        name: name.into(),
        host: "127.0.0.1".into(),
        port: 1,
        address: format!("127.0.0.1:{name}"),
        is_self: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::split::splittable;

    fn c(words: &[&str]) -> Command {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn parts_by_owner_and_replies_in_queue_order() {
        let (a, b) = (endpoint("a"), endpoint("b"));
        let how = splittable(b"MGET").unwrap();
        let args: Vec<&[u8]> = vec![b"MGET", b"x", b"y", b"z"];
        let pieces = split::split(&args, how, &[0, 1, 0]);
        let queue = vec![
            Queued::Whole {
                owner: b.clone(),
                command: c(&["INCR", "y"]),
            },
            Queued::Split {
                merge: how.merge,
                pieces: vec![
                    (a.clone(), pieces[0].clone()),
                    (b.clone(), pieces[1].clone()),
                ],
                keys: 3,
            },
            Queued::Whole {
                owner: a.clone(),
                command: c(&["SET", "x", "1"]),
            },
        ];
        let watched = vec![(a.clone(), vec![b"w".to_vec(), b"w".to_vec()])];
        let txn = Txn::build("t".into(), &watched, queue);
        assert_eq!(txn.parts.len(), 2);
        assert_eq!(txn.parts[0].owner.name, "a");
        assert_eq!(txn.parts[0].watched, vec![b"w".to_vec()]);
        assert_eq!(
            txn.parts[0].commands,
            vec![c(&["MGET", "x", "z"]), c(&["SET", "x", "1"])]
        );
        assert_eq!(
            txn.parts[1].commands,
            vec![c(&["INCR", "y"]), c(&["MGET", "y"])]
        );
        let bulk = |s: &str| Resp::Bulk(s.as_bytes().to_vec());
        let replies = vec![
            vec![
                Resp::Array(vec![bulk("X"), Resp::Null]),
                Resp::Simple(b"OK".to_vec()),
            ],
            vec![Resp::Int(5), Resp::Array(vec![bulk("5")])],
        ];
        assert_eq!(
            txn.merge(replies),
            Ok(vec![
                Resp::Int(5),
                Resp::Array(vec![bulk("X"), bulk("5"), Resp::Null]),
                Resp::Simple(b"OK".to_vec()),
            ])
        );
        assert!(txn.merge(vec![vec![], vec![]]).is_err());
        assert!(txn.merge(vec![]).is_err());
    }
}
