//! `Page`: a small set of names, built for memory: the names packed in one arena (a length, then
//! the bytes), and an open-addressing table of 5-byte records (a control byte holding 7 bits of
//! the name's hash, then the entry's offset in the arena). Linear probing, deletion by backward
//! shift (no tombstones). The table is at most 80% full: it grows by about a quarter when it
//! would be fuller, shrinks when under 25% full, and is 62% full after either; the arena grows
//! by a quarter (to the allocator's next size class) and is compacted when a quarter of it is
//! dead. Every step is bounded by the page's size, which its bucket keeps under `PAGE_MAX`
//! entries by splitting it.
//!
//! A name of `LONG_NAME` bytes or more lives in its own allocation beside its hash (`big`), so
//! that no step ever copies or hashes a long name again.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

/// The control byte of a free record (a used one holds the hash's top 7 bits: 0..=127).
const EMPTY: u8 = 0x80;
/// Bytes of a record: the control byte, then the entry's reference (u32, little-endian).
const RECORD: usize = 5;
/// A reference with this bit is an index in `big`; without it, an offset in the arena.
const BIG: u32 = 1 << 31;
/// Names this long or longer live in their own allocation, beside their hash.
pub(super) const LONG_NAME: usize = 1024;
/// Entries a page may hold before its bucket splits it.
pub(super) const PAGE_MAX: usize = 1024;
/// The smallest table.
const MIN_CAP: usize = 4;

/// A long name and its hash.
type Long = (u64, Box<[u8]>);

/// A set of names (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Page {
    /// `cap` records (control byte, then reference), then the arena: the names, each a LEB128
    /// length then the bytes, dead ones kept until compaction. One allocation, so that the
    /// record and the name a lookup reads are near each other.
    data: Vec<u8>,
    /// Long names and their hashes.
    big: Vec<Long>,
    /// Records in the table.
    cap: u32,
    /// Live entries.
    len: u32,
    /// Dead bytes in the arena.
    garbage: u32,
    /// The hash bits its bucket's directory used to choose this page (`bucket.rs`).
    pub(super) depth: u8,
}

/// Where a name's probe starts in a table of `cap` records (`cap > 0`).
#[inline]
fn home(hash: u64, cap: usize) -> usize {
    (((hash & 0xffff_ffff) * cap as u64) >> 32) as usize
}

/// The 7 bits of the hash kept in the control byte.
#[inline]
fn tag(hash: u64) -> u8 {
    (hash >> 57) as u8
}

/// A table of `cap` free records, with room for `arena` bytes of names after it.
fn fresh(cap: usize, arena: usize) -> Vec<u8> {
    let mut data = Vec::with_capacity(size_class(cap * RECORD + arena));
    for _ in 0..cap {
        data.extend_from_slice(&[EMPTY, 0, 0, 0, 0]);
    }
    data
}

/// `n` rounded up to the size class of jemalloc (Redis's allocator), which gives a request
/// that much anyway: 16-byte steps up to 128, then four classes for each doubling.
pub(super) fn size_class(n: usize) -> usize {
    if n <= 8 {
        return 8;
    }
    if n <= 128 {
        return n.div_ceil(16) * 16;
    }
    let step = 1usize << ((usize::BITS - 1 - (n - 1).leading_zeros()) - 2);
    n.div_ceil(step) * step
}

/// What an allocation of `n` bytes costs (none for 0: no allocation).
pub(super) fn allocated(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        size_class(n)
    }
}

/// The reference in a record.
#[inline]
fn reference_in(record: &[u8]) -> u32 {
    u32::from_le_bytes([record[1], record[2], record[3], record[4]])
}

/// The table size that holds `n` entries about 62% full.
fn cap_for(n: usize) -> usize {
    (n * 8 / 5 + 1).max(MIN_CAP)
}

/// Whether a table of `cap` records is too full for `n` entries (over 80%).
fn too_full(n: usize, cap: usize) -> bool {
    n * 5 > cap * 4
}

/// The name at `offset` of an arena, and the bytes its entry takes.
#[inline]
fn arena_entry(arena: &[u8], offset: usize) -> (&[u8], usize) {
    let (mut len, mut shift, mut at) = (0usize, 0u32, offset);
    while let Some(&b) = arena.get(at) {
        len |= usize::from(b & 0x7f) << shift;
        at += 1;
        shift += 7;
        if b & 0x80 == 0 {
            break;
        }
    }
    let name = arena.get(at..at + len).unwrap_or(&[]);
    (name, at + len - offset)
}

/// Appends an entry for `name` to an arena.
fn push_entry(arena: &mut Vec<u8>, name: &[u8]) {
    let mut n = name.len();
    while n >= 0x80 {
        arena.push((n as u8) | 0x80);
        n >>= 7;
    }
    arena.push(n as u8);
    arena.extend_from_slice(name);
}

impl Page {
    /// A page sized for `n` entries and `arena` bytes of names.
    fn with_capacity(n: usize, arena: usize, depth: u8) -> Page {
        let cap = cap_for(n);
        Page {
            data: fresh(cap, arena),
            cap: cap as u32,
            depth,
            ..Page::default()
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len as usize
    }

    #[inline]
    fn cap(&self) -> usize {
        self.cap as usize
    }

    /// The arena.
    #[inline]
    fn arena(&self) -> &[u8] {
        self.data.get(self.cap() * RECORD..).unwrap_or(&[])
    }

    #[inline]
    fn control(&self, i: usize) -> u8 {
        self.data[i * RECORD]
    }

    #[inline]
    fn reference(&self, i: usize) -> u32 {
        reference_in(&self.data[i * RECORD..i * RECORD + RECORD])
    }

    #[inline]
    fn set(&mut self, i: usize, control: u8, reference: u32) {
        let r = &mut self.data[i * RECORD..i * RECORD + RECORD];
        r[0] = control;
        r[1..].copy_from_slice(&reference.to_le_bytes());
    }

    /// The name a reference points at.
    #[inline]
    fn name(&self, reference: u32) -> &[u8] {
        if reference & BIG != 0 {
            self.big
                .get((reference & !BIG) as usize)
                .map_or(&[], |b| &b.1)
        } else {
            arena_entry(self.arena(), reference as usize).0
        }
    }

    /// The hash of the entry a reference points at.
    fn hash_of(&self, reference: u32, hasher: &impl BuildHasher) -> u64 {
        if reference & BIG != 0 {
            self.big.get((reference & !BIG) as usize).map_or(0, |b| b.0)
        } else {
            hasher.hash_one(self.name(reference))
        }
    }

    /// The record holding `name`.
    pub(super) fn find(&self, name: &[u8], hash: u64) -> Option<usize> {
        let cap = self.cap();
        if cap == 0 {
            return None;
        }
        let (tag, mut i) = (tag(hash), home(hash, cap));
        for _ in 0..cap {
            let c = self.control(i);
            if c == EMPTY {
                return None;
            }
            if c == tag && self.name(self.reference(i)) == name {
                return Some(i);
            }
            i = if i + 1 == cap { 0 } else { i + 1 };
        }
        None
    }

    /// Adds `name`, known to be absent. False only if the page cannot address it (an arena
    /// and a list of long names of 2^31 entries each: never).
    pub(super) fn insert_new(&mut self, name: &[u8], hash: u64, hasher: &impl BuildHasher) -> bool {
        let n = self.len() + 1;
        if too_full(n, self.cap()) {
            self.resize(cap_for(n), hasher);
        }
        let Some(reference) = self.store(name, hash) else {
            return false;
        };
        self.place(hash, reference);
        self.len += 1;
        true
    }

    /// Stores a name in the arena or in `big`; its reference.
    fn store(&mut self, name: &[u8], hash: u64) -> Option<u32> {
        let need = name.len() + 2;
        let offset = self.data.len() - self.cap() * RECORD;
        if name.len() >= LONG_NAME || offset + need >= BIG as usize {
            let index = u32::try_from(self.big.len()).ok().filter(|&i| i < BIG)?;
            self.big.push((hash, name.into()));
            return Some(BIG | index);
        }
        if self.data.capacity() - self.data.len() < need {
            // A quarter of the arena more at a time: its slack stays small.
            let want = size_class(self.data.len() + need.max(offset / 4).max(16));
            self.data.reserve_exact(want - self.data.len());
        }
        push_entry(&mut self.data, name);
        Some(offset as u32)
    }

    /// Puts a reference in the first free record from the hash's home.
    fn place(&mut self, hash: u64, reference: u32) {
        let cap = self.cap();
        let mut i = home(hash, cap);
        for _ in 0..cap {
            if self.control(i) == EMPTY {
                self.set(i, tag(hash), reference);
                return;
            }
            i = if i + 1 == cap { 0 } else { i + 1 };
        }
    }

    /// Removes `name` if present.
    pub(super) fn remove(&mut self, name: &[u8], hash: u64, hasher: &impl BuildHasher) -> bool {
        let Some(i) = self.find(name, hash) else {
            return false;
        };
        let reference = self.reference(i);
        self.unlink(i, hasher);
        self.release(reference);
        self.len -= 1;
        let (len, cap) = (self.len(), self.cap());
        if len == 0 {
            let depth = self.depth;
            *self = Page {
                depth,
                ..Page::default()
            };
        } else if cap > MIN_CAP && len * 4 < cap {
            self.resize(cap_for(len), hasher);
        } else if self.garbage > 64 && self.garbage as usize * 4 > self.arena().len() {
            self.compact();
        }
        true
    }

    /// Frees record `i`, shifting back the records after it that may move nearer their home.
    fn unlink(&mut self, i: usize, hasher: &impl BuildHasher) {
        let cap = self.cap();
        let mut hole = i;
        let mut j = i;
        for _ in 0..cap {
            j = if j + 1 == cap { 0 } else { j + 1 };
            let c = self.control(j);
            if c == EMPTY {
                break;
            }
            let reference = self.reference(j);
            let h = home(self.hash_of(reference, hasher), cap);
            // The record may fill the hole unless its home lies in (hole, j], cyclically.
            let stays = if hole <= j {
                hole < h && h <= j
            } else {
                h > hole || h <= j
            };
            if !stays {
                self.set(hole, c, reference);
                hole = j;
            }
        }
        self.set(hole, EMPTY, 0);
    }

    /// Frees the storage of a removed entry (a long name's last one takes its index).
    fn release(&mut self, reference: u32) {
        if reference & BIG == 0 {
            let bytes = arena_entry(self.arena(), reference as usize).1;
            self.garbage += bytes as u32;
            return;
        }
        let index = (reference & !BIG) as usize;
        if index >= self.big.len() {
            return;
        }
        let last = self.big.len() - 1;
        self.big.swap_remove(index);
        if index == last {
            return;
        }
        // Point the record of the moved name at its new index.
        let (hash, cap) = (self.big[index].0, self.cap());
        let mut i = home(hash, cap);
        for _ in 0..cap {
            if self.control(i) != EMPTY && self.reference(i) == BIG | last as u32 {
                self.set(i, tag(hash), BIG | index as u32);
                return;
            }
            i = if i + 1 == cap { 0 } else { i + 1 };
        }
    }

    /// Moves the entries of `old` (a table of `old_cap` records and its arena) into this page's
    /// empty table, packing the arena: with a hasher the records are placed anew, without one
    /// each record stays where it was.
    fn refill<H: BuildHasher>(&mut self, old: &[u8], old_cap: usize, hasher: Option<&H>) {
        let (table, arena) = old.split_at((old_cap * RECORD).min(old.len()));
        for (i, record) in table.chunks_exact(RECORD).enumerate() {
            if record[0] == EMPTY {
                continue;
            }
            let mut reference = reference_in(record);
            let mut h = 0;
            if reference & BIG != 0 {
                h = self.big.get((reference & !BIG) as usize).map_or(0, |b| b.0);
            } else {
                let name = arena_entry(arena, reference as usize).0;
                reference = (self.data.len() - self.cap() * RECORD) as u32;
                push_entry(&mut self.data, name);
                if let Some(hasher) = hasher {
                    h = hasher.hash_one(name);
                }
            }
            if hasher.is_some() {
                self.place(h, reference);
            } else {
                self.set(i, record[0], reference);
            }
        }
    }

    /// A new table of `cap` records and a packed arena.
    fn resize(&mut self, cap: usize, hasher: &impl BuildHasher) {
        let old_cap = self.cap();
        let old = std::mem::take(&mut self.data);
        let live =
            (old.len().saturating_sub(old_cap * RECORD)).saturating_sub(self.garbage as usize);
        self.data = fresh(cap, live);
        self.cap = cap as u32;
        self.garbage = 0;
        self.refill(&old, old_cap, Some(hasher));
    }

    /// The arena without its dead entries (each record stays where it is).
    fn compact(&mut self) {
        let cap = self.cap();
        let old = std::mem::take(&mut self.data);
        let live = (old.len().saturating_sub(cap * RECORD)).saturating_sub(self.garbage as usize);
        self.data = fresh(cap, live);
        self.garbage = 0;
        self.refill(&old, cap, None::<&RandomState>);
    }

    /// Splits the page by hash bit `bit` (of the hash's upper half): the entries without it
    /// stay, those with it go to the page returned; both at depth `depth`.
    pub(super) fn split(&mut self, bit: u32, depth: u8, hasher: &impl BuildHasher) -> Page {
        let old = std::mem::take(self);
        let arena = old.data.get(old.cap() * RECORD..).unwrap_or(&[]);
        let mut entries: Vec<(u64, u32)> = Vec::with_capacity(old.len());
        let (mut ones, mut one_bytes, mut zero_bytes) = (0, 0, 0);
        for i in 0..old.cap() {
            if old.control(i) == EMPTY {
                continue;
            }
            let reference = old.reference(i);
            let hash = old.hash_of(reference, hasher);
            let bytes = if reference & BIG == 0 {
                arena_entry(arena, reference as usize).1
            } else {
                0
            };
            if (hash >> (32 + bit)) & 1 == 1 {
                ones += 1;
                one_bytes += bytes;
            } else {
                zero_bytes += bytes;
            }
            entries.push((hash, reference));
        }
        *self = Page::with_capacity(entries.len() - ones, zero_bytes, depth);
        let mut moved = Page::with_capacity(ones, one_bytes, depth);
        let mut big: Vec<Option<Long>> = old.big.into_iter().map(Some).collect();
        for (hash, reference) in entries {
            let to = if (hash >> (32 + bit)) & 1 == 1 {
                &mut moved
            } else {
                &mut *self
            };
            let new_reference = if reference & BIG != 0 {
                let Some(Some(entry)) = big.get_mut((reference & !BIG) as usize).map(Option::take)
                else {
                    continue;
                };
                to.big.push(entry);
                BIG | (to.big.len() - 1) as u32
            } else {
                let offset = (to.data.len() - to.cap() * RECORD) as u32;
                push_entry(&mut to.data, arena_entry(arena, reference as usize).0);
                offset
            };
            to.place(hash, new_reference);
            to.len += 1;
        }
        moved
    }

    /// The live names, in table order.
    pub(super) fn names(&self) -> PageNames<'_> {
        PageNames { page: self, at: 0 }
    }

    /// Bytes this page holds on the heap, each allocation counted at its size class.
    pub(super) fn heap_bytes(&self) -> usize {
        allocated(self.data.capacity())
            + allocated(self.big.capacity() * std::mem::size_of::<Long>())
            + self.big.iter().map(|b| allocated(b.1.len())).sum::<usize>()
    }
}

/// The names of a page, in table order.
#[derive(Debug, Clone)]
pub(super) struct PageNames<'a> {
    page: &'a Page,
    at: usize,
}

impl<'a> Iterator for PageNames<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let page = self.page;
        while self.at < page.cap() {
            let i = self.at;
            self.at += 1;
            if page.control(i) != EMPTY {
                return Some(page.name(page.reference(i)));
            }
        }
        None
    }
}
