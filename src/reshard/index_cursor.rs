//! A walk of the key index in steps on the main thread: the names of the buckets a ring does
//! not give wholly to this node, one page of names at a time (at most the index's `PAGE_MAX`,
//! copied, so that no borrow of the index outlives the step: a lookup may expire a key, whose
//! event changes the index). A page's index in its bucket is stable while names come and go
//! (`KeyIndex::page_count`), so a key present through the whole walk is seen (once, or twice
//! after its page split); what is written meanwhile is the caller's to follow (`dirty`). Used
//! by a copy's pass in steps (`copy_steps`) and by a cleanup that needs no fork (`cleanup_job`).

use std::sync::Arc;

use crate::ring::placement::Placement;

/// What the cursor gives next.
pub enum Next {
    /// Names of one page, of this database.
    Names(i32, Vec<Vec<u8>>),
    /// Every page was visited.
    End,
    /// The index is no longer ready for the ring: the walk cannot go on.
    NotReady,
}

/// A position in the index.
pub struct IndexCursor {
    ring: Arc<Placement>,
    visit: Vec<bool>,
    dbs: Vec<i32>,
    db_at: usize,
    bucket: usize,
    page: usize,
}

impl IndexCursor {
    /// A walk of the buckets `ring` does not give wholly to `self_name` (all of them when it
    /// names no node), in the databases the index holds now; `None` when the index is not
    /// ready for `ring`.
    pub fn new(ring: &Arc<Placement>, self_name: &str) -> Option<IndexCursor> {
        let r = ring.ring.as_ref()?;
        let visit = r.buckets_not_wholly_of(r.spec().node_index(self_name));
        let dbs = crate::index::with_ready(ring, |index| index.databases().collect())?;
        Some(IndexCursor {
            ring: Arc::clone(ring),
            visit,
            dbs,
            db_at: 0,
            bucket: 0,
            page: 0,
        })
    }

    /// The next page's names.
    pub fn next_page(&mut self) -> Next {
        let (visit, dbs) = (&self.visit, &self.dbs);
        let (db_at, bucket, page) = (&mut self.db_at, &mut self.bucket, &mut self.page);
        crate::index::with_ready(&self.ring, |index| loop {
            let Some(&db) = dbs.get(*db_at) else {
                return Next::End;
            };
            let Some(&wanted) = visit.get(*bucket) else {
                *db_at += 1;
                *bucket = 0;
                *page = 0;
                continue;
            };
            let b = u16::try_from(*bucket).unwrap_or(u16::MAX);
            if !wanted || *page >= index.page_count(db, b) {
                *bucket += 1;
                *page = 0;
                continue;
            }
            *page += 1;
            return Next::Names(db, index.page_names(db, b, *page - 1));
        })
        .unwrap_or(Next::NotReady)
    }
}
