//! Property tests of the tsid, uuidv7 and ulid layouts (proptest): whatever the clock does
//! (steps forward, back, standing still), whatever the counts asked for and the node width,
//! the IDs one generator issues strictly increase in every written form (text, hex, binary,
//! decimal) and never repeat; every ID reads back to the millisecond and node it was issued
//! for; a change of layout moves on to later milliseconds; the text forms sort like the
//! numbers they hold.

use proptest::prelude::*;

use super::codec::{self, Encoding};
use super::crockford;
use super::entropy::Entropy;
use super::format::Format;
use super::generator::{Generator, Request, Shape};
use super::layout::Layout;
use super::uuidv7;

/// A time in 2024, in unix ms.
const NOW: i64 = 1_717_000_000_000;

fn layout_of(which: u8, node_bits: u32) -> Layout {
    match which % 3 {
        0 => Layout::uuidv7(node_bits),
        1 => Layout::ulid(node_bits),
        _ => Layout::tsid(node_bits),
    }
}

/// Issues the keys of `steps` (clock offset from NOW, count) on `layout` for `node`, in
/// `format`: the bytes of each key, or none for a refused request.
fn issue(
    layout: &Layout,
    node: u64,
    format: Format,
    steps: &[(i64, u64)],
    generator: &mut Generator,
    entropy: &mut Entropy,
) -> Vec<Vec<u8>> {
    let shape = Shape::of(layout, node);
    let mut formatter = codec::KeyFormatter::new();
    let mut out = Vec::new();
    for &(offset, count) in steps {
        let req = Request {
            now_ms: NOW + offset,
            count,
            node,
            key_type: 0,
            max_drift_ms: 60_000,
        };
        let mut draw = entropy.ready().unwrap();
        let Ok(batch) = generator.reserve(layout, &shape, &req) else {
            continue;
        };
        for fields in batch {
            out.push(formatter.issue(layout, format, &fields, &mut draw).to_vec());
        }
    }
    out
}

fn steps() -> impl Strategy<Value = Vec<(i64, u64)>> {
    // Mostly forward, sometimes the same millisecond, sometimes seconds back.
    prop::collection::vec((-5_000i64..50, 1u64..3000), 1..40).prop_map(|v| {
        let mut clock = 0;
        v.into_iter()
            .map(|(step, count)| {
                clock += if step < -4_900 { step } else { step.max(0) % 3 };
                (clock, count)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn ids_strictly_increase_in_every_form(
        which in 0u8..3,
        node_bits in 0u32..=20,
        node_seed in any::<u64>(),
        steps in steps(),
        seed in any::<[u8; 32]>(),
    ) {
        let layout = layout_of(which, node_bits);
        let node = node_seed & layout.max_node();
        for format in Format::choices(&layout).iter().copied() {
            let mut generator = Generator::new();
            let mut entropy = Entropy::from_seed(seed);
            let keys = issue(&layout, node, format, &steps, &mut generator, &mut entropy);
            prop_assert!(!keys.is_empty());
            for pair in keys.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                let ordered = if format == Format::Decimal {
                    (a.len(), a) < (b.len(), b)
                } else {
                    a < b
                };
                prop_assert!(ordered, "{} {:?}: {:?} then {:?}", layout.name(), format, a, b);
            }
            // Each reads back to its millisecond and node.
            for key in keys.iter().step_by(97) {
                let f = codec::parse_as(&layout, Encoding::Decimal, Some(format), key).unwrap();
                prop_assert_eq!(f.node, node);
                prop_assert!(layout.time_ms(f.tick) >= NOW - 5_000 * 40);
            }
        }
    }

    #[test]
    fn a_layout_change_moves_to_later_milliseconds(
        first in 0u8..3,
        second in 0u8..3,
        node_bits in 0u32..=20,
        steps in steps(),
    ) {
        let (a, b) = (layout_of(first, node_bits), layout_of(second, 20 - node_bits));
        let mut generator = Generator::new();
        let mut entropy = Entropy::from_seed([9; 32]);
        let old = issue(&a, 0, Format::Text, &steps, &mut generator, &mut entropy);
        let last_ms = a.time_ms(codec::parse(&a, Encoding::Decimal, old.last().unwrap()).unwrap().tick);
        generator.rebase(&a, &b);
        let new = issue(&b, 0, Format::Text, &steps, &mut generator, &mut entropy);
        let first_ms = b.time_ms(codec::parse(&b, Encoding::Decimal, &new[0]).unwrap().tick);
        prop_assert!(first_ms > last_ms, "{} then {}: {} then {}", a.name(), b.name(), last_ms, first_ms);
    }

    #[test]
    fn texts_sort_like_their_numbers(x in any::<u128>(), y in any::<u128>()) {
        let (mut tx, mut ty) = ([0u8; 26], [0u8; 26]);
        crockford::encode(x, &mut tx);
        crockford::encode(y, &mut ty);
        prop_assert_eq!(tx.cmp(&ty), x.cmp(&y));
        prop_assert_eq!(crockford::decode(&tx, 128), Ok(x));
        let (mut ux, mut uy) = ([0u8; 36], [0u8; 36]);
        uuidv7::write_text(x, &mut ux);
        uuidv7::write_text(y, &mut uy);
        prop_assert_eq!(ux.cmp(&uy), x.cmp(&y));
        prop_assert_eq!(uuidv7::read_any(&ux), Ok(x));
    }

    #[test]
    fn decoding_any_bytes_never_panics(text in prop::collection::vec(any::<u8>(), 0..40)) {
        for which in 0..3 {
            let layout = layout_of(which, 10);
            for format in [None, Some(Format::Text), Some(Format::Hex), Some(Format::Binary), Some(Format::Decimal)] {
                if let Ok(f) = codec::parse_as(&layout, Encoding::Decimal, format, &text) {
                    prop_assert!(f.tick <= layout.max_tick());
                }
            }
        }
    }
}
