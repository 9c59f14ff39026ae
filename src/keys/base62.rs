//! Base62 with the alphabet `0-9A-Za-z` (ASCII order, so fixed-width text sorts like the numbers).
//!
//! Two forms: a fixed width, padded with `0` (11 characters hold any 63-bit key), and the
//! unpadded form Shardjs uses for its time part. Encoding writes into a caller's buffer and
//! allocates nothing; decoding rejects foreign characters and overflow instead of wrapping.

use std::fmt;

/// The alphabet, in ASCII order.
pub const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Width that holds any 63-bit number: 62^11 > 2^63.
pub const KEY_WIDTH: usize = 11;

/// Longest unpadded text of a `u64` (62^10 < 2^64 < 62^11).
pub const MAX_WIDTH: usize = 11;

/// Why a text is not base62.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base62Error {
    Empty,
    BadChar(u8),
    Overflow,
}

impl fmt::Display for Base62Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Base62Error::Empty => write!(f, "empty base62 text"),
            Base62Error::BadChar(c) if c.is_ascii_graphic() => {
                write!(f, "'{}' is not a base62 character (0-9A-Za-z)", *c as char)
            }
            Base62Error::BadChar(c) => {
                write!(f, "byte 0x{c:02x} is not a base62 character (0-9A-Za-z)")
            }
            Base62Error::Overflow => write!(f, "base62 value out of range"),
        }
    }
}

/// The value of one base62 digit.
#[inline]
fn digit(c: u8) -> Result<u64, Base62Error> {
    match c {
        b'0'..=b'9' => Ok(u64::from(c - b'0')),
        b'A'..=b'Z' => Ok(u64::from(c - b'A') + 10),
        b'a'..=b'z' => Ok(u64::from(c - b'a') + 36),
        _ => Err(Base62Error::BadChar(c)),
    }
}

/// Writes `n` in exactly `out.len()` characters, padded with `0`.
/// Returns false (and leaves `out` unspecified) when `n` does not fit.
#[inline]
pub fn encode_fixed(mut n: u64, out: &mut [u8]) -> bool {
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(n % 62) as usize];
        n /= 62;
    }
    n == 0
}

/// Writes `n` without padding at the start of `out` and returns the length used.
#[inline]
pub fn encode_unpadded(mut n: u64, out: &mut [u8; MAX_WIDTH]) -> usize {
    let mut tmp = [0u8; MAX_WIDTH];
    let mut i = MAX_WIDTH;
    loop {
        i -= 1;
        tmp[i] = ALPHABET[(n % 62) as usize];
        n /= 62;
        if n == 0 {
            break;
        }
    }
    let len = MAX_WIDTH - i;
    out[..len].copy_from_slice(&tmp[i..]);
    len
}

/// Reads a base62 text of any width (leading `0`s allowed).
pub fn decode(text: &[u8]) -> Result<u64, Base62Error> {
    if text.is_empty() {
        return Err(Base62Error::Empty);
    }
    text.iter().try_fold(0u64, |acc, &c| {
        let d = digit(c)?;
        acc.checked_mul(62)
            .and_then(|v| v.checked_add(d))
            .ok_or(Base62Error::Overflow)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(n: u64) -> String {
        let mut buf = [0u8; KEY_WIDTH];
        assert!(encode_fixed(n, &mut buf));
        String::from_utf8(buf.to_vec()).unwrap()
    }

    #[test]
    fn fixed_width_round_trips_and_pads() {
        assert_eq!(fixed(0), "00000000000");
        assert_eq!(fixed(61), "0000000000z");
        assert_eq!(fixed(62), "00000000010");
        let max = i64::MAX as u64;
        assert_eq!(decode(fixed(max).as_bytes()).unwrap(), max);
        assert_eq!(decode(fixed(u64::MAX).as_bytes()).unwrap(), u64::MAX);
    }

    #[test]
    fn fixed_width_text_sorts_like_numbers() {
        let samples = [
            0u64,
            1,
            9,
            10,
            35,
            36,
            61,
            62,
            3843,
            3844,
            1 << 40,
            i64::MAX as u64,
        ];
        for w in samples.windows(2) {
            assert!(fixed(w[0]) < fixed(w[1]), "{} vs {}", w[0], w[1]);
        }
    }

    #[test]
    fn fixed_width_reports_overflow() {
        let mut two = [0u8; 2];
        assert!(encode_fixed(3843, &mut two));
        assert_eq!(&two, b"zz");
        assert!(!encode_fixed(3844, &mut two));
    }

    #[test]
    fn unpadded_matches_shardjs_readme() {
        let mut buf = [0u8; MAX_WIDTH];
        let n = encode_unpadded(1_595_487_784, &mut buf);
        assert_eq!(&buf[..n], b"1jyVFw");
        let n = encode_unpadded(0, &mut buf);
        assert_eq!(&buf[..n], b"0");
        let n = encode_unpadded(u64::MAX, &mut buf);
        assert_eq!(decode(&buf[..n]).unwrap(), u64::MAX);
    }

    #[test]
    fn decode_rejects_foreign_input() {
        assert_eq!(decode(b""), Err(Base62Error::Empty));
        assert_eq!(decode(b"ab-c"), Err(Base62Error::BadChar(b'-')));
        assert_eq!(decode("é".as_bytes()), Err(Base62Error::BadChar(0xc3)));
        assert_eq!(decode(b"zzzzzzzzzzzz"), Err(Base62Error::Overflow));
        assert!(Base62Error::BadChar(0xff).to_string().contains("0xff"));
    }
}
