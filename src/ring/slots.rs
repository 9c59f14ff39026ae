//! Redis Cluster hash slots: `CRC16/XMODEM(tag) & 16383`, and the `slots` ring: the spec's
//! explicit slot map (`slot_map`) when it has one, else the 16384 slots split into contiguous
//! ranges, one per node in listed order, in proportion to the weights (with equal weights
//! exactly the split `redis-cli --cluster create` makes).

use super::error::RingError;
use super::hashtag::HashTag;
use super::slot_map::{self, Ranges};
use super::spec::RingSpec;

/// Number of hash slots.
pub const SLOTS: usize = 16384;

/// CRC-16/XMODEM, with its 256-entry table built at compile time.
static XMODEM: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

/// CRC-16/XMODEM (poly 0x1021, init 0, no reflection), the CRC Redis Cluster uses.
pub fn crc16(data: &[u8]) -> u16 {
    XMODEM.checksum(data)
}

/// The slot of already tag-extracted bytes.
pub fn slot_of(hashed: &[u8]) -> u16 {
    crc16(hashed) & (SLOTS as u16 - 1)
}

/// `CLUSTER KEYSLOT key`: the Redis Cluster hash-tag rule, then the slot.
pub fn key_slot(key: &[u8]) -> u16 {
    slot_of(HashTag::Cluster.extract(key))
}

/// The slots of a ring: per slot its owner, per node its inclusive ranges in slot order.
#[derive(Debug, Clone)]
pub(crate) struct SlotMap {
    owner: Vec<u16>,
    ranges: Vec<Ranges>,
}

impl SlotMap {
    pub(crate) fn owner(&self, slot: u16) -> usize {
        usize::from(self.owner[usize::from(slot) & (SLOTS - 1)])
    }

    pub(crate) fn ranges(&self) -> &[Ranges] {
        &self.ranges
    }
}

/// The slots of a `slots` ring: its explicit map (checked again: the spec's fields are public),
/// or the contiguous split of its weights.
pub(crate) fn build(spec: &RingSpec) -> Result<SlotMap, RingError> {
    let ranges = match &spec.slot_map {
        Some(map) => {
            let names: Vec<&str> = spec.nodes.iter().map(|n| n.name.as_str()).collect();
            slot_map::check_cover(&names, map)?
        }
        None => contiguous(spec)?.into_iter().map(|r| vec![r]).collect(),
    };
    let mut owner = vec![0u16; SLOTS];
    for (i, node) in ranges.iter().enumerate() {
        for &(a, b) in node {
            for s in a..=b {
                owner[usize::from(s) & (SLOTS - 1)] = i as u16;
            }
        }
    }
    Ok(SlotMap { owner, ranges })
}

/// Splits the slots like redis-cli's `clusterManagerCommandCreate`, generalized to weights:
///
/// ```text
/// float slots_per_node = 16384 / (float) masters_count; float cursor = 0; long first = 0;
/// for each master i: last = lround(cursor + slots_per_node - 1);
///     if (last > 16384 || i == last master) last = 16383; if (last < first) last = first;
///     assign first..=last; first = last + 1; cursor += slots_per_node;
/// ```
///
/// (This code clamps `last` at 16383, where redis-cli tests `> 16384`; no equal split reaches
/// either.) Node i's share is `(float)(16384 * w_i) / (float) W` in single precision. Both operands are
/// exact in an f32 (below 2^24), so with equal weights the correctly rounded quotient is
/// bit-for-bit redis-cli's `16384 / (float) N`, and so is every later step. Every node gets at
/// least one slot, or the split is refused.
pub(crate) fn contiguous(spec: &RingSpec) -> Result<Vec<(u16, u16)>, RingError> {
    let n = spec.nodes.len();
    if n == 0 {
        return Err(RingError::new("a ring needs at least one node"));
    }
    if n > SLOTS {
        return Err(RingError::new(format!(
            "the slots algo can split 16384 slots among at most 16384 nodes, got {}",
            n
        )));
    }
    let total = spec.total_weight() as f32;
    let mut ranges = Vec::with_capacity(n);
    let mut first: i64 = 0;
    let mut cursor: f32 = 0.0;
    for (i, node) in spec.nodes.iter().enumerate() {
        let share: f32 = (SLOTS as f32 * node.weight as f32) / total;
        let mut last = f64::from(cursor + share - 1.0).round() as i64;
        if last > SLOTS as i64 - 1 || i == n - 1 {
            last = SLOTS as i64 - 1;
        }
        if last < first {
            last = first;
        }
        if first > SLOTS as i64 - 1 {
            return Err(RingError::new(format!(
                "the slots algo leaves node '{}' without a slot: too many nodes for 16384 slots at these weights",
                node.name
            )));
        }
        ranges.push((first as u16, last as u16));
        first = last + 1;
        cursor += share;
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_check_value_and_keyslot_vectors() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // CLUSTER KEYSLOT on redis-server 7.0 with cluster-enabled yes.
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(key_slot(b"{user1}.following"), 8106);
        assert_eq!(key_slot(b"{user1}.followers"), 8106);
        assert_eq!(key_slot(b""), 0);
    }
}
