//! An owner's tables, pure: the watch table (each txid's watched keys, which of them were
//! written since, and when the entry was last used), the prepared parts and the locks they hold
//! on their commands' keys, and the bounded list of txids applied here. Time comes in as an
//! argument (monotonic ms). A small counting filter of the watched and locked keys' names
//! answers "surely not watched nor locked" with one probe, so that the command filter pays
//! nothing more for the keys of no transaction; it is kept up to date as names come and go
//! (never rebuilt from the whole tables: an unwatch or a commit costs its own keys only).

use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasher, Hasher};

use rustc_hash::{FxBuildHasher, FxHashMap, FxHashSet};

/// A key of a database.
pub type DbKey = (i32, Vec<u8>);

/// How many txids applied here are remembered (`COMMIT` of one of them replies `DONE`).
pub const DONE_KEPT: usize = 10_000;

/// Slots of the names' filter.
pub const FILTER_SLOTS: usize = 4096;

/// One txid's watches.
#[derive(Debug, Clone, Default)]
struct Watch {
    keys: FxHashSet<DbKey>,
    written: FxHashSet<DbKey>,
    /// The keys that were there when watched: one gone at the check, which no write marked,
    /// expired or was evicted (no keyspace event is followed for those).
    existed: FxHashSet<DbKey>,
    last_used_ms: u64,
    ttl_ms: u64,
}

/// A prepared part: its database, its commands (each the name first), the keys it locks, its
/// lock's length and deadline, and its coordinator's address as `PREPARE` gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub db: i32,
    pub cmds: Vec<Vec<Vec<u8>>>,
    pub keys: Vec<Vec<u8>>,
    pub lock_ms: u64,
    /// When it was locked (monotonic ms, this process's: a restart or a replica starts again).
    pub since_ms: u64,
    /// Where the coordinator said it was (`PREPARE ... FROM host:port`): asked when no ring
    /// here names the coordinator any more (`doubt`). `None` from a coordinator that did not
    /// say, or a record of a build before it.
    pub coordinator_at: Option<String>,
}

impl Prepared {
    pub fn deadline_ms(&self) -> u64 {
        self.since_ms.saturating_add(self.lock_ms)
    }
}

/// The owner's tables.
#[derive(Debug, Default)]
pub struct Tables {
    watches: FxHashMap<String, Watch>,
    /// Watched key names → the txids (and databases) that watch them.
    watchers: FxHashMap<Vec<u8>, Vec<(i32, String)>>,
    prepared: BTreeMap<String, Prepared>,
    locks: FxHashMap<DbKey, String>,
    done: VecDeque<String>,
    done_set: FxHashSet<String>,
    /// For each coordinator (the txid's node name), the highest number of its txids dropped
    /// from the done list: a txid of that coordinator at or below it, not in the list, may have
    /// been applied here (`forgot`).
    forgotten: FxHashMap<String, u64>,
    /// For each slot, how many names of `watchers` and keys of `locks` hash to it (empty until
    /// the first).
    counts: Vec<u32>,
    /// A bit per slot, set while its count is not 0: what the probe reads (512 bytes, where
    /// the counts take 16 KB).
    filter: Vec<u64>,
    /// A bit per name length (63: that long or longer), set while a name of that length is in
    /// the filter: the probe's first look, before it hashes (a value of another length than
    /// every watched or locked name costs no hash).
    lengths: u64,
    /// How many names of the filter have each length (as `lengths`' bits).
    length_counts: Vec<u32>,
    /// The locked key names, counted over databases (whether a name is locked in some
    /// database, without a walk of `locks`).
    locked_names: FxHashMap<Vec<u8>, u32>,
}

/// A txid's coordinator and number (`<node name>/<hex>`, as coordinators make them).
fn numbered(txid: &str) -> Option<(&str, u64)> {
    let (coordinator, hex) = txid.split_once('/')?;
    Some((coordinator, u64::from_str_radix(hex, 16).ok()?))
}

/// The bit of `Tables::lengths` of a name (as `FilterArgs::any_length_in` reads it).
#[inline(always)]
pub fn length_bit(name: &[u8]) -> usize {
    name.len().min(63)
}

/// The slot of a name in the filter.
pub fn slot_of(name: &[u8]) -> usize {
    let mut h = FxBuildHasher.build_hasher();
    h.write(name);
    (h.finish() as usize) % FILTER_SLOTS
}

impl Tables {
    /// Whether no key is watched or locked (the command filter's first check).
    pub fn is_idle(&self) -> bool {
        self.watchers.is_empty() && self.locks.is_empty()
    }

    /// False when no key of this name is watched or locked, in any database (one probe);
    /// true when one may be.
    pub fn may_hold(&self, name: &[u8]) -> bool {
        if self.lengths & (1 << length_bit(name)) == 0 {
            return false;
        }
        let slot = slot_of(name);
        self.filter
            .get(slot / 64)
            .is_some_and(|w| w & (1 << (slot % 64)) != 0)
    }

    /// The filter as the probe reads it: the bit per name length, and the bit per slot (empty
    /// until the first name).
    pub fn filter_bits(&self) -> (u64, &[u64]) {
        (self.lengths, &self.filter)
    }

    /// A name came into `watchers`, or a key into `locks`.
    fn add_to_filter(&mut self, name: &[u8]) {
        if self.counts.is_empty() {
            self.counts = vec![0; FILTER_SLOTS];
            self.filter = vec![0; FILTER_SLOTS / 64];
            self.length_counts = vec![0; 64];
        }
        let slot = slot_of(name);
        self.counts[slot] = self.counts[slot].saturating_add(1);
        self.filter[slot / 64] |= 1 << (slot % 64);
        let bit = length_bit(name);
        self.length_counts[bit] = self.length_counts[bit].saturating_add(1);
        self.lengths |= 1 << bit;
    }

    /// A name left `watchers`, or a key left `locks`.
    fn remove_from_filter(&mut self, name: &[u8]) {
        let slot = slot_of(name);
        if let Some(n) = self.counts.get_mut(slot) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.filter[slot / 64] &= !(1 << (slot % 64));
            }
        }
        let bit = length_bit(name);
        if let Some(n) = self.length_counts.get_mut(bit) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.lengths &= !(1 << bit);
            }
        }
    }

    // --- watches ---

    /// Adds `keys` of database `db` to `txid`'s watches (idempotent), which live `ttl_ms`
    /// without use; `exists` says whether a key is there now (a key watched again that was
    /// there and is gone counts as written).
    pub fn watch(
        &mut self,
        txid: &str,
        db: i32,
        keys: &[Vec<u8>],
        ttl_ms: u64,
        now: u64,
        exists: impl Fn(&[u8]) -> bool,
    ) {
        let w = self.watches.entry(txid.to_string()).or_default();
        w.ttl_ms = ttl_ms;
        w.last_used_ms = now;
        let mut added = Vec::new();
        for k in keys {
            let dk = (db, k.clone());
            let there = exists(k);
            if w.keys.insert(dk.clone()) {
                added.push(k.clone());
                if there {
                    w.existed.insert(dk);
                }
            } else if !there && w.existed.remove(&dk) {
                w.written.insert(dk);
            }
        }
        for k in added {
            if let Some(list) = self.watchers.get_mut(&k) {
                list.push((db, txid.to_string()));
            } else {
                self.add_to_filter(&k);
                self.watchers.insert(k, vec![(db, txid.to_string())]);
            }
        }
    }

    /// Drops `txid`'s watches.
    pub fn unwatch(&mut self, txid: &str) {
        let Some(w) = self.watches.remove(txid) else {
            return;
        };
        for (db, k) in w.keys {
            if let Some(list) = self.watchers.get_mut(&k) {
                list.retain(|(d, t)| !(*d == db && t == txid));
                if list.is_empty() {
                    self.watchers.remove(&k);
                    self.remove_from_filter(&k);
                }
            }
        }
    }

    /// Drops the watch entries unused for longer than their ttl.
    pub fn expire_watches(&mut self, now: u64) {
        let old: Vec<String> = self
            .watches
            .iter()
            .filter(|(_, w)| now.saturating_sub(w.last_used_ms) > w.ttl_ms)
            .map(|(t, _)| t.clone())
            .collect();
        for t in old {
            self.unwatch(&t);
        }
    }

    /// Whether every key of `keys` (database `db`) is watched by `txid`, unwritten since, still
    /// there if it was there when watched (`exists`: whether a key is there now), and the entry
    /// alive (a gone or timed-out entry counts as written). Uses the entry.
    pub fn watched_clean(
        &mut self,
        txid: &str,
        db: i32,
        keys: &[Vec<u8>],
        now: u64,
        exists: impl Fn(&[u8]) -> bool,
    ) -> bool {
        if keys.is_empty() {
            return true;
        }
        let Some(w) = self.watches.get_mut(txid) else {
            return false;
        };
        if now.saturating_sub(w.last_used_ms) > w.ttl_ms {
            return false;
        }
        w.last_used_ms = now;
        keys.iter().all(|k| {
            let dk = (db, k.clone());
            w.keys.contains(&dk)
                && !w.written.contains(&dk)
                && (!w.existed.contains(&dk) || exists(k))
        })
    }

    /// Marks the key `name` written, in database `db` (`None`: in every database, when the
    /// database is not known).
    pub fn mark(&mut self, db: Option<i32>, name: &[u8]) {
        let Some(list) = self.watchers.get(name) else {
            return;
        };
        for (d, txid) in list {
            if db.is_some_and(|db| db != *d) {
                continue;
            }
            if let Some(w) = self.watches.get_mut(txid) {
                w.written.insert((*d, name.to_vec()));
            }
        }
    }

    /// Marks every watched key of database `db` written (`None`: of every database).
    pub fn mark_db(&mut self, db: Option<i32>) {
        for w in self.watches.values_mut() {
            let hit: Vec<DbKey> = w
                .keys
                .iter()
                .filter(|(d, _)| db.is_none_or(|db| db == *d))
                .cloned()
                .collect();
            w.written.extend(hit);
        }
    }

    // --- locks and prepared parts ---

    /// The txid that locks `name` in database `db`.
    pub fn locked_by(&self, db: i32, name: &[u8]) -> Option<&str> {
        if self.locks.is_empty() {
            return None;
        }
        self.locks.get(&(db, name.to_vec())).map(String::as_str)
    }

    /// Whether a key of this name is locked in some database.
    pub fn locked_in_any(&self, name: &[u8]) -> bool {
        !self.locked_names.is_empty() && self.locked_names.contains_key(name)
    }

    /// Whether a key of this name is watched in some database.
    pub fn watched_in_any(&self, name: &[u8]) -> bool {
        self.watchers.contains_key(name)
    }

    /// Every locked key.
    pub fn locked_keys(&self) -> impl Iterator<Item = (&DbKey, &str)> {
        self.locks.iter().map(|(k, t)| (k, t.as_str()))
    }

    pub fn prepared(&self, txid: &str) -> Option<&Prepared> {
        self.prepared.get(txid)
    }

    /// Every prepared part.
    pub fn all_prepared(&self) -> impl Iterator<Item = (&str, &Prepared)> {
        self.prepared.iter().map(|(t, p)| (t.as_str(), p))
    }

    /// Records a prepared part and locks its keys (a second record of the same txid replaces
    /// the first).
    pub fn prepare(&mut self, txid: &str, part: Prepared) {
        self.take_prepared(txid);
        for k in &part.keys {
            if self
                .locks
                .insert((part.db, k.clone()), txid.to_string())
                .is_none()
            {
                self.add_to_filter(k);
                *self.locked_names.entry(k.clone()).or_insert(0) += 1;
            }
        }
        self.prepared.insert(txid.to_string(), part);
    }

    /// Removes a prepared part and its locks.
    pub fn take_prepared(&mut self, txid: &str) -> Option<Prepared> {
        let part = self.prepared.remove(txid)?;
        for k in &part.keys {
            let key = (part.db, k.clone());
            if self.locks.get(&key).is_some_and(|t| t == txid) {
                self.locks.remove(&key);
                self.remove_from_filter(k);
                if let Some(n) = self.locked_names.get_mut(k) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.locked_names.remove(k);
                    }
                }
            }
        }
        Some(part)
    }

    // --- done ---

    pub fn is_done(&self, txid: &str) -> bool {
        self.done_set.contains(txid)
    }

    /// Remembers `txid` as applied here (the oldest forgotten past `DONE_KEPT`, its number
    /// kept as its coordinator's mark).
    pub fn add_done(&mut self, txid: &str) {
        if !self.done_set.insert(txid.to_string()) {
            return;
        }
        self.done.push_back(txid.to_string());
        while self.done.len() > DONE_KEPT {
            if let Some(old) = self.done.pop_front() {
                self.done_set.remove(&old);
                if let Some((coordinator, number)) = numbered(&old) {
                    let mark = self.forgotten.entry(coordinator.to_string()).or_default();
                    *mark = (*mark).max(number);
                }
            }
        }
    }

    /// Whether `txid`, not in the done list, may have been applied here all the same: a txid
    /// of its coordinator as high or higher was dropped from the list. (A txid above its
    /// coordinator's mark was never dropped: not in the list, it was never applied here.)
    pub fn forgot(&self, txid: &str) -> bool {
        !self.is_done(txid)
            && numbered(txid).is_some_and(|(coordinator, number)| {
                self.forgotten
                    .get(coordinator)
                    .is_some_and(|mark| number <= *mark)
            })
    }

    /// Each coordinator's mark of `forgot`.
    pub fn forgotten_marks(&self) -> impl Iterator<Item = (&str, u64)> {
        self.forgotten.iter().map(|(c, n)| (c.as_str(), *n))
    }

    /// The txids applied here, oldest first.
    pub fn done_list(&self) -> impl Iterator<Item = &str> {
        self.done.iter().map(String::as_str)
    }

    /// Replaces the prepared parts, the done list and its coordinators' marks (a load),
    /// locking again from `now`.
    pub fn replace_durable(
        &mut self,
        prepared: Vec<(String, Prepared)>,
        done: Vec<String>,
        forgotten: Vec<(String, u64)>,
    ) {
        for t in self.prepared.keys().cloned().collect::<Vec<_>>() {
            self.take_prepared(&t);
        }
        self.done.clear();
        self.done_set.clear();
        self.forgotten = forgotten.into_iter().collect();
        for (t, p) in prepared {
            self.prepare(&t, p);
        }
        for t in done {
            self.add_done(&t);
        }
    }

    // --- INFO ---

    pub fn locks_held(&self) -> usize {
        self.locks.len()
    }

    /// How long the oldest lock has been held (ms).
    pub fn longest_lock_ms(&self, now: u64) -> u64 {
        self.prepared
            .values()
            .map(|p| now.saturating_sub(p.since_ms))
            .max()
            .unwrap_or(0)
    }

    /// The prepared parts past their lock's deadline.
    pub fn in_doubt(&self, now: u64) -> Vec<String> {
        self.prepared
            .iter()
            .filter(|(_, p)| now >= p.deadline_ms())
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Whether anything is timed (watches to expire, locks to resolve).
    pub fn has_timed(&self) -> bool {
        !self.watches.is_empty() || !self.prepared.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    fn part(keys: &[&str]) -> Prepared {
        Prepared {
            db: 0,
            cmds: vec![vec![k("SET"), k(keys[0]), k("v")]],
            keys: keys.iter().map(|s| k(s)).collect(),
            lock_ms: 100,
            since_ms: 1000,
            coordinator_at: None,
        }
    }

    #[test]
    fn a_watch_is_clean_until_written_and_gone_when_expired() {
        let mut t = Tables::default();
        assert!(t.is_idle() && !t.may_hold(b"a"));
        t.watch("n0/1", 0, &[k("a"), k("b")], 50, 0, |_| false);
        assert!(t.may_hold(b"a") && !t.is_idle());
        assert!(t.watched_clean("n0/1", 0, &[k("a")], 10, |_| true));
        assert!(
            !t.watched_clean("n0/1", 0, &[k("c")], 10, |_| true),
            "not watched"
        );
        assert!(
            !t.watched_clean("n0/1", 1, &[k("a")], 10, |_| true),
            "another database"
        );
        t.mark(Some(1), b"a");
        assert!(t.watched_clean("n0/1", 0, &[k("a")], 20, |_| true));
        t.mark(None, b"a");
        assert!(!t.watched_clean("n0/1", 0, &[k("a")], 20, |_| true));
        assert!(t.watched_clean("n0/1", 0, &[k("b")], 20, |_| true));
        assert!(
            !t.watched_clean("n0/1", 0, &[k("b")], 71, |_| true),
            "timed out"
        );
        assert!(
            !t.watched_clean("n0/2", 0, &[k("b")], 20, |_| true),
            "no entry"
        );
        t.expire_watches(200);
        assert!(t.is_idle() && !t.may_hold(b"a"));
    }

    #[test]
    fn a_key_there_when_watched_and_gone_at_the_check_counts_as_written() {
        let mut t = Tables::default();
        let there = |k: &[u8]| k == b"a" || k == b"b";
        t.watch("x/1", 0, &[k("a"), k("b"), k("c")], 1000, 0, there);
        assert!(t.watched_clean("x/1", 0, &[k("a"), k("c")], 1, there));
        assert!(
            t.watched_clean("x/1", 0, &[k("c")], 1, |_| false),
            "never there"
        );
        assert!(
            !t.watched_clean("x/1", 0, &[k("a")], 1, |k| k == b"b"),
            "expired"
        );
        // Watched again once gone: written.
        t.watch("x/1", 0, &[k("b")], 1000, 2, |_| false);
        assert!(!t.watched_clean("x/1", 0, &[k("b")], 3, there));
    }

    #[test]
    fn a_flush_marks_its_database() {
        let mut t = Tables::default();
        t.watch("x/1", 0, &[k("a")], 1000, 0, |_| false);
        t.watch("x/2", 3, &[k("a")], 1000, 0, |_| false);
        t.mark_db(Some(3));
        assert!(t.watched_clean("x/1", 0, &[k("a")], 1, |_| true));
        assert!(!t.watched_clean("x/2", 3, &[k("a")], 1, |_| true));
        t.mark_db(None);
        assert!(!t.watched_clean("x/1", 0, &[k("a")], 1, |_| true));
    }

    #[test]
    fn a_prepared_part_locks_its_keys_until_taken() {
        let mut t = Tables::default();
        t.prepare("x/1", part(&["a", "b"]));
        assert_eq!(t.locked_by(0, b"a"), Some("x/1"));
        assert_eq!(t.locked_by(1, b"a"), None);
        assert!(t.locked_in_any(b"b") && t.may_hold(b"b"));
        assert_eq!(t.locks_held(), 2);
        assert_eq!(t.longest_lock_ms(1500), 500);
        assert!(t.in_doubt(1099).is_empty());
        assert_eq!(t.in_doubt(1100), vec!["x/1".to_string()]);
        assert_eq!(t.take_prepared("x/1"), Some(part(&["a", "b"])));
        assert!(t.take_prepared("x/1").is_none());
        assert!(t.is_idle() && !t.may_hold(b"a"));
    }

    /// The filter counts exactly the names watched and the keys locked, through watches and
    /// locks that share names, databases and txids, so that it never forgets one still held.
    #[test]
    fn the_filter_follows_every_name_in_and_out() {
        let mut t = Tables::default();
        let counted = |t: &Tables| {
            let bits = (0..FILTER_SLOTS).filter(|s| t.filter[s / 64] & (1 << (s % 64)) != 0);
            assert!(bits.eq((0..FILTER_SLOTS).filter(|s| t.counts[*s] > 0)));
            t.counts.iter().map(|n| u64::from(*n)).sum::<u64>()
        };
        let held = |t: &Tables| (t.watchers.len() + t.locks.len()) as u64;
        let names: Vec<Vec<u8>> = (0..300).map(|i| k(&format!("n{i}"))).collect();
        for i in 0..100usize {
            let keys = [names[i].clone(), names[(i * 7) % 300].clone()];
            t.watch(&format!("w/{i}"), (i % 3) as i32, &keys, 1000, 0, |_| false);
            t.watch(&format!("w/{i}"), (i % 3) as i32, &keys, 1000, 0, |_| false);
            let a = format!("n{}", (i * 5) % 300);
            let b = format!("n{}", (i * 11) % 300);
            t.prepare(&format!("p/{i}"), part(&[a.as_str(), b.as_str()]));
            assert_eq!(counted(&t), held(&t));
        }
        for n in t.watchers.keys().chain(t.locks.keys().map(|(_, n)| n)) {
            assert!(t.may_hold(n));
        }
        for i in (0..100).step_by(2) {
            t.unwatch(&format!("w/{i}"));
            t.take_prepared(&format!("p/{}", i + 1));
            assert_eq!(counted(&t), held(&t));
        }
        for n in t.watchers.keys().chain(t.locks.keys().map(|(_, n)| n)) {
            assert!(t.may_hold(n));
        }
        for i in 0..100 {
            t.unwatch(&format!("w/{i}"));
            t.take_prepared(&format!("p/{i}"));
        }
        assert!(t.is_idle() && counted(&t) == 0);
    }

    #[test]
    fn the_done_list_is_bounded() {
        let mut t = Tables::default();
        for i in 0..DONE_KEPT + 5 {
            t.add_done(&format!("x/{i}"));
        }
        assert!(!t.is_done("x/0") && !t.is_done("x/4"));
        assert!(t.is_done("x/5") && t.is_done(&format!("x/{}", DONE_KEPT + 4)));
        assert_eq!(t.done_list().count(), DONE_KEPT);
    }

    /// A txid dropped from the done list is known as possibly applied (its coordinator's mark
    /// covers it, and every lower number of that coordinator); a higher one, or another
    /// coordinator's, is not.
    #[test]
    fn a_txid_dropped_from_the_done_list_is_known_as_forgotten() {
        let mut t = Tables::default();
        t.add_done("n0/30");
        for i in 0..DONE_KEPT - 1 {
            t.add_done(&format!("n1/{:x}", 0x1000 + i));
        }
        assert!(!t.forgot("n0/30") && t.is_done("n0/30"));
        t.add_done("n1/ffffff");
        assert!(!t.is_done("n0/30") && t.forgot("n0/30") && t.forgot("n0/2f"));
        assert!(!t.forgot("n0/31"), "above the mark: never applied here");
        assert!(
            !t.forgot("n2/1") && !t.forgot("n1/1001"),
            "in the list, or no mark"
        );
        t.add_done("n1/ffffff0");
        assert!(t.forgot("n1/1000") && t.forgot("n1/fff") && !t.forgot("n1/1001"));
        assert!(!t.forgot("plain") && !t.forgot("n0/zz"), "no number");
        let marks: Vec<(String, u64)> = t
            .forgotten_marks()
            .map(|(c, n)| (c.to_string(), n))
            .collect();
        let mut loaded = Tables::default();
        loaded.replace_durable(Vec::new(), Vec::new(), marks);
        assert!(loaded.forgot("n0/30") && !loaded.forgot("n0/31"));
    }
}
