//! `Points`: the flat sorted continuum shared by the point rings (ketama, jedis, redis-shard):
//! one owner per point (the later-added node wins a tie, as in every peer), binary-search lookup.

use super::error::RingError;

/// Most points a ring may hold (16 MiB of `(i64, u32)` pairs): ketama up to 6553 nodes,
/// jedis up to a total weight of 6553.
pub const MAX_POINTS: usize = 1 << 20;

/// A sorted continuum of `(point, owner node index)`, one entry per distinct point.
#[derive(Debug, Clone)]
pub(crate) struct Points<T> {
    entries: Vec<(T, u32)>,
}

impl<T: Ord + Copy> Points<T> {
    /// Builds from points in insertion order (node 0's points first). On equal points the
    /// entry of the highest node index (the node added later) is kept.
    pub(crate) fn build(mut entries: Vec<(T, u32)>) -> Result<Points<T>, RingError> {
        if entries.is_empty() {
            return Err(RingError::new("the ring has no points"));
        }
        entries.sort_unstable();
        // After sorting by (point, owner), the last entry of each run of equal points is the
        // latest-added owner: keep it.
        let mut w = 0;
        for r in 0..entries.len() {
            if r + 1 < entries.len() && entries[r + 1].0 == entries[r].0 {
                continue;
            }
            entries[w] = entries[r];
            w += 1;
        }
        entries.truncate(w);
        entries.shrink_to_fit();
        Ok(Points { entries })
    }

    /// Number of distinct points.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entry at `i` (callers keep `i < len()`; the ring is never empty).
    pub(crate) fn get(&self, i: usize) -> (T, u32) {
        self.entries[i.min(self.entries.len() - 1)]
    }

    /// Index of the first point strictly greater than `h` (python `bisect_right`); may be `len()`.
    pub(crate) fn first_greater(&self, h: T) -> usize {
        self.entries.partition_point(|&(p, _)| p <= h)
    }

    /// Index of the first point greater than or equal to `h` (java `tailMap`); may be `len()`.
    pub(crate) fn first_at_least(&self, h: T) -> usize {
        self.entries.partition_point(|&(p, _)| p < h)
    }

    /// All entries, sorted.
    pub(crate) fn entries(&self) -> &[(T, u32)] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_node_wins_ties_and_search() {
        let p = Points::build(vec![(5u32, 0), (1, 0), (5, 1), (9, 1), (5, 2), (1, 1)]).unwrap();
        assert_eq!(p.entries(), &[(1, 1), (5, 2), (9, 1)]);
        assert_eq!(p.first_greater(0), 0);
        assert_eq!(p.first_greater(1), 1);
        assert_eq!(p.first_greater(5), 2);
        assert_eq!(p.first_greater(9), 3);
        assert_eq!(p.first_at_least(5), 1);
        assert_eq!(p.first_at_least(10), 3);
        assert_eq!(p.get(3), (9, 1));
        assert!(Points::<u32>::build(Vec::new()).is_err());
    }
}
