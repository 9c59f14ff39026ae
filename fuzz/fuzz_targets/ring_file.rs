//! The ring-file parser (`parse_ring_file`, `RingSpec::from_file`) on arbitrary bytes, then the
//! ring built from what it accepts and lookups on it. Checks: no panic; an accepted file has
//! nodes with unique names, ports 1..=65535 and weights 1..=1000; errors name the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shard::ring::{parse_ring_file, Algo, HashTag, RingSpec, MAX_WEIGHT};
use shard_fuzz::{build_bounded, check_locate};

fuzz_target!(|data: &[u8]| {
    let (head, content) = match data.split_first() {
        Some((h, rest)) => (*h, rest),
        None => (0, data),
    };
    match parse_ring_file("fuzz.ring", content) {
        Ok(nodes) => {
            assert!(!nodes.is_empty());
            let mut names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
            names.sort_unstable();
            assert!(
                names.windows(2).all(|w| w[0] != w[1]),
                "duplicate names accepted"
            );
            for n in &nodes {
                assert!(n.port >= 1 && (1..=MAX_WEIGHT).contains(&n.weight));
                assert!(!n.name.is_empty() && !n.host.is_empty());
            }
        }
        Err(e) => assert!(
            e.to_string().contains("fuzz.ring"),
            "error without the file: {e}"
        ),
    }
    let algo = Algo::ALL[usize::from(head) % Algo::ALL.len()];
    let hashtag = match (head / 8) % 5 {
        4 => None,
        i => Some(HashTag::ALL[usize::from(i)].name().as_bytes()),
    };
    let Ok(spec) = RingSpec::from_file(algo.name().as_bytes(), hashtag, "fuzz.ring", content)
    else {
        return;
    };
    if let Some(Ok(ring)) = build_bounded(&spec) {
        for line in content.split(|&b| b == b'\n').take(16) {
            check_locate(&ring, line);
        }
        check_locate(&ring, b"");
        check_locate(&ring, content);
    }
});
