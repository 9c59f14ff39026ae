//! The walk of a cleanup, run by a forked child (`host::fork`): the child scans its snapshot of
//! the keyspace (`host::keyspace`), computes each key's owner, and writes the names of the keys
//! this node no longer owns to a pipe; the main thread reads them in its time-bounded steps
//! (`cleanup_job`) and unlinks them. Walking and hashing every key (most of a cleanup's cost,
//! `bench/findings.md`) so leave the main thread, which only deletes. Keys written after the
//! fork are not in the snapshot: `dirty` records them and the main thread checks those itself
//! once the child is done. A cleanup that follows a copy on the same ring needs no walk at all:
//! it reads the copy's list (`moved`).
//!
//! The pipe carries the records of `names` (every database that has keys is walked). The child
//! blocks when the pipe is full: the main thread's pace sets the child's.

use std::ffi::c_int;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use redis_module::Context;

use crate::host::fork::{self, Exit, Forked, Pid};
use crate::host::keyspace::{self, ScanCursor};
use crate::reshard::names::{Names, Record};
use crate::ring::placement::Placement;

/// The pipe's capacity asked for.
const PIPE_BYTES: c_int = 1 << 20;

/// Forks the child; its pid and the pipe's read end. `done` is told on the main thread when the
/// child exits.
pub fn start(
    ctx: &Context,
    ring: &Arc<Placement>,
    self_name: &str,
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
            let ok = catch_unwind(AssertUnwindSafe(|| walk(ctx, ring, self_name, &mut out)))
                .unwrap_or(false);
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

/// The child's walk: every key of every database, the names of those that go elsewhere to
/// `out`.
fn walk(ctx: &Context, ring: &Arc<Placement>, self_name: &str, out: &mut std::fs::File) -> bool {
    let Some(ring) = ring.ring.as_ref() else {
        return false;
    };
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
                if crate::reshard::cleanup_deletes(ring, self_name, name) {
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
