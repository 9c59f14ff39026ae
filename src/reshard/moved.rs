//! What a copy learnt for its cleanup, so that a resharding walks the keyspace once: the names
//! of the keys the copy's walk found going to another node, in a file in the server's directory
//! (`shard-moved.keys`, the record format of `names`), and the keys written here since the
//! copy's first fork that its ring gives away (`dirty`'s `since` record). A cleanup on the same
//! ring deletes exactly those instead of walking.
//!
//! Why a file and not memory: a copy's list is as long as the data that moves (750 000 names of
//! 16 bytes: 15 MB), which the server's own memory should not hold for as long as an operator
//! takes between COPY and CLEANUP; the copy's child writes it as it walks (it has nothing else
//! to write), and the cleanup reads it back in its time-bounded steps. Why not a child that
//! pipes the names at cleanup time: that child would walk again, which is what costs.
//!
//! The list is believed only while this process saw everything since the copy's walk: a
//! restart or a failover (a new process, or a replica that never copied), a load of an RDB or
//! AOF, a full sync or a `SWAPDB` forget it, as does a copy stopped before its walk ended, and
//! the cleanup walks as it did before. A cleanup that is stopped keeps the list for the next.

use std::cell::RefCell;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use crate::reshard::dirty;
use crate::reshard::names::{Names, Record};
use crate::ring::placement::Placement;

/// The list's file name, in the server's directory.
const FILE: &str = "shard-moved.keys";

/// What the running or last copy learnt.
struct Learnt {
    ring: Arc<Placement>,
    self_name: String,
    /// Where the list is (an absolute path: `CONFIG SET dir` may change the directory).
    path: PathBuf,
    /// A whole walk's list is there.
    complete: bool,
}

thread_local! {
    static LEARNT: RefCell<Option<Learnt>> = const { RefCell::new(None) };
}

/// Where a copy's child writes the list of a walk while it walks (the parent renames it into
/// place once the walk ended well).
fn partial(path: &std::path::Path) -> PathBuf {
    path.with_extension("keys.partial")
}

/// A copy starts on `ring`: what an earlier one learnt goes, and the keys written from now on
/// that move are recorded. The path of the list its walks write, or `None` (no directory).
pub fn begin_copy(ring: &Arc<Placement>, self_name: &str) -> Option<PathBuf> {
    forget();
    let path = std::env::current_dir().ok()?.join(FILE);
    dirty::begin_since(Arc::clone(ring), self_name);
    LEARNT.with(|l| {
        *l.borrow_mut() = Some(Learnt {
            ring: Arc::clone(ring),
            self_name: self_name.to_owned(),
            path: path.clone(),
            complete: false,
        })
    });
    Some(partial(&path))
}

/// A copy's walk ended (`ok`: its child walked every key and wrote every name): its list
/// becomes the one a cleanup reads.
pub fn walk_ended(ok: bool) {
    LEARNT.with(|l| {
        let mut l = l.borrow_mut();
        let Some(learnt) = l.as_mut() else {
            return;
        };
        let from = partial(&learnt.path);
        if ok && std::fs::rename(&from, &learnt.path).is_ok() {
            learnt.complete = true;
        } else {
            let _ = std::fs::remove_file(&from);
        }
    });
}

/// Forgets what was learnt (the keyspace changed behind the list's back, or a copy was
/// stopped) and removes its files: the next cleanup walks.
pub fn forget() {
    dirty::end_since();
    if let Some(learnt) = LEARNT.with(|l| l.borrow_mut().take()) {
        let _ = std::fs::remove_file(&learnt.path);
        let _ = std::fs::remove_file(partial(&learnt.path));
    }
}

/// The list to read for a cleanup on `ring` by `self_name`, when there is a whole one for that
/// very ring and every key written since its walk is known.
pub fn list_for(ring: &Placement, self_name: &str) -> Option<Names> {
    LEARNT.with(|l| {
        let l = l.borrow();
        let learnt = l.as_ref()?;
        let usable = learnt.complete
            && learnt.self_name == self_name
            && learnt.ring.spec == ring.spec
            && dirty::since_whole();
        if !usable {
            return None;
        }
        let file = File::open(&learnt.path).ok()?;
        Some(Names::new(OwnedFd::from(file)))
    })
}

/// The cleanup that read the list is done: what was learnt is spent.
pub fn cleanup_done() {
    forget();
}

/// What a copy's child writes as it walks: the names it found going elsewhere, by database.
pub struct ListWriter {
    out: BufWriter<File>,
    path: PathBuf,
    db: Option<i32>,
    names: u64,
    ok: bool,
}

impl ListWriter {
    /// A new list at `path` (from `begin_copy`), or `None` if it cannot be made.
    pub fn create(path: PathBuf) -> Option<ListWriter> {
        let file = File::create(&path).ok()?;
        Some(ListWriter {
            out: BufWriter::with_capacity(256 * 1024, file),
            path,
            db: None,
            names: 0,
            ok: true,
        })
    }

    /// Adds a name of database `db`.
    pub fn add(&mut self, db: i32, name: &[u8]) {
        if !self.ok {
            return;
        }
        let mut buf = Vec::with_capacity(name.len() + 12);
        if self.db != Some(db) {
            Record::Database(db).write(&mut buf);
            self.db = Some(db);
        }
        Record::Name(name).write(&mut buf);
        self.names += 1;
        // How far the list goes, now and then, for the cleanup's progress as it reads.
        if self.names.is_multiple_of(1024) {
            Record::Walked(self.names).write(&mut buf);
        }
        self.ok = self.out.write_all(&buf).is_ok();
    }

    /// Writes the end of the list; false (and no list left) if any write failed.
    pub fn finish(mut self) -> bool {
        let mut buf = Vec::new();
        Record::Walked(self.names).write(&mut buf);
        let ok = self.ok && self.out.write_all(&buf).is_ok() && self.out.flush().is_ok();
        if !ok {
            let _ = std::fs::remove_file(&self.path);
        }
        ok
    }
}
