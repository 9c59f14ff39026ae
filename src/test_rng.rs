//! The seeded random source of the unit tests: `rand`'s `StdRng` from a fixed seed, so that a
//! failure replays. Compiled only for tests.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A reproducible stream of random numbers.
pub struct TestRng(StdRng);

impl TestRng {
    pub fn new(seed: u64) -> TestRng {
        TestRng(StdRng::seed_from_u64(seed))
    }

    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
