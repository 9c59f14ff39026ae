//! A walk of the keyspace by a forked child (`fork`), the way `BGSAVE` works: the child scans
//! its snapshot of every database (`keyspace`), tests each name, and writes the names that pass
//! to a pipe; the main thread reads them (`names`) in its time-bounded steps. A cleanup walks
//! this way (the test: this node no longer owns the key; the steps unlink what arrives), and so
//! does the build of the key index (every name). Walking and hashing every key (most of a
//! cleanup's cost, `bench/findings.md`) so leave the main thread. Keys written after the fork
//! are not in the snapshot: the caller follows them through keyspace events.
//!
//! The pipe carries the records of `names`. The child blocks when the pipe is full: the main
//! thread's pace sets the child's.

use redis_module::Context;
use std::ffi::c_int;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::host::fork::{self, Exit, Forked, Pid};
use crate::host::keyspace::{self, ScanCursor};
use crate::host::names::{Names, Record};

/// The pipe's capacity asked for.
const PIPE_BYTES: c_int = 1 << 20;

/// Forks the child, which sends the names for which `keep` is true; its pid and the pipe's read
/// end. `done` is told on the main thread when the child exits.
pub fn start<F: Fn(&[u8]) -> bool>(
    ctx: &Context,
    keep: F,
    done: fn(Exit),
) -> Result<(Pid, Names), String> {
    start_child(ctx, |ctx, out| walk(ctx, &keep, out), done)
}

/// Forks a child that sends what `produce` hands it (`Emit`: a database, then its names)
/// instead of walking: the key index's names of a few buckets, say. Its pid and the pipe's
/// read end, as `start`.
pub fn start_from<P: FnOnce(&mut Emit)>(
    ctx: &Context,
    produce: P,
    done: fn(Exit),
) -> Result<(Pid, Names), String> {
    start_child(
        ctx,
        |_, out| {
            let mut emit = Emit {
                buf: Vec::with_capacity(128 * 1024),
                out,
                walked: 0,
                ok: true,
            };
            produce(&mut emit);
            emit.flush();
            emit.ok
        },
        done,
    )
}

/// What a `start_from` child sends: databases and names, with the count of names looked at.
pub struct Emit<'a> {
    buf: Vec<u8>,
    out: &'a mut std::fs::File,
    walked: u64,
    ok: bool,
}

impl Emit<'_> {
    /// The names that follow are of database `db`.
    pub fn database(&mut self, db: i32) {
        Record::Database(db).write(&mut self.buf);
    }

    /// One name looked at: sent if `send`.
    pub fn name(&mut self, name: &[u8], send: bool) {
        self.walked += 1;
        if send {
            Record::Name(name).write(&mut self.buf);
        }
        if self.buf.len() >= 64 * 1024 {
            self.flush();
        }
    }

    fn flush(&mut self) {
        Record::Walked(self.walked).write(&mut self.buf);
        if self.out.write_all(&self.buf).is_err() {
            self.ok = false;
        }
        self.buf.clear();
    }
}

/// Forks the child, which runs `body` on the pipe's write end (true: it did all its work).
fn start_child<B: FnOnce(&Context, &mut std::fs::File) -> bool>(
    ctx: &Context,
    body: B,
    done: fn(Exit),
) -> Result<(Pid, Names), String> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: two fds for a new pipe.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!(
            "cannot make a pipe: {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: fresh fds, owned from here on.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A deeper pipe than the default 64 KB, so that the child walks on while the main thread
    // serves clients (the kernel may refuse: the default then).
    // SAFETY: our fd.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, PIPE_BYTES) };
    let pid = match fork::fork(done)? {
        Forked::Parent(pid) => pid,
        Forked::Child => {
            drop(read_end);
            let mut out = std::fs::File::from(write_end);
            let ok = catch_unwind(AssertUnwindSafe(|| body(ctx, &mut out))).unwrap_or(false);
            fork::exit_child(if ok { 0 } else { 1 });
        }
    };
    drop(write_end);
    // SAFETY: our fd.
    unsafe {
        let fd = read_end.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok((pid, Names::new(read_end)))
}

/// The child's walk: every key of every database, the names `keep` keeps to `out`.
fn walk(ctx: &Context, keep: &dyn Fn(&[u8]) -> bool, out: &mut std::fs::File) -> bool {
    let mut buf: Vec<u8> = Vec::with_capacity(128 * 1024);
    let mut walked: u64 = 0;
    for db in 0.. {
        if !keyspace::select_db(ctx, db) {
            break;
        }
        if keyspace::db_size(ctx) == 0 {
            continue;
        }
        let Some(cursor) = ScanCursor::new() else {
            return false;
        };
        Record::Database(db).write(&mut buf);
        loop {
            let more = cursor.scan(ctx, &mut |name, _| {
                walked += 1;
                if keep(name) {
                    Record::Name(name).write(&mut buf);
                }
            });
            if buf.len() >= 64 * 1024 || !more {
                Record::Walked(walked).write(&mut buf);
                if out.write_all(&buf).is_err() {
                    return false;
                }
                buf.clear();
            }
            if !more {
                break;
            }
        }
    }
    true
}
