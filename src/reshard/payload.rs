//! The `DUMP` payload of a string value, built without the server: a copy serializes small
//! strings (most keys of most datasets) this way, since asking the server for `DUMP` costs a
//! full command call per key, several times what the bytes cost.
//!
//! The format is the RDB encoding of one value, as `RESTORE` reads it: the type byte
//! (`RDB_TYPE_STRING`, 0), the length in RDB's length encoding, the bytes, the RDB version (two
//! bytes, little-endian: the version the source's own `DUMP` writes, learnt from one real
//! `DUMP` at the start of a pass, so a destination accepts it exactly when it accepts the
//! server's own payloads) and a CRC-64 (Redis's Jones polynomial, `crc`'s `CRC_64_REDIS`) of
//! all that. The value is always written as raw bytes, never integer-encoded or LZF-compressed:
//! `RESTORE` accepts every encoding and decides how to store the value itself.

use crc::{Crc, CRC_64_REDIS};

const CRC64: Crc<u64> = Crc::<u64>::new(&CRC_64_REDIS);

/// The RDB version of a real `DUMP` payload (its two bytes before the checksum).
pub fn rdb_version(dump: &[u8]) -> Option<u16> {
    let n = dump.len();
    (n >= 10).then(|| u16::from_le_bytes([dump[n - 10], dump[n - 9]]))
}

/// Appends RDB's length encoding of `len`.
fn push_len(out: &mut Vec<u8>, len: usize) {
    if len < 1 << 6 {
        out.push(len as u8);
    } else if len < 1 << 14 {
        out.push(0x40 | (len >> 8) as u8);
        out.push(len as u8);
    } else if let Ok(small) = u32::try_from(len) {
        out.push(0x80);
        out.extend_from_slice(&small.to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// Writes the payload of the string `value` into `out` (cleared first).
pub fn string_payload(out: &mut Vec<u8>, value: &[u8], version: u16) {
    out.clear();
    out.reserve(value.len() + 20);
    out.push(0); // RDB_TYPE_STRING
    push_len(out, value.len());
    out.extend_from_slice(value);
    out.extend_from_slice(&version.to_le_bytes());
    let crc = CRC64.checksum(out);
    out.extend_from_slice(&crc.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_what_redis_7_dumps_for_a_short_string() {
        // `SET k hello` then `DUMP k` on Redis 7.0.15.
        let real = b"\x00\x05hello\x0a\x00cr\xdfve4 \x0a";
        assert_eq!(rdb_version(real), Some(10));
        let mut out = Vec::new();
        string_payload(&mut out, b"hello", 10);
        assert_eq!(out, real);
    }

    #[test]
    fn length_encodings() {
        for (len, head) in [
            (0usize, vec![0u8]),
            (63, vec![63]),
            (64, vec![0x40, 64]),
            (16383, vec![0x7f, 0xff]),
            (16384, vec![0x80, 0, 0, 0x40, 0]),
        ] {
            let mut out = Vec::new();
            push_len(&mut out, len);
            assert_eq!(out, head, "{len}");
        }
        let mut out = Vec::new();
        string_payload(&mut out, &vec![7u8; 100_000], 11);
        assert_eq!(out.len(), 1 + 5 + 100_000 + 2 + 8);
        assert_eq!(rdb_version(&out), Some(11));
    }
}
