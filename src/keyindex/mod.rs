//! The index of keys by ring bucket: for each database and each of the 16384 buckets of the
//! ring (`Ring::bucket`), the set of its key names, so that a resharding visits only the
//! buckets a ring change moves (`ring::changing_buckets`) and `CLUSTER COUNTKEYSINSLOT` and
//! `GETKEYSINSLOT` answer without a walk. Pure Rust: the glue keeps it exact from the server's
//! keyspace events.
//!
//! It owns the layout of the names in memory, because that is its whole cost: the issue's
//! target is the name's length plus 16 bytes a key (Redis's own per-slot lists cost 16), where
//! a `HashSet<Vec<u8>>` (or any map of owned keys: `hashbrown`, `indexmap`) costs 70 and more
//! (a 24-byte `Vec`, an allocation of its own, the table's slack). No crate keeps many small
//! sets of byte strings packed in arenas, with each step bounded for a server's main thread.
//!
//! Layout: a database allocates its 16384 bucket pointers at its first key, a bucket at its
//! first name (`bucket.rs`: one page, or a directory of pages for a bucket of many names), a
//! page (`page.rs`) packs its names in an arena indexed by an open-addressing table of 5-byte
//! records. Names are hashed with SipHash-1-3 under keys chosen at random for each index (the
//! standard library's `RandomState`, as Redis's own dictionaries use SipHash), so that no one
//! can choose names that collide. Every operation is O(1) amortized, and its worst step (a
//! page's resize, compaction or split) is bounded by a page's 1024 entries. Names are any
//! bytes, empty or long (a name of 1024 bytes or more gets an allocation of its own, with its
//! hash, and is never copied or hashed again). Clearing a database frees a few allocations per
//! bucket, not one per name.

mod bucket;
pub mod chunked;
pub mod free;
mod page;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use rustc_hash::FxHashMap;

use bucket::Bucket;
use page::{allocated, Page, PageNames};

/// Number of buckets of each database (as many as the ring's, `ring::BUCKETS`). A bucket
/// number is taken modulo this.
pub const BUCKETS: usize = 16384;

/// One database's buckets.
#[derive(Debug)]
struct Db {
    buckets: Box<[Option<Box<Bucket>>]>,
    len: usize,
}

impl Db {
    fn new() -> Db {
        Db {
            buckets: (0..BUCKETS).map(|_| None).collect(),
            len: 0,
        }
    }
}

/// The key names of each database, by ring bucket (see the module doc).
#[derive(Debug)]
pub struct KeyIndex {
    dbs: FxHashMap<i32, Db>,
    hasher: RandomState,
    len: usize,
}

impl Default for KeyIndex {
    fn default() -> Self {
        KeyIndex::new()
    }
}

#[inline]
fn slot(bucket: u16) -> usize {
    usize::from(bucket) & (BUCKETS - 1)
}

impl KeyIndex {
    /// An empty index.
    pub fn new() -> KeyIndex {
        KeyIndex {
            dbs: FxHashMap::default(),
            hasher: RandomState::new(),
            len: 0,
        }
    }

    fn bucket(&self, db: i32, bucket: u16) -> Option<&Bucket> {
        self.dbs.get(&db)?.buckets.get(slot(bucket))?.as_deref()
    }

    /// Adds `name` to `bucket` of `db`; true if it was not there.
    pub fn insert(&mut self, db: i32, bucket: u16, name: &[u8]) -> bool {
        let hash = self.hasher.hash_one(name);
        let d = self.dbs.entry(db).or_insert_with(Db::new);
        let Some(cell) = d.buckets.get_mut(slot(bucket)) else {
            return false;
        };
        let b = cell.get_or_insert_with(|| Box::new(Bucket::new()));
        let added = b.insert(name, hash, &self.hasher);
        if added {
            d.len += 1;
            self.len += 1;
        } else if b.len() == 0 {
            *cell = None;
        }
        added
    }

    /// Removes `name` from `bucket` of `db`; true if it was there.
    pub fn remove(&mut self, db: i32, bucket: u16, name: &[u8]) -> bool {
        let hash = self.hasher.hash_one(name);
        let Some(d) = self.dbs.get_mut(&db) else {
            return false;
        };
        let Some(cell) = d.buckets.get_mut(slot(bucket)) else {
            return false;
        };
        let Some(b) = cell.as_deref_mut() else {
            return false;
        };
        let removed = b.remove(name, hash, &self.hasher);
        if removed {
            if b.len() == 0 {
                *cell = None;
            }
            d.len -= 1;
            self.len -= 1;
        }
        removed
    }

    /// Whether `bucket` of `db` holds `name`.
    pub fn contains(&self, db: i32, bucket: u16, name: &[u8]) -> bool {
        self.bucket(db, bucket)
            .is_some_and(|b| b.contains(name, self.hasher.hash_one(name)))
    }

    /// Number of names in `bucket` of `db`.
    pub fn count(&self, db: i32, bucket: u16) -> usize {
        self.bucket(db, bucket).map_or(0, Bucket::len)
    }

    /// The names in `bucket` of `db`, in no particular order.
    pub fn names(&self, db: i32, bucket: u16) -> Names<'_> {
        let pages = self.bucket(db, bucket).map_or(&[][..], Bucket::pages);
        Names {
            pages: pages.iter(),
            current: None,
        }
    }

    /// Number of pages of `bucket` of `db` (0 when it holds no name). A page's index stays
    /// that page's while names come and go: a page that splits keeps its index and its other
    /// half is added at the end, and pages never merge (`bucket.rs`). So a walk in steps that
    /// visits the pages by index, each page's names taken at once, sees every name that stays
    /// in the bucket throughout (some twice, after a split), at a cost a step bounded by a
    /// page's `PAGE_MAX` names.
    pub fn page_count(&self, db: i32, bucket: u16) -> usize {
        self.bucket(db, bucket).map_or(0, |b| b.pages().len())
    }

    /// The names of page `page` of `bucket` of `db`, copied (none past the last page).
    pub fn page_names(&self, db: i32, bucket: u16, page: usize) -> Vec<Vec<u8>> {
        self.bucket(db, bucket)
            .and_then(|b| b.pages().get(page))
            .map(|p| p.names().map(<[u8]>::to_vec).collect())
            .unwrap_or_default()
    }

    /// The buckets of `db` that hold names, ascending, with their counts.
    pub fn buckets(&self, db: i32) -> impl Iterator<Item = (u16, usize)> + '_ {
        let buckets = self.dbs.get(&db).map_or(&[][..], |d| &d.buckets[..]);
        buckets
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref().map(|b| (i as u16, b.len())))
    }

    /// The databases that hold names, ascending.
    pub fn databases(&self) -> impl Iterator<Item = i32> {
        let mut dbs: Vec<i32> = self
            .dbs
            .iter()
            .filter(|(_, d)| d.len > 0)
            .map(|(&db, _)| db)
            .collect();
        dbs.sort_unstable();
        dbs.into_iter()
    }

    /// Number of names in `db`.
    pub fn db_len(&self, db: i32) -> usize {
        self.dbs.get(&db).map_or(0, |d| d.len)
    }

    /// Forgets every name of `db` (FLUSHDB).
    pub fn clear_db(&mut self, db: i32) {
        if let Some(d) = self.dbs.remove(&db) {
            self.len -= d.len;
        }
    }

    /// Exchanges the names of two databases (SWAPDB).
    pub fn swap_dbs(&mut self, a: i32, b: i32) {
        if a == b {
            return;
        }
        let da = self.dbs.remove(&a);
        let db = self.dbs.remove(&b);
        if let Some(d) = da {
            self.dbs.insert(b, d);
        }
        if let Some(d) = db {
            self.dbs.insert(a, d);
        }
    }

    /// Forgets every name (FLUSHALL).
    pub fn clear(&mut self) {
        self.dbs = FxHashMap::default();
        self.len = 0;
    }

    /// Number of names in every database.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index holds no name.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the index holds on the heap, each allocation counted at its size class in
    /// jemalloc (Redis's allocator, which counts them so in `used_memory`).
    pub fn heap_bytes(&self) -> usize {
        let map = allocated(self.dbs.capacity() * (std::mem::size_of::<(i32, Db)>() + 1));
        let dbs: usize = self
            .dbs
            .values()
            .map(|d| {
                allocated(d.buckets.len() * std::mem::size_of::<Option<Box<Bucket>>>())
                    + d.buckets
                        .iter()
                        .flatten()
                        .map(|b| allocated(std::mem::size_of::<Bucket>()) + b.heap_bytes())
                        .sum::<usize>()
            })
            .sum();
        map + dbs
    }
}

/// The names of one bucket (`KeyIndex::names`).
#[derive(Debug, Clone)]
pub struct Names<'a> {
    pages: std::slice::Iter<'a, Page>,
    current: Option<PageNames<'a>>,
}

impl<'a> Iterator for Names<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        loop {
            if let Some(name) = self.current.as_mut().and_then(Iterator::next) {
                return Some(name);
            }
            let page = self.pages.next()?;
            self.current = Some(page.names());
        }
    }
}

#[cfg(test)]
mod tests;
