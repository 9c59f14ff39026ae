//! The random bits of uuidv7 and ulid IDs: a cryptographic generator seeded from the operating
//! system, and the counter's random start for the millisecond being issued.
//!
//! The generator is rand's `StdRng` (ChaCha with 12 rounds) seeded from `SysRng` (getrandom:
//! the kernel's CSPRNG) and seeded again from it after every 64 KiB of output, as rand's own
//! `ThreadRng` does. Why not the kernel for every ID: one `getrandom` call costs about a
//! microsecond here, as much as a whole pipelined GENKEY, while ChaCha12 gives the 8 bytes of an
//! ID in a few nanoseconds; and reseeding bounds what a leak of the state could reveal to the
//! next 64 KiB (about 8000 IDs). Unlike `ThreadRng` (which panics when a reseed fails, and is
//! not `Send`, so cannot live in the module's state), a failed reseed here keeps the current
//! state, still unpredictable, and tries again at the next call; only a first seed that fails
//! refuses the call, so no ID is ever drawn from an unseeded generator. Seeding happens in
//! `ready`, before the generator reserves any key, so a failure issues nothing and nothing is
//! half-replied. Forked children (BGSAVE, AOF rewrites, the module's walks) never issue IDs, so
//! a state copied into them is never used.
//!
//! The counter of a millisecond starts at a random value below half its room (RFC 9562 section
//! 6.2's seeding with a rollover guard bit) and adds the generator's sequence: the start is
//! drawn at the first ID of a millisecond and kept for the next ones, one start for each
//! 128-bit layout (a server may issue uuidv7 and ulid IDs in turn, `GENKEY LAYOUT`, each from
//! a generator of its own). A generator only ever continues the millisecond of the last ID it
//! issued (after a restart, a failover or a layout change it moves to a later one), so the kept
//! start of its layout is always that millisecond's.

use rand::rngs::{StdRng, SysRng};
use rand::{Rng, SeedableRng};

/// Bytes of output after which the generator is seeded again from the OS.
const RESEED_BYTES: u64 = 64 * 1024;

/// How many counters keep a start of their own: one per 128-bit layout (uuidv7, ulid).
pub const SLOTS: usize = 2;

/// The start of the counter of one millisecond (tick) for counters of `bits` bits.
#[derive(Debug, Clone, Copy)]
struct Start {
    tick: u64,
    bits: u32,
    value: u128,
}

/// The randomness of ID generation (one per server, in the module's state).
#[derive(Default)]
pub struct Entropy {
    rng: Option<StdRng>,
    /// Bytes drawn since the last seed.
    drawn: u64,
    /// False for a generator given a fixed seed (tests): never seeded from the OS.
    fixed: bool,
    /// The counter's start of the current millisecond, for each 128-bit layout (`SLOTS`).
    starts: [Option<Start>; SLOTS],
    /// Reseeds that failed (the state in use was kept).
    pub reseed_failures: u64,
}

impl std::fmt::Debug for Entropy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the generator's state.
        f.debug_struct("Entropy")
            .field("seeded", &self.rng.is_some())
            .field("drawn", &self.drawn)
            .finish()
    }
}

impl Entropy {
    /// Unseeded: the first `ready` seeds it from the OS.
    pub fn new() -> Entropy {
        Entropy::default()
    }

    /// A generator of a fixed seed, never seeded from the OS: for tests.
    pub fn from_seed(seed: [u8; 32]) -> Entropy {
        Entropy {
            rng: Some(StdRng::from_seed(seed)),
            fixed: true,
            ..Entropy::default()
        }
    }

    /// The generator, seeded (or seeded again after `RESEED_BYTES`) from the OS; an error only
    /// when it was never seeded and the OS gives no randomness now.
    pub fn ready(&mut self) -> Result<Draw<'_>, String> {
        let due = self.rng.is_none() || (!self.fixed && self.drawn >= RESEED_BYTES);
        if due {
            match StdRng::try_from_rng(&mut SysRng) {
                Ok(rng) => {
                    self.rng = Some(rng);
                    self.drawn = 0;
                }
                Err(e) if self.rng.is_none() => {
                    return Err(format!(
                    "the operating system's random source cannot be read ({e}); no ID was issued"
                ))
                }
                Err(_) => self.reseed_failures = self.reseed_failures.saturating_add(1),
            }
        }
        let Entropy {
            rng, drawn, starts, ..
        } = self;
        match rng {
            Some(rng) => Ok(Draw { rng, drawn, starts }),
            None => Err("the random source is not seeded".into()),
        }
    }
}

/// The seeded generator, for one call.
pub struct Draw<'a> {
    rng: &'a mut StdRng,
    drawn: &'a mut u64,
    starts: &'a mut [Option<Start>; SLOTS],
}

impl Draw<'_> {
    /// `bits` random bits (at most 128), in the low bits.
    #[inline]
    pub fn bits(&mut self, bits: u32) -> u128 {
        match bits {
            0 => 0,
            1..=64 => {
                *self.drawn += 8;
                u128::from(self.rng.next_u64() >> (64 - bits))
            }
            _ => {
                *self.drawn += 16;
                let high = u128::from(self.rng.next_u64());
                let low = u128::from(self.rng.next_u64());
                ((high << 64) | low) >> (128 - bits.min(128))
            }
        }
    }

    /// The counter of the `seq`-th ID of millisecond `tick`, for the counter `slot` (one per
    /// 128-bit layout, below `SLOTS`) of `bits` bits: the millisecond's random start (below
    /// 2^(bits - 1)) plus `seq`.
    #[inline]
    pub fn counter(&mut self, slot: usize, tick: u64, seq: u64, bits: u32) -> u128 {
        let kept = self.starts.get(slot).copied().flatten();
        let start = match kept {
            Some(s) if s.tick == tick && s.bits == bits => s.value,
            _ => {
                let value = self.bits(bits.saturating_sub(1));
                if let Some(s) = self.starts.get_mut(slot) {
                    *s = Some(Start { tick, bits, value });
                }
                value
            }
        };
        start + u128::from(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_os_seeds_it_and_draws_differ() {
        let mut a = Entropy::new();
        let mut b = Entropy::new();
        let x = a.ready().unwrap().bits(128);
        let y = b.ready().unwrap().bits(128);
        assert_ne!(x, y, "two generators seeded from the OS");
        assert!(!format!("{a:?}").contains(&format!("{x}")));
    }

    #[test]
    fn it_is_seeded_again_after_64_kib() {
        let mut e = Entropy::new();
        for _ in 0..(RESEED_BYTES / 16) {
            e.ready().unwrap().bits(128);
        }
        assert_eq!(e.drawn, RESEED_BYTES);
        e.ready().unwrap();
        assert_eq!(e.drawn, 0, "reseeded");
        let mut fixed = Entropy::from_seed([7; 32]);
        for _ in 0..(RESEED_BYTES / 8 + 1) {
            fixed.ready().unwrap().bits(64);
        }
        let mut again = Entropy::from_seed([7; 32]);
        for _ in 0..(RESEED_BYTES / 8 + 1) {
            again.ready().unwrap().bits(64);
        }
        assert_eq!(
            fixed.ready().unwrap().bits(64),
            again.ready().unwrap().bits(64),
            "a fixed seed is never replaced"
        );
    }

    #[test]
    fn bits_stay_within_their_width() {
        let mut e = Entropy::from_seed([1; 32]);
        let mut d = e.ready().unwrap();
        assert_eq!(d.bits(0), 0);
        for bits in [1, 12, 40, 63, 64, 65, 69, 80, 127, 128] {
            for _ in 0..200 {
                let v = d.bits(bits);
                assert!(bits == 128 || v >> bits == 0, "{bits}: {v:x}");
            }
        }
    }

    #[test]
    fn a_millisecond_keeps_its_start_and_the_next_draws_anew() {
        let mut e = Entropy::from_seed([2; 32]);
        let mut d = e.ready().unwrap();
        let a0 = d.counter(0, 100, 0, 24);
        assert!(a0 < 1 << 23, "the guard bit is 0");
        assert_eq!(d.counter(0, 100, 1, 24), a0 + 1);
        assert_eq!(d.counter(0, 100, 7, 24), a0 + 7);
        let b0 = d.counter(0, 101, 0, 24);
        assert_eq!(d.counter(0, 101, 3, 24), b0 + 3);
        // Another counter width (a layout change) never reuses the start.
        let c = d.counter(0, 101, 0, 70);
        assert!(c < 1 << 69);
    }

    #[test]
    fn each_layout_keeps_its_own_start() {
        let mut e = Entropy::from_seed([3; 32]);
        let mut d = e.ready().unwrap();
        let u0 = d.counter(0, 100, 0, 24);
        // Another layout's IDs in the same millisecond, in turn: neither start moves.
        let l0 = d.counter(1, 100, 0, 70);
        for seq in 1..50 {
            assert_eq!(d.counter(0, 100, seq, 24), u0 + u128::from(seq));
            assert_eq!(d.counter(1, 100, seq, 70), l0 + u128::from(seq));
        }
    }
}
