//! `RingSpec::from_args` (the nodes of SHARD.RING SET/BEGIN, `SLOTS` maps included, and the ring-algo /
//! ring-hashtag settings) on arbitrary arguments, then `Ring::build` and `locate`. Checks: no
//! panic; an accepted spec's canonical text reads back to the same spec (`parse_canonical`),
//! and so does its RDB form (`Persisted` encode then decode); lookups stay in range.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shard::persist::{parse_canonical, Persisted};
use shard::ring::{Algo, RingSpec, SLOTS};
use shard_fuzz::{build_bounded, check_locate, split_args};

fuzz_target!(|data: &[u8]| {
    let args = split_args(data);
    let (algo, rest) = match args.split_first() {
        Some((a, r)) => (*a, r),
        None => return,
    };
    // An argument "HASHTAG" followed by a rule, as the command reads it.
    let (hashtag, fields) = match rest {
        [h, rule, tail @ ..] if h.eq_ignore_ascii_case(b"hashtag") => (Some(*rule), tail),
        _ => (None, rest),
    };
    // Also try the first argument as a known algo name, so building gets exercised.
    let named = Algo::ALL[usize::from(algo.first().copied().unwrap_or(0)) % Algo::ALL.len()];
    for algo in [algo, named.name().as_bytes()] {
        let Ok(spec) = RingSpec::from_args(algo, hashtag, fields) else {
            continue;
        };
        let canonical = spec.canonical();
        assert_eq!(
            parse_canonical(canonical.as_bytes()).as_ref(),
            Ok(&spec),
            "canonical text {canonical:?} does not read back"
        );
        assert_eq!(spec.digest().len(), 32);
        let p = Persisted {
            high_water_ms: Some(i64::from(data.len() as u32)),
            ring_epoch: u64::from(data.first().copied().unwrap_or(0)),
            current: Some(spec.clone()),
            previous: Some(spec.clone()),
            returning: data.len() % 2 == 1,
            ..Persisted::default()
        };
        assert_eq!(Persisted::decode(&p.encode()).as_ref(), Ok(&p));
        if let Some(Ok(ring)) = build_bounded(&spec) {
            for key in args.iter().take(8) {
                check_locate(&ring, key);
            }
            check_locate(&ring, data);
            if let Some(ranges) = ring.slot_ranges() {
                // Every slot once, every node at least one, each node's ranges in slot order
                // and apart (adjacent ones are merged); without SLOTS, one contiguous range
                // per node in node order.
                let mut seen = vec![false; SLOTS];
                for node in ranges {
                    assert!(!node.is_empty(), "slot ranges {ranges:?}");
                    for w in node.windows(2) {
                        assert!(w[0].1 + 1 < w[1].0, "slot ranges {ranges:?}");
                    }
                    for &(a, b) in node {
                        assert!(a <= b);
                        for s in a..=b {
                            assert!(!seen[usize::from(s)], "slot {s} twice in {ranges:?}");
                            seen[usize::from(s)] = true;
                        }
                    }
                }
                assert!(seen.iter().all(|s| *s), "slot ranges {ranges:?}");
                if spec.slot_map.is_none() {
                    let firsts: Vec<usize> = ranges.iter().map(|r| usize::from(r[0].0)).collect();
                    assert!(ranges.iter().all(|r| r.len() == 1), "{ranges:?}");
                    assert!(firsts.windows(2).all(|w| w[0] < w[1]), "{ranges:?}");
                }
            }
            let per_node = ring.points_per_node();
            assert_eq!(per_node.len(), ring.node_count());
        }
    }
});
