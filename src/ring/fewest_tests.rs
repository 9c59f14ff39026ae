//! Tests of the slot map that moves the fewest slots: the counts of a grow and a shrink of
//! equal nodes, weights, a node leaving, a node joining with a weight, rings it leaves alone.

use crate::ring::{HashTag, Ring, RingSpec, SLOTS};

/// A `slots` ring of `(name, weight)` nodes.
fn spec(nodes: &[(&str, u32)]) -> RingSpec {
    let fields: Vec<String> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, (n, w))| [n.to_string(), format!("10.0.0.{i}:6379"), w.to_string()])
        .collect();
    let refs: Vec<&[u8]> = fields.iter().map(|s| s.as_bytes()).collect();
    RingSpec::from_args(b"slots", None, &refs).unwrap()
}

fn equal(n: usize) -> Vec<(String, u32)> {
    (0..n).map(|i| (format!("n{i}"), 1)).collect()
}

fn named(nodes: &[(String, u32)]) -> Vec<(&str, u32)> {
    nodes.iter().map(|(n, w)| (n.as_str(), *w)).collect()
}

/// Per slot, the name of its owner.
fn owners(s: &RingSpec) -> Vec<String> {
    let ring = Ring::build(s).unwrap();
    let mut out = vec![String::new(); SLOTS];
    for (node, ranges) in s.nodes.iter().zip(ring.slot_ranges().unwrap()) {
        for &(a, b) in ranges {
            for slot in a..=b {
                out[usize::from(slot)] = node.name.clone();
            }
        }
    }
    out
}

fn moved(old: &RingSpec, new: &RingSpec) -> usize {
    let (a, b) = (owners(old), owners(new));
    a.iter().zip(&b).filter(|(x, y)| x != y).count()
}

fn counts(s: &RingSpec) -> Vec<usize> {
    Ring::build(s).unwrap().points_per_node()
}

#[test]
fn three_to_four_equal_nodes_moves_a_quarter() {
    let old = spec(&named(&equal(3)));
    let plain = spec(&named(&equal(4)));
    assert_eq!(moved(&old, &plain), 8192, "the contiguous split moves half");
    let new = plain.clone().moving_fewest_slots_from(&old).unwrap();
    assert_eq!(moved(&old, &new), 4096);
    assert_eq!(counts(&new), vec![4096; 4]);
    let map = new.slot_map.clone().unwrap();
    assert_eq!(
        map,
        vec![
            vec![(0, 4095)],
            vec![(5461, 9556)],
            vec![(10923, 15018)],
            vec![(4096, 5460), (9557, 10922), (15019, 16383)],
        ],
        "each node keeps its lowest slots; the new one gets the three ends"
    );
    assert_ne!(new.digest(), plain.digest());
    // The same inputs, the same map.
    assert_eq!(plain.moving_fewest_slots_from(&old).unwrap(), new);
}

#[test]
fn four_to_three_moves_only_the_leaving_nodes_slots_and_back_is_the_first_ring() {
    let three = spec(&named(&equal(3)));
    let four = spec(&named(&equal(4)))
        .moving_fewest_slots_from(&three)
        .unwrap();
    let back = spec(&named(&equal(3)))
        .moving_fewest_slots_from(&four)
        .unwrap();
    assert_eq!(moved(&four, &back), 4096);
    let (before, after) = (owners(&four), owners(&back));
    for (x, y) in before.iter().zip(&after) {
        assert!(x == y || x == "n3", "a slot of {x} went to {y}");
    }
    assert_eq!(
        back, three,
        "grown and shrunk back: the first ring, the same digest"
    );
    assert_eq!(back.slot_map, None);
    // From the contiguous split of four too: only n3's quarter moves.
    let plain4 = spec(&named(&equal(4)));
    let shrunk = spec(&named(&equal(3)))
        .moving_fewest_slots_from(&plain4)
        .unwrap();
    assert_eq!(moved(&plain4, &shrunk), 4096);
    assert_eq!(counts(&shrunk), vec![5461, 5462, 5461]);
}

#[test]
fn new_weights_move_only_the_surplus() {
    let old = spec(&[("a", 1), ("b", 1), ("c", 1)]);
    let new = spec(&[("a", 1), ("b", 1), ("c", 2)])
        .moving_fewest_slots_from(&old)
        .unwrap();
    assert_eq!(counts(&new), vec![4096, 4096, 8192]);
    assert_eq!(moved(&old, &new), (5461 - 4096) + (5462 - 4096));
    // c grows its range down into b's highest slots, then takes a's.
    assert_eq!(
        new.slot_map.unwrap(),
        vec![
            vec![(0, 4095)],
            vec![(5461, 9556)],
            vec![(4096, 5460), (9557, 16383)]
        ]
    );
}

#[test]
fn a_node_joining_with_a_weight_gets_its_share() {
    let old = spec(&[("a", 1), ("b", 1), ("c", 1)]);
    let target = spec(&[("a", 1), ("b", 1), ("c", 1), ("d", 3)]);
    let want = counts(&target);
    let new = target.moving_fewest_slots_from(&old).unwrap();
    assert_eq!(counts(&new), want);
    assert_eq!(want.iter().sum::<usize>(), SLOTS);
    assert_eq!(moved(&old, &new), want[3], "only what d takes moves");
}

#[test]
fn a_node_joins_while_another_leaves() {
    let old = spec(&[("a", 1), ("b", 1), ("c", 1)]);
    let new = spec(&[("a", 1), ("c", 1), ("d", 1)])
        .moving_fewest_slots_from(&old)
        .unwrap();
    let (before, after) = (owners(&old), owners(&new));
    for (x, y) in before.iter().zip(&after) {
        assert!(x == y || x == "b", "a slot of {x} went to {y}");
    }
    assert_eq!(moved(&old, &new), 5462, "b's slots, and only those");
}

#[test]
fn every_change_moves_the_least_the_targets_allow() {
    let mut x: u64 = 0x2545F4914F6CDD1D;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for _ in 0..60 {
        let old: Vec<(String, u32)> = (0..1 + next(8))
            .map(|i| (format!("n{i}"), 1 + next(5) as u32))
            .collect();
        let mut new: Vec<(String, u32)> = Vec::new();
        for (n, _) in &old {
            if next(4) != 0 {
                new.push((n.clone(), 1 + next(5) as u32));
            }
        }
        for j in 0..next(4) {
            new.push((format!("j{j}"), 1 + next(1000) as u32));
        }
        if new.is_empty() {
            continue;
        }
        let old = spec(&named(&old));
        let target = spec(&named(&new));
        let want = counts(&target);
        let got = target.clone().moving_fewest_slots_from(&old).unwrap();
        assert_eq!(counts(&got), want, "each node gets its target");
        // The least: what an over-full kept node has beyond its target, and a leaving node's.
        let held = counts(&old);
        let least: usize = old
            .nodes
            .iter()
            .zip(&held)
            .map(|(n, h)| match target.node_index(&n.name) {
                Some(i) => h.saturating_sub(want[i]),
                None => *h,
            })
            .sum();
        assert_eq!(
            moved(&old, &got),
            least,
            "{:?} -> {:?}",
            old.nodes.len(),
            new
        );
    }
}

#[test]
fn rings_it_leaves_alone() {
    let old = spec(&[("a", 1), ("b", 1)]);
    // An explicit map is the operator's.
    let given = RingSpec::from_args(
        b"slots",
        None,
        &[
            b"a",
            b"h:1",
            b"1",
            b"SLOTS",
            b"100-16383",
            b"b",
            b"h:2",
            b"1",
            b"SLOTS",
            b"0-99",
        ],
    )
    .unwrap();
    assert_eq!(given.clone().moving_fewest_slots_from(&old).unwrap(), given);
    // Another algo, or another hash-tag rule (every key's slot may change).
    let ketama = crate::ring::test_spec(&["a", "b", "c"]);
    assert_eq!(
        ketama.clone().moving_fewest_slots_from(&old).unwrap(),
        ketama
    );
    let plain = spec(&[("a", 1), ("b", 1), ("c", 1)]);
    assert_eq!(
        plain.clone().moving_fewest_slots_from(&ketama).unwrap(),
        plain
    );
    let untagged = RingSpec::new(plain.algo, HashTag::None, plain.nodes.clone()).unwrap();
    assert_eq!(
        untagged.clone().moving_fewest_slots_from(&old).unwrap(),
        untagged
    );
    // The same ring: nothing moves, the same digest.
    let same = spec(&[("a", 1), ("b", 1)])
        .moving_fewest_slots_from(&old)
        .unwrap();
    assert_eq!(same, old);
}
