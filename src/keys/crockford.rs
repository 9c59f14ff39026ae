//! Crockford's base32 of a fixed width, the text of ULIDs (26 characters, 128 bits) and TSIDs
//! (13 characters, 64 bits): `0-9A-Z` without `I`, `L`, `O` and `U`, in ASCII order, so that
//! texts of one width sort like the numbers they hold.
//!
//! Written here rather than taken from a crate: the base32 crates encode a byte string from its
//! first bit, five bits at a time, padding the end; ULID and TSID write a *number*
//! right-aligned (the first character holds the top 3 bits of a ULID, the top 4 of a TSID),
//! which is a different text for the same bytes. A fixed width of one number is a loop of
//! shifts (tens of lines), checked here against the ULID and TSID specifications' examples.
//!
//! Decoding is case-insensitive and strict: a character outside the alphabet (`I`, `L`, `O`,
//! `U` included: Crockford's reading of them as 1 and 0 is not the ULID specification's, and
//! python-ulid and npm `ulid` refuse them) is an error naming it and its place, and a text
//! whose value does not fit the width in bits is refused, never wrapped.

use std::fmt;

/// The alphabet, in ASCII order.
pub const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Why a text is not Crockford base32 of the expected width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrockfordError {
    /// The byte at this position (from 0) is not in the alphabet.
    BadChar { at: usize, byte: u8 },
    /// The text holds more than `bits` bits: its first character may be at most `max_first`.
    TooLarge { bits: u32, max_first: u8 },
}

impl fmt::Display for CrockfordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrockfordError::BadChar { at, byte } if byte.is_ascii_graphic() => write!(
                f,
                "character {} ('{}') is not Crockford base32 (0-9 and A-Z without I, L, O, U)",
                at + 1,
                *byte as char
            ),
            CrockfordError::BadChar { at, byte } => write!(
                f,
                "character {} (byte 0x{byte:02x}) is not Crockford base32 (0-9 and A-Z without I, L, O, U)",
                at + 1
            ),
            CrockfordError::TooLarge { bits, max_first } => write!(
                f,
                "the value does not fit {bits} bits: the first character must be at most '{}'",
                *max_first as char
            ),
        }
    }
}

/// The value of one character, either case; `None` outside the alphabet.
#[inline]
fn value(c: u8) -> Option<u8> {
    const TABLE: [u8; 128] = {
        let mut t = [0xFF; 128];
        let mut i = 0;
        while i < 32 {
            let c = ALPHABET[i];
            t[c as usize] = i as u8;
            t[c.to_ascii_lowercase() as usize] = i as u8;
            i += 1;
        }
        t
    };
    TABLE.get(usize::from(c)).copied().filter(|v| *v != 0xFF)
}

/// Writes the low `5 * out.len()` bits of `n` into `out`, most significant first.
#[inline]
pub fn encode(mut n: u128, out: &mut [u8]) {
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(n & 31) as usize];
        n >>= 5;
    }
}

/// Reads a text whose value must fit `bits` bits (at most 128). The callers check the width
/// first; a text with a whole character more than `bits` need is refused as too large.
pub fn decode(text: &[u8], bits: u32) -> Result<u128, CrockfordError> {
    let spare_chars = (text.len() as u32 * 5).saturating_sub(bits);
    if spare_chars >= 5 {
        return Err(CrockfordError::TooLarge {
            bits,
            max_first: b'0',
        });
    }
    let mut n: u128 = 0;
    for (at, &c) in text.iter().enumerate() {
        let v = value(c).ok_or(CrockfordError::BadChar { at, byte: c })?;
        if at == 0 {
            // The first character carries what is left of `bits` after the others.
            let spare = spare_chars;
            if spare > 0 && u32::from(v) >> (5 - spare) != 0 {
                return Err(CrockfordError::TooLarge {
                    bits,
                    max_first: ALPHABET[31usize >> spare],
                });
            }
        }
        n = (n << 5) | u128::from(v);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: u128, width: usize) -> String {
        let mut out = vec![0u8; width];
        encode(n, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn alphabet_is_in_ascii_order_without_i_l_o_u() {
        assert!(ALPHABET.windows(2).all(|w| w[0] < w[1]));
        for c in b"ILOUilou" {
            assert_eq!(value(*c), None);
        }
        assert_eq!(value(b'z'), Some(31));
        assert_eq!(value(0xC3), None);
    }

    #[test]
    fn fixed_widths_round_trip() {
        assert_eq!(text(0, 26), "0".repeat(26));
        assert_eq!(text(u128::MAX, 26), format!("7{}", "Z".repeat(25)));
        assert_eq!(decode(text(u128::MAX, 26).as_bytes(), 128), Ok(u128::MAX));
        // TSID's own examples (tsid-creator, tsidpy): 13 characters of a 64-bit number.
        assert_eq!(text(u128::from(u64::MAX), 13), "FZZZZZZZZZZZZ");
        assert_eq!(text(0x0575_FDC1_787D_AFA0, 13), "0AXFXR5W7VBX0");
        assert_eq!(decode(b"0axfxr5w7vbx0", 64), Ok(0x0575_FDC1_787D_AFA0));
    }

    #[test]
    fn errors_name_the_character_and_the_limit() {
        let e = decode(b"01ARZ3NDEKTSV4RRFFQ69G5FAU", 128).unwrap_err();
        assert_eq!(e, CrockfordError::BadChar { at: 25, byte: b'U' });
        assert!(e.to_string().contains("character 26 ('U')"));
        let big = decode(b"8ZZZZZZZZZZZZZZZZZZZZZZZZZ", 128).unwrap_err();
        assert!(big.to_string().contains("at most '7'"), "{big}");
        assert!(decode(b"GZZZZZZZZZZZZ", 64)
            .unwrap_err()
            .to_string()
            .contains("at most 'F'"));
        assert!(decode(b"0\x01", 64)
            .unwrap_err()
            .to_string()
            .contains("0x01"));
    }
}
