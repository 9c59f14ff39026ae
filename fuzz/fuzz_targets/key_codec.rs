//! The key decoders of every layout (`codec::parse`), decimal and base62, and `codec::format`:
//! never a panic; whatever parses re-formats to a text that parses to the same fields; fields
//! that `validate` accepts format and parse back; base62 text order is numeric order.
#![no_main]

use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use shard::keys::{codec, time, Encoding, KeyFields, Layout};
use shard_fuzz::{custom_spec, fixed_layouts};

const ENCODINGS: [Encoding; 2] = [Encoding::Decimal, Encoding::Base62];

fn parse_all(layout: &Layout, text: &[u8]) {
    for enc in ENCODINGS {
        let Ok(fields) = codec::parse(layout, enc, text) else {
            continue;
        };
        layout
            .validate(&fields)
            .unwrap_or_else(|e| panic!("parsed fields {fields:?} do not validate: {e}"));
        let again = codec::format(layout, enc, &fields);
        let back = codec::parse(layout, enc, again.as_bytes())
            .unwrap_or_else(|e| panic!("formatted {again:?} of {fields:?} does not parse: {e}"));
        assert_eq!(back, fields, "round trip of {again:?}");
        // What SHARD.DECODE computes after parsing.
        let _ = time::iso8601_ms(layout.time_ms(fields.tick));
        let _ = layout.node_of(&fields);
    }
}

fn fields_from(u: &mut Unstructured, layout: &Layout) -> KeyFields {
    // Values near the fields' limits are the interesting ones.
    let mut pick = |max: u64| -> u64 {
        match u.int_in_range(0..=3u8).unwrap_or(0) {
            0 => u.int_in_range(0..=max).unwrap_or(0),
            1 => max,
            2 => max.saturating_add(1),
            _ => u.arbitrary().unwrap_or(0),
        }
    };
    let tick = pick(layout.max_tick());
    let seq = pick(layout.max_seq());
    let node = pick(layout.max_node());
    let key_type = pick(layout.max_type().unwrap_or(0));
    let mut f = KeyFields {
        tick,
        node,
        key_type,
        seq,
    };
    if layout.is_text() && node % 2 == 0 {
        f.node = layout.node_of(&f);
    }
    f
}

fn format_and_parse(layout: &Layout, a: &KeyFields, b: &KeyFields) {
    if layout.validate(a).is_err() {
        return;
    }
    for enc in ENCODINGS {
        let text = codec::format(layout, enc, a);
        let back = codec::parse(layout, enc, text.as_bytes())
            .unwrap_or_else(|e| panic!("formatted {text:?} of {a:?} does not parse: {e}"));
        assert_eq!(&back, a, "round trip of {text:?}");
    }
    if layout.is_text() || layout.validate(b).is_err() {
        return;
    }
    let (ta, tb) = (
        codec::format(layout, Encoding::Base62, a),
        codec::format(layout, Encoding::Base62, b),
    );
    assert_eq!(
        ta.as_bytes().cmp(tb.as_bytes()),
        layout.pack(a).cmp(&layout.pack(b)),
        "base62 order differs from numeric order: {ta:?} {tb:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    // 1. The whole input as a key, for every layout.
    for layout in fixed_layouts() {
        parse_all(layout, data);
    }
    // 2. A custom layout and fields drawn from the input.
    let mut u = Unstructured::new(data);
    let spec = custom_spec(&mut u);
    let custom = Layout::custom(&spec).ok();
    let which = u.int_in_range(0..=fixed_layouts().len()).unwrap_or(0);
    let layout = match (fixed_layouts().get(which), &custom) {
        (Some(l), _) => l,
        (None, Some(c)) => c,
        (None, None) => &fixed_layouts()[0],
    };
    let a = fields_from(&mut u, layout);
    let b = fields_from(&mut u, layout);
    format_and_parse(layout, &a, &b);
    // 3. The rest of the input as a key of that layout.
    let rest = u.take_rest();
    parse_all(layout, rest);
    if let Some(c) = &custom {
        parse_all(c, rest);
    }
});
