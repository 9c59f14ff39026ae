//! The forms a key is written in (GENKEY's and ENCODE's `FORMAT`) or read from (DECODE's
//! `FORMAT`), which forms each layout has, and the one it uses when none is asked for.
//!
//! | layout | forms (the default first) |
//! |---|---|
//! | bit layouts | the `encoding` setting's (`decimal` or `base62`), then the other |
//! | shardjs | `text` |
//! | tsid | `text` (13 characters of Crockford base32), `decimal`, `hex` (16 digits), `binary` (8 bytes) |
//! | uuidv7 | `text` (36 characters), `hex` (32 digits), `binary` (16 bytes) |
//! | ulid | `text` (26 characters of Crockford base32), `hex` (32 digits), `binary` (16 bytes) |

use super::codec::Encoding;
use super::layout::{Layout, LayoutKind};

/// One written form of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Decimal,
    Base62,
    Text,
    Hex,
    Binary,
}

impl Format {
    const ALL: [Format; 5] = [
        Format::Decimal,
        Format::Base62,
        Format::Text,
        Format::Hex,
        Format::Binary,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Format::Decimal => "decimal",
            Format::Base62 => "base62",
            Format::Text => "text",
            Format::Hex => "hex",
            Format::Binary => "binary",
        }
    }

    /// The forms of `layout`'s keys.
    pub fn choices(layout: &Layout) -> &'static [Format] {
        match layout.kind {
            LayoutKind::Shardjs => &[Format::Text],
            LayoutKind::Tsid => &[Format::Text, Format::Decimal, Format::Hex, Format::Binary],
            LayoutKind::Uuidv7 | LayoutKind::Ulid => &[Format::Text, Format::Hex, Format::Binary],
            _ => &[Format::Decimal, Format::Base62],
        }
    }

    /// The form `layout`'s keys take when no `FORMAT` is given.
    pub fn default_for(layout: &Layout, encoding: Encoding) -> Format {
        match layout.kind {
            LayoutKind::Shardjs | LayoutKind::Tsid | LayoutKind::Uuidv7 | LayoutKind::Ulid => {
                Format::Text
            }
            _ => match encoding {
                Encoding::Decimal => Format::Decimal,
                Encoding::Base62 => Format::Base62,
            },
        }
    }

    /// A form's name, either case.
    pub fn parse(name: &[u8]) -> Option<Format> {
        Format::ALL
            .into_iter()
            .find(|f| f.name().as_bytes().eq_ignore_ascii_case(name))
    }

    /// The error for a name that is no form.
    pub fn unknown(name: &[u8]) -> String {
        format!(
            "unknown FORMAT '{}': expected decimal, base62, text, hex or binary",
            String::from_utf8_lossy(name)
        )
    }

    /// `self` if `layout` has it, or the error that lists the forms it has.
    pub fn check(self, layout: &Layout) -> Result<Format, String> {
        let choices = Format::choices(layout);
        if choices.contains(&self) {
            return Ok(self);
        }
        let names: Vec<&str> = choices.iter().map(|f| f.name()).collect();
        Err(format!(
            "layout {} has no {} form: it has {}",
            layout.name(),
            self.name(),
            names.join(", ")
        ))
    }

    /// A `FORMAT` argument for `layout`, or the error that says what is wrong.
    pub fn for_layout(layout: &Layout, name: &[u8]) -> Result<Format, String> {
        Format::parse(name)
            .ok_or_else(|| Format::unknown(name))?
            .check(layout)
    }

    /// The encoding of a bit layout's key in this form (decimal for the others).
    pub fn encoding(self) -> Encoding {
        match self {
            Format::Base62 => Encoding::Base62,
            _ => Encoding::Decimal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_layout_has_its_forms() {
        let snow = Layout::snowflake();
        assert_eq!(Format::default_for(&snow, Encoding::Base62), Format::Base62);
        assert_eq!(Format::for_layout(&snow, b"DECIMAL"), Ok(Format::Decimal));
        assert!(Format::for_layout(&snow, b"hex")
            .unwrap_err()
            .contains("layout snowflake has no hex form: it has decimal, base62"));
        let uuid = Layout::uuidv7(10);
        assert_eq!(Format::default_for(&uuid, Encoding::Decimal), Format::Text);
        assert_eq!(Format::for_layout(&uuid, b"binary"), Ok(Format::Binary));
        assert!(Format::for_layout(&uuid, b"decimal").is_err());
        assert!(Format::for_layout(&uuid, b"octal")
            .unwrap_err()
            .contains("unknown FORMAT 'octal': expected decimal, base62, text, hex or binary"));
        assert_eq!(
            Format::for_layout(&Layout::tsid(10), b"decimal"),
            Ok(Format::Decimal)
        );
    }
}
