// Compiled only under #[cfg(test)], as declared in bucket.rs.
//! Buckets against `locate`: random keys land in a bucket whose owners hold their owner; every
//! key whose owner name changes between two rings is in a bucket `changing_buckets` names.

use super::*;
use crate::ring::{RingSpec, SLOTS};
use crate::test_rng::TestRng as Rng;

/// Random keys for the bucket tests.
trait Keys {
    fn key(&mut self) -> Vec<u8>;
}

impl Keys for Rng {
    /// A key of 0..24 bytes, some with a hash tag, some with a `-`, some text, some binary.
    fn key(&mut self) -> Vec<u8> {
        match self.below(4) {
            0 => format!("user:{}", self.next()).into_bytes(),
            1 => format!("{{t{}}}:{}", self.below(50), self.next()).into_bytes(),
            2 => format!("s{}-{}", self.below(50), self.next()).into_bytes(),
            _ => {
                let len = self.below(25) as usize;
                const ALPHABET: &[u8] = b"ab{}-:\x00\xff";
                (0..len)
                    .map(|_| {
                        let r = self.next();
                        if r & 1 == 0 {
                            ALPHABET[(r >> 1) as usize % ALPHABET.len()]
                        } else {
                            (r >> 8) as u8
                        }
                    })
                    .collect()
            }
        }
    }
}

const ALGOS: [&str; 5] = ["ketama", "jedis", "jedis-murmur", "redis-shard", "slots"];

fn spec(algo: &str, nodes: &[(&str, u32)]) -> RingSpec {
    let owned: Vec<Vec<u8>> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, (n, w))| {
            [
                n.as_bytes().to_vec(),
                format!("127.0.0.1:{}", 7001 + i).into_bytes(),
                w.to_string().into_bytes(),
            ]
        })
        .collect();
    let fields: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
    RingSpec::from_args(algo.as_bytes(), None, &fields).unwrap()
}

fn ring(algo: &str, nodes: &[(&str, u32)]) -> Ring {
    Ring::build(&spec(algo, nodes)).unwrap()
}

fn named(n: usize) -> Vec<(String, u32)> {
    (0..n).map(|i| (format!("node{i}"), 1)).collect()
}

fn refs(nodes: &[(String, u32)]) -> Vec<(&str, u32)> {
    nodes.iter().map(|(n, w)| (n.as_str(), *w)).collect()
}

fn owner_name<'a>(r: &'a Ring, key: &[u8]) -> &'a str {
    &r.spec().nodes[r.locate(key).node].name
}

#[test]
fn a_bucket_is_the_top_of_the_hash_in_ring_order() {
    let mut rng = Rng::new(1);
    for algo in ALGOS {
        let r = ring(algo, &refs(&named(5)));
        for _ in 0..3000 {
            let key = rng.key();
            let h = r.locate(&key).hash;
            let want = match algo {
                "jedis-murmur" => ((h as u64) ^ (1 << 63)) >> 50,
                "slots" => h as u64,
                _ => {
                    assert!((0..1 << 32).contains(&h), "{algo}: {h}");
                    (h as u64) >> 18
                }
            };
            assert_eq!(u64::from(r.bucket(&key)), want, "{algo} {key:?}");
            assert!(usize::from(r.bucket(&key)) < BUCKETS);
        }
    }
    // The extremes of jedis-murmur's order are the first and last buckets.
    assert_eq!(
        super::jedis_coordinate(JedisHash::Murmur, i64::MIN) >> 50,
        0
    );
    assert_eq!(
        super::jedis_coordinate(JedisHash::Murmur, i64::MAX) >> 50,
        16383
    );
}

#[test]
fn the_owners_of_a_bucket_hold_the_owner_of_each_of_its_keys() {
    let mut rng = Rng::new(2);
    for algo in ALGOS {
        for n in [1, 3, 60] {
            let r = ring(algo, &refs(&named(n)));
            let owners: Vec<Vec<usize>> = (0..BUCKETS as u16).map(|b| r.bucket_owners(b)).collect();
            for o in &owners {
                assert!(!o.is_empty() && o.windows(2).all(|w| w[0] < w[1]), "{algo}");
                assert!(o.iter().all(|&i| i < n));
            }
            let split = owners.iter().filter(|o| o.len() > 1).count();
            if algo == "slots" || n == 1 {
                assert_eq!(split, 0, "{algo} {n}");
            } else if n == 60 {
                // About 8000-9600 points on 16384 buckets: many buckets hold a point.
                assert!(split > 3000, "{algo}: {split} split buckets");
            }
            for _ in 0..5000 {
                let key = rng.key();
                let loc = r.locate(&key);
                let b = usize::from(r.bucket(&key));
                assert!(owners[b].contains(&loc.node), "{algo} {n} {key:?}");
                // The view's owner of the key's own coordinate is locate's.
                let view = View::of(&r);
                let c = match algo {
                    "jedis-murmur" => (loc.hash as u64) ^ (1 << 63),
                    _ => loc.hash as u64,
                };
                assert_eq!(view.owner_at(c), loc.node, "{algo} {key:?}");
            }
            assert!(r.bucket_owners(BUCKETS as u16).is_empty());
        }
    }
}

#[test]
fn a_nodes_shares_agree_with_the_owners_of_each_bucket_and_sum_its_keys() {
    let mut rng = Rng::new(7);
    for algo in ALGOS {
        for n in [1, 3, 12] {
            let r = ring(algo, &refs(&named(n)));
            for node in 0..n {
                let shares = r.bucket_shares(node);
                assert_eq!(shares.len(), BUCKETS);
                for (b, share) in shares.iter().enumerate() {
                    let owners = r.bucket_owners(b as u16);
                    let expected = match (owners.contains(&node), owners.len()) {
                        (false, _) => Share::Nothing,
                        (true, 1) => Share::Whole,
                        (true, _) => Share::Part,
                    };
                    assert_eq!(*share, expected, "{algo} {n} node {node} bucket {b}");
                }
                // Keys counted by bucket: every key falls in exactly one of the three sums, and
                // a key whose bucket the node owns wholly is the node's.
                let mut counts = vec![0u64; BUCKETS];
                let mut mine_whole = 0;
                for _ in 0..2000 {
                    let key = rng.key();
                    let b = usize::from(r.bucket(&key));
                    counts[b] += 1;
                    if shares[b] == Share::Whole {
                        assert_eq!(r.locate(&key).node, node, "{algo} {key:?}");
                        mine_whole += 1;
                    }
                }
                let by = keys_by_share(&shares, &counts);
                let in_ranges: u64 = by.ranges.iter().map(|r| r.2).sum();
                assert_eq!(in_ranges, mine_whole);
                assert_eq!(in_ranges + by.in_part + by.not_owned, 2000);
                // Maximal ascending ranges of whole buckets.
                for w in by.ranges.windows(2) {
                    assert!(w[0].1 + 1 < w[1].0, "{algo}: ranges {w:?} touch");
                }
                for &(first, last, _) in &by.ranges {
                    assert!((first..=last).all(|b| shares[usize::from(b)] == Share::Whole));
                }
                if n == 1 {
                    assert_eq!(by.ranges, vec![(0, BUCKETS as u16 - 1, 2000)]);
                }
            }
        }
    }
}

#[test]
fn keys_by_share_cuts_ranges_at_each_bucket_not_wholly_owned() {
    use Share::*;
    let shares = [Whole, Whole, Part, Whole, Nothing, Nothing, Whole];
    let keys = [1, 2, 3, 4, 5, 6, 7];
    let by = keys_by_share(&shares, &keys);
    assert_eq!(by.ranges, vec![(0, 1, 3), (3, 3, 4), (6, 6, 7)]);
    assert_eq!((by.in_part, by.not_owned), (3, 11));
    assert_eq!(keys_by_share(&[], &[]), KeysByShare::default());
}

#[test]
fn the_owners_of_a_bucket_hold_the_owners_at_each_point_and_beside_it() {
    for algo in ["ketama", "jedis", "jedis-murmur", "redis-shard"] {
        let r = ring(algo, &refs(&named(40)));
        let view = View::of(&r);
        let shift = view.shift();
        let coordinates: Vec<u64> = match &r.inner {
            Inner::Ketama(p) | Inner::RedisShard(p) => {
                p.entries().iter().map(|e| u64::from(e.0)).collect()
            }
            Inner::Jedis(p, h) => p
                .entries()
                .iter()
                .map(|e| jedis_coordinate(*h, e.0))
                .collect(),
            Inner::Slots(_) => unreachable!(),
        };
        let top = if shift == U32_SHIFT {
            u32::MAX as u64
        } else {
            u64::MAX
        };
        for &c in coordinates.iter().chain(&[0, top]) {
            for c in [c.saturating_sub(1), c, c.saturating_add(1).min(top)] {
                let b = (c >> shift) as u16;
                assert!(
                    r.bucket_owners(b).contains(&view.owner_at(c)),
                    "{algo}: coordinate {c} bucket {b}"
                );
            }
        }
    }
}

/// Whether every key of `keys` whose owner name differs between `old` and `new` is in a bucket
/// named by `changing_buckets`; returns (keys moved, buckets named).
fn check_change(old: &Ring, new: &Ring, keys: &[Vec<u8>], what: &str) -> (usize, usize) {
    let named = changing_buckets(old, new).unwrap();
    assert!(named.windows(2).all(|w| w[0] < w[1]), "{what}");
    let mut moved = 0;
    for key in keys {
        if owner_name(old, key) != owner_name(new, key) {
            moved += 1;
            let b = old.bucket(key);
            assert_eq!(b, new.bucket(key));
            assert!(named.binary_search(&b).is_ok(), "{what}: {key:?} in {b}");
        }
    }
    (moved, named.len())
}

fn with_map(algo_spec: RingSpec, map: &str) -> RingSpec {
    let ranges: Vec<_> = map
        .split(' ')
        .map(|r| crate::ring::parse_ranges(r.as_bytes(), "n").unwrap())
        .collect();
    algo_spec.with_slot_map(ranges).unwrap()
}

#[test]
fn every_key_that_changes_owner_is_in_a_changing_bucket() {
    let mut rng = Rng::new(3);
    let keys: Vec<Vec<u8>> = (0..20_000).map(|_| rng.key()).collect();
    let three = [("a", 1), ("b", 1), ("c", 1)];
    let changes: [(&str, &[(&str, u32)]); 6] = [
        ("add d", &[("a", 1), ("b", 1), ("c", 1), ("d", 1)]),
        ("add d first", &[("d", 1), ("a", 1), ("b", 1), ("c", 1)]),
        ("remove b", &[("a", 1), ("c", 1)]),
        ("weights", &[("a", 3), ("b", 1), ("c", 2)]),
        ("replace c", &[("a", 1), ("b", 1), ("e", 1)]),
        ("reorder", &[("c", 1), ("a", 1), ("b", 1)]),
    ];
    for algo in ALGOS {
        let old = ring(algo, &three);
        assert_eq!(changing_buckets(&old, &old), Some(vec![]), "{algo}");
        for (what, nodes) in changes {
            let new = ring(algo, nodes);
            let (moved, named) = check_change(&old, &new, &keys, &format!("{algo} {what}"));
            let (back, _) = check_change(&new, &old, &keys, &format!("{algo} {what} back"));
            assert_eq!(moved, back);
            if what == "reorder" && algo != "slots" {
                // Only ties between points depend on the order.
                assert!(named < 4, "{algo}: {named}");
            }
            if what == "add d" {
                assert!(moved > 0 && named > 0, "{algo}");
            }
        }
    }
}

#[test]
fn slot_maps_move_the_named_slots_only() {
    let mut rng = Rng::new(4);
    let keys: Vec<Vec<u8>> = (0..20_000).map(|_| rng.key()).collect();
    let three = spec("slots", &[("a", 1), ("b", 1), ("c", 1)]);
    let four = spec("slots", &[("a", 1), ("b", 1), ("c", 1), ("d", 1)]);
    let fewest = four.clone().moving_fewest_slots_from(&three).unwrap();
    let (old, new) = (Ring::build(&three).unwrap(), Ring::build(&fewest).unwrap());
    let (moved, named) = check_change(&old, &new, &keys, "fewest grow");
    // A quarter of the slots move, each named once.
    assert!((4000..=4200).contains(&named), "{named}");
    assert!(moved * 5 < keys.len() * 2, "{moved}");
    let shrink = three.clone().moving_fewest_slots_from(&fewest).unwrap();
    check_change(&new, &Ring::build(&shrink).unwrap(), &keys, "fewest shrink");
    // An explicit map: b gives slots 100-199 to a; c and a swap nothing else.
    let m1 = with_map(three.clone(), "0-5460 5461-10922 10923-16383");
    let m2 = with_map(
        three.clone(),
        "0-5460,5500-5599 5461-5499,5600-10922 10923-16383",
    );
    let (r1, r2) = (Ring::build(&m1).unwrap(), Ring::build(&m2).unwrap());
    assert_eq!(
        changing_buckets(&r1, &r2).unwrap(),
        (5500..5600).collect::<Vec<u16>>()
    );
    check_change(&r1, &r2, &keys, "explicit map");
    assert_eq!(SLOTS, BUCKETS);
}

#[test]
fn rings_that_bucket_keys_otherwise_are_not_compared() {
    let three = [("a", 1), ("b", 1), ("c", 1)];
    let k = ring("ketama", &three);
    let j = ring("jedis", &three);
    let jm = ring("jedis-murmur", &three);
    assert_eq!(changing_buckets(&k, &j), None);
    assert_eq!(changing_buckets(&j, &jm), None);
    let tagged = Ring::build(&spec("ketama", &three).with_shardjs_default().unwrap()).unwrap();
    assert!(!k.same_buckets(&tagged));
    assert_eq!(changing_buckets(&k, &tagged), None);
    assert!(k.same_buckets(&ring("ketama", &[("x", 1)])));
}

/// The figures of a ketama grow 3 -> 4: the share of buckets named against the share of keys
/// that move (printed with `--nocapture`).
#[test]
fn a_ketama_grow_names_about_the_share_of_keys_that_move() {
    let mut rng = Rng::new(5);
    let keys: Vec<Vec<u8>> = (0..200_000)
        .map(|_| format!("key:{:016x}", rng.next()).into_bytes())
        .collect();
    for algo in ["ketama", "jedis", "jedis-murmur", "redis-shard", "slots"] {
        let old = ring(algo, &refs(&named(3)));
        let new = ring(algo, &refs(&named(4)));
        let (moved, named) = check_change(&old, &new, &keys, algo);
        let keys_share = moved as f64 / keys.len() as f64;
        let bucket_share = named as f64 / BUCKETS as f64;
        println!(
            "{algo} grow 3 -> 4: keys moved {:.2}%, buckets named {:.2}% ({named})",
            100.0 * keys_share,
            100.0 * bucket_share
        );
        if algo == "ketama" {
            assert!(
                bucket_share < keys_share + 0.02,
                "{bucket_share} {keys_share}"
            );
            assert!(
                bucket_share >= keys_share - 0.01,
                "{bucket_share} {keys_share}"
            );
        }
    }
}

/// `cargo test --release --lib bucket_speed -- --ignored --nocapture`: ns per `bucket()`
/// and per `locate()` of 16-byte keys on rings of 10 nodes.
#[test]
#[ignore]
fn bucket_speed() {
    let keys: Vec<Vec<u8>> = (0..1024u64)
        .map(|i| format!("key:{:012}", i * 7919).into_bytes())
        .collect();
    for algo in ALGOS {
        let r = ring(algo, &refs(&named(10)));
        let rounds = 2000;
        let t = std::time::Instant::now();
        let mut sum = 0u64;
        for _ in 0..rounds {
            for k in &keys {
                sum += u64::from(r.bucket(std::hint::black_box(k)));
            }
        }
        let bucket_ns = t.elapsed().as_nanos() as f64 / (rounds * keys.len()) as f64;
        let t = std::time::Instant::now();
        for _ in 0..rounds {
            for k in &keys {
                sum += r.locate(std::hint::black_box(k)).node as u64;
            }
        }
        let locate_ns = t.elapsed().as_nanos() as f64 / (rounds * keys.len()) as f64;
        let t = std::time::Instant::now();
        let named = changing_buckets(&r, &ring(algo, &refs(&named(11))));
        let change = t.elapsed();
        println!(
            "{algo}: bucket {bucket_ns:.1} ns, locate {locate_ns:.1} ns, changing_buckets 10 -> 11 {change:?} ({} buckets) [{sum}]",
            named.map_or(0, |n| n.len())
        );
    }
}
