//! What a copy learnt for its cleanup, so that a resharding walks the keyspace once: the names
//! of the keys the copy's walk found going to another node, in a file in the server's directory
//! named after its RDB file and its port (`dump.rdb.shard-moved.6379`: servers that share a
//! directory, even with the same `dbfilename`, do not share it, and the next copy of a server
//! overwrites what a crash left; the record format of `names`, ended by the count of its
//! names), and the keys written here since the
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

use crate::host::names::{Names, Record};
use crate::reshard::dirty;
use crate::ring::placement::Placement;

/// The list's file name, between the server's `dbfilename` and its port, in its directory.
const SUFFIX: &str = ".shard-moved";

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
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// A copy starts on `ring`: what an earlier one learnt goes, and the keys written from now on
/// that move are recorded. The path of the list its walks write, or `None` (no directory).
pub fn begin_copy(ring: &Arc<Placement>, self_name: &str) -> Option<PathBuf> {
    forget();
    let rdb = crate::host::context::server_config("dbfilename");
    let rdb = if rdb.is_empty() {
        "dump.rdb"
    } else {
        rdb.as_str()
    };
    let port = crate::host::context::server_config("port");
    let port = if port.is_empty() || port == "0" {
        std::process::id().to_string()
    } else {
        port
    };
    // (`dbfilename` is a plain name: the server refuses a path.)
    let path = std::env::current_dir()
        .ok()?
        .join(format!("{rdb}{SUFFIX}.{port}"));
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

/// A copy's walk ended (`ok`: its child walked every key and wrote every name; `written`: where
/// it wrote): its list becomes the one a cleanup reads, or goes.
pub fn walk_ended(ok: bool, written: Option<&std::path::Path>) {
    LEARNT.with(|l| {
        let mut l = l.borrow_mut();
        let Some(learnt) = l.as_mut() else {
            // Forgotten while the child wrote (a load, a SWAPDB): what it wrote goes too.
            if let Some(path) = written {
                let _ = std::fs::remove_file(path);
            }
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
/// very ring and every key written since its walk is known. (The reader checks, at its end,
/// that it read every name the list counts: `Names::whole_list`.)
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
        Record::End(self.names).write(&mut buf);
        let ok = self.ok && self.out.write_all(&buf).is_ok() && self.out.flush().is_ok();
        if !ok {
            let _ = std::fs::remove_file(&self.path);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn read_all(path: &std::path::Path) -> (Vec<(i32, Vec<u8>)>, bool) {
        let mut names = Names::new(OwnedFd::from(File::open(path).expect("the list")));
        let mut out = VecDeque::new();
        while names.read(&mut out, 7) {}
        (out.into_iter().collect(), names.whole_list())
    }

    #[test]
    fn a_list_reads_back_whole_and_a_cut_one_is_not_whole() {
        let dir = std::env::temp_dir().join(format!("shard-moved-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let path = dir.join("dump.rdb.shard-moved");
        let mut list = ListWriter::create(path.clone()).expect("a new list");
        let mut want = Vec::new();
        for i in 0..3000u32 {
            let db = if i < 2500 { 0 } else { 3 };
            let name = format!("k:{i}").into_bytes();
            list.add(db, &name);
            want.push((db, name));
        }
        assert!(list.finish());
        let (got, whole) = read_all(&path);
        assert_eq!(got, want);
        assert!(whole);
        // Cut anywhere (a writer that died), even right after a progress record: the reader
        // ends, and says the list is not whole.
        let bytes = std::fs::read(&path).expect("the list");
        let mut progress = Vec::new();
        Record::Walked(2048).write(&mut progress);
        let after_progress = bytes
            .windows(progress.len())
            .position(|w| w == progress.as_slice())
            .map(|at| bytes.len() - (at + progress.len()))
            .expect("a progress record");
        for cut in [1, 3, 12, bytes.len() / 2, after_progress, bytes.len()] {
            std::fs::write(&path, &bytes[..bytes.len() - cut]).expect("a cut list");
            let (got, whole) = read_all(&path);
            assert!(!whole, "cut {cut}");
            assert!(got.len() <= want.len());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
