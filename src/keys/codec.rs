//! The text of a key: decimal or fixed-width base62 for bit layouts, Shardjs's own text form.
//!
//! Formatting writes into small stack buffers (`KeyFormatter`, or the `KeyText` that `format`
//! returns), so issuing a key allocates nothing.
//! Parsing checks every character and range and says what was wrong.

use std::fmt;

use super::base62;
use super::layout::{KeyFields, Layout, LayoutError};

/// How the keys of a bit layout are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Decimal digits, no padding (the number itself).
    Decimal,
    /// Exactly 11 characters of `0-9A-Za-z`, so that text order equals numeric order.
    Base62,
}

impl Encoding {
    pub fn parse(name: &[u8]) -> Option<Encoding> {
        if name.eq_ignore_ascii_case(b"decimal") {
            Some(Encoding::Decimal)
        } else if name.eq_ignore_ascii_case(b"base62") {
            Some(Encoding::Base62)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Encoding::Decimal => "decimal",
            Encoding::Base62 => "base62",
        }
    }
}

/// A formatted key, held on the stack.
#[derive(Clone, Copy)]
pub struct KeyText {
    buf: [u8; 24],
    len: usize,
}

impl KeyText {
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl fmt::Debug for KeyText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// Why a text is not a key of the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    Empty,
    NotDecimal,
    TooLong { max: usize },
    ShardjsTooShort,
    OutOfRange,
    WiderThanLayout,
    Base62(base62::Base62Error),
    Layout(LayoutError),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Empty => write!(f, "the key is empty"),
            KeyError::NotDecimal => write!(f, "the key is not a decimal number"),
            KeyError::TooLong { max } => write!(f, "the key is longer than {max} characters"),
            KeyError::ShardjsTooShort => write!(
                f,
                "a shardjs key has at least 5 characters: time, 2 of variant, 2 of type"
            ),
            KeyError::OutOfRange => write!(f, "the key is out of range"),
            KeyError::WiderThanLayout => {
                write!(f, "the key has bits set above the layout's fields")
            }
            KeyError::Base62(e) => write!(f, "{e}"),
            KeyError::Layout(e) => write!(f, "{e}"),
        }
    }
}

impl From<base62::Base62Error> for KeyError {
    fn from(e: base62::Base62Error) -> Self {
        KeyError::Base62(e)
    }
}

impl From<LayoutError> for KeyError {
    fn from(e: LayoutError) -> Self {
        KeyError::Layout(e)
    }
}

/// Formats keys in its own buffers and lends out the text, so a caller that replies at once
/// (GENKEY) copies nothing: the decimal digits are replied from where `itoa` wrote them.
#[derive(Default)]
pub struct KeyFormatter {
    digits: itoa::Buffer,
    text: [u8; 24],
}

impl KeyFormatter {
    pub fn new() -> KeyFormatter {
        KeyFormatter::default()
    }

    /// The text of the key of `fields` (already validated for `layout`).
    #[inline]
    pub fn format(&mut self, layout: &Layout, encoding: Encoding, fields: &KeyFields) -> &[u8] {
        if layout.is_text() {
            let mut time = [0u8; base62::MAX_WIDTH];
            let n = base62::encode_unpadded(fields.tick, &mut time);
            self.text[..n].copy_from_slice(&time[..n]);
            // Variant and type are at most 3843 once validated: two characters always hold them.
            base62::encode_fixed(fields.seq, &mut self.text[n..n + 2]);
            base62::encode_fixed(fields.key_type, &mut self.text[n + 2..n + 4]);
            return &self.text[..n + 4];
        }
        let number = layout.pack(fields);
        match encoding {
            Encoding::Decimal => self.digits.format(number).as_bytes(),
            Encoding::Base62 => {
                base62::encode_fixed(number, &mut self.text[..base62::KEY_WIDTH]);
                &self.text[..base62::KEY_WIDTH]
            }
        }
    }
}

/// The key of `fields` (already validated for `layout`), as a value of its own.
pub fn format(layout: &Layout, encoding: Encoding, fields: &KeyFields) -> KeyText {
    let mut formatter = KeyFormatter::new();
    let bytes = formatter.format(layout, encoding, fields);
    let mut text = KeyText {
        buf: [0; 24],
        len: bytes.len(),
    };
    text.buf[..bytes.len()].copy_from_slice(bytes);
    text
}

/// Reads a key of `layout`. With the base62 encoding an 11-character text is base62 and a
/// text of digits of any other length is decimal (so foreign decimal IDs still decode).
pub fn parse(layout: &Layout, encoding: Encoding, text: &[u8]) -> Result<KeyFields, KeyError> {
    if text.is_empty() {
        return Err(KeyError::Empty);
    }
    if layout.is_text() {
        return parse_shardjs(layout, text);
    }
    let number = if encoding == Encoding::Base62 && text.len() == base62::KEY_WIDTH {
        base62::decode(text)?
    } else {
        parse_decimal(text)?
    };
    layout.unpack(number).ok_or(KeyError::WiderThanLayout)
}

fn parse_decimal(text: &[u8]) -> Result<u64, KeyError> {
    if !text.iter().all(u8::is_ascii_digit) {
        return Err(KeyError::NotDecimal);
    }
    if text.len() > 20 {
        return Err(KeyError::TooLong { max: 20 });
    }
    text.iter()
        .try_fold(0u64, |acc, d| {
            acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
        .ok_or(KeyError::OutOfRange)
}

/// Shardjs text: base62 time, 2 characters of variant, 2 of type; a fixed key's `-suffix` is
/// ignored (Shardjs places such keys by the part before the first `-`).
fn parse_shardjs(layout: &Layout, text: &[u8]) -> Result<KeyFields, KeyError> {
    let body = text.split(|&c| c == b'-').next().unwrap_or(text);
    if body.len() < 5 {
        return Err(KeyError::ShardjsTooShort);
    }
    let max_len = 9 + 4;
    if body.len() > max_len {
        return Err(KeyError::TooLong { max: max_len });
    }
    let (time, rest) = body.split_at(body.len() - 4);
    let mut fields = KeyFields {
        tick: base62::decode(time)?,
        node: 0,
        seq: base62::decode(&rest[..2])?,
        key_type: base62::decode(&rest[2..])?,
    };
    if fields.tick > layout.max_tick() {
        return Err(KeyError::OutOfRange);
    }
    fields.node = layout.node_of(&fields);
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(layout: &Layout, enc: Encoding, f: &KeyFields) -> String {
        String::from_utf8(format(layout, enc, f).as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn shardjs_readme_example() {
        let l = Layout::shardjs(1);
        let f = parse(&l, Encoding::Decimal, b"1jyVFw3401").unwrap();
        assert_eq!((f.tick, f.seq, f.key_type), (1_595_487_784, 190, 1));
        assert_eq!(l.time_ms(f.tick), 1_325_404_800_000 + 1_595_487_784);
        assert_eq!(
            text(&l, Encoding::Decimal, &KeyFields { seq: 191, ..f }),
            "1jyVFw3501"
        );
        assert_eq!(
            parse(&l, Encoding::Decimal, b"1jyVFw3401-avatar").unwrap(),
            f
        );
    }

    #[test]
    fn shardjs_node_comes_from_node_count() {
        let l = Layout::shardjs(4);
        let f = parse(&l, Encoding::Decimal, b"1jyVFw3401").unwrap();
        assert_eq!(f.node, 1_595_487_784 % 4);
    }

    #[test]
    fn decimal_and_base62_round_trip() {
        let l = Layout::snowflake();
        let f = KeyFields {
            tick: 123_456_789,
            node: 513,
            key_type: 0,
            seq: 4095,
        };
        let dec = text(&l, Encoding::Decimal, &f);
        assert_eq!(dec, l.pack(&f).to_string());
        assert_eq!(parse(&l, Encoding::Decimal, dec.as_bytes()).unwrap(), f);
        let b62 = text(&l, Encoding::Base62, &f);
        assert_eq!(b62.len(), 11);
        assert_eq!(parse(&l, Encoding::Base62, b62.as_bytes()).unwrap(), f);
        // A decimal Twitter ID still decodes when base62 is configured.
        assert_eq!(parse(&l, Encoding::Base62, dec.as_bytes()).unwrap(), f);
    }

    #[test]
    fn parse_errors() {
        let l = Layout::snowflake();
        assert_eq!(parse(&l, Encoding::Decimal, b""), Err(KeyError::Empty));
        assert_eq!(
            parse(&l, Encoding::Decimal, b"12a"),
            Err(KeyError::NotDecimal)
        );
        assert_eq!(
            parse(&l, Encoding::Decimal, b"-1"),
            Err(KeyError::NotDecimal)
        );
        assert_eq!(
            parse(&l, Encoding::Decimal, b"+1"),
            Err(KeyError::NotDecimal)
        );
        assert_eq!(
            parse(&l, Encoding::Decimal, b"18446744073709551616"),
            Err(KeyError::OutOfRange)
        );
        assert_eq!(
            parse(&l, Encoding::Decimal, b"9223372036854775808"),
            Err(KeyError::WiderThanLayout)
        );
        assert_eq!(
            parse(&l, Encoding::Decimal, &[b'1'; 40]),
            Err(KeyError::TooLong { max: 20 })
        );
        assert!(parse(&l, Encoding::Base62, b"0000000000!").is_err());
        let s = Layout::shardjs(1);
        assert!(parse(&s, Encoding::Decimal, b"3401").is_err());
        assert!(parse(&s, Encoding::Decimal, b"1jy_Fw3401").is_err());
        assert!(parse(&s, Encoding::Decimal, b"zzzzzzzzzzzzzz3401").is_err());
    }
}
