//! The configuration parsers: `Layout::custom`, `TypeNames::parse`, `parse_epoch` and
//! `KeySettings::resolve` over whole configurations, then what DECODE/ENCODE/GENKEY derive from
//! resolved settings (`layout_for`, `type_number`, `tick_of`/`time_ms`, pack/unpack).
#![no_main]

use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use shard::keys::settings::parse_epoch;
use shard::keys::{KeyConfig, KeyFields, KeySettings, Layout, LayoutKind, TypeNames};
use shard_fuzz::custom_spec;

/// A string from the input: arbitrary UTF-8, or one of the plausible values.
fn text(u: &mut Unstructured, plausible: &[&str]) -> String {
    let i = u.int_in_range(0..=plausible.len()).unwrap_or(0);
    match plausible.get(i) {
        Some(s) => (*s).to_string(),
        None => u.arbitrary::<String>().unwrap_or_default(),
    }
}

fn int(u: &mut Unstructured, plausible: &[i64]) -> i64 {
    let i = u.int_in_range(0..=plausible.len()).unwrap_or(0);
    match plausible.get(i) {
        Some(n) => *n,
        None => u.arbitrary().unwrap_or(0),
    }
}

fn check_layout(layout: &Layout, u: &mut Unstructured) {
    let ms: i64 = u.arbitrary().unwrap_or(0);
    if let Ok(tick) = layout.tick_of(ms) {
        assert!(tick <= layout.max_tick());
        let start = layout.time_ms(tick);
        assert!(start <= ms, "tick {tick} of {ms} starts at {start}");
        let unit = i64::try_from(layout.unit_ms).unwrap();
        assert!(ms - start < unit, "tick {tick} of {ms} starts at {start}");
        assert_eq!(layout.tick_of(start), Ok(tick));
    }
    let key: u64 = u.arbitrary().unwrap_or(0);
    if let Some(f) = layout.unpack(key) {
        layout
            .validate(&f)
            .unwrap_or_else(|e| panic!("unpacked {f:?} does not validate: {e}"));
        assert_eq!(layout.pack(&f), key);
    }
    let f = KeyFields {
        tick: u.arbitrary().unwrap_or(0),
        node: u.arbitrary().unwrap_or(0),
        key_type: u.arbitrary().unwrap_or(0),
        seq: u.arbitrary().unwrap_or(0),
    };
    if !layout.is_text() && layout.validate(&f).is_ok() {
        assert_eq!(layout.unpack(layout.pack(&f)), Some(f));
    }
    let _ = (
        layout.max_type(),
        layout.default_type(),
        layout.type_above_seq(),
    );
    let _ = layout.tick_stride(u.arbitrary().unwrap_or(0));
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    // The parsers alone, on arbitrary text.
    let raw: String = u.arbitrary().unwrap_or_default();
    if let Ok(layout) = Layout::custom(&raw) {
        check_layout(&layout, &mut u);
    }
    if let Ok(types) = TypeNames::parse(&raw) {
        let spec = types.to_spec();
        assert_eq!(
            TypeNames::parse(&spec).as_ref(),
            Ok(&types),
            "to_spec {spec:?}"
        );
        if let Some(max) = types.max_number() {
            assert!(types.name_of(max).is_some());
        }
    }
    if let Ok(Some(e)) = parse_epoch(&raw) {
        assert!(e >= 0);
    }
    // A whole configuration.
    let custom = if u.arbitrary().unwrap_or(false) {
        custom_spec(&mut u)
    } else {
        text(
            &mut u,
            &[
                "",
                "time:41 node:10 type:0 seq:12 unit:1",
                "time:30 type:8 seq:10 node:5",
            ],
        )
    };
    let cfg = KeyConfig {
        layout: text(
            &mut u,
            &[
                "snowflake",
                "instagram",
                "sonyflake",
                "shardjs",
                "custom",
                "SHARDJS",
            ],
        ),
        node_id: int(&mut u, &[0, 1, 1023, 1024, 3843, 65535, -1]),
        epoch: text(&mut u, &["", "0", "1288834974657", "253402300799999", "-1"]),
        custom_layout: custom,
        encoding: text(&mut u, &["decimal", "base62", "Base62"]),
        types: text(
            &mut u,
            &["", "user:2 group:3", "a:0", "big:18446744073709551615"],
        ),
        node_count: int(&mut u, &[1, 2, 3844, 3845, 0]),
        max_drift_ms: int(&mut u, &[0, 5000, 86_400_000, -1]),
    };
    let Ok(settings) = KeySettings::resolve(&cfg) else {
        return;
    };
    assert!(settings.node_id <= settings.layout.max_node());
    check_layout(&settings.layout, &mut u);
    for kind in LayoutKind::ALL {
        let epoch = if u.arbitrary().unwrap_or(false) {
            Some(u.arbitrary().unwrap_or(0))
        } else {
            None
        };
        if let Ok(layout) = settings.layout_for(kind, epoch) {
            check_layout(&layout, &mut u);
            let arg: Vec<u8> = u.arbitrary().unwrap_or_default();
            if let Ok(t) = settings.type_number(&layout, &arg) {
                assert!(Some(t) <= layout.max_type());
            }
        }
    }
});
