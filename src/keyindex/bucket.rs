//! `Bucket`: the names of one ring bucket of one database. Usually one `Page` (a bucket holds
//! about N/16384 names); a bucket that outgrows a page (many keys of one hash tag) becomes a
//! directory of pages by extendible hashing on the name's hash, so that a full page splits in
//! two at a cost bounded by `PAGE_MAX`, never a rehash of the whole bucket.

use std::hash::BuildHasher;

use super::page::{allocated, Page, PAGE_MAX};

/// The directory's hash bits: bits 32.. of the name's hash (the table uses bits 0..32, the
/// control byte bits 57..64).
const MAX_DEPTH: u8 = 25;

/// The names of one bucket (see the module doc).
#[derive(Debug)]
pub(super) enum Bucket {
    /// One page.
    One(Page),
    /// Pages chosen by the low `depth` bits of the hash's upper half.
    Split(Pages),
}

/// A directory of pages.
#[derive(Debug)]
pub(super) struct Pages {
    depth: u8,
    /// For each value of the hash bits, the index of its page.
    dir: Vec<u32>,
    pages: Vec<Page>,
    len: usize,
}

impl Pages {
    #[inline]
    fn index(&self, hash: u64) -> usize {
        let slot = ((hash >> 32) as usize) & ((1usize << self.depth) - 1);
        self.dir.get(slot).map_or(0, |&p| p as usize)
    }

    /// Splits page `p` by its next hash bit, doubling the directory when the page already uses
    /// all of its bits. False when the directory is at its deepest.
    fn split(&mut self, p: usize, hasher: &impl BuildHasher) -> bool {
        let Some(local) = self.pages.get(p).map(|page| page.depth) else {
            return false;
        };
        if local >= MAX_DEPTH {
            return false;
        }
        if local == self.depth {
            self.dir.extend_from_within(..);
            self.depth += 1;
        }
        let moved = self.pages[p].split(u32::from(local), local + 1, hasher);
        let q = self.pages.len() as u32;
        self.pages.push(moved);
        // The directory slots of page p whose bit `local` is set now go to the new page.
        for (slot, page) in self.dir.iter_mut().enumerate() {
            if *page as usize == p && (slot >> local) & 1 == 1 {
                *page = q;
            }
        }
        true
    }
}

impl Bucket {
    pub(super) fn new() -> Bucket {
        Bucket::One(Page::default())
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Bucket::One(p) => p.len(),
            Bucket::Split(s) => s.len,
        }
    }

    fn page(&self, hash: u64) -> Option<&Page> {
        match self {
            Bucket::One(p) => Some(p),
            Bucket::Split(s) => s.pages.get(s.index(hash)),
        }
    }

    pub(super) fn contains(&self, name: &[u8], hash: u64) -> bool {
        self.page(hash)
            .is_some_and(|p| p.find(name, hash).is_some())
    }

    /// Adds `name`; false if it was there.
    pub(super) fn insert(&mut self, name: &[u8], hash: u64, hasher: &impl BuildHasher) -> bool {
        if self.contains(name, hash) {
            return false;
        }
        if let Bucket::One(p) = self {
            if p.len() < PAGE_MAX {
                return p.insert_new(name, hash, hasher);
            }
            let page = std::mem::take(p);
            *self = Bucket::Split(Pages {
                depth: 0,
                dir: vec![0],
                len: page.len(),
                pages: vec![page],
            });
        }
        let Bucket::Split(s) = self else {
            return false;
        };
        let mut p = s.index(hash);
        while s.pages.get(p).is_some_and(|page| page.len() >= PAGE_MAX) && s.split(p, hasher) {
            p = s.index(hash);
        }
        let Some(page) = s.pages.get_mut(p) else {
            return false;
        };
        let added = page.insert_new(name, hash, hasher);
        s.len += usize::from(added);
        added
    }

    /// Removes `name`; false if it was not there.
    pub(super) fn remove(&mut self, name: &[u8], hash: u64, hasher: &impl BuildHasher) -> bool {
        match self {
            Bucket::One(p) => p.remove(name, hash, hasher),
            Bucket::Split(s) => {
                let p = s.index(hash);
                let removed = s
                    .pages
                    .get_mut(p)
                    .is_some_and(|page| page.remove(name, hash, hasher));
                s.len -= usize::from(removed);
                removed
            }
        }
    }

    /// The pages, to walk the names.
    pub(super) fn pages(&self) -> &[Page] {
        match self {
            Bucket::One(p) => std::slice::from_ref(p),
            Bucket::Split(s) => &s.pages,
        }
    }

    /// Bytes this bucket holds on the heap, beyond its own struct.
    pub(super) fn heap_bytes(&self) -> usize {
        match self {
            Bucket::One(p) => p.heap_bytes(),
            Bucket::Split(s) => {
                allocated(s.dir.capacity() * 4)
                    + allocated(s.pages.capacity() * std::mem::size_of::<Page>())
                    + s.pages.iter().map(Page::heap_bytes).sum::<usize>()
            }
        }
    }
}
