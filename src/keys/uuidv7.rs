//! UUIDv7 (RFC 9562 section 5.7): its bits and its three written forms.
//!
//! ```text
//!  48 unix_ts_ms | 4 ver = 0111 | 12 rand_a | 2 var = 10 | 62 rand_b
//! ```
//!
//! How `shard` fills `rand_a` and `rand_b`: section 6.2's **method 1, a fixed bit-length
//! dedicated counter**, of 24 bits: the 12 bits of `rand_a` and the first 12 of `rand_b`, right
//! after the timestamp as the RFC requires. Then `node-bits` bits of the node id (0 to 20,
//! default 10), then random bits to the end (50 - node-bits: 40 by default).
//!
//! Why method 1: the generator already hands out a (millisecond, sequence) pair under every
//! guarantee GENKEY gives (monotonic through clock steps, borrowing the next millisecond when
//! one is full, the high-water mark across restarts and failovers); a counter is that sequence
//! written into the ID, so strict order in one server follows from the counter alone, whatever
//! the random bits after it. Method 3 (a sub-millisecond fraction) would order IDs only as
//! finely as the clock ticks, and still need a counter for IDs in the same tick; method 2
//! (a random increment) orders IDs but gives a millisecond no fixed room, so "the millisecond
//! is full, borrow the next" has no exact point. The counter starts each millisecond at a
//! random value below 2^23 (section 6.2's seeding, with the top bit as the rollover guard), so
//! every millisecond has room for at least 2^23 IDs and the first ID of a millisecond does not
//! tell how many came before it; the counter itself is drawn in `entropy`.
//!
//! The node id in `rand_b` makes two servers' IDs differ by construction (RFC 9562 section 6.4
//! calls this "node IDs"; it suggests version 8 for them, but every UUID library and database
//! reads a version 7 UUID, and the bits stay opaque to them). With `node-bits 0` the whole of
//! `rand_b` after the counter is random, as in RFC 9562's plain reading.
//!
//! Forms: the canonical text (36 characters, 8-4-4-4-12 lowercase hex), 32 hex digits, the 16
//! bytes in network order. Reading accepts either case, and refuses a UUID of another version
//! or variant with an error that says which.

use std::fmt;

/// Bits of the counter: all of `rand_a` and the first 12 of `rand_b`.
pub const COUNTER_BITS: u32 = 24;
/// Bits of `rand_b` after the counter: the node id's and the random ones.
pub const AFTER_COUNTER_BITS: u32 = 62 - 12;
/// Characters of the canonical text.
pub const TEXT_LEN: usize = 36;
/// Positions of the hyphens in the canonical text.
const HYPHENS: [usize; 4] = [8, 13, 18, 23];

/// The fields of a UUIDv7 as `shard` lays them out (see the module's comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Uuid7Parts {
    pub ms: u64,
    pub counter: u64,
    pub node: u64,
    pub random: u64,
}

/// The 128-bit value of `parts`, each already within its width.
#[inline]
pub fn pack(p: &Uuid7Parts, node_bits: u32) -> u128 {
    let random_bits = AFTER_COUNTER_BITS - node_bits;
    (u128::from(p.ms) << 80)
        | (7u128 << 76)
        | (u128::from(p.counter >> 12) << 64)
        | (0b10u128 << 62)
        | (u128::from(p.counter & 0xFFF) << AFTER_COUNTER_BITS)
        | (u128::from(p.node) << random_bits)
        | u128::from(p.random)
}

/// The fields of a UUIDv7 value (its version and variant checked by `read`).
pub fn unpack(v: u128, node_bits: u32) -> Uuid7Parts {
    let random_bits = AFTER_COUNTER_BITS - node_bits;
    let low = |bits: u32| {
        if bits == 0 {
            0
        } else {
            u64::MAX >> (64 - bits)
        }
    };
    let rand_a = ((v >> 64) & 0xFFF) as u64;
    let rand_b = (v & ((1u128 << 62) - 1)) as u64;
    Uuid7Parts {
        ms: (v >> 80) as u64,
        counter: (rand_a << 12) | (rand_b >> AFTER_COUNTER_BITS),
        node: (rand_b >> random_bits) & low(node_bits),
        random: rand_b & low(random_bits),
    }
}

/// Why a text is not a UUIDv7.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UuidError {
    Length(usize),
    NotHex { at: usize, byte: u8 },
    Hyphen { at: usize },
    Version(u8),
    Variant(u8),
}

impl fmt::Display for UuidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UuidError::Length(n) => write!(
                f,
                "a UUID is 36 characters (8-4-4-4-12 hex digits), 32 hex digits or 16 bytes, not {n}"
            ),
            UuidError::NotHex { at, byte } if byte.is_ascii_graphic() => write!(
                f,
                "character {} ('{}') is not a hex digit",
                at + 1,
                *byte as char
            ),
            UuidError::NotHex { at, byte } => write!(
                f,
                "character {} (byte 0x{byte:02x}) is not a hex digit",
                at + 1
            ),
            UuidError::Hyphen { at } => write!(
                f,
                "character {} must be '-' (the form is 8-4-4-4-12 hex digits)",
                at + 1
            ),
            UuidError::Version(v) => write!(f, "this UUID is version {v}, not 7"),
            UuidError::Variant(bits) => write!(
                f,
                "this UUID's variant bits are {bits:02b}, not 10 (RFC 9562's variant): {}",
                match bits {
                    0b00 | 0b01 => "an NCS-reserved UUID",
                    _ => "a Microsoft-reserved UUID",
                }
            ),
        }
    }
}

fn hex_value(c: u8, at: usize) -> Result<u8, UuidError> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(UuidError::NotHex { at, byte: c }),
    }
}

/// Reads 32 hex digits (either case), skipping the characters at `skip` (checked to be `-`).
fn read_hex(text: &[u8], skip: &[usize]) -> Result<u128, UuidError> {
    let mut v: u128 = 0;
    for (at, &c) in text.iter().enumerate() {
        if skip.contains(&at) {
            if c != b'-' {
                return Err(UuidError::Hyphen { at });
            }
            continue;
        }
        v = (v << 4) | u128::from(hex_value(c, at)?);
    }
    Ok(v)
}

/// The 128-bit value of a UUID of any version, from any of its forms.
pub fn read_any(text: &[u8]) -> Result<u128, UuidError> {
    match text.len() {
        TEXT_LEN => read_hex(text, &HYPHENS),
        32 => read_hex(text, &[]),
        16 => {
            let mut b = [0u8; 16];
            b.copy_from_slice(text);
            Ok(u128::from_be_bytes(b))
        }
        n => Err(UuidError::Length(n)),
    }
}

/// The value of a UUIDv7 from its text, hex or bytes: version 7 and variant 10, or an error.
pub fn read(text: &[u8]) -> Result<u128, UuidError> {
    let v = read_any(text)?;
    let version = ((v >> 76) & 0xF) as u8;
    if version != 7 {
        return Err(UuidError::Version(version));
    }
    let variant = ((v >> 62) & 0b11) as u8;
    if variant != 0b10 {
        return Err(UuidError::Variant(variant));
    }
    Ok(v)
}

/// The canonical text: 8-4-4-4-12 lowercase hex digits.
#[inline]
pub fn write_text(v: u128, out: &mut [u8; TEXT_LEN]) {
    // Each group straight from its bits (the hot path of GENKEY: no digits copied twice).
    let hi = (v >> 64) as u64;
    let lo = v as u64;
    out[..8].copy_from_slice(&hex8((hi >> 32) as u32));
    out[8] = b'-';
    out[9..13].copy_from_slice(&hex8(hi as u32)[..4]);
    out[13] = b'-';
    out[14..18].copy_from_slice(&hex8(hi as u32)[4..]);
    out[18] = b'-';
    out[19..23].copy_from_slice(&hex8((lo >> 32) as u32)[..4]);
    out[23] = b'-';
    out[24..28].copy_from_slice(&hex8((lo >> 32) as u32)[4..]);
    out[28..].copy_from_slice(&hex8(lo as u32));
}

/// 32 lowercase hex digits, into the first 32 bytes of `out`.
#[inline]
pub fn write_hex(v: u128, out: &mut [u8]) {
    for (chunk, word) in out[..32].chunks_exact_mut(8).zip([96, 64, 32, 0]) {
        chunk.copy_from_slice(&hex8((v >> word) as u32));
    }
}

/// The 8 lowercase hex digits of `x`, without a table or a branch: the nibbles are spread
/// one to a byte (three shifts and masks), then each byte of 0-15 becomes its digit at once
/// (`'0' + b`, plus 39 more where `b >= 10`: `b + 6` then has bit 4 set). GENKEY spends
/// about a third of what a byte-at-a-time table lookup cost.
#[inline]
fn hex8(x: u32) -> [u8; 8] {
    let x = u64::from(x);
    let x = ((x & 0xFFFF_0000) << 16) | (x & 0xFFFF);
    let x = ((x & 0x0000_FF00_0000_FF00) << 8) | (x & 0x0000_00FF_0000_00FF);
    let x = ((x & 0x00F0_00F0_00F0_00F0) << 4) | (x & 0x000F_000F_000F_000F);
    let letters = ((x + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    (x + 0x3030_3030_3030_3030 + letters * 39).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 9562 appendix A.6: 2022-02-22 14:22:22 -05:00, rand_a 0xCC3, rand_b 0b01 then
    /// 0x8C4DC0C0C07398F.
    const RFC_TEXT: &str = "017f22e2-79b0-7cc3-98c4-dc0c0c07398f";

    #[test]
    fn rfc_9562_appendix_a6() {
        let v = read(RFC_TEXT.as_bytes()).unwrap();
        assert_eq!(v >> 80, 0x017F_22E2_79B0);
        assert_eq!(
            0x017F_22E2_79B0_u64, 1_645_557_742_000,
            "Tue 2022-02-22 19:22:22 UTC"
        );
        assert_eq!((v >> 64) & 0xFFF, 0xCC3, "rand_a");
        assert_eq!(v & ((1 << 62) - 1), 0x18C4_DC0C_0C07_398F, "rand_b");
        let mut text = [0u8; TEXT_LEN];
        write_text(v, &mut text);
        assert_eq!(&text, RFC_TEXT.as_bytes());
        assert_eq!(read(RFC_TEXT.to_uppercase().as_bytes()), Ok(v));
        let mut hex = [0u8; 32];
        write_hex(v, &mut hex);
        assert_eq!(&hex, RFC_TEXT.replace('-', "").as_bytes());
        assert_eq!(read(&hex), Ok(v));
        assert_eq!(read(&v.to_be_bytes()), Ok(v));
        // Its fields as shard reads them (a counter of rand_a and 12 bits of rand_b).
        let p = unpack(v, 10);
        assert_eq!(p.ms, 1_645_557_742_000);
        assert_eq!(p.counter, (0xCC3 << 12) | (0x18C4_DC0C_0C07_398F >> 50));
        assert_eq!(pack(&p, 10), v);
    }

    #[test]
    fn pack_and_unpack_are_inverse_at_the_edges() {
        for node_bits in [0, 1, 10, 20] {
            let max = |bits: u32| {
                if bits == 0 {
                    0
                } else {
                    u64::MAX >> (64 - bits)
                }
            };
            for p in [
                Uuid7Parts::default(),
                Uuid7Parts {
                    ms: (1 << 48) - 1,
                    counter: (1 << COUNTER_BITS) - 1,
                    node: max(node_bits),
                    random: max(AFTER_COUNTER_BITS - node_bits),
                },
            ] {
                let v = pack(&p, node_bits);
                assert_eq!(read(&v.to_be_bytes()), Ok(v), "version and variant set");
                assert_eq!(unpack(v, node_bits), p);
            }
        }
    }

    #[test]
    fn other_versions_variants_and_garbage_are_refused() {
        let v4 = "9b2f5c3e-4a1d-4e8b-8c7f-2d3e4f5a6b7c";
        assert_eq!(read(v4.as_bytes()), Err(UuidError::Version(4)));
        assert!(UuidError::Version(4)
            .to_string()
            .contains("version 4, not 7"));
        let ms_variant = "017f22e2-79b0-7cc3-d8c4-dc0c0c07398f";
        let e = read(ms_variant.as_bytes()).unwrap_err();
        assert_eq!(e, UuidError::Variant(0b11));
        assert!(e.to_string().contains("variant bits are 11"));
        assert_eq!(
            read(b"017f22e2-79b0-7cc3-98c4-dc0c0c07398g"),
            Err(UuidError::NotHex { at: 35, byte: b'g' })
        );
        assert_eq!(
            read(b"017f22e2079b0-7cc3-98c4-dc0c0c07398f"),
            Err(UuidError::Hyphen { at: 8 })
        );
        assert_eq!(read(b"017f22e2"), Err(UuidError::Length(8)));
        assert!(UuidError::Length(8).to_string().contains("not 8"));
        assert!(UuidError::NotHex { at: 0, byte: 0 }
            .to_string()
            .contains("0x00"));
    }

    #[test]
    fn text_and_hex_agree_with_std_formatting() {
        let mut rng = crate::test_rng::TestRng::new(9);
        let edges = [0, u128::MAX, 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210];
        let random = (0..100_000).map(|_| (u128::from(rng.next()) << 64) | u128::from(rng.next()));
        let values: Vec<u128> = edges.into_iter().chain(random).collect();
        for v in values {
            let hex = format!("{v:032x}");
            let mut out = [0u8; 32];
            write_hex(v, &mut out);
            assert_eq!(out, hex.as_bytes(), "{v:x}");
            let mut text = [0u8; TEXT_LEN];
            write_text(v, &mut text);
            let want = format!(
                "{}-{}-{}-{}-{}",
                &hex[..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..]
            );
            assert_eq!(text, want.as_bytes());
            assert_eq!(read_any(&text), Ok(v));
        }
    }
}
