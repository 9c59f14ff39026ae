//! The tsid, uuidv7 and ulid layouts (issue 34): reading any bytes in every form
//! (`codec::parse_as`, `WideForm::read`, `tsid::read`) never panics; whatever reads writes back
//! in every form and reads again to the same value; IDs built from fields drawn from the input
//! keep those fields; the text forms sort as their numbers.
#![no_main]

use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use shard::keys::{codec, tsid, Encoding, Format, Layout, WideParts};

const FORMS: [Option<Format>; 6] = [
    None,
    Some(Format::Text),
    Some(Format::Hex),
    Some(Format::Binary),
    Some(Format::Decimal),
    Some(Format::Base62),
];

fn wide(layout: &Layout, data: &[u8], u: &mut Unstructured) {
    let Some(w) = layout.wide_form() else { return };
    for format in FORMS {
        let _ = codec::parse_as(layout, Encoding::Decimal, format, data);
        let Ok(v) = w.read(data, format) else { continue };
        let parts = w.parts(v);
        assert_eq!(w.build(&parts), Ok(v), "the fields of {v:x} build it again");
        let mut out = [0u8; 36];
        for f in [Format::Text, Format::Hex, Format::Binary] {
            let text = w.write(v, f, &mut out).to_vec();
            assert_eq!(w.read(&text, Some(f)), Ok(v), "{f:?} of {v:x}");
        }
    }
    let parts = WideParts {
        ms: u.arbitrary::<u64>().unwrap_or(0) >> u.int_in_range(0..=63u32).unwrap_or(16),
        node: u.arbitrary::<u64>().unwrap_or(0) >> u.int_in_range(0..=63u32).unwrap_or(50),
        counter: u.arbitrary::<Option<u64>>().unwrap_or(None),
        random: u.arbitrary::<u128>().unwrap_or(0) >> u.int_in_range(0..=127u32).unwrap_or(60),
    };
    let Ok(a) = w.build(&parts) else { return };
    let back = w.parts(a);
    assert_eq!((back.ms, back.node, back.random), (parts.ms, parts.node, parts.random));
    let b: u128 = u.arbitrary().unwrap_or(0);
    let (mut ta, mut tb) = ([0u8; 36], [0u8; 36]);
    let (ta, tb) = (
        w.write(a, Format::Text, &mut ta).to_vec(),
        w.write(b, Format::Text, &mut tb).to_vec(),
    );
    assert_eq!(ta.cmp(&tb), a.cmp(&b), "text order of {a:x} and {b:x}");
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let node_bits = u.int_in_range(0..=20u32).unwrap_or(10);
    let rest = u.bytes(u.len() / 2).unwrap_or_default();
    for layout in [Layout::uuidv7(node_bits), Layout::ulid(node_bits)] {
        wide(&layout, rest, &mut Unstructured::new(data));
    }
    let t = Layout::tsid(node_bits);
    for format in FORMS {
        if let Ok(fields) = codec::parse_as(&t, Encoding::Decimal, format, rest) {
            let v = t.pack(&fields);
            for f in [Format::Text, Format::Decimal, Format::Hex, Format::Binary] {
                let text = codec::format_as(&t, f, &fields);
                assert_eq!(tsid::read(text.as_bytes(), Some(f)), Ok(v), "{f:?} of {v:x}");
            }
        }
    }
});
