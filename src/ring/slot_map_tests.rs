//! Tests of explicit slot maps: the range lists, the cover check, `SLOTS` in a ring's
//! arguments and canonical text, and the ring built from a map.

use super::*;

fn err(text: &str) -> String {
    parse_ranges(text.as_bytes(), "a").unwrap_err().to_string()
}

#[test]
fn parses_and_formats() {
    let r = parse_ranges(b"0-4095,8192-9000,16383,7", "a").unwrap();
    assert_eq!(r, vec![(0, 4095), (8192, 9000), (16383, 16383), (7, 7)]);
    assert_eq!(format_ranges(&r), "0-4095,8192-9000,16383,7");
    assert_eq!(count(&r), 4096 + 809 + 1 + 1);
    assert_eq!(parse_ranges(b"5-5", "a").unwrap(), vec![(5, 5)]);
}

#[test]
fn range_errors() {
    assert_eq!(
        err(""),
        "SLOTS of node 'a': '' is not a slot range: expected first-last or a slot, like 0-5460,10923"
    );
    assert!(err("0-16384").ends_with("'0-16384' is not a slot range: slots are 0 to 16383"));
    assert!(err("99999999999").contains("expected first-last"));
    assert!(err("10-5").ends_with("the first slot is after the last"));
    assert!(err("1,,2").contains("'' is not a slot range"));
    assert!(err("-5").contains("'-5' is not a slot range"));
    assert!(err("1-2-3").contains("'1-2-3'"));
    assert!(err("+1").contains("expected first-last"));
    assert!(err("0x10").contains("expected first-last"));
    let many = vec!["1"; MAX_RANGES + 1].join(",");
    assert!(err(&many).contains("more than 16384 ranges"));
}

#[test]
fn cover_names_the_first_slot_missing_or_doubled() {
    let names = ["a", "b"];
    let ok = check_cover(&names, &[vec![(8192, 16383)], vec![(0, 100), (101, 8191)]]);
    assert_eq!(
        ok.unwrap(),
        vec![vec![(8192, 16383)], vec![(0, 8191)]],
        "adjacent ranges merged"
    );
    let e = check_cover(&names, &[vec![(0, 8191)], vec![(8192, 16382)]]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "slot map: slot 16383 is given to no node (each of the 16384 slots goes to exactly one node)"
    );
    let e = check_cover(&names, &[vec![(0, 99)], vec![(200, 16383)]]).unwrap_err();
    assert!(e
        .to_string()
        .starts_with("slot map: slots 100-199 are given to no node"));
    let e = check_cover(&names, &[vec![(0, 8191)], vec![(8191, 16383)]]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "slot map: slot 8191 is given to both node 'a' and node 'b'"
    );
    let e = check_cover(&names, &[vec![(0, 10), (5, 16383)], vec![]]).unwrap_err();
    assert_eq!(e.to_string(), "slot map: slot 5 is given twice to node 'a'");
    let e = check_cover(&names, &[vec![(0, 16383)], vec![]]).unwrap_err();
    assert_eq!(e.to_string(), "slot map: node 'b' owns no slot");
    assert!(check_cover(&names, &[vec![(0, 16383)]]).is_err());
}

#[test]
fn ranges_of_an_owner_table() {
    let mut owner = vec![0u32; SLOTS];
    owner[10] = 1;
    owner[11] = 1;
    owner[SLOTS - 1] = 1;
    assert_eq!(
        ranges_of(&owner, 2),
        vec![vec![(0, 9), (12, 16382)], vec![(10, 11), (16383, 16383)]]
    );
}

// --- SLOTS in a ring's arguments, its canonical text, and the ring built from it ---

use crate::ring::{Ring, RingSpec};

fn args(s: &str) -> Vec<&[u8]> {
    s.split(' ')
        .filter(|x| !x.is_empty())
        .map(str::as_bytes)
        .collect()
}

fn spec(algo: &str, fields: &str) -> Result<RingSpec, String> {
    RingSpec::from_args(algo.as_bytes(), None, &args(fields)).map_err(|e| e.to_string())
}

const MAPPED: &str =
    "a h:1 1 SLOTS 0-4095,8192-9000 b h:2 1 slots 4096-8191 c h:3 2 Slots 9001-16383";

#[test]
fn a_ring_with_slots_places_keys_by_its_map() {
    let s = spec("slots", MAPPED).unwrap();
    assert_eq!(
        s.slot_map,
        Some(vec![
            vec![(0, 4095), (8192, 9000)],
            vec![(4096, 8191)],
            vec![(9001, 16383)]
        ])
    );
    let r = Ring::build(&s).unwrap();
    assert_eq!(r.slot_ranges().unwrap(), s.slot_map.as_deref().unwrap());
    assert_eq!(r.points_per_node(), vec![4096 + 809, 4096, 7383]);
    let shares = r.shares();
    assert!((shares[0] - 4905.0 / 16384.0).abs() < 1e-12, "{shares:?}");
    for key in ["user:1000", "a", "b", "{x}y", "somekey"] {
        let slot = crate::ring::key_slot(key.as_bytes());
        let want = match slot {
            0..=4095 | 8192..=9000 => 0,
            4096..=8191 => 1,
            _ => 2,
        };
        assert_eq!(r.owner(key.as_bytes()), want, "{key} in slot {slot}");
        assert_eq!(r.locate(key.as_bytes()).point, i64::from(slot));
    }
}

#[test]
fn the_map_is_in_the_canonical_text_and_the_digest() {
    let s = spec("slots", MAPPED).unwrap();
    assert_eq!(
        s.canonical(),
        "algo slots\nhashtag cluster\nnode a h:1 1 0-4095,8192-9000\nnode b h:2 1 4096-8191\nnode c h:3 2 9001-16383\n"
    );
    let plain = spec("slots", "a h:1 1 b h:2 1 c h:3 2").unwrap();
    assert_ne!(s.digest(), plain.digest());
    // Listed in another order, cut differently: the same map, the same ring.
    let again = spec(
        "slots",
        "a h:1 1 SLOTS 8192-9000,0-100,101-4095 b h:2 1 SLOTS 4096-8191 c h:3 2 SLOTS 9001-16383",
    )
    .unwrap();
    assert_eq!(again, s);
    assert_eq!(again.digest(), s.digest());
}

#[test]
fn a_map_equal_to_the_split_of_the_weights_is_the_plain_ring() {
    let given = spec(
        "slots",
        "a h:1 1 SLOTS 0-5460 b h:2 1 SLOTS 5461-10922 c h:3 1 SLOTS 10923-16383",
    )
    .unwrap();
    let plain = spec("slots", "a h:1 1 b h:2 1 c h:3 1").unwrap();
    assert_eq!(given.slot_map, None);
    assert_eq!(given, plain);
    assert_eq!(given.digest(), plain.digest());
    assert_eq!(
        plain.slot_ranges(),
        Some(vec![
            vec![(0, 5460)],
            vec![(5461, 10922)],
            vec![(10923, 16383)]
        ])
    );
}

#[test]
fn bad_maps_are_refused() {
    assert_eq!(
        spec("slots", "a h:1 1 SLOTS 0-8191 b h:2 1 SLOTS 8192-16382").unwrap_err(),
        "slot map: slot 16383 is given to no node (each of the 16384 slots goes to exactly one node)"
    );
    assert_eq!(
        spec("slots", "a h:1 1 SLOTS 0-8192 b h:2 1 SLOTS 8192-16383").unwrap_err(),
        "slot map: slot 8192 is given to both node 'a' and node 'b'"
    );
    assert_eq!(
        spec("slots", "a h:1 1 SLOTS 0-16383 b h:2 1").unwrap_err(),
        "node 'b' has no SLOTS: once a node gives its slots, every node does"
    );
    assert_eq!(
        spec("ketama", "a h:1 1 SLOTS 0-16383").unwrap_err(),
        "only the slots algo takes a slot map (SLOTS), not ketama"
    );
    assert_eq!(
        spec("slots", "a h:1 1 SLOTS").unwrap_err(),
        "nodes are given as 'name host:port weight [SLOTS ranges]', got 1 more field after node 'a'"
    );
    assert_eq!(
        spec("slots", "a h:1 1 SLOTS 0-16383 b h:2").unwrap_err(),
        "nodes are given as 'name host:port weight [SLOTS ranges]', got 2 more fields after node 'a'"
    );
    assert!(spec("slots", "a h:1 1 SLOTS 0-16384")
        .unwrap_err()
        .contains("slots are 0 to 16383"));
    assert!(spec("slots", "a h:1 1 SLOTS x")
        .unwrap_err()
        .starts_with("SLOTS of node 'a': 'x' is not a slot range"));
    // The old syntax's messages are unchanged.
    assert_eq!(
        spec("slots", "a h:1 1 b").unwrap_err(),
        "nodes are given as 'name host:port weight' triplets, got 4 fields, not a multiple of 3"
    );
}

#[test]
fn whether_fields_give_slots() {
    let given = |f: &str| RingSpec::fields_give_slots(&args(f));
    assert!(given(MAPPED));
    assert!(given("a h:1 1 SLOTS 0-8191 b h:2 1 SLOTS 8192-16383"));
    assert!(!given("a h:1 1 b h:2 1"));
    assert!(!given("a h:1 1 slots h:2 1"));
    assert!(!given("a h:1 1 SLOTS"));
}

#[test]
fn a_node_may_still_be_called_slots() {
    let s = spec("slots", "a h:1 1 slots h:2 1 SLOTS sentinel 1").unwrap();
    let names: Vec<&str> = s.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["a", "slots", "SLOTS"]);
    assert_eq!(s.slot_map, None);
    let s = spec("slots", "slots h:1 1 SLOTS 0-16383").unwrap();
    assert_eq!(s.nodes[0].name, "slots");
    let s = spec("slots", "a h:1 1 SLOTS 1-16383 SLOTS h:2 1 SLOTS 0").unwrap();
    assert_eq!(s.nodes[1].name, "SLOTS");
    assert_eq!(s.slot_map, Some(vec![vec![(1, 16383)], vec![(0, 0)]]));
}
