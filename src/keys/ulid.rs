//! ULID (the ULID specification, github.com/ulid/spec): its bits and its written forms.
//!
//! ```text
//!  48 milliseconds since 1970 | 80 randomness
//! ```
//!
//! How `shard` fills the 80 bits: `node-bits` bits of the node id first (0 to 20, default 10),
//! then the rest (70 by default) as the specification's monotonic factory does: random at the
//! first ID of a millisecond, then one more for each ID in the same millisecond. The random
//! start keeps its top bit 0 (a rollover guard, as RFC 9562 section 6.2 puts it), so a
//! millisecond holds at least 2^69 IDs and the increment never reaches the node bits; where
//! the specification's factory throws on overflow, the generator borrows the next millisecond
//! first (in practice never: GENKEY draws at most 100 000 IDs a call). With the node bits at
//! the top of the randomness, two servers' IDs differ by construction; one server's IDs
//! increase by exactly one within a millisecond, as the specification's.
//!
//! Forms: the canonical text (26 characters of Crockford base32, upper case), 32 hex digits
//! (python-ulid's `hex`), the hyphenated UUID text of the same 16 bytes (python-ulid's
//! `to_uuid`) and the 16 bytes in network order (the specification's binary layout). Reading
//! is case-insensitive; a text whose value passes 128 bits (`8ZZZ...`: the specification's
//! "largest valid ULID is 7ZZZZZZZZZZZZZZZZZZZZZZZZZ") is refused, never wrapped.

use std::fmt;

use super::crockford::{self, CrockfordError};
use super::uuidv7::{self, UuidError};

/// Bits of the randomness (node and counter).
pub const RANDOM_BITS: u32 = 80;
/// Characters of the canonical text.
pub const TEXT_LEN: usize = 26;

/// The fields of a ULID as `shard` lays them out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UlidParts {
    pub ms: u64,
    pub node: u64,
    /// The randomness below the node bits, which the monotonic factory increments.
    pub random: u128,
}

/// The 128-bit value of `parts`, each already within its width.
#[inline]
pub fn pack(p: &UlidParts, node_bits: u32) -> u128 {
    (u128::from(p.ms) << 80) | (u128::from(p.node) << (RANDOM_BITS - node_bits)) | p.random
}

/// The fields of a ULID value.
pub fn unpack(v: u128, node_bits: u32) -> UlidParts {
    let random_bits = RANDOM_BITS - node_bits;
    let node_mask = (1u128 << node_bits) - 1;
    UlidParts {
        ms: (v >> 80) as u64,
        node: ((v >> random_bits) & node_mask) as u64,
        random: v & ((1u128 << random_bits) - 1),
    }
}

/// Why a text is not a ULID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UlidError {
    Length(usize),
    Text(CrockfordError),
    Hex(UuidError),
}

impl fmt::Display for UlidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UlidError::Length(n) => write!(
                f,
                "a ULID is 26 characters of Crockford base32, 32 hex digits, a 36-character UUID \
                 text or 16 bytes, not {n}"
            ),
            UlidError::Text(e) => write!(f, "{e}"),
            UlidError::Hex(e) => write!(f, "{e}"),
        }
    }
}

/// The value of a ULID from its text, hex, UUID text or bytes.
pub fn read(text: &[u8]) -> Result<u128, UlidError> {
    match text.len() {
        TEXT_LEN => crockford::decode(text, 128).map_err(UlidError::Text),
        32 | 36 | 16 => uuidv7::read_any(text).map_err(UlidError::Hex),
        n => Err(UlidError::Length(n)),
    }
}

/// The canonical text: 26 characters, upper case.
#[inline]
pub fn write_text(v: u128, out: &mut [u8; TEXT_LEN]) {
    crockford::encode(v, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: u128) -> String {
        let mut out = [0u8; TEXT_LEN];
        write_text(v, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn the_specifications_examples() {
        // "decodeTime('01ARYZ6S41TSV4RRFFQ69G5FAV') // 1469918176385" and `ulid(1469918176385)`
        // keeps the time in the first 10 characters.
        let v = read(b"01ARYZ6S41TSV4RRFFQ69G5FAV").unwrap();
        assert_eq!(v >> 80, 1_469_918_176_385);
        assert_eq!(text(v), "01ARYZ6S41TSV4RRFFQ69G5FAV");
        assert_eq!(read(b"01aryz6s41tsv4rrffq69g5fav"), Ok(v));
        // The monotonic factory's example: the next ULID of the millisecond is one more.
        let a = read(b"01BX5ZZKBKACTAV9WEVGEMMVRZ").unwrap();
        assert_eq!(text(a + 1), "01BX5ZZKBKACTAV9WEVGEMMVS0");
        // "The largest valid ULID ... is 7ZZZZZZZZZZZZZZZZZZZZZZZZZ", 2^48 - 1 ms.
        let max = read(b"7ZZZZZZZZZZZZZZZZZZZZZZZZZ").unwrap();
        assert_eq!((max, max >> 80), (u128::MAX, (1 << 48) - 1));
        let e = read(b"8ZZZZZZZZZZZZZZZZZZZZZZZZZ").unwrap_err();
        assert!(e.to_string().contains("at most '7'"), "{e}");
    }

    #[test]
    fn hex_uuid_and_bytes_forms() {
        let v = read(b"01ARZ3NDEKTSV4RRFFQ69G5FAV").unwrap();
        let mut hex = [0u8; 32];
        uuidv7::write_hex(v, &mut hex);
        assert_eq!(read(&hex), Ok(v));
        let mut uuid = [0u8; 36];
        uuidv7::write_text(v, &mut uuid);
        assert_eq!(read(&uuid), Ok(v));
        assert_eq!(read(&v.to_be_bytes()), Ok(v));
        assert_eq!(read(b"01ARZ3"), Err(UlidError::Length(6)));
        assert!(read(b"01ARZ3NDEKTSV4RRFFQ69G5FAI")
            .unwrap_err()
            .to_string()
            .contains("character 26 ('I')"));
    }

    #[test]
    fn node_bits_sit_at_the_top_of_the_randomness() {
        for node_bits in [0, 10, 20] {
            let p = UlidParts {
                ms: (1 << 48) - 1,
                node: (1 << node_bits) - 1,
                random: (1u128 << (RANDOM_BITS - node_bits)) - 1,
            };
            assert_eq!(pack(&p, node_bits), u128::MAX);
            assert_eq!(unpack(u128::MAX, node_bits), p);
        }
        let p = UlidParts {
            ms: 5,
            node: 3,
            random: 9,
        };
        assert_eq!(unpack(pack(&p, 10), 10), p);
        assert_eq!(pack(&p, 10) >> 70 & 1023, 3);
    }
}
