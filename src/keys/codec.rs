//! The text of a key: decimal or fixed-width base62 for bit layouts, Shardjs's own text form,
//! TSID's forms (`tsid`), and for uuidv7 and ulid the dispatch to `wide`.
//!
//! Formatting writes into small stack buffers (`KeyFormatter`, or the `KeyText` that `format`
//! returns), so issuing a key allocates nothing.
//! Parsing checks every character and range and says what was wrong.

use std::fmt;

use super::base62;
use super::entropy::Draw;
use super::format::Format;
use super::layout::{Form, KeyFields, Layout, LayoutError, LayoutKind};
use super::tsid::{self, TsidError};
use super::ulid::UlidError;
use super::uuidv7::{self, UuidError};
use super::wide::WideForm;

/// The longest text of a key: a UUID's 36 characters.
pub const MAX_TEXT: usize = 36;

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
    buf: [u8; MAX_TEXT],
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
    TooLong {
        max: usize,
    },
    ShardjsTooShort,
    OutOfRange,
    WiderThanLayout,
    Base62(base62::Base62Error),
    Layout(LayoutError),
    Uuid(UuidError),
    Ulid(UlidError),
    Tsid(TsidError),
    /// A `FORMAT` was given and the text's length is not that form's.
    FormLength {
        format: &'static str,
        len: usize,
        want: usize,
    },
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
            KeyError::Uuid(e) => write!(f, "{e}"),
            KeyError::Ulid(e) => write!(f, "{e}"),
            KeyError::Tsid(e) => write!(f, "{e}"),
            KeyError::FormLength { format, len, want } => {
                write!(f, "the {format} form is {want} bytes long, not {len}")
            }
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
pub struct KeyFormatter {
    digits: itoa::Buffer,
    text: [u8; MAX_TEXT],
}

impl Default for KeyFormatter {
    fn default() -> Self {
        KeyFormatter {
            digits: itoa::Buffer::new(),
            text: [0; MAX_TEXT],
        }
    }
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

impl KeyFormatter {
    /// The text of a key just issued, in `format` (one of `Format::choices(layout)`): a
    /// uuidv7 or ulid ID takes its counter and random bits from `draw`.
    #[inline]
    pub fn issue(
        &mut self,
        layout: &Layout,
        format: Format,
        fields: &KeyFields,
        draw: &mut Draw<'_>,
    ) -> &[u8] {
        match layout.form {
            Form::Wide(w) => {
                let v = w.issued(fields, draw);
                w.write(v, format, &mut self.text)
            }
            _ => self.format_in(layout, format, fields),
        }
    }

    /// The text of `fields` (already validated for `layout`, not a 128-bit layout) in `format`.
    #[inline]
    pub fn format_in(&mut self, layout: &Layout, format: Format, fields: &KeyFields) -> &[u8] {
        if layout.kind != LayoutKind::Tsid {
            return self.format(layout, format.encoding(), fields);
        }
        let v = layout.pack(fields);
        match format {
            Format::Decimal => self.digits.format(v).as_bytes(),
            Format::Hex => {
                uuidv7::write_hex(u128::from(v), &mut self.text[..32]);
                &self.text[16..32]
            }
            Format::Binary => {
                self.text[..8].copy_from_slice(&v.to_be_bytes());
                &self.text[..8]
            }
            _ => {
                super::crockford::encode(u128::from(v), &mut self.text[..tsid::TEXT_LEN]);
                &self.text[..tsid::TEXT_LEN]
            }
        }
    }
}

/// The key of `fields` (already validated for `layout`), as a value of its own.
pub fn format(layout: &Layout, encoding: Encoding, fields: &KeyFields) -> KeyText {
    let mut formatter = KeyFormatter::new();
    KeyText::of(formatter.format(layout, encoding, fields))
}

/// The key of `fields` (already validated for `layout`, not a 128-bit layout) in `format`.
pub fn format_as(layout: &Layout, format: Format, fields: &KeyFields) -> KeyText {
    let mut formatter = KeyFormatter::new();
    KeyText::of(formatter.format_in(layout, format, fields))
}

/// The 128-bit ID `v` of `w` in `format`.
pub fn format_wide(w: &WideForm, v: u128, format: Format) -> KeyText {
    let mut out = [0u8; MAX_TEXT];
    KeyText::of(w.write(v, format, &mut out))
}

impl KeyText {
    fn of(bytes: &[u8]) -> KeyText {
        let mut text = KeyText {
            buf: [0; MAX_TEXT],
            len: bytes.len().min(MAX_TEXT),
        };
        text.buf[..text.len].copy_from_slice(&bytes[..text.len]);
        text
    }
}

/// Reads a key of `layout`. With the base62 encoding an 11-character text is base62 and a
/// text of digits of any other length is decimal (so foreign decimal IDs still decode).
pub fn parse(layout: &Layout, encoding: Encoding, text: &[u8]) -> Result<KeyFields, KeyError> {
    parse_as(layout, encoding, None, text)
}

/// Reads a key of `layout` in `format` when one is given (DECODE's `FORMAT`), else as `parse`
/// does; a TSID's form is told by its shape (`tsid::read`). A 128-bit ID gives its
/// millisecond, node and counter (the rest is `wide`'s to read).
pub fn parse_as(
    layout: &Layout,
    encoding: Encoding,
    format: Option<Format>,
    text: &[u8],
) -> Result<KeyFields, KeyError> {
    if text.is_empty() {
        return Err(KeyError::Empty);
    }
    if let Some(w) = layout.wide_form() {
        let p = w.parts(w.read(text, format)?);
        return Ok(KeyFields {
            tick: p.ms,
            node: p.node,
            key_type: 0,
            seq: p.counter.unwrap_or(0),
        });
    }
    if layout.is_text() {
        return parse_shardjs(layout, text);
    }
    let number = if layout.kind == LayoutKind::Tsid {
        tsid::read(text, format).map_err(KeyError::Tsid)?
    } else {
        match format.map(Format::encoding).unwrap_or(encoding) {
            Encoding::Base62 if format.is_some() || text.len() == base62::KEY_WIDTH => {
                base62::decode(text)?
            }
            _ => parse_decimal(text)?,
        }
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
