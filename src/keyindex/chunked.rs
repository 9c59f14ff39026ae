//! A set that never rehashes: its entries live in tables made at their final size (the first
//! small, each next twice as large up to `MAX_CHUNK` entries, then `MAX_CHUNK` each), so that no
//! insert moves the entries already in (one `HashSet` of a million names, grown by doubling,
//! moves them all at once when it passes 917 504: tens of milliseconds of the server's main
//! thread in one keyspace event). A lookup probes each table: about a dozen for a million
//! entries. For the records kept from keyspace events (a copy's keys written, a build's names
//! deleted), bounded by a million entries.

use std::borrow::Borrow;
use std::hash::Hash;

use rustc_hash::FxHashSet;

/// The first table's entries.
const FIRST_CHUNK: usize = 1024;
/// The largest table's entries.
pub const MAX_CHUNK: usize = 128 * 1024;

/// A set of `T` in tables that are never resized.
#[derive(Clone, Debug)]
pub struct ChunkedSet<T> {
    chunks: Vec<FxHashSet<T>>,
    len: usize,
}

impl<T> Default for ChunkedSet<T> {
    fn default() -> Self {
        ChunkedSet {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

/// The size of the table after one of `last` entries (`None`: the first).
fn next_size(last: Option<usize>) -> usize {
    last.map_or(FIRST_CHUNK, |n| (n * 2).min(MAX_CHUNK))
}

impl<T> ChunkedSet<T> {
    /// Its tables (for `free::ChunkedDrain`).
    pub(super) fn into_chunks(self) -> Vec<FxHashSet<T>> {
        self.chunks
    }
}

impl<T: Hash + Eq> ChunkedSet<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains<Q>(&self, x: &Q) -> bool
    where
        T: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.chunks.iter().any(|c| c.contains(x))
    }

    /// Adds `x`; false if it was there.
    pub fn insert(&mut self, x: T) -> bool {
        if self.contains(&x) {
            return false;
        }
        let full = self.chunks.last().is_none_or(|c| c.len() >= c.capacity());
        if full {
            let size = next_size(self.chunks.last().map(FxHashSet::capacity));
            let mut chunk = FxHashSet::default();
            chunk.reserve(size);
            self.chunks.push(chunk);
        }
        if let Some(last) = self.chunks.last_mut() {
            last.insert(x);
            self.len += 1;
        }
        true
    }

    /// The tables' capacities (for the tests).
    #[cfg(test)]
    fn capacities(&self) -> Vec<usize> {
        self.chunks.iter().map(FxHashSet::capacity).collect()
    }
}

impl<T> IntoIterator for ChunkedSet<T> {
    type Item = T;
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<FxHashSet<T>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.chunks.into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_a_set() {
        let mut s: ChunkedSet<Vec<u8>> = ChunkedSet::default();
        assert!(s.is_empty());
        for i in 0..10_000u32 {
            assert!(s.insert(i.to_be_bytes().to_vec()));
        }
        for i in 0..10_000u32 {
            assert!(
                !s.insert(i.to_be_bytes().to_vec()),
                "a second insert adds nothing"
            );
            assert!(s.contains(&i.to_be_bytes()[..]));
        }
        assert!(!s.contains(&10_000u32.to_be_bytes()[..]));
        assert_eq!(s.len(), 10_000);
        let mut all: Vec<Vec<u8>> = s.into_iter().collect();
        all.sort();
        assert_eq!(
            all,
            (0..10_000u32)
                .map(|i| i.to_be_bytes().to_vec())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn no_table_is_ever_resized() {
        let mut s: ChunkedSet<u32> = ChunkedSet::default();
        let mut seen: Vec<usize> = Vec::new();
        for i in 0..600_000u32 {
            s.insert(i);
            let caps = s.capacities();
            // The tables made before keep their capacity: none was grown (which moves all).
            assert_eq!(&caps[..seen.len()], &seen[..], "a table was resized at {i}");
            seen = caps;
        }
        assert!(seen.iter().all(|&c| c <= 2 * MAX_CHUNK), "{seen:?}");
        // A million entries are looked up in a few tables.
        assert!(seen.len() <= 12, "{} tables", seen.len());
    }

    #[test]
    fn the_tables_grow_to_their_bound() {
        assert_eq!(next_size(None), FIRST_CHUNK);
        assert_eq!(next_size(Some(FIRST_CHUNK)), 2 * FIRST_CHUNK);
        assert_eq!(next_size(Some(MAX_CHUNK)), MAX_CHUNK);
        assert_eq!(next_size(Some(MAX_CHUNK * 2)), MAX_CHUNK);
    }
}
