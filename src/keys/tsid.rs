//! TSID (tsid-creator's Time-Sorted ID, also tsidpy's and npm tsid-ts's): a 64-bit bit layout and
//! its written forms.
//!
//! ```text
//!  42 milliseconds since 2020-01-01T00:00:00Z | node-bits node (0 to 20) | 22 - node-bits counter
//! ```
//!
//! It is a bit layout like snowflake's (the generator's sequence is the counter), with the TSID
//! libraries' split of the 22 low bits: `node-bits` as their `node_bits`/`nodeBits` (0 to 20,
//! default 10: 1024 nodes, 4096 IDs a millisecond each). The counter starts each millisecond at
//! 0 where the libraries start it at a random value: a TSID has no secret to keep (64 bits, a
//! node and a count are in it), and starting at 0 gives every millisecond its whole room, so a
//! server borrows the next millisecond only after 2^(22 - node-bits) IDs.
//!
//! Forms: the canonical text (13 characters of Crockford base32, upper case, the first at most
//! `F`), the number in decimal (for a BIGINT column; below 2^63, so a signed 64-bit column
//! holds it, until 2089), 16 hex digits and the 8 bytes in network order. Reading takes either
//! case; without a `FORMAT` a text of 13 characters is the canonical text, one of digits only
//! is decimal and 8 bytes that are not all digits are binary.

use std::fmt;

use super::crockford::{self, CrockfordError};
use super::format::Format;
use super::layout::{Field, Layout, LayoutKind};

/// Characters of the canonical text.
pub const TEXT_LEN: usize = 13;
/// Bits below the time: node and counter.
pub const LOW_BITS: u32 = 22;
/// The most node bits the TSID libraries allow.
pub const MAX_NODE_BITS: u32 = 20;
/// tsid-creator's, tsidpy's and tsid-ts's default.
pub const DEFAULT_NODE_BITS: u32 = 10;

impl Layout {
    /// TSID with `node_bits` (at most 20) of node and the rest of the 22 low bits of counter.
    pub fn tsid(node_bits: u32) -> Layout {
        let node_bits = node_bits.min(MAX_NODE_BITS);
        Layout::from_fields(
            LayoutKind::Tsid,
            &[
                (Field::Time, 42),
                (Field::Node, node_bits),
                (Field::Seq, LOW_BITS - node_bits),
            ],
            1,
        )
    }
}

/// Why a text is not a TSID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TsidError {
    Length { len: usize, format: Format },
    Text(CrockfordError),
    NotDigit { at: usize, byte: u8 },
    TooLarge,
    Unknown(usize),
}

impl fmt::Display for TsidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TsidError::Length { len, format } => {
                let want = match format {
                    Format::Hex => "16 hex digits",
                    Format::Binary => "8 bytes",
                    Format::Decimal => "1 to 20 digits",
                    _ => "13 characters of Crockford base32",
                };
                write!(f, "a TSID in {} form is {want}, not {len}", format.name())
            }
            TsidError::Text(e) => write!(f, "{e}"),
            TsidError::NotDigit { at, byte } if byte.is_ascii_graphic() => write!(
                f,
                "character {} ('{}') is not a digit of the form asked for",
                at + 1,
                *byte as char
            ),
            TsidError::NotDigit { at, byte } => write!(
                f,
                "character {} (byte 0x{byte:02x}) is not a digit of the form asked for",
                at + 1
            ),
            TsidError::TooLarge => write!(f, "the number does not fit 64 bits"),
            TsidError::Unknown(n) => write!(
                f,
                "a TSID is 13 characters of Crockford base32, a decimal number or 8 bytes, not \
                 {n} characters that are none of these (FORMAT hex reads 16 hex digits)"
            ),
        }
    }
}

fn digits(text: &[u8], radix: u32) -> Result<u64, TsidError> {
    text.iter().enumerate().try_fold(0u64, |acc, (at, &c)| {
        let d = char::from(c)
            .to_digit(radix)
            .ok_or(TsidError::NotDigit { at, byte: c })?;
        acc.checked_mul(u64::from(radix))
            .and_then(|v| v.checked_add(u64::from(d)))
            .ok_or(TsidError::TooLarge)
    })
}

/// The 64-bit value of a TSID from `text`, in `format` when given, else told by its shape.
pub fn read(text: &[u8], format: Option<Format>) -> Result<u64, TsidError> {
    let format = match format {
        Some(f) => f,
        None if text.len() == TEXT_LEN => Format::Text,
        None if !text.is_empty() && text.iter().all(u8::is_ascii_digit) => Format::Decimal,
        None if text.len() == 8 => Format::Binary,
        None => return Err(TsidError::Unknown(text.len())),
    };
    let wrong = || TsidError::Length {
        len: text.len(),
        format,
    };
    match format {
        Format::Decimal if (1..=20).contains(&text.len()) => digits(text, 10),
        Format::Hex if text.len() == 16 => digits(text, 16),
        Format::Binary if text.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(text);
            Ok(u64::from_be_bytes(b))
        }
        Format::Text if text.len() == TEXT_LEN => crockford::decode(text, 64)
            .map(|v| v as u64)
            .map_err(TsidError::Text),
        _ => Err(wrong()),
    }
}

/// The canonical text: 13 characters, upper case.
#[inline]
pub fn write_text(v: u64, out: &mut [u8; TEXT_LEN]) {
    crockford::encode(u128::from(v), out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::KeyFields;

    #[test]
    fn the_libraries_examples() {
        // tsidpy's and tsid-ts's doctests.
        assert_eq!(read(b"0AXFXR5W7VBX0", None), Ok(0x0575_FDC1_787D_AFA0));
        assert_eq!(
            read(b"0575FDC1787DAFA0", Some(Format::Hex)),
            Ok(0x0575_FDC1_787D_AFA0)
        );
        assert_eq!(read(b"0AWE5HZP3SKTK", None), Ok(0x0571_c58f_ec3c_cf53));
        assert_eq!(
            read(b"437283649808777971", None),
            Ok(437_283_649_808_777_971)
        );
        let mut out = [0u8; TEXT_LEN];
        write_text(u64::MAX, &mut out);
        assert_eq!(&out, b"FZZZZZZZZZZZZ");
        write_text(10, &mut out);
        assert_eq!(&out, b"000000000000A");
        assert_eq!(
            read(&0xffca_fefa_bada_beef_u64.to_be_bytes(), None),
            Ok(0xffca_fefa_bada_beef)
        );
    }

    #[test]
    fn the_layout_splits_the_low_bits() {
        let l = Layout::tsid(10);
        assert_eq!(
            (l.max_node(), l.max_seq(), l.max_tick()),
            (1023, 4095, (1 << 42) - 1)
        );
        assert_eq!(l.epoch_ms, 1_577_836_800_000, "2020-01-01T00:00:00Z");
        let f = KeyFields {
            tick: (1 << 42) - 1,
            node: 1023,
            key_type: 0,
            seq: 4095,
        };
        assert_eq!(l.pack(&f), u64::MAX);
        assert_eq!(l.unpack(u64::MAX), Some(f));
        assert_eq!(Layout::tsid(0).max_seq(), (1 << 22) - 1);
        assert_eq!(Layout::tsid(20).max_seq(), 3);
        assert_eq!(Layout::tsid(99).max_node(), (1 << 20) - 1, "capped at 20");
    }

    #[test]
    fn bad_texts_say_what_is_wrong() {
        let e = read(b"0AXFXR5W7VBXU", None).unwrap_err();
        assert!(e.to_string().contains("character 13 ('U')"), "{e}");
        assert!(read(b"GZZZZZZZZZZZZ", None)
            .unwrap_err()
            .to_string()
            .contains("at most 'F'"));
        assert_eq!(
            read(b"18446744073709551616", None),
            Err(TsidError::TooLarge)
        );
        assert!(read(b"0AXF", None)
            .unwrap_err()
            .to_string()
            .contains("not 4 characters"));
        assert!(read(b"12", Some(Format::Binary))
            .unwrap_err()
            .to_string()
            .contains("binary form is 8 bytes, not 2"));
        assert!(read(b"0575FDC1787DAFAG", Some(Format::Hex)).is_err());
        assert_eq!(
            read(b"12345678", None),
            Ok(12_345_678),
            "digits are decimal"
        );
        assert_eq!(
            read(b"12345678", Some(Format::Binary)),
            Ok(u64::from_be_bytes(*b"12345678"))
        );
    }
}
