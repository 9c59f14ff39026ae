//! The generators of one server: the configured layout's, and one for each other layout that a
//! `SHARD.GENKEY LAYOUT name` asks for (so that calls of two layouts can interleave without
//! either moving the other's clock).
//!
//! They share one high-water mark in unix milliseconds, the largest of theirs: it is what the
//! RDB keeps, what `SHARD.ADVANCE` carries to replicas and the AOF, and what every generator
//! moves past at a restart, a full sync or a promotion; a generator made for a layout asked
//! for the first time starts past it too. A change of the configured layout, epoch or node
//! moves the configured one past it and forgets the others, which start past it again when
//! asked for. So no key of any layout repeats a key this server (or its master) issued before
//! a restart, a failover or a change of configuration, and each layout's keys increase.

use super::generator::{Batch, GenError, GenStats, Generator, Request, Shape};
use super::layout::Layout;

/// The configured layout's generator and the others'.
#[derive(Debug, Clone, Default)]
pub struct Generators {
    main: Generator,
    others: Vec<(Layout, Generator)>,
}

impl Generators {
    pub fn new() -> Generators {
        Generators::default()
    }

    /// Grants `req` on `layout`'s generator (`configured` is the configured layout).
    pub fn reserve(
        &mut self,
        configured: &Layout,
        layout: &Layout,
        shape: &Shape,
        req: &Request,
    ) -> Result<Batch, GenError> {
        if layout == configured {
            return self.main.reserve(layout, shape, req);
        }
        let at = match self.others.iter().position(|(l, _)| l == layout) {
            Some(at) => at,
            None => {
                let mut generator = Generator::new();
                if let Some(ms) = self.high_water_ms(configured) {
                    generator.advance_past_ms(layout, ms);
                }
                self.others.push((layout.clone(), generator));
                self.others.len() - 1
            }
        };
        self.others[at].1.reserve(layout, shape, req)
    }

    /// The counters of all the generators together.
    pub fn stats(&self) -> GenStats {
        let mut sum = self.main.stats();
        for (_, g) in &self.others {
            let s = g.stats();
            sum.generated = sum.generated.saturating_add(s.generated);
            sum.borrowed = sum.borrowed.saturating_add(s.borrowed);
            sum.backsteps = sum.backsteps.saturating_add(s.backsteps);
            sum.refused = sum.refused.saturating_add(s.refused);
        }
        sum
    }

    /// The last unix millisecond any generator issued a key in (the high-water mark).
    pub fn high_water_ms(&self, configured: &Layout) -> Option<i64> {
        let others = self.others.iter().filter_map(|(l, g)| g.high_water_ms(l));
        self.main
            .high_water_ms(configured)
            .into_iter()
            .chain(others)
            .max()
    }

    /// How far (ms) the furthest generator is ahead of the wall clock `now_ms`.
    pub fn drift_ms(&self, configured: &Layout, now_ms: i64) -> i64 {
        let others = self.others.iter().map(|(l, g)| g.drift_ms(l, now_ms));
        others.fold(self.main.drift_ms(configured, now_ms), i64::max)
    }

    /// Records that keys were issued up to unix millisecond `ms` (before a restart, or by the
    /// master): every generator moves past it.
    pub fn advance_past_ms(&mut self, configured: &Layout, ms: i64) {
        self.main.advance_past_ms(configured, ms);
        for (l, g) in &mut self.others {
            g.advance_past_ms(l, ms);
        }
    }

    /// A change of the configured layout (or its epoch, or the node): the new configured
    /// generator starts past the high-water mark; the others are forgotten (they start past it
    /// again when asked for).
    pub fn rebase(&mut self, old: &Layout, new: &Layout) {
        let mark = self.high_water_ms(old);
        let stats = self.stats();
        self.others.clear();
        self.main = Generator::with_stats(stats);
        if let Some(ms) = mark {
            self.main.advance_past_ms(new, ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_717_000_000_000;

    fn ask(g: &mut Generators, configured: &Layout, layout: &Layout, now: i64, n: u64) -> Batch {
        let req = Request {
            now_ms: now,
            count: n,
            node: 1,
            key_type: 0,
            max_drift_ms: 60_000,
        };
        g.reserve(configured, layout, &Shape::of(layout, 1), &req)
            .unwrap()
    }

    #[test]
    fn layouts_interleave_without_moving_each_other() {
        let (snow, uuid) = (Layout::snowflake(), Layout::uuidv7(10));
        let mut g = Generators::new();
        let a = ask(&mut g, &snow, &snow, NOW, 3).last().unwrap();
        let b = ask(&mut g, &snow, &uuid, NOW, 3).next().unwrap();
        assert_eq!(
            uuid.time_ms(b.tick),
            NOW + 1,
            "a new layout starts past the mark"
        );
        let c = ask(&mut g, &snow, &snow, NOW + 1, 1).next().unwrap();
        assert_eq!(
            snow.time_ms(c.tick),
            NOW + 1,
            "the snowflake clock was not moved"
        );
        assert!(c.tick > a.tick);
        let d = ask(&mut g, &snow, &uuid, NOW + 1, 1).next().unwrap();
        assert_eq!(
            (d.tick, d.seq),
            (b.tick, 3),
            "uuidv7 continues its millisecond"
        );
        assert_eq!(g.stats().generated, 8);
        assert_eq!(g.high_water_ms(&snow), Some(NOW + 1));
    }

    #[test]
    fn the_mark_moves_every_generator_and_a_rebase_starts_past_it() {
        let (snow, ulid, tsid) = (Layout::snowflake(), Layout::ulid(10), Layout::tsid(10));
        let mut g = Generators::new();
        ask(&mut g, &snow, &ulid, NOW + 50, 1);
        g.advance_past_ms(&snow, NOW + 100);
        let u = ask(&mut g, &snow, &ulid, NOW, 1).next().unwrap();
        assert_eq!(ulid.time_ms(u.tick), NOW + 101);
        let s = ask(&mut g, &snow, &snow, NOW, 1).next().unwrap();
        assert_eq!(snow.time_ms(s.tick), NOW + 101);
        g.rebase(&snow, &tsid);
        let t = ask(&mut g, &tsid, &tsid, NOW, 1).next().unwrap();
        assert_eq!(tsid.time_ms(t.tick), NOW + 102);
        let u2 = ask(&mut g, &tsid, &ulid, NOW, 1).next().unwrap();
        assert!(ulid.time_ms(u2.tick) > NOW + 101);
        assert_eq!(g.stats().generated, 5, "counters survive a rebase");
    }
}
