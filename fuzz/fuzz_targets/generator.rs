//! `Generator::reserve` under any layout with arbitrary wall clocks (jumps, steps back, before
//! the epoch, past the layout's end), counts, types and drift limits, mixed with the
//! high-water-mark operations (`advance_past_ms`, `rebase`). Checks: no panic; every key
//! issued validates for its layout and node; keys strictly increase; a refused request changes
//! nothing; a batch has exactly the count asked for; after a rebase, keys start after the old
//! high-water mark.
#![no_main]

use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use shard::keys::{GenError, Generator, KeyFields, Layout, Request, Shape};
use shard_fuzz::pick_layout;

/// The most keys one GENKEY call may ask for.
const MAX_COUNT: u64 = 100_000;

struct Run {
    layout: Layout,
    node: u64,
    shape: Shape,
    /// The last key issued under the current layout: (tick, seq, packed order).
    last: Option<(KeyFields, u128)>,
    /// After a rebase: keys must start after this unix ms.
    floor_ms: Option<i64>,
}

/// A total order of keys of one layout and node that matches the key text's order.
fn order(layout: &Layout, f: &KeyFields) -> u128 {
    if layout.is_text() {
        (u128::from(f.tick) << 24) | (u128::from(f.seq) << 12) | u128::from(f.key_type)
    } else {
        u128::from(layout.pack(f))
    }
}

fn clock(u: &mut Unstructured, base: i64) -> i64 {
    match u.int_in_range(0..=5u8).unwrap_or(0) {
        0 => base,
        1 => base.saturating_add(u.int_in_range(0..=3u64).unwrap_or(0) as i64),
        2 => base.saturating_sub(u.int_in_range(0..=10_000u64).unwrap_or(0) as i64),
        3 => base.saturating_add(u.int_in_range(0..=100_000_000u64).unwrap_or(0) as i64),
        4 => u.arbitrary().unwrap_or(0),
        _ => [i64::MIN, -1, 0, i64::MAX][u.int_in_range(0..=3usize).unwrap_or(0)],
    }
}

fn new_run(u: &mut Unstructured) -> Run {
    let layout = pick_layout(u);
    let node = u.int_in_range(0..=layout.max_node()).unwrap_or(0);
    Run {
        shape: Shape::of(&layout, node),
        layout,
        node,
        last: None,
        floor_ms: None,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mut run = new_run(&mut u);
    let mut gen = Generator::new();
    // Start near the layout's epoch (plus a few years) most of the time.
    let mut now = run
        .layout
        .epoch_ms
        .saturating_add(u.int_in_range(0..=200_000_000_000i64).unwrap_or(0));
    for _ in 0..64 {
        if u.is_empty() {
            break;
        }
        match u.int_in_range(0..=9u8).unwrap_or(0) {
            0 => {
                let ms = clock(&mut u, now);
                gen.advance_past_ms(&run.layout, ms);
                // Keys issued later come after ms too (unless ms is before the epoch).
                if run.layout.tick_of(ms).is_ok() && ms < i64::MAX {
                    run.floor_ms = Some(run.floor_ms.map_or(ms, |f| f.max(ms)));
                }
            }
            1 => {
                let old = run.layout.clone();
                let hw = gen.high_water_ms(&old);
                let next = new_run(&mut u);
                gen.rebase(&old, &next.layout);
                run = Run {
                    floor_ms: hw.filter(|&h| h < i64::MAX),
                    ..next
                };
            }
            _ => {
                now = clock(&mut u, now);
                let count = match u.int_in_range(0..=31u8).unwrap_or(0) {
                    0 => 0,
                    1 => MAX_COUNT,
                    2 => u.int_in_range(0..=MAX_COUNT).unwrap_or(1),
                    _ => u.int_in_range(1..=300u64).unwrap_or(1),
                };
                let max_type = run.layout.max_type().unwrap_or(0);
                let key_type = match u.int_in_range(0..=2u8).unwrap_or(0) {
                    0 => run.layout.default_type().min(max_type),
                    1 => max_type,
                    _ => u.int_in_range(0..=max_type).unwrap_or(0),
                };
                let req = Request {
                    now_ms: now,
                    count,
                    node: run.node,
                    key_type,
                    max_drift_ms: u.int_in_range(0..=86_400_000i64).unwrap_or(5000),
                };
                let before = gen.last_tick();
                match gen.reserve(&run.layout, &run.shape, &req) {
                    Err(GenError::Drift {
                        ahead_ms,
                        max_drift_ms,
                    }) => {
                        assert!(ahead_ms > max_drift_ms);
                        assert_eq!(gen.last_tick(), before, "a refused request moved the clock");
                    }
                    Err(_) => {
                        assert_eq!(gen.last_tick(), before, "a refused request moved the clock")
                    }
                    Ok(batch) => {
                        assert_eq!(batch.len() as u64, count.max(1));
                        let mut n = 0u64;
                        for f in batch {
                            n += 1;
                            run.layout.validate(&f).unwrap_or_else(|e| {
                                panic!("issued {f:?} does not fit {:?}: {e}", run.layout)
                            });
                            assert_eq!(run.layout.node_of(&f), run.node, "key of another node");
                            assert_eq!(f.key_type, key_type);
                            let o = order(&run.layout, &f);
                            if let Some((prev, po)) = run.last {
                                assert!(o > po, "key {f:?} not after {prev:?}");
                            }
                            if let Some(floor) = run.floor_ms {
                                let t = run.layout.time_ms(f.tick);
                                assert!(
                                    t > floor,
                                    "key {f:?} at {t} ms not after the high-water mark {floor}"
                                );
                            }
                            run.last = Some((f, o));
                        }
                        assert_eq!(n, count.max(1));
                        assert_eq!(gen.last_tick(), run.last.map(|(f, _)| f.tick));
                    }
                }
            }
        }
    }
    // One request with an arbitrary count and drift limit (beyond what GENKEY allows).
    let req = Request {
        now_ms: clock(&mut u, now),
        count: u.arbitrary().unwrap_or(u64::MAX),
        node: run.node,
        key_type: 0,
        max_drift_ms: u.arbitrary().unwrap_or(i64::MAX),
    };
    if let Ok(batch) = gen.reserve(&run.layout, &run.shape, &req) {
        assert_eq!(batch.len() as u64, req.count.max(1));
    }
    let _ = gen.drift_ms(&run.layout, now);
    let _ = gen.stats();
});
