//! Big sets freed a part at a time (`FreeInSteps`), so that the server's main thread frees a
//! million names in steps it bounds rather than at once: the key index (`IndexDrain`, a bucket
//! at a time) and the sets that never rehash (`ChunkedDrain`, an entry at a time, then each
//! table). The main thread drives them (`index::free`).
//!
//! Why on the main thread: they were freed on a thread of their own, which gave each name back
//! to the main thread's allocator arena under the arena's locks while the main thread
//! allocated and freed in the same arena (a cleanup's deletes): the main thread slept on those
//! locks, 13 times in one 8 ms cleanup step (bench/findings.md, "No stall").

use std::collections::hash_set;

use rustc_hash::FxHashSet;

use super::chunked::ChunkedSet;
use super::{Db, KeyIndex};

/// Something big, freed a part at a time.
pub trait FreeInSteps {
    /// Frees about `n` of its parts; whether nothing is left.
    fn free_some(&mut self, n: usize) -> bool;
}

/// A key index being freed, a bucket at a time.
pub struct IndexDrain {
    dbs: Vec<Db>,
    /// The next bucket of the last database.
    at: usize,
}

impl KeyIndex {
    /// The index, to be freed in steps.
    pub fn into_drain(self) -> IndexDrain {
        IndexDrain {
            dbs: self.dbs.into_values().collect(),
            at: 0,
        }
    }
}

impl FreeInSteps for IndexDrain {
    /// `n` buckets looked at (an empty one counts a sixteenth).
    fn free_some(&mut self, n: usize) -> bool {
        let mut left = n.saturating_mul(16);
        while left > 0 {
            let Some(db) = self.dbs.last_mut() else {
                return true;
            };
            match db.buckets.get_mut(self.at) {
                Some(cell) => {
                    left = left.saturating_sub(if cell.take().is_some() { 16 } else { 1 });
                    self.at += 1;
                }
                None => {
                    self.dbs.pop();
                    self.at = 0;
                }
            }
        }
        self.dbs.is_empty()
    }
}

/// A `ChunkedSet` being freed, an entry at a time, each table once it is empty.
pub struct ChunkedDrain<T> {
    chunks: Vec<FxHashSet<T>>,
    current: Option<hash_set::IntoIter<T>>,
}

impl<T> ChunkedSet<T> {
    /// The set, to be freed in steps.
    pub fn into_drain(self) -> ChunkedDrain<T> {
        ChunkedDrain {
            chunks: self.into_chunks(),
            current: None,
        }
    }
}

impl<T> FreeInSteps for ChunkedDrain<T> {
    fn free_some(&mut self, n: usize) -> bool {
        for _ in 0..n {
            if let Some(entries) = self.current.as_mut() {
                if entries.next().is_some() {
                    continue;
                }
                // Its table, once empty.
                self.current = None;
            }
            match self.chunks.pop() {
                Some(chunk) => self.current = Some(chunk.into_iter()),
                None => return true,
            }
        }
        false
    }
}

/// Each in turn, from the last.
impl<D: FreeInSteps> FreeInSteps for Vec<D> {
    fn free_some(&mut self, n: usize) -> bool {
        if self.last_mut().is_some_and(|last| last.free_some(n)) {
            self.pop();
        }
        self.is_empty()
    }
}

impl<A: FreeInSteps, B: FreeInSteps> FreeInSteps for (A, B) {
    fn free_some(&mut self, n: usize) -> bool {
        self.0.free_some(n) && self.1.free_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps_until_freed(item: &mut dyn FreeInSteps, n: usize) -> usize {
        let mut steps = 1;
        while !item.free_some(n) {
            steps += 1;
            assert!(steps < 1_000_000, "never freed");
        }
        steps
    }

    #[test]
    fn a_chunked_set_is_freed_in_steps_of_about_n_entries() {
        let mut set = ChunkedSet::default();
        for i in 0..10_000u32 {
            set.insert(i.to_be_bytes().to_vec());
        }
        let mut drain = set.into_drain();
        let steps = steps_until_freed(&mut drain, 100);
        // 10 000 entries and a few tables (each empty table costs one more call).
        assert!((100..=110).contains(&steps), "{steps}");
        assert!(drain.free_some(100), "stays freed");
    }

    #[test]
    fn an_index_is_freed_a_few_buckets_at_a_time() {
        let mut index = KeyIndex::new();
        for i in 0..20_000u32 {
            index.insert((i % 3) as i32, (i % 16384) as u16, &i.to_be_bytes());
        }
        let mut drain = index.into_drain();
        // 3 databases of 16 384 buckets, 20 000 of them used: about 20 000 + 49 152 / 16 units.
        let steps = steps_until_freed(&mut drain, 64);
        assert!((300..=400).contains(&steps), "{steps}");
        assert!(KeyIndex::new().into_drain().free_some(1));
    }

    #[test]
    fn a_pair_is_freed_when_both_are() {
        let mut set = ChunkedSet::default();
        set.insert(1u8);
        let mut pair = (KeyIndex::new().into_drain(), set.into_drain());
        assert!(steps_until_freed(&mut pair, 1) <= 3);
    }
}
