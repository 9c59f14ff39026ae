//! A copy's destinations followed through a failover: which ring nodes behind Sentinel lost
//! keys in a pass (the child counts them by node, `copy_page`; `ship` says what a loss is),
//! since when, and when the job walks again for them alone: at once when the node's address
//! in use is no longer the one that was lost (Sentinel named a new primary and the topology
//! watcher followed), else after a wait that doubles from 1 s to 8 s (a primary that comes
//! back where it was), until `GIVE_UP` after the first loss, when the keys it lost count as
//! failed.
//!
//! A node whose address changed since the last walk that sent it all of its keys is walked
//! again too, although no pass lost anything there: its old primary may have acknowledged keys
//! that it had not yet replicated when it died, and those are gone from the new one. Every
//! pass keeps the copy's rules (`NX` and `RESTORE` without `REPLACE` skip what the destination
//! has; a copy that replaces replaces), so a key sent again never overwrites a newer one.
//!
//! Pure: the time and the addresses in use come in as arguments.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::reshard::ship::Target;

/// How long a copy waits for a lost destination's failover before its keys count as failed.
pub const GIVE_UP: Duration = Duration::from_secs(120);
const FIRST_WAIT: Duration = Duration::from_secs(1);
const LONGEST_WAIT: Duration = Duration::from_secs(8);

/// A destination lost, waiting to be walked again.
#[derive(Debug, Clone)]
struct Lost {
    name: String,
    /// The address it was lost at.
    at: String,
    since: Instant,
    next_try: Instant,
    wait: Duration,
    /// Keys it lost, the most any pass lost (a walk's count covers a pass over written keys).
    keys: u64,
}

/// The followed destinations of a copy job.
#[derive(Debug, Default)]
pub struct Followed {
    /// The address each followed node (by index) had at the fork of the last walk that sent
    /// it all of its keys and lost none.
    walked: HashMap<usize, String>,
    lost: BTreeMap<usize, Lost>,
}

/// A node the job had lost and has walked again: (name, the address it was lost at, the
/// address its keys went to).
pub type Recovered = (String, String, String);

impl Followed {
    /// A pass ended: its destinations as forked (`targets`), the nodes it walked all the keys
    /// of (by index; `None` for a pass over written keys) and the keys its child lost by node.
    /// Returns the nodes the job had lost and that this walk reached.
    pub fn pass_ended(
        &mut self,
        targets: &[Target],
        walked: Option<&[bool]>,
        lost_by_node: &[u64],
        now: Instant,
    ) -> Vec<Recovered> {
        let mut recovered = Vec::new();
        for t in targets.iter().filter(|t| t.followed) {
            let keys = lost_by_node.get(t.index).copied().unwrap_or(0);
            if keys > 0 {
                self.walked.remove(&t.index);
                let lost = self.lost.entry(t.index).or_insert_with(|| Lost {
                    name: t.name.clone(),
                    at: t.address.clone(),
                    since: now,
                    next_try: now,
                    wait: FIRST_WAIT,
                    keys: 0,
                });
                lost.at.clone_from(&t.address);
                lost.keys = lost.keys.max(keys);
                lost.next_try = now + lost.wait;
                lost.wait = (lost.wait * 2).min(LONGEST_WAIT);
            } else if walked.is_some_and(|w| w.get(t.index).copied().unwrap_or(false)) {
                if let Some(lost) = self.lost.remove(&t.index) {
                    recovered.push((lost.name, lost.at, t.address.clone()));
                }
                self.walked.insert(t.index, t.address.clone());
            }
        }
        recovered
    }

    /// Nodes whose address in use (`now_at`: the ring's destinations now) is not the one they
    /// were last walked at: lost, though no key was seen lost, and due at once.
    pub fn moved(&mut self, now_at: &[Target], now: Instant) {
        for t in now_at.iter().filter(|t| t.followed) {
            let Some(at) = self.walked.get(&t.index).filter(|at| **at != t.address) else {
                continue;
            };
            self.lost.entry(t.index).or_insert_with(|| Lost {
                name: t.name.clone(),
                at: at.clone(),
                since: now,
                next_try: now,
                wait: FIRST_WAIT,
                keys: 0,
            });
            self.walked.remove(&t.index);
        }
    }

    /// The nodes to walk again now, by index, or `None` when none is due: those whose address in
    /// use (`now_at`) is no longer the one they were lost at, and those whose wait is over.
    pub fn due(&self, now_at: &[Target], now: Instant) -> Option<Vec<bool>> {
        let mut only = vec![false; now_at.len()];
        let mut any = false;
        for (&index, lost) in &self.lost {
            let moved = now_at.get(index).is_some_and(|t| t.address != lost.at);
            if moved || now >= lost.next_try {
                if let Some(slot) = only.get_mut(index) {
                    *slot = true;
                    any = true;
                }
            }
        }
        any.then_some(only)
    }

    /// The nodes waited for longer than `GIVE_UP`, forgotten: (name, keys they lost), which
    /// the job counts as failed.
    pub fn give_up(&mut self, now: Instant) -> Vec<(String, u64)> {
        let over: Vec<usize> = self
            .lost
            .iter()
            .filter(|(_, l)| now.duration_since(l.since) >= GIVE_UP)
            .map(|(&i, _)| i)
            .collect();
        over.into_iter()
            .filter_map(|i| self.lost.remove(&i))
            .map(|l| (l.name, l.keys.max(1)))
            .collect()
    }

    /// Whether a lost node is waited for.
    pub fn waiting(&self) -> bool {
        !self.lost.is_empty()
    }

    /// The names of the nodes waited for, for the job's `last_error`.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.lost.values().map(|l| l.name.as_str()).collect();
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(addresses: &[&str]) -> Vec<Target> {
        addresses
            .iter()
            .enumerate()
            .map(|(index, a)| Target {
                name: format!("n{index}"),
                address: a.to_string(),
                index,
                followed: index > 0,
            })
            .collect()
    }

    #[test]
    fn a_lost_node_is_walked_again_once_its_address_changes_or_its_wait_is_over() {
        let t0 = Instant::now();
        let mut f = Followed::default();
        let fork = at(&["h:1", "h:2", "h:3"]);
        let all = [true, true, true];
        // The first walk lost n1's keys; n2 was reached.
        assert!(f.pass_ended(&fork, Some(&all), &[0, 40], t0).is_empty());
        assert!(f.waiting() && f.names() == "n1");
        assert_eq!(f.due(&fork, t0), None);
        // Still at its address: tried again after a second, then after two more.
        assert_eq!(
            f.due(&fork, t0 + FIRST_WAIT),
            Some(vec![false, true, false])
        );
        f.pass_ended(
            &fork,
            Some(&[false, true, false]),
            &[0, 40],
            t0 + FIRST_WAIT,
        );
        assert_eq!(f.due(&fork, t0 + FIRST_WAIT * 2), None);
        assert!(f.due(&fork, t0 + FIRST_WAIT * 3).is_some());
        // Failed over: due at once, and the walk that reaches the new primary ends the wait.
        let after = at(&["h:1", "h:22", "h:3"]);
        let only = f.due(&after, t0 + FIRST_WAIT + FIRST_WAIT / 2).unwrap();
        assert_eq!(only, vec![false, true, false]);
        let back = f.pass_ended(&after, Some(&only), &[0, 0], t0 + FIRST_WAIT * 2);
        assert_eq!(back, vec![("n1".into(), "h:2".into(), "h:22".into())]);
        assert!(!f.waiting());
        // A plain node (n0) is never followed, whatever it lost.
        f.pass_ended(&after, Some(&all), &[9, 0, 0], t0);
        assert!(!f.waiting());
    }

    #[test]
    fn a_failover_after_the_walk_sent_everything_is_walked_again() {
        let t0 = Instant::now();
        let mut f = Followed::default();
        f.pass_ended(&at(&["h:1", "h:2", "h:3"]), Some(&[true; 3]), &[], t0);
        // A pass over written keys changes nothing.
        f.pass_ended(&at(&["h:1", "h:2", "h:3"]), None, &[], t0);
        f.moved(&at(&["h:1", "h:2", "h:3"]), t0);
        assert!(!f.waiting());
        // n2 failed over after the child had sent it everything.
        let now = at(&["h:1", "h:2", "h:33"]);
        f.moved(&now, t0);
        assert_eq!(f.due(&now, t0), Some(vec![false, false, true]));
        f.moved(&now, t0);
        assert_eq!(f.names(), "n2");
    }

    #[test]
    fn a_node_waited_for_too_long_counts_its_keys_failed() {
        let t0 = Instant::now();
        let mut f = Followed::default();
        let fork = at(&["h:1", "h:2", "h:3"]);
        f.pass_ended(&fork, Some(&[true; 3]), &[0, 5, 7], t0);
        // A later pass over written keys lost fewer: the walk's count stays.
        f.pass_ended(&fork, None, &[0, 2, 0], t0 + GIVE_UP / 2);
        assert!(f.give_up(t0 + GIVE_UP / 2).is_empty());
        let given = f.give_up(t0 + GIVE_UP);
        assert_eq!(given, vec![("n1".into(), 5), ("n2".into(), 7)]);
        assert!(!f.waiting());
    }
}
