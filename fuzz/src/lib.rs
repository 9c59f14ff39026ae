//! Helpers shared by the fuzz targets: argument splitting, the layouts to try, cheap bounds.

use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::Unstructured;
use shard::keys::Layout;
use shard::ring::{Algo, Ring, RingError, RingSpec, MAX_POINTS};

/// Splits fuzz input into command arguments on 0x00 (an argument may be empty).
pub fn split_args(data: &[u8]) -> Vec<&[u8]> {
    data.split(|&b| b == 0).collect()
}

/// The named layouts and a few fixed custom ones (shapes the fuzzed ones may not reach quickly).
pub fn fixed_layouts() -> &'static [Layout] {
    static LAYOUTS: OnceLock<Vec<Layout>> = OnceLock::new();
    LAYOUTS.get_or_init(|| {
        let mut v = vec![
            Layout::snowflake(),
            Layout::instagram(),
            Layout::sonyflake(),
            Layout::shardjs(1),
            Layout::shardjs(7),
            Layout::shardjs(3844),
        ];
        for spec in [
            "time:41 node:10 type:0 seq:12 unit:1",
            "time:30 type:8 seq:10 node:5 unit:10",
            "time:40 seq:11 type:12",
            "time:63 seq:0",
            "time:1 seq:62",
            "time:1 node:31 type:31 seq:0 unit:86400000",
        ] {
            v.push(Layout::custom(spec).expect("fixed custom layout"));
        }
        v
    })
}

/// A custom-layout text drawn from the input: well-formed most of the time (so the layout
/// behind it gets exercised), with odd widths, orders, units and duplicates now and then.
pub fn custom_spec(u: &mut Unstructured) -> String {
    const NAMES: [&str; 5] = ["time", "node", "type", "seq", "unit"];
    let n = u.int_in_range(0..=6u8).unwrap_or(4);
    let mut parts = Vec::new();
    for i in 0..n {
        let pick: u8 = u.arbitrary().unwrap_or(0);
        let name = if pick < 200 {
            // Mostly the canonical order time, node, type, seq, unit.
            NAMES[usize::from(i) % NAMES.len()]
        } else {
            NAMES[usize::from(pick) % NAMES.len()]
        };
        let value: u64 = if name == "unit" {
            match u.int_in_range(0..=3u8).unwrap_or(0) {
                0 => 1,
                1 => u.int_in_range(0..=86_400_001u64).unwrap_or(1),
                2 => u.arbitrary().unwrap_or(0),
                _ => 10,
            }
        } else {
            u.int_in_range(0..=70u64).unwrap_or(0)
        };
        parts.push(format!("{name}:{value}"));
    }
    parts.join(" ")
}

/// A layout to work with: one of the fixed ones, or a custom one drawn from the input.
pub fn pick_layout(u: &mut Unstructured) -> Layout {
    let layouts = fixed_layouts();
    let i = u.int_in_range(0..=layouts.len()).unwrap_or(0);
    if i < layouts.len() {
        return layouts[i].clone();
    }
    let spec = custom_spec(u);
    Layout::custom(&spec).unwrap_or_else(|_| Layout::snowflake())
}

/// Builds a ring unless it is legal but slow to build (hundreds of thousands of MD5s): those
/// waste fuzzing time without reaching new code. Rings over the point limit are always built,
/// so the refusal path runs.
pub fn build_bounded(spec: &RingSpec) -> Option<Result<Ring, RingError>> {
    let points = match spec.algo {
        Algo::Jedis | Algo::JedisMurmur => 160 * spec.total_weight(),
        Algo::Ketama => 160 * spec.nodes.len() as u64,
        Algo::RedisShard => 128 * spec.nodes.len() as u64,
        Algo::Slots | Algo::Cluster => 0,
    };
    if points > 40_000 && points <= MAX_POINTS as u64 {
        return None;
    }
    Some(Ring::build(spec))
}

/// Checks the invariants of a built ring on one key.
pub fn check_locate(ring: &Ring, key: &[u8]) {
    let loc = ring.locate(key);
    assert!(loc.node < ring.node_count(), "owner index out of range");
    // The hashed part is a sub-slice of the key.
    let (k0, k1) = (key.as_ptr() as usize, key.as_ptr() as usize + key.len());
    let (h0, h1) = (
        loc.hashed.as_ptr() as usize,
        loc.hashed.as_ptr() as usize + loc.hashed.len(),
    );
    assert!(
        loc.hashed.is_empty() || (k0 <= h0 && h1 <= k1),
        "hashed part is not part of the key"
    );
    assert_eq!(ring.locate(key), loc, "locate is not deterministic");
    assert_eq!(ring.owner_spec(key).name, ring.spec().nodes[loc.node].name);
}
