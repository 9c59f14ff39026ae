//! redis-shard 0.3.7 `HashRing` (crc32): 128 points `crc32("<name>:<x>")` per node, no weights;
//! `i = bisect_right(points, crc32(key))`, then `min(i, len - 1)`: no wrap, a hash above the
//! last point goes to the last point's node. A later node overwrites an equal point.

use super::error::RingError;
use super::ketama::push_decimal;
use super::points::Points;
use super::spec::RingSpec;

/// Points per node.
pub const REPLICAS: u64 = 128;

/// zlib CRC-32 of bytes.
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// The bytes redis-shard hashes for a node name: python's `str.encode('iso-8859-1')` when every
/// character fits in latin-1 (redis-shard raises otherwise; then the UTF-8 bytes are used).
fn name_bytes(name: &str, out: &mut Vec<u8>) {
    if name.chars().all(|c| u32::from(c) <= 0xff) {
        out.extend(name.chars().map(|c| u32::from(c) as u8));
    } else {
        out.extend_from_slice(name.as_bytes());
    }
}

pub(crate) fn build(spec: &RingSpec) -> Result<Points<u32>, RingError> {
    let mut entries = Vec::with_capacity(spec.nodes.len() * REPLICAS as usize);
    let mut buf = Vec::with_capacity(300);
    for (k, node) in spec.nodes.iter().enumerate() {
        for x in 0..REPLICAS {
            buf.clear();
            name_bytes(&node.name, &mut buf);
            buf.push(b':');
            push_decimal(&mut buf, x);
            entries.push((crc32(&buf), k as u32));
        }
    }
    Points::build(entries)
}

/// Index of the point that owns hash `h`.
pub(crate) fn lookup(points: &Points<u32>, h: u32) -> usize {
    points.first_greater(h).min(points.len().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF43926);
    }

    #[test]
    fn latin1_names() {
        let mut b = Vec::new();
        name_bytes("caf\u{e9}", &mut b);
        assert_eq!(b, b"caf\xe9");
        b.clear();
        name_bytes("\u{2603}", &mut b);
        assert_eq!(b, "\u{2603}".as_bytes());
    }
}
