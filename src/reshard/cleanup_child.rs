//! The walk of a cleanup, run by a forked child (`host::fork`): the child scans its snapshot of
//! the keyspace (`host::keyspace`), computes each key's owner, and writes the names of the keys
//! this node no longer owns to a pipe; the main thread reads them in its time-bounded steps
//! (`cleanup_job`) and unlinks them. Walking and hashing every key (most of a cleanup's cost,
//! `bench/findings.md`) so leave the main thread, which only deletes. Keys written after the fork are not in the snapshot: `dirty` records
//! them and the main thread checks those itself once the child is done.
//!
//! The pipe carries each name as a 4-byte little-endian length and the bytes; a length of
//! `u32::MAX` is followed instead by the 8-byte count of keys walked so far, and `u32::MAX - 1`
//! by the 4-byte number of the database the next names belong to (every database that has
//! keys is walked). The child blocks when the pipe is full: the main thread's pace sets the
//! child's.

use std::ffi::{c_int, c_void};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use redis_module::Context;

use crate::host::fork::{self, Exit, Forked, Pid};
use crate::host::keyspace::{self, ScanCursor};
use crate::reshard::dirty::DbKey;
use crate::ring::placement::Placement;

/// The read end of the pipe, non-blocking, and what was read of a name not yet whole.
pub struct Names {
    fd: OwnedFd,
    buf: Vec<u8>,
    eof: bool,
    /// Keys the child has walked, as it last said.
    pub walked: u64,
    /// The database of the names being read.
    db: i32,
    /// Whether the read end is in the server's event loop (waiting for names).
    registered: bool,
}

const WALKED: u32 = u32::MAX;
const DATABASE: u32 = u32::MAX - 1;

/// One record of the pipe.
#[derive(Debug, PartialEq, Eq)]
enum Record<'a> {
    /// A key to delete, in the database of the last `Database` record.
    Name(&'a [u8]),
    /// Keys walked so far.
    Walked(u64),
    /// The database of the names that follow.
    Database(i32),
}

impl Record<'_> {
    /// Appends the record to `out` (a name too long for its length field is left out: Redis
    /// keys are far shorter).
    fn write(&self, out: &mut Vec<u8>) {
        match *self {
            Record::Name(name) => {
                if let Ok(len) = u32::try_from(name.len()) {
                    out.extend_from_slice(&len.to_le_bytes());
                    out.extend_from_slice(name);
                }
            }
            Record::Walked(n) => {
                out.extend_from_slice(&WALKED.to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
            }
            Record::Database(db) => {
                out.extend_from_slice(&DATABASE.to_le_bytes());
                out.extend_from_slice(&db.to_le_bytes());
            }
        }
    }

    /// The record at the start of `buf` and its length in bytes, or `None` while it has not
    /// arrived whole.
    fn parse(buf: &[u8]) -> Option<(Record<'_>, usize)> {
        let tag = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?);
        let body = &buf[4..];
        Some(match tag {
            WALKED => (
                Record::Walked(u64::from_le_bytes(body.get(..8)?.try_into().ok()?)),
                12,
            ),
            DATABASE => (
                Record::Database(i32::from_le_bytes(body.get(..4)?.try_into().ok()?)),
                8,
            ),
            len => {
                let len = usize::try_from(len).ok()?;
                (Record::Name(body.get(..len)?), 4 + len)
            }
        })
    }
}

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
    Ok((
        pid,
        Names {
            fd: read_end,
            buf: Vec::new(),
            eof: false,
            walked: 0,
            db: 0,
            registered: false,
        },
    ))
}

impl Names {
    /// Asks the event loop to call `ready` once the pipe has something to read, so that the
    /// main thread sleeps rather than polls while the child walks. False if it cannot.
    pub fn wait_readable(&mut self, ready: fn()) -> bool {
        if self.eof {
            return false;
        }
        if !self.registered {
            // In the event loop until `stop_waiting` or drop takes it out.
            self.registered = crate::host::event_loop::watch_readable(self.fd.as_raw_fd(), ready);
        }
        self.registered
    }

    /// Whether the step waits in the event loop for the pipe.
    pub fn waiting(&self) -> bool {
        self.registered
    }

    /// Takes the pipe out of the event loop.
    pub fn stop_waiting(&mut self) {
        if self.registered {
            crate::host::event_loop::stop_watching(self.fd.as_raw_fd());
            self.registered = false;
        }
    }

    /// Moves the names that arrived into `out`, at most `max`. False once the child closed
    /// the pipe and every name was taken.
    pub fn read(&mut self, out: &mut std::collections::VecDeque<DbKey>, max: usize) -> bool {
        let mut taken = 0;
        loop {
            // Whole names first.
            let mut at = 0;
            while taken < max {
                let Some((record, used)) = Record::parse(&self.buf[at..]) else {
                    break;
                };
                match record {
                    Record::Name(name) => {
                        out.push_back((self.db, name.to_vec()));
                        taken += 1;
                    }
                    Record::Walked(n) => self.walked = n,
                    Record::Database(db) => self.db = db,
                }
                at += used;
            }
            self.buf.drain(..at);
            if taken >= max || self.eof {
                return !(self.eof && self.buf.is_empty());
            }
            let mut chunk = [0u8; 64 * 1024];
            // SAFETY: reading into a local buffer from our fd.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    chunk.as_mut_ptr().cast::<c_void>(),
                    chunk.len(),
                )
            };
            match n {
                0 => self.eof = true,
                n if n > 0 => self.buf.extend_from_slice(&chunk[..n as usize]),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    // Nothing to read now (or the pipe broke: the child's end is reported by
                    // its exit).
                    return true;
                }
            }
        }
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        // Out of the event loop before the fd closes (its number may be reused).
        self.stop_waiting();
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_written_and_wait_until_whole() {
        let records = [
            Record::Database(3),
            Record::Name(b"k:1"),
            Record::Name(b""),
            Record::Walked(1 << 40),
            Record::Database(0),
        ];
        let mut buf = Vec::new();
        for r in &records {
            r.write(&mut buf);
        }
        let mut at = 0;
        for r in &records {
            let (got, used) = Record::parse(&buf[at..]).expect("a whole record");
            assert_eq!(&got, r);
            // Any shorter prefix is not whole yet.
            assert_eq!(Record::parse(&buf[at..at + used - 1]), None);
            at += used;
        }
        assert_eq!(at, buf.len());
        assert_eq!(Record::parse(&[]), None);
    }
}
