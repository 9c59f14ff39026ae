//! The generator's clock and sequence: which (tick, seq) pairs a request gets.
//!
//! It works like Redis stream IDs and Sonyflake: a new tick starts at seq 0; a request in the
//! same tick, or while the wall clock is behind the last tick, continues the sequence of the
//! last tick; a full sequence borrows the next tick. It never moves backwards, never sleeps,
//! and refuses (issuing nothing) a request that would carry its logical clock more than
//! `max_drift_ms` ahead of the wall clock. Time comes in as an argument, so tests drive it
//! with a fake clock.

use std::fmt;

use super::layout::{KeyFields, Layout, LayoutError};

/// The last key issued, as (tick, seq, type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Last {
    tick: u64,
    seq: u64,
    key_type: u64,
}

/// Counters shown in `INFO shard`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GenStats {
    /// Keys issued.
    pub generated: u64,
    /// Ticks taken ahead of the wall clock because a tick's sequence was full.
    pub borrowed: u64,
    /// Times the wall clock was seen lower than on the call before.
    pub backsteps: u64,
    /// Requests refused (drift limit, exhausted time field, clock before the epoch).
    pub refused: u64,
}

/// Why a request was refused; nothing was issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenError {
    Drift { ahead_ms: i64, max_drift_ms: i64 },
    Exhausted,
    Clock(LayoutError),
}

impl fmt::Display for GenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GenError::Drift {
                ahead_ms,
                max_drift_ms,
            } => write!(
                f,
                "issuing these keys would put the generator {ahead_ms} ms ahead of the wall clock, \
                 more than max-drift-ms {max_drift_ms}; ask for fewer keys or retry later"
            ),
            GenError::Exhausted => write!(
                f,
                "the layout's time field is exhausted: choose a later epoch"
            ),
            GenError::Clock(e) => write!(f, "the wall clock cannot be used: {e}"),
        }
    }
}

/// What one request may use: the layout's shape for this node.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub max_tick: u64,
    pub max_seq: u64,
    /// Usable ticks are those with `tick % stride == offset`.
    pub stride: u64,
    pub offset: u64,
    pub type_above_seq: bool,
}

impl Shape {
    pub fn of(layout: &Layout, node_id: u64) -> Shape {
        let (stride, offset) = layout.tick_stride(node_id);
        Shape {
            max_tick: layout.max_tick(),
            max_seq: layout.max_seq(),
            stride,
            offset,
            type_above_seq: layout.type_above_seq(),
        }
    }

    /// The latest usable tick at or below `t`.
    fn own_at_or_below(&self, t: u64) -> Option<u64> {
        match self.stride {
            // Every tick is usable (all layouts but Shardjs): no division.
            1 => (t >= self.offset).then_some(t),
            stride => t.checked_sub(self.offset).map(|d| t - d % stride),
        }
    }

    /// The first usable tick above `t`.
    fn own_after(&self, t: u64) -> Option<u64> {
        match self.own_at_or_below(t) {
            Some(own) => own.checked_add(self.stride),
            None => Some(self.offset),
        }
    }
}

/// A run of keys granted to one request: `count` consecutive (tick, seq) pairs from `start`.
#[derive(Debug, Clone, Copy)]
pub struct Batch {
    tick: u64,
    seq: u64,
    remaining: u64,
    max_seq: u64,
    stride: u64,
    node: u64,
    key_type: u64,
}

impl Iterator for Batch {
    type Item = KeyFields;

    #[inline]
    fn next(&mut self) -> Option<KeyFields> {
        if self.remaining == 0 {
            return None;
        }
        let fields = KeyFields {
            tick: self.tick,
            node: self.node,
            key_type: self.key_type,
            seq: self.seq,
        };
        self.remaining -= 1;
        if self.seq == self.max_seq {
            self.seq = 0;
            self.tick += self.stride;
        } else {
            self.seq += 1;
        }
        Some(fields)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Batch {}

/// The generator's state: the last key issued and the last wall clock seen.
#[derive(Debug, Clone, Default)]
pub struct Generator {
    last: Option<Last>,
    last_wall_ms: Option<i64>,
    stats: GenStats,
}

/// One request: how many keys, of which node and type, at what wall-clock time.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub now_ms: i64,
    pub count: u64,
    pub node: u64,
    pub key_type: u64,
    pub max_drift_ms: i64,
}

impl Generator {
    pub fn new() -> Generator {
        Generator::default()
    }

    pub fn stats(&self) -> GenStats {
        self.stats
    }

    /// A generator that has issued nothing, keeping `stats` (a rebase's).
    pub fn with_stats(stats: GenStats) -> Generator {
        Generator {
            stats,
            ..Generator::default()
        }
    }

    /// The tick of the last key issued (the high-water mark), if any.
    pub fn last_tick(&self) -> Option<u64> {
        self.last.map(|l| l.tick)
    }

    /// How far (ms) the logical clock is ahead of the wall clock `now_ms`; 0 when behind.
    pub fn drift_ms(&self, layout: &Layout, now_ms: i64) -> i64 {
        self.last
            .map_or(0, |l| layout.time_ms(l.tick).saturating_sub(now_ms).max(0))
    }

    /// Grants `req.count` keys (at least 1), or refuses and changes nothing but the counters.
    pub fn reserve(
        &mut self,
        layout: &Layout,
        shape: &Shape,
        req: &Request,
    ) -> Result<Batch, GenError> {
        let result = self.plan(layout, shape, req);
        if let Some(w) = self.last_wall_ms {
            if req.now_ms < w {
                self.stats.backsteps = self.stats.backsteps.saturating_add(1);
            }
        }
        self.last_wall_ms = Some(req.now_ms);
        match result {
            Ok((batch, end, borrowed)) => {
                self.last = Some(end);
                self.stats.generated = self.stats.generated.saturating_add(req.count.max(1));
                self.stats.borrowed = self.stats.borrowed.saturating_add(borrowed);
                Ok(batch)
            }
            Err(e) => {
                self.stats.refused = self.stats.refused.saturating_add(1);
                Err(e)
            }
        }
    }

    fn plan(
        &self,
        layout: &Layout,
        shape: &Shape,
        req: &Request,
    ) -> Result<(Batch, Last, u64), GenError> {
        let now_tick = match layout.tick_of(req.now_ms) {
            Ok(t) => t,
            Err(LayoutError::FieldRange { .. }) => return Err(GenError::Exhausted),
            Err(e) => return Err(GenError::Clock(e)),
        };
        let now_own = shape.own_at_or_below(now_tick);
        let (start_tick, start_seq) = match (self.last, now_own) {
            (None, Some(own)) => (own, 0),
            (None, None) => (shape.offset, 0),
            (Some(last), Some(own)) if own > last.tick => (own, 0),
            (Some(last), _) => {
                let same_tick_ok = last.seq < shape.max_seq
                    && !(shape.type_above_seq && req.key_type < last.key_type)
                    && shape.own_at_or_below(last.tick) == Some(last.tick);
                if same_tick_ok {
                    (last.tick, last.seq + 1)
                } else {
                    (shape.own_after(last.tick).ok_or(GenError::Exhausted)?, 0)
                }
            }
        };
        let count = req.count.max(1);
        let per_tick = shape.max_seq + 1;
        let first_room = per_tick - start_seq;
        let (end_tick, end_seq) = if count <= first_room {
            (start_tick, start_seq + count - 1)
        } else {
            let rest = count - first_room;
            let more_ticks = (rest - 1) / per_tick + 1;
            let end = more_ticks
                .checked_mul(shape.stride)
                .and_then(|d| start_tick.checked_add(d))
                .ok_or(GenError::Exhausted)?;
            (end, (rest - 1) % per_tick)
        };
        if end_tick > shape.max_tick {
            return Err(GenError::Exhausted);
        }
        // Ticks beyond both the wall clock and the last tick are borrowed; only those can
        // push the logical clock further ahead.
        let base = match (self.last, now_own) {
            (Some(l), Some(o)) => Some(l.tick.max(o)),
            (Some(l), None) => Some(l.tick),
            (None, o) => o,
        };
        let borrowed = match base {
            Some(b) if end_tick > b => (end_tick - b).div_ceil(shape.stride),
            Some(_) => 0,
            None => 1 + (end_tick - start_tick) / shape.stride,
        };
        if borrowed > 0 {
            let ahead_ms = layout.time_ms(end_tick).saturating_sub(req.now_ms);
            if ahead_ms > req.max_drift_ms {
                return Err(GenError::Drift {
                    ahead_ms,
                    max_drift_ms: req.max_drift_ms,
                });
            }
        }
        let batch = Batch {
            tick: start_tick,
            seq: start_seq,
            remaining: count,
            max_seq: shape.max_seq,
            stride: shape.stride,
            node: req.node,
            key_type: req.key_type,
        };
        let end = Last {
            tick: end_tick,
            seq: end_seq,
            key_type: req.key_type,
        };
        Ok((batch, end, borrowed))
    }

    /// Records that keys up to and including `tick` were issued (by a master before a
    /// failover, or before a restart): every later key is in a later tick.
    pub fn advance_past(&mut self, tick: u64, max_seq: u64) {
        let behind = match self.last {
            None => true,
            Some(l) => l.tick < tick || (l.tick == tick && l.seq < max_seq),
        };
        if behind {
            self.last = Some(Last {
                tick,
                seq: max_seq,
                key_type: 0,
            });
        }
    }

    /// The last unix millisecond covered by the last tick issued (the high-water mark).
    pub fn high_water_ms(&self, layout: &Layout) -> Option<i64> {
        let unit = i64::try_from(layout.unit_ms).unwrap_or(i64::MAX);
        self.last
            .map(|l| layout.time_ms(l.tick).saturating_add(unit - 1))
    }

    /// Records that keys were issued up to unix millisecond `ms` (by this server before a
    /// restart, or by its master): every later key is in a tick that starts after it.
    pub fn advance_past_ms(&mut self, layout: &Layout, ms: i64) {
        match layout.tick_of(ms) {
            Ok(tick) => self.advance_past(tick, layout.max_seq()),
            // Before the epoch: nothing of this layout was used yet.
            Err(LayoutError::BeforeEpoch { .. }) => {}
            // Past the layout's time field: every later request is refused.
            Err(_) => self.advance_past(layout.max_tick(), layout.max_seq()),
        }
    }

    /// Carries the high-water mark over a change of layout, epoch or node: the first key of
    /// the new layout is in a tick that starts after the last millisecond already used.
    pub fn rebase(&mut self, old: &Layout, new: &Layout) {
        let Some(last_ms) = self.high_water_ms(old) else {
            return;
        };
        self.last = None;
        self.advance_past_ms(new, last_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPOCH: i64 = 1_288_834_974_657;

    struct Rig {
        layout: Layout,
        shape: Shape,
        generator: Generator,
        node: u64,
    }

    impl Rig {
        fn new(layout: Layout, node: u64) -> Rig {
            let shape = Shape::of(&layout, node);
            Rig {
                layout,
                shape,
                generator: Generator::new(),
                node,
            }
        }

        fn ask(
            &mut self,
            now_ms: i64,
            count: u64,
            key_type: u64,
            drift: i64,
        ) -> Result<Vec<u64>, GenError> {
            let req = Request {
                now_ms,
                count,
                node: self.node,
                key_type,
                max_drift_ms: drift,
            };
            let batch = self.generator.reserve(&self.layout, &self.shape, &req)?;
            Ok(batch.map(|f| self.layout.pack(&f)).collect())
        }

        fn take(&mut self, now_ms: i64, count: u64) -> Vec<KeyFields> {
            let req = Request {
                now_ms,
                count,
                node: self.node,
                key_type: 0,
                max_drift_ms: 1000,
            };
            self.generator
                .reserve(&self.layout, &self.shape, &req)
                .unwrap()
                .collect()
        }
    }

    fn strictly_increasing(keys: &[u64]) -> bool {
        keys.windows(2).all(|w| w[0] < w[1])
    }

    #[test]
    fn new_tick_starts_at_seq_zero() {
        let mut rig = Rig::new(Layout::snowflake(), 5);
        let a = rig.take(EPOCH + 10, 3);
        assert_eq!(
            a.iter()
                .map(|f| (f.tick, f.seq, f.node))
                .collect::<Vec<_>>(),
            [(10, 0, 5), (10, 1, 5), (10, 2, 5)]
        );
        let b = rig.take(EPOCH + 11, 1);
        assert_eq!((b[0].tick, b[0].seq), (11, 0));
    }

    #[test]
    fn full_sequence_borrows_next_tick() {
        let mut rig = Rig::new(Layout::snowflake(), 0);
        let keys = rig.take(EPOCH + 100, 4096 + 10);
        assert_eq!(keys[4095].tick, 100);
        assert_eq!((keys[4096].tick, keys[4096].seq), (101, 0));
        assert_eq!(rig.generator.stats().borrowed, 1);
        // The wall clock catches up with the borrowed tick: continue its sequence.
        let next = rig.take(EPOCH + 101, 1);
        assert_eq!((next[0].tick, next[0].seq), (101, 10));
        assert_eq!(rig.generator.stats().borrowed, 1);
        assert_eq!(rig.generator.stats().generated, 4096 + 11);
    }

    #[test]
    fn clock_step_back_keeps_last_tick() {
        let mut rig = Rig::new(Layout::snowflake(), 1);
        let mut all = rig.ask(EPOCH + 10_000, 5, 0, 1000).unwrap();
        all.extend(rig.ask(EPOCH + 5_000, 5, 0, 1000).unwrap()); // 5 s back
        all.extend(rig.ask(EPOCH + 5_001, 5, 0, 1000).unwrap());
        assert!(strictly_increasing(&all), "{all:?}");
        assert_eq!(rig.generator.stats().backsteps, 1);
        assert_eq!(rig.generator.drift_ms(&rig.layout, EPOCH + 5_001), 4_999);
        assert_eq!(rig.layout.unpack(all[14]).unwrap().tick, 10_000);
    }

    #[test]
    fn drift_limit_refuses_and_issues_nothing() {
        let mut rig = Rig::new(Layout::snowflake(), 0);
        // 4096 keys a tick: 10 ticks ahead would be needed for 4096*11 keys.
        let err = rig.ask(EPOCH + 50, 4096 * 11, 0, 5).unwrap_err();
        assert!(
            matches!(
                err,
                GenError::Drift {
                    ahead_ms: 10,
                    max_drift_ms: 5
                }
            ),
            "{err:?}"
        );
        assert_eq!(rig.generator.last_tick(), None);
        assert_eq!(rig.generator.stats().refused, 1);
        assert_eq!(rig.generator.stats().generated, 0);
        // Within the limit it works, and the next keys follow.
        let ok = rig.ask(EPOCH + 50, 4096 * 6, 0, 5).unwrap();
        assert_eq!(rig.layout.unpack(*ok.last().unwrap()).unwrap().tick, 55);
        assert!(matches!(
            rig.ask(EPOCH + 50, 1, 0, 5),
            Err(GenError::Drift { ahead_ms: 6, .. })
        ));
        let more = rig.ask(EPOCH + 51, 1, 0, 5).unwrap();
        assert!(more[0] > *ok.last().unwrap());
    }

    #[test]
    fn same_tick_after_step_back_is_not_refused_by_drift() {
        let mut rig = Rig::new(Layout::snowflake(), 0);
        rig.ask(EPOCH + 20_000, 1, 0, 100).unwrap();
        // Wall clock 10 s behind, but the request fits in the last tick: no new drift.
        let keys = rig.ask(EPOCH + 10_000, 100, 0, 100).unwrap();
        assert_eq!(keys.len(), 100);
        // Filling the tick would need to borrow 10 s ahead: refused.
        assert!(matches!(
            rig.ask(EPOCH + 10_000, 4096, 0, 100),
            Err(GenError::Drift { .. })
        ));
    }

    #[test]
    fn sonyflake_units_of_ten_ms() {
        let mut rig = Rig::new(Layout::sonyflake(), 7);
        let a = rig.take(1_409_529_600_000 + 1_234, 256 + 1);
        assert_eq!((a[0].tick, a[255].seq, a[256].tick), (123, 255, 124));
    }

    #[test]
    fn shardjs_uses_only_its_virtual_shard() {
        let mut rig = Rig::new(Layout::shardjs(4), 2);
        let epoch = 1_325_404_800_000;
        let a = rig.take(epoch + 101, 1); // 101 % 4 == 1: the node's latest tick is 98
        assert_eq!(a[0].tick, 98);
        let b = rig.take(epoch + 102, 3844 + 1);
        assert!(b.iter().all(|f| f.tick % 4 == 2));
        assert_eq!((b[0].tick, b[3844].tick, b[3844].seq), (102, 106, 0));
        // Four nodes never collide: their ticks are disjoint.
        let mut other = Rig::new(Layout::shardjs(4), 3);
        assert!(other.take(epoch + 102, 10).iter().all(|f| f.tick == 99));
    }

    #[test]
    fn type_above_seq_keeps_keys_increasing() {
        let layout = Layout::custom("time:40 type:4 node:6 seq:10").unwrap();
        let mut rig = Rig::new(layout, 1);
        let mut all = rig.ask(EPOCH + 10, 2, 9, 1000).unwrap();
        all.extend(rig.ask(EPOCH + 10, 2, 3, 1000).unwrap());
        all.extend(rig.ask(EPOCH + 10, 2, 12, 1000).unwrap());
        assert!(strictly_increasing(&all), "{all:?}");
    }

    #[test]
    fn exhausted_time_field_and_clock_before_epoch() {
        let layout = Layout::custom("time:4 seq:1").unwrap().with_epoch(0);
        let mut rig = Rig::new(layout, 0);
        assert_eq!(rig.ask(15, 2, 0, 1000).unwrap().len(), 2);
        assert_eq!(rig.ask(15, 1, 0, 1000), Err(GenError::Exhausted));
        assert_eq!(rig.ask(16, 1, 0, 1000), Err(GenError::Exhausted));
        let mut early = Rig::new(Layout::snowflake(), 0);
        assert!(matches!(
            early.ask(EPOCH - 1, 1, 0, 1000),
            Err(GenError::Clock(_))
        ));
    }

    #[test]
    fn huge_counts_do_not_overflow() {
        let mut rig = Rig::new(Layout::snowflake(), 0);
        assert!(matches!(
            rig.ask(EPOCH, u64::MAX, 0, i64::MAX),
            Err(GenError::Exhausted)
        ));
        assert!(rig.ask(EPOCH, u64::MAX / 2, 0, 1000).is_err());
    }

    #[test]
    fn counters_saturate_instead_of_overflowing() {
        // Found by the `generator` fuzz target: a huge count overflowed `generated`.
        let mut rig = Rig::new(Layout::custom("time:62 seq:0").unwrap().with_epoch(0), 0);
        rig.generator.stats.generated = u64::MAX - 1;
        assert_eq!(rig.ask(5, 3, 0, i64::MAX).unwrap().len(), 3);
        assert_eq!(rig.generator.stats().generated, u64::MAX);
    }

    #[test]
    fn advance_past_and_rebase_never_go_back() {
        let mut rig = Rig::new(Layout::snowflake(), 0);
        rig.generator.advance_past(5000, 4095);
        let k = rig.take(EPOCH + 4990, 1);
        assert_eq!((k[0].tick, k[0].seq), (5001, 0));

        let mut sony = Rig::new(Layout::sonyflake(), 0);
        sony.take(1_409_529_600_000 + 1000, 1); // tick 100 = ms 1000..=1009 after its epoch
        let instagram = Layout::instagram().with_epoch(1_409_529_600_000);
        sony.generator.rebase(&sony.layout, &instagram);
        sony.layout = instagram;
        sony.shape = Shape::of(&sony.layout, 0);
        let k = sony.take(1_409_529_600_000 + 1002, 1);
        assert_eq!(
            k[0].tick, 1010,
            "starts after the last ms the old tick covered"
        );
    }
}
