//! The coordinator's decisions (`docs/transactions.md`): for each transaction of its own that
//! prepared everywhere, `commit` with every owner's part, kept until every owner confirmed;
//! for each transaction an owner in doubt asked about and that was not decided, `abort`
//! (presumed abort), so that the answer never changes. Both are durable: replicated and in
//! the AOF as `SHARD.TXN DECIDE` / `SHARD.TXN FORGET` (recorded at the end of the event
//! loop's turn, `turn`, or sent by this node to itself, `fleet`), in the RDB aux field (`encode`, `decode`). What `SHARD.TXN STATUS` answers
//! comes from here: the record; `pending` while the transaction is being prepared here and
//! its deadline has not passed (kept in memory only: after a restart or on a promoted
//! replica no prepare of the old process goes on); else `abort`, recorded.
//!
//! A decision forgotten after every owner confirmed it stays known as `commit` for the last
//! `DONE_KEPT` of them (in memory): an owner that asks late (its confirmation lost in its own
//! failover) still hears `commit`. Presumed aborts are kept for the last `ABORTS_KEPT`.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};

use crate::persist::Reader;
use crate::txn::coord::wire::{self, Decision};

pub const DONE_KEPT: usize = 10_000;
pub const ABORTS_KEPT: usize = 100_000;

/// What was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Commit(Decision),
    Abort,
}

/// `SHARD.TXN STATUS`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Commit,
    Abort,
    Pending,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Commit => "commit",
            Status::Abort => "abort",
            Status::Pending => "pending",
        }
    }
}

#[derive(Debug, Default)]
pub struct Book {
    records: HashMap<String, Record>,
    /// The order abort records came in (the oldest dropped past `ABORTS_KEPT`).
    aborts: VecDeque<String>,
    /// Transactions being prepared here, with their deadline (monotonic ms).
    preparing: HashMap<String, u64>,
    /// Commits forgotten lately, in the order they were (the oldest dropped past
    /// `DONE_KEPT`), and as a set, for the look-up of each decision and question.
    done: VecDeque<String>,
    done_set: HashSet<String>,
    /// Commits recorded here that no replica of this node acknowledged in time while one may
    /// be promoted (`txn::coord::confirm`): answered `pending`, not carried out, until one
    /// does. Not saved: a server loaded from its files holds what a replica syncs from it.
    unsure: HashSet<String>,
}

impl Book {
    /// Records `record` for `txid`: `Ok` when it is recorded now or was already (a record
    /// replayed from the replication stream or the AOF), `Err` naming the other decision.
    pub fn decide(&mut self, txid: &str, record: Record) -> Result<(), String> {
        match self.records.get(txid) {
            Some(r) if *r == record => return Ok(()),
            Some(Record::Abort) => {
                return Err(format!("ABORTED transaction {txid} was aborted already"))
            }
            Some(Record::Commit(_)) => {
                return Err(format!(
                    "COMMITTED transaction {txid} was committed already"
                ))
            }
            None => {}
        }
        if self.done_set.contains(txid) {
            return Err(format!(
                "COMMITTED transaction {txid} was committed already"
            ));
        }
        if record == Record::Abort {
            self.aborts.push_back(txid.to_string());
            while self.aborts.len() > ABORTS_KEPT {
                if let Some(old) = self.aborts.pop_front() {
                    self.records.remove(&old);
                }
            }
        }
        self.records.insert(txid.to_string(), record);
        Ok(())
    }

    /// The commit of `txid` recorded here is not known to be at a replica (`unsure`).
    pub fn unsure(&mut self, txid: &str) {
        if matches!(self.records.get(txid), Some(Record::Commit(_))) {
            self.unsure.insert(txid.to_string());
        }
    }

    /// Whether some commit is not known to be at a replica.
    pub fn any_unsure(&self) -> bool {
        !self.unsure.is_empty()
    }

    /// A replica acknowledged everything replicated so far: every commit is known there.
    pub fn confirm_all(&mut self) {
        self.unsure.clear();
    }

    /// Forgets the decision of `txid` (every owner applied it).
    pub fn forget(&mut self, txid: &str) {
        match self.records.remove(txid) {
            Some(Record::Commit(_)) => {
                if self.done_set.insert(txid.to_string()) {
                    self.done.push_back(txid.to_string());
                }
                if self.done.len() > DONE_KEPT {
                    if let Some(old) = self.done.pop_front() {
                        self.done_set.remove(&old);
                    }
                }
            }
            // (A txid is in `aborts` only while its record is an abort.)
            Some(Record::Abort) => self.aborts.retain(|a| a != txid),
            None => {}
        }
        self.preparing.remove(txid);
        self.unsure.remove(txid);
    }

    pub fn preparing(&mut self, txid: &str, deadline_ms: u64) {
        self.preparing.insert(txid.to_string(), deadline_ms);
    }

    /// The transaction is no longer being prepared here (it ended, either way).
    pub fn prepared(&mut self, txid: &str) {
        self.preparing.remove(txid);
    }

    /// The answer to an owner in doubt at `now_ms`; `true` when the answer is an abort
    /// recorded by this very question (to be made durable by the caller).
    pub fn status(&mut self, txid: &str, now_ms: u64) -> (Status, bool) {
        match self.records.get(txid) {
            // Not at a replica yet: a failover now would answer abort (`unsure`).
            Some(Record::Commit(_)) if self.unsure.contains(txid) => {
                return (Status::Pending, false)
            }
            Some(Record::Commit(_)) => return (Status::Commit, false),
            Some(Record::Abort) => return (Status::Abort, false),
            None => {}
        }
        if self.done_set.contains(txid) {
            return (Status::Commit, false);
        }
        if self.preparing.get(txid).is_some_and(|d| now_ms <= *d) {
            return (Status::Pending, false);
        }
        let recorded = self.decide(txid, Record::Abort).is_ok();
        (Status::Abort, recorded)
    }

    pub fn record(&self, txid: &str) -> Option<&Record> {
        self.records.get(txid)
    }

    /// Every commit still to carry out: (txid, parts); not one `unsure`.
    pub fn commits(&self) -> Vec<(String, Decision)> {
        let mut out: Vec<_> = self
            .records
            .iter()
            .filter_map(|(t, r)| match r {
                Record::Commit(_) if self.unsure.contains(t) => None,
                Record::Commit(d) => Some((t.clone(), d.clone())),
                Record::Abort => None,
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// (commit records, abort records), for INFO.
    pub fn counts(&self) -> (usize, usize) {
        let aborts = self.aborts.len();
        (self.records.len() - aborts, aborts)
    }

    /// The records as bytes (the RDB aux field): their count, then each txid and its
    /// decision as `SHARD.TXN DECIDE`'s arguments after the txid.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut ids: Vec<&String> = self.records.keys().collect();
        ids.sort();
        out.extend_from_slice(&(ids.len() as u64).to_le_bytes());
        for txid in ids {
            let args = match &self.records[txid] {
                Record::Commit(d) => wire::decide_commit(txid, d),
                Record::Abort => wire::decide_abort(txid),
            };
            let tail = &args[2..];
            out.extend_from_slice(&(tail.len() as u64).to_le_bytes());
            for a in tail {
                out.extend_from_slice(&(a.len() as u64).to_le_bytes());
                out.extend_from_slice(a);
            }
        }
        out
    }

    /// The records `encode` wrote (the book as it was, with nothing being prepared).
    pub fn decode(bytes: &[u8]) -> Result<Book, String> {
        let mut r = Reader::new(bytes);
        let mut book = Book::default();
        if bytes.is_empty() {
            return Ok(book);
        }
        let n = r.u64("decision count")?;
        for _ in 0..n {
            let argc = r.u64("decision length")?;
            if argc > bytes.len() as u64 {
                return Err(format!(
                    "a decision of {argc} arguments is longer than the data"
                ));
            }
            let mut args: Vec<&[u8]> = Vec::new();
            for _ in 0..argc {
                args.push(r.sized("decision argument")?);
            }
            let (txid, record) = parse_decision(&args)?;
            book.decide(&txid, record)?;
        }
        if r.pos != bytes.len() {
            return Err(format!(
                "{} unexpected bytes after the decisions",
                bytes.len() - r.pos
            ));
        }
        Ok(book)
    }
}

/// `txid COMMIT nparts ...` or `txid ABORT` (`SHARD.TXN DECIDE`'s arguments).
pub fn parse_decision(args: &[&[u8]]) -> Result<(String, Record), String> {
    let (Some(txid), Some(what)) = (args.first(), args.get(1)) else {
        return Err("a decision needs a txid and COMMIT or ABORT".into());
    };
    let txid = std::str::from_utf8(txid)
        .map_err(|_| "a txid is text".to_string())?
        .to_string();
    if what.eq_ignore_ascii_case(b"ABORT") && args.len() == 2 {
        return Ok((txid, Record::Abort));
    }
    if what.eq_ignore_ascii_case(b"COMMIT") {
        return Ok((txid, Record::Commit(wire::read_decision(args, 2)?)));
    }
    Err("a decision is COMMIT db nparts ... or ABORT".into())
}

thread_local! {
    static BOOK: RefCell<Book> = RefCell::new(Book::default());
}

/// The book of this node, for the length of `f`. Main thread only.
pub fn with<R>(f: impl FnOnce(&mut Book) -> R) -> R {
    BOOK.with(|b| f(&mut b.borrow_mut()))
}

/// Replaces the book with the one loaded (an RDB, or a primary's at a full sync).
pub fn restore(book: Book) {
    BOOK.with(|b| *b.borrow_mut() = book);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Decision {
        Decision {
            db: 2,
            parts: vec![(
                "n1".into(),
                vec![vec![b"SET".to_vec(), b"a".to_vec(), b"1".to_vec()]],
            )],
            addresses: vec!["127.0.0.1:7001".into()],
        }
    }

    #[test]
    fn the_first_decision_wins_and_answers_never_change() {
        let mut book = Book::default();
        book.preparing("a/1", 100);
        assert_eq!(book.status("a/1", 50), (Status::Pending, false));
        assert_eq!(book.decide("a/1", Record::Commit(parts())), Ok(()));
        assert_eq!(book.decide("a/1", Record::Commit(parts())), Ok(()));
        assert_eq!(book.status("a/1", 500), (Status::Commit, false));
        assert!(book.decide("a/1", Record::Abort).is_err());
        // Past its deadline, a transaction not decided is aborted, for good.
        book.preparing("a/2", 100);
        assert_eq!(book.status("a/2", 101), (Status::Abort, true));
        assert_eq!(book.status("a/2", 102), (Status::Abort, false));
        assert!(book.decide("a/2", Record::Commit(parts())).is_err());
        // Unknown here (a restart, a promoted replica): aborted at once.
        assert_eq!(book.status("a/3", 0), (Status::Abort, true));
        // Forgotten commits are still known as commits.
        book.forget("a/1");
        assert_eq!(book.status("a/1", 500), (Status::Commit, false));
        assert!(book.decide("a/1", Record::Abort).is_err());
        assert_eq!(book.counts(), (0, 2));
    }

    #[test]
    fn a_commit_no_replica_has_is_pending_until_one_does() {
        let mut book = Book::default();
        assert_eq!(book.decide("a/1", Record::Commit(parts())), Ok(()));
        book.unsure("a/1");
        book.unsure("a/9"); // no commit recorded: nothing to hold
        assert!(book.any_unsure());
        // Neither answered commit nor carried out: a failover now would answer abort.
        assert_eq!(book.status("a/1", 10_000), (Status::Pending, false));
        assert!(book.commits().is_empty());
        book.confirm_all();
        assert_eq!(book.status("a/1", 10_000), (Status::Commit, false));
        assert_eq!(book.commits().len(), 1);
        book.unsure("a/1");
        book.forget("a/1");
        assert!(!book.any_unsure());
    }

    #[test]
    fn the_last_forgotten_commits_are_known_and_older_ones_dropped() {
        let mut book = Book::default();
        for i in 0..DONE_KEPT + 3 {
            let txid = format!("n0/{i}");
            book.decide(&txid, Record::Commit(parts())).unwrap();
            book.forget(&txid);
            book.forget(&txid);
        }
        assert_eq!(
            (book.done.len(), book.done_set.len()),
            (DONE_KEPT, DONE_KEPT)
        );
        assert_eq!(book.status("n0/3", 0), (Status::Commit, false));
        assert_eq!(
            book.status(&format!("n0/{}", DONE_KEPT + 2), 0).0,
            Status::Commit
        );
        assert_eq!(
            book.status("n0/2", 0),
            (Status::Abort, true),
            "dropped, unknown now"
        );
        // An abort forgotten leaves the aborts' order too.
        book.decide("n0/x", Record::Abort).unwrap();
        assert_eq!(book.counts(), (0, 2));
        book.forget("n0/x");
        assert_eq!(book.counts(), (0, 1));
    }

    #[test]
    fn the_book_round_trips_and_bad_bytes_are_refused() {
        let mut book = Book::default();
        book.decide("n1/a", Record::Commit(parts())).unwrap();
        book.decide("n1/b", Record::Abort).unwrap();
        let bytes = book.encode();
        let back = Book::decode(&bytes).unwrap();
        assert_eq!(back.record("n1/a"), Some(&Record::Commit(parts())));
        assert_eq!(back.record("n1/b"), Some(&Record::Abort));
        assert_eq!(back.commits().len(), 1);
        for end in 1..bytes.len() {
            assert!(Book::decode(&bytes[..end]).is_err(), "{end}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Book::decode(&longer).is_err());
        assert!(Book::decode(&[]).unwrap().commits().is_empty());
    }
}
