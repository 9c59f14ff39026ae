//! Which fleet coordinator may change this node's rings: the term of the fleet operation the
//! node follows (a fencing token) and the lease of the coordinator holding it, pure (time comes
//! in as milliseconds of a monotonic clock).
//!
//! Every step a coordinator sends (`SHARD.RING INSTALL`, `SHARD.RESHARD COPY|CLEANUP|STOP`,
//! `SHARD.RING LEASE`) carries its term and who it is (`Claim`). A node refuses a step of an older
//! term than the one it follows, a step of its own term from another holder, and a step of a
//! term its holder handed over (`How::Release`), naming the holder it follows (`STALETERM`); it
//! follows a newer term at its first step. Whether a new term may be taken is the new
//! coordinator's decision (`reshard::fleet::lease`), from what each node says of its term: how
//! long the holder's lease still runs there (`left_ms`). The record (`Record`) is durable with
//! the rings; when the holder was last heard is not (a record restored from disk counts as heard
//! at its load, so a restart never makes a lease look run out).
//!
//! Rings that come without a step (`Unstepped`) are held to the same term: rings pushed from
//! another node carry that node's record and are refused when older than this node's, or while
//! the holder's lease runs here (`Lease::check_push`); a ring change by hand names a term (none:
//! 0) and is refused the same way, leaving the record as it is (`Lease::check_by_hand`).

use std::fmt;

/// A coordinator: its node name, the address it was reached at, and its server's run id (a
/// replica promoted under the same node name, or the same server restarted, is another run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holder {
    pub name: String,
    pub address: String,
    pub run_id: String,
}

/// What a coordinator's step says of itself: `TERM term lease-ms name address run-id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub term: u64,
    /// How long the node may count the holder as alive after hearing from it.
    pub lease_ms: u64,
    pub holder: Holder,
}

/// The durable part: the term this node follows, its holder, and whether it was handed over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// 0: no fleet operation with a term has reached this node.
    pub term: u64,
    pub lease_ms: u64,
    pub holder: Holder,
    /// The holder released the term (its operation ended, or `SHARD.RESHARD HANDOVER`).
    pub released: bool,
}

/// What the step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// A step of the operation, a claim or a renewal: follows a newer term at once.
    Step,
    /// The holder hands its term over: the lease ends now.
    Release,
}

/// Why a step was refused (an older term, its term from another holder, or a term handed
/// over); its text is the error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub step: Claim,
    pub current: Record,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (step, current) = (&self.step, &self.current);
        let what = if current.released && current.term == step.term {
            "was handed over"
        } else {
            "holds this operation"
        };
        write!(
            f,
            "STALETERM step of term {} from {} refused: term {} of {} ({}) {what}",
            step.term, step.holder.name, current.term, current.holder.name, current.holder.address
        )
    }
}

/// A node's record and when it last heard from the holder (ms of a monotonic clock).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lease {
    pub record: Record,
    heard_ms: Option<u64>,
}

impl Lease {
    /// A record restored from disk (or a primary's full sync) at `now`: a term not handed over
    /// counts as heard now.
    pub fn restored(record: Record, now: u64) -> Lease {
        let heard_ms = (record.term > 0 && !record.released).then_some(now);
        Lease { record, heard_ms }
    }

    /// How long the holder's lease still runs here at `now` (0: expired, released or none).
    pub fn left_ms(&self, now: u64) -> u64 {
        match self.heard_ms {
            Some(heard) if !self.record.released && self.record.term > 0 => self
                .record
                .lease_ms
                .saturating_sub(now.saturating_sub(heard)),
            _ => 0,
        }
    }

    /// How long ago the holder was last heard here (`None`: not since this process began, or
    /// since the term was handed over).
    pub fn heard_ago(&self, now: u64) -> Option<u64> {
        self.heard_ms.map(|h| now.saturating_sub(h))
    }

    /// A coordinator's step at `now`: accepted (true when the durable record changed, which the
    /// caller then makes durable) or refused, changing nothing.
    pub fn accept(&mut self, step: &Claim, how: How, now: u64) -> Result<bool, Box<Refusal>> {
        let current = &self.record;
        let stale = || {
            Box::new(Refusal {
                step: step.clone(),
                current: current.clone(),
            })
        };
        if step.term < current.term {
            return Err(stale());
        }
        if step.term == current.term {
            if step.holder.run_id != current.holder.run_id {
                return Err(stale());
            }
            if current.released {
                return if how == How::Release {
                    Ok(false)
                } else {
                    Err(stale())
                };
            }
            if how == How::Release {
                self.record.released = true;
                self.heard_ms = None;
                return Ok(true);
            }
            self.heard_ms = Some(now);
            let changed = self.record.lease_ms != step.lease_ms;
            self.record.lease_ms = step.lease_ms;
            return Ok(changed);
        }
        self.take(step, how == How::Release, now);
        Ok(true)
    }

    /// The same step as the primary (or the AOF) applied it: never refused; an older term
    /// changes nothing. True when the record changed.
    pub fn follow(&mut self, step: &Claim, release: bool, now: u64) -> bool {
        let current = &self.record;
        let newer = step.term > current.term
            || (step.term == current.term && step.holder.run_id == current.holder.run_id);
        if !newer || self.record == record_of(step, release) {
            return false;
        }
        self.take(step, release, now);
        true
    }

    fn take(&mut self, step: &Claim, release: bool, now: u64) {
        self.record = record_of(step, release);
        self.heard_ms = (!release).then_some(now);
    }
}

/// Rings that come without a coordinator's step: pushed from another node (`SHARD.RING PUSH`,
/// carrying that node's record) or changed by hand (`SHARD.RING SET|BEGIN|...`, with the term
/// the operator names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unstepped {
    Push,
    ByHand,
}

/// Why rings that came without a step were refused; its text is the error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fenced {
    /// Of an older term than this node's, or of its term but from another holder, or not
    /// handed over where this node's was (the pusher missed the operation's end).
    Stale {
        how: Unstepped,
        term: u64,
        current: Record,
    },
    /// The holder's lease runs here for `left_ms` more: its operation drives the rings.
    Held {
        how: Unstepped,
        current: Record,
        left_ms: u64,
    },
}

impl fmt::Display for Fenced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = |how: &Unstepped| match how {
            Unstepped::Push => "rings pushed",
            Unstepped::ByHand => "a ring change by hand",
        };
        match self {
            Fenced::Stale { how, term, current } => {
                let state = if current.released {
                    ", handed over"
                } else {
                    ""
                };
                write!(
                    f,
                    "STALETERM {} under term {term} refused: this node follows term {} of {} \
                     ({}){state}",
                    what(how),
                    current.term,
                    current.holder.name,
                    current.holder.address
                )?;
                match how {
                    Unstepped::Push => write!(
                        f,
                        ": push from a node of term {} (SHARD.RING STATE's term)",
                        current.term
                    ),
                    Unstepped::ByHand => write!(
                        f,
                        ": this node's rings came from that operation; give TERM {} (SHARD.RING \
                         STATE's term) once sure the change should replace them",
                        current.term
                    ),
                }
            }
            Fenced::Held {
                how,
                current,
                left_ms,
            } => write!(
                f,
                "LEASEHELD term {} of {} ({}) holds this fleet operation: its lease runs here for \
                 {left_ms} ms more, and {} waits until it has run out, or SHARD.RESHARD HANDOVER \
                 on {}",
                current.term,
                current.holder.name,
                current.holder.address,
                what(how),
                current.holder.name
            ),
        }
    }
}

impl Lease {
    /// Rings pushed from a node whose record is `pushed` (the default record: a node that
    /// followed no term, or a build that sends none), at `now`. Accepted when of a newer term
    /// (with the record this node then takes on), or of this node's own term from its holder,
    /// its lease not running here (with the record when the pusher saw the term handed over and
    /// this node did not); refused, changing nothing, when older (`Fenced::Stale`) or while the
    /// holder's lease runs here (`Fenced::Held`).
    pub fn check_push(&self, pushed: &Record, now: u64) -> Result<Option<Record>, Box<Fenced>> {
        let current = &self.record;
        let stale = || {
            Box::new(Fenced::Stale {
                how: Unstepped::Push,
                term: pushed.term,
                current: current.clone(),
            })
        };
        if pushed.term > current.term {
            return Ok(Some(pushed.clone()));
        }
        if pushed.term < current.term {
            return Err(stale());
        }
        if current.term == 0 {
            return Ok(None);
        }
        if pushed.holder.run_id != current.holder.run_id || (current.released && !pushed.released) {
            return Err(stale());
        }
        if pushed.released {
            return Ok((!current.released).then(|| pushed.clone()));
        }
        let left_ms = self.left_ms(now);
        if left_ms > 0 {
            return Err(Box::new(Fenced::Held {
                how: Unstepped::Push,
                current: current.clone(),
                left_ms,
            }));
        }
        Ok(None)
    }

    /// A ring change by hand naming `term` (0: none named), at `now`: refused while the
    /// holder's lease runs here, or when `term` is older than this node's; the record is left
    /// as it is (a change by hand takes no term).
    pub fn check_by_hand(&self, term: u64, now: u64) -> Result<(), Box<Fenced>> {
        let left_ms = self.left_ms(now);
        if left_ms > 0 {
            return Err(Box::new(Fenced::Held {
                how: Unstepped::ByHand,
                current: self.record.clone(),
                left_ms,
            }));
        }
        if term < self.record.term {
            return Err(Box::new(Fenced::Stale {
                how: Unstepped::ByHand,
                term,
                current: self.record.clone(),
            }));
        }
        Ok(())
    }

    /// Takes on the record rings were pushed with (`check_push`): the term, not the lease (its
    /// holder was not heard here).
    pub fn adopt(&mut self, record: Record) {
        self.record = record;
        self.heard_ms = None;
    }
}

fn record_of(step: &Claim, released: bool) -> Record {
    Record {
        term: step.term,
        lease_ms: step.lease_ms,
        holder: step.holder.clone(),
        released,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(term: u64, name: &str, address: &str, run: &str) -> Claim {
        Claim {
            term,
            lease_ms: 1000,
            holder: Holder {
                name: name.into(),
                address: address.into(),
                run_id: run.into(),
            },
        }
    }

    #[test]
    fn a_newer_term_is_followed_and_an_older_one_refused_naming_both() {
        let mut lease = Lease::default();
        assert_eq!(lease.left_ms(0), 0, "no term: nothing runs");
        let t3 = claim(3, "n0", "h:1", "r0");
        assert_eq!(lease.accept(&t3, How::Step, 10), Ok(true));
        assert_eq!(lease.accept(&t3, How::Step, 20), Ok(false), "a renewal");
        assert_eq!(lease.left_ms(520), 500);
        assert_eq!(lease.heard_ago(520), Some(500));
        assert_eq!(lease.left_ms(1020), 0, "run out");
        // A newer term is followed at its first step, even while the lease runs.
        let t4 = claim(4, "n2", "h:3", "r2");
        assert_eq!(lease.accept(&t4, How::Step, 30), Ok(true));
        let stale = lease.accept(&t3, How::Step, 40).unwrap_err();
        assert_eq!(
            stale.to_string(),
            "STALETERM step of term 3 from n0 refused: term 4 of n2 (h:3) holds this operation"
        );
        // The same term from another holder (two RESUMEs that took the same number).
        let other = claim(4, "n1", "h:2", "r1");
        assert!(lease.accept(&other, How::Step, 50).is_err());
        assert!(lease.accept(&other, How::Release, 50).is_err());
        assert_eq!(lease.record.holder.name, "n2");
        assert_eq!(lease.left_ms(60), 970);
    }

    #[test]
    fn a_release_ends_the_lease_at_once_and_fences_its_term() {
        let mut lease = Lease::default();
        let t1 = claim(1, "n0", "h:1", "r0");
        lease.accept(&t1, How::Step, 0).unwrap();
        assert_eq!(lease.accept(&t1, How::Release, 5), Ok(true));
        assert_eq!(lease.accept(&t1, How::Release, 6), Ok(false), "idempotent");
        assert_eq!(lease.left_ms(6), 0);
        let late = lease.accept(&t1, How::Step, 7).unwrap_err().to_string();
        assert!(
            late.ends_with("term 1 of n0 (h:1) was handed over"),
            "{late}"
        );
        assert_eq!(
            lease.accept(&claim(2, "n1", "h:2", "r1"), How::Step, 8),
            Ok(true)
        );
    }

    #[test]
    fn a_restored_term_counts_as_heard_at_its_load() {
        let record = Record {
            term: 5,
            lease_ms: 1000,
            holder: claim(5, "n0", "h:1", "old").holder,
            released: false,
        };
        let lease = Lease::restored(record.clone(), 100);
        assert_eq!(lease.left_ms(300), 800);
        let released = Lease::restored(
            Record {
                released: true,
                ..record
            },
            100,
        );
        assert_eq!(released.left_ms(100), 0);
    }

    #[test]
    fn a_replica_follows_what_its_primary_accepted() {
        let mut lease = Lease::default();
        assert!(lease.follow(&claim(2, "n1", "h:2", "r1"), false, 0));
        assert!(!lease.follow(&claim(1, "n0", "h:1", "r0"), false, 0));
        assert!(!lease.follow(&claim(2, "n1", "h:2", "r1"), false, 1));
        assert!(lease.follow(&claim(2, "n1", "h:2", "r1"), true, 2));
        assert!(lease.record.released);
    }

    fn record(term: u64, run: &str, released: bool) -> Record {
        Record {
            term,
            lease_ms: 1000,
            holder: claim(term, "n0", "h:1", run).holder,
            released,
        }
    }

    #[test]
    fn pushed_rings_of_an_older_term_are_refused_and_a_newer_term_is_taken_on() {
        let mut lease = Lease::default();
        assert_eq!(
            lease.check_push(&Record::default(), 0),
            Ok(None),
            "a fresh fleet"
        );
        lease
            .accept(&claim(4, "n0", "h:1", "r0"), How::Step, 0)
            .unwrap();
        let old = lease.check_push(&record(3, "r9", true), 5).unwrap_err();
        assert_eq!(
            old.to_string(),
            "STALETERM rings pushed under term 3 refused: this node follows term 4 of n0 (h:1): \
             push from a node of term 4 (SHARD.RING STATE's term)"
        );
        assert!(lease.check_push(&Record::default(), 5).is_err(), "no term");
        // Its own term, while the lease runs here: the coordinator drives the rings.
        let held = lease.check_push(&record(4, "r0", false), 500).unwrap_err();
        assert!(
            held.to_string().starts_with("LEASEHELD term 4 of n0 (h:1)"),
            "{held}"
        );
        assert!(held.to_string().contains("500 ms more"), "{held}");
        assert_eq!(lease.check_push(&record(4, "r0", false), 2000), Ok(None));
        // The pusher saw the term handed over: taken on.
        let released = record(4, "r0", true);
        assert_eq!(lease.check_push(&released, 500), Ok(Some(released.clone())));
        lease.adopt(released.clone());
        assert_eq!(lease.left_ms(500), 0);
        // The pusher missed the end of the operation, or is of another holder.
        assert!(lease.check_push(&record(4, "r0", false), 600).is_err());
        assert!(lease.check_push(&record(4, "r1", true), 600).is_err());
        let newer = record(5, "r1", false);
        assert_eq!(lease.check_push(&newer, 600), Ok(Some(newer.clone())));
        lease.adopt(newer);
        assert_eq!(
            lease.left_ms(600),
            0,
            "a push brings the term, not the lease"
        );
    }

    #[test]
    fn a_change_by_hand_is_refused_while_a_lease_runs_or_under_an_older_term() {
        let mut lease = Lease::default();
        assert_eq!(lease.check_by_hand(0, 0), Ok(()), "a fresh fleet");
        lease
            .accept(&claim(2, "n0", "h:1", "r0"), How::Step, 0)
            .unwrap();
        let held = lease.check_by_hand(2, 10).unwrap_err().to_string();
        assert!(held.starts_with("LEASEHELD term 2 of n0 (h:1)"), "{held}");
        assert!(held.contains("a ring change by hand waits"), "{held}");
        let stale = lease.check_by_hand(0, 1000).unwrap_err().to_string();
        assert!(
            stale.starts_with(
                "STALETERM a ring change by hand under term 0 refused: this node follows term 2"
            ),
            "{stale}"
        );
        assert_eq!(lease.check_by_hand(2, 1000), Ok(()));
        assert_eq!(lease.check_by_hand(3, 1000), Ok(()));
        assert_eq!(lease.record.term, 2, "the record is left as it is");
    }
}
