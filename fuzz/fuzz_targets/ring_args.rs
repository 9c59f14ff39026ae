//! `RingSpec::from_args` (the node triplets of SHARD.RING SET/BEGIN and the ring-algo /
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
            fleet: None,
        };
        assert_eq!(Persisted::decode(&p.encode()).as_ref(), Ok(&p));
        if let Some(Ok(ring)) = build_bounded(&spec) {
            for key in args.iter().take(8) {
                check_locate(&ring, key);
            }
            check_locate(&ring, data);
            if let Some(ranges) = ring.slot_ranges() {
                // Contiguous ranges that cover every slot once.
                let mut next = 0usize;
                for &(a, b) in ranges {
                    assert_eq!(usize::from(a), next, "slot ranges {ranges:?}");
                    assert!(a <= b);
                    next = usize::from(b) + 1;
                }
                assert_eq!(next, SLOTS, "slot ranges {ranges:?}");
            }
            let per_node = ring.points_per_node();
            assert_eq!(per_node.len(), ring.node_count());
        }
    }
});
