//! Names of keys, with their databases, as the main thread reads them back in its steps: from
//! the pipe of a child that walks the keyspace (`walk`: a cleanup's names to delete, the names
//! the key index is built from), or from the list a copy wrote as it walked
//! (`reshard::moved`), so that a cleanup after a copy does not walk again. One format for all.
//!
//! Each name is a 4-byte little-endian length and the bytes; a length of `u32::MAX` is
//! followed instead by the 8-byte count of keys walked so far, and `u32::MAX - 1` by the
//! 4-byte number of the database the next names belong to.

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// A database number and a key of it.
pub type DbKey = (i32, Vec<u8>);

/// Where names are read from (a pipe's read end, non-blocking, or a file), and what was read
/// of a name not yet whole.
pub struct Names {
    fd: OwnedFd,
    buf: Vec<u8>,
    eof: bool,
    /// Keys the child has walked, as it last said (a list: the names written before).
    pub walked: u64,
    /// Names read so far.
    names: u64,
    /// The count of a list's `End` record, once read (a name after it unsets it).
    ended: Option<u64>,
    /// The database of the names being read.
    db: i32,
    /// Whether the read end is in the server's event loop (waiting for names).
    registered: bool,
}

const WALKED: u32 = u32::MAX;
const DATABASE: u32 = u32::MAX - 1;
const END: u32 = u32::MAX - 2;

/// One record of the pipe.
#[derive(Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// A key to delete, in the database of the last `Database` record.
    Name(&'a [u8]),
    /// Keys walked so far.
    Walked(u64),
    /// The database of the names that follow.
    Database(i32),
    /// The end of a list, with the count of its names: only a list that ends so is whole.
    End(u64),
}

impl Record<'_> {
    /// Appends the record to `out` (a name too long for its length field is left out: Redis
    /// keys are far shorter).
    pub fn write(&self, out: &mut Vec<u8>) {
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
            Record::End(n) => {
                out.extend_from_slice(&END.to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
    }

    /// The record at the start of `buf` and its length in bytes, or `None` while it has not
    /// arrived whole.
    pub fn parse(buf: &[u8]) -> Option<(Record<'_>, usize)> {
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
            END => (
                Record::End(u64::from_le_bytes(body.get(..8)?.try_into().ok()?)),
                12,
            ),
            len => {
                let len = usize::try_from(len).ok()?;
                (Record::Name(body.get(..len)?), 4 + len)
            }
        })
    }
}

impl Names {
    /// Names read from `fd`.
    pub fn new(fd: OwnedFd) -> Names {
        Names {
            fd,
            buf: Vec::new(),
            eof: false,
            walked: 0,
            names: 0,
            ended: None,
            db: 0,
            registered: false,
        }
    }
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

    /// Whether a list (`moved`) was read to its end, whole: it ended with its `End` record,
    /// which counts every name before it, and nothing after.
    pub fn whole_list(&self) -> bool {
        self.eof && self.buf.is_empty() && self.ended == Some(self.names)
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
                        self.names += 1;
                        self.ended = None;
                        taken += 1;
                    }
                    Record::Walked(n) => self.walked = n,
                    Record::End(n) => {
                        self.walked = n;
                        self.ended = Some(n);
                    }
                    Record::Database(db) => self.db = db,
                }
                at += used;
            }
            self.buf.drain(..at);
            // At the end, what is left is a record cut short (a writer that died): no more
            // names come.
            if taken >= max || self.eof {
                return !self.eof;
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
            Record::End(7),
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
