//! Command names to their entries, read by the command filter on every command while
//! `route-plain` is on: a name of up to 24 bytes is lower-cased word by word into three
//! words, then found by one probe (rarely a few) of an open-addressing table of such words;
//! a longer name is looked up in a map by its lower-case bytes. Built whole, read only
//! (`command_table` publishes a new one on each learn).

use rustc_hash::FxHashMap;

/// The longest name the table's words hold.
const SHORT: usize = 24;

/// Names to values, by name in any ASCII case.
#[derive(Clone)]
pub struct NameTable<V: Copy> {
    /// Every entry by lower-case name: what a new table is built from.
    all: FxHashMap<Vec<u8>, V>,
    /// The names of up to `SHORT` bytes, by their words: a power of two of slots, at most half
    /// of them taken.
    slots: Box<[Slot<V>]>,
}

#[derive(Clone, Copy)]
struct Slot<V: Copy> {
    words: [u64; 3],
    /// The name's length (0: an empty slot; no name is empty).
    len: usize,
    value: Option<V>,
}

impl<V: Copy> Default for NameTable<V> {
    fn default() -> Self {
        NameTable::build(FxHashMap::default())
    }
}

impl<V: Copy + PartialEq> NameTable<V> {
    /// The entries with `entries` added (their names in any case); `None` when none of them
    /// is new or changed.
    pub fn with(&self, entries: impl IntoIterator<Item = (Vec<u8>, V)>) -> Option<NameTable<V>> {
        let mut all = self.all.clone();
        let mut changed = false;
        for (mut name, value) in entries {
            name.make_ascii_lowercase();
            changed |= all.insert(name, value) != Some(value);
        }
        changed.then(|| NameTable::build(all))
    }
}

impl<V: Copy> NameTable<V> {
    fn build(all: FxHashMap<Vec<u8>, V>) -> NameTable<V> {
        let short = all.keys().filter(|n| !n.is_empty() && n.len() <= SHORT);
        let size = (short.count() * 2).next_power_of_two().max(16);
        let empty = Slot {
            words: [0; 3],
            len: 0,
            value: None,
        };
        let mut slots = vec![empty; size].into_boxed_slice();
        for (name, value) in &all {
            let Some(words) = pack(name) else {
                continue;
            };
            let mut at = spot(&words, size);
            while slots[at].len != 0 {
                at = (at + 1) & (size - 1);
            }
            slots[at] = Slot {
                words,
                len: name.len(),
                value: Some(*value),
            };
        }
        NameTable { all, slots }
    }

    /// The value of `name`, in any case.
    #[inline]
    pub fn get(&self, name: &[u8]) -> Option<V> {
        let Some(words) = pack(name) else {
            return self.get_long(name);
        };
        let mask = self.slots.len() - 1;
        let mut at = spot(&words, self.slots.len());
        loop {
            let slot = self.slots.get(at)?;
            if slot.len == 0 {
                return None;
            }
            if slot.words == words && slot.len == name.len() {
                return slot.value;
            }
            at = (at + 1) & mask;
        }
    }

    /// A name longer than the words hold (or empty).
    #[cold]
    fn get_long(&self, name: &[u8]) -> Option<V> {
        self.all.get(&name.to_ascii_lowercase()).copied()
    }

    /// How many names the table has.
    pub fn len(&self) -> usize {
        self.all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }
}

/// The slot a name's words start looking at, in a table of `size` (a power of two).
#[inline(always)]
fn spot(words: &[u64; 3], size: usize) -> usize {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let h = (words[0].wrapping_mul(K).rotate_left(23) ^ words[1] ^ words[2].rotate_left(17))
        .wrapping_mul(K);
    (h >> 40) as usize & (size - 1)
}

/// A name of 1 to `SHORT` bytes as three little-endian words, zero-padded, ASCII lower-cased.
#[inline(always)]
fn pack(name: &[u8]) -> Option<[u64; 3]> {
    if name.is_empty() || name.len() > SHORT {
        return None;
    }
    let mut words = [0u64; 3];
    for (i, &b) in name.iter().enumerate() {
        words[i / 8] |= u64::from(b) << (8 * (i % 8));
    }
    // Only the words the name reaches (the others are zero).
    for w in words.iter_mut().take(name.len().div_ceil(8)) {
        *w = lower(*w);
    }
    Some(words)
}

/// Eight bytes ASCII lower-cased at once (the others left as they are).
#[inline(always)]
fn lower(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let low7 = x & !HIGH;
    // Bit 7 of each byte: its low seven bits are at least 'A', resp. more than 'Z' (no carry
    // leaves a byte: at most 0x7f + 0x3f).
    let at_least_a = low7 + (0x80 - u64::from(b'A')) * ONES;
    let above_z = low7 + (0x80 - u64::from(b'Z') - 1) * ONES;
    let upper = at_least_a & !above_z & !x & HIGH;
    x | (upper >> 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_case_word_by_word_as_bytes_are() {
        for b in 0..=255u8 {
            let x = u64::from_le_bytes([b, b'A', b'z', b'@', b'[', b, 0xc1, b'Z']);
            let mut want = x.to_le_bytes();
            want.make_ascii_lowercase();
            assert_eq!(lower(x).to_le_bytes(), want, "byte {b}");
        }
    }

    #[test]
    fn names_found_in_any_case_and_only_them() {
        let names: Vec<String> = (0..300)
            .map(|i| format!("cmd{i}{}", "x".repeat(i % 30)))
            .collect();
        let table = NameTable::default()
            .with(
                names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n.as_bytes().to_vec(), i)),
            )
            .expect("new entries");
        assert_eq!(table.len(), 300);
        for (i, n) in names.iter().enumerate() {
            assert_eq!(table.get(n.as_bytes()), Some(i), "{n}");
            assert_eq!(table.get(n.to_ascii_uppercase().as_bytes()), Some(i), "{n}");
            let mut longer = n.as_bytes().to_vec();
            longer.push(0);
            assert_eq!(table.get(&longer), None, "{n} and a NUL");
        }
        assert_eq!(table.get(b""), None);
        assert_eq!(table.get(b"cmd"), None);
        assert_eq!(table.get(&[b'c'; 100]), None);
        assert!(table.with([(b"CMD0".to_vec(), 0)]).is_none(), "nothing new");
        let more = table.with([(b"GET".to_vec(), 7)]).expect("one more");
        assert_eq!(
            (more.get(b"get"), more.get(b"cmd5xxxxx")),
            (Some(7), Some(5))
        );
    }
}
