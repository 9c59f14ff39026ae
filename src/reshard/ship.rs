//! Ships `RESTORE`, `SET` and `SHARD.APPLY` commands to the destinations of a copy, many in
//! flight on one connection per destination, and counts what each reply says: `+OK` copied,
//! `-BUSYKEY` (or a `SET NX`'s null) skipped (the key is there already, newer than this copy),
//! `SHARD.APPLY`'s count of strings written (the rest skipped), any other error or a lost
//! connection failed; but a destination followed through Sentinel that is lost (it cannot be
//! reached, drops the connection, stays silent, or answers `READONLY` or `LOADING`: a primary
//! that died, was demoted or restarts) has its keys counted `lost`, by node, for the job to send
//! again once the failover is followed (`failover`), never failed for good here. A big
//! key's pieces (`pieces`) travel the same way: their errors are counted apart, and the
//! `RENAMENX` that puts the key in place counts it (`:1` copied, `:0` skipped). Keys of
//! another database than 0 go on a connection of their own, which `SELECT`ed it when it logged
//! in: a destination that lacks the database fails those keys with its reason, never stores
//! them elsewhere.
//!
//! It runs in the forked child of a copy (`copy_child`), which has nothing else to do: its
//! sockets are non-blocking and it waits in `poll(2)` only when a destination's window is full
//! or at the end. The window bounds both the requests and the bytes sent but not yet answered,
//! so the child's memory stays bounded however fast it serializes. No crate pipelines raw RESP
//! commands with per-reply accounting and a byte window; the route layer's connections belong to
//! the main thread's event loop, which the child does not run.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::net::frame::FrameScanner;
use crate::net::resp::{encode_command, encode_command_into};
use crate::net::tls::Tls;
use crate::net::transport::{self, Transport};

/// How much may be in flight to one destination.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub requests: usize,
    pub bytes: usize,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            requests: 4096,
            bytes: 8 << 20,
        }
    }
}

/// Requests are written once this many bytes are waiting (or the window is full, or at the
/// end).
const WRITE_CHUNK: usize = 64 * 1024;

/// What the replies came to, summed over every destination.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    pub copied: u64,
    pub skipped: u64,
    pub failed: u64,
    pub bytes_sent: u64,
    /// Pieces of big keys refused or lost (the key they belong to is then not put in place).
    pub piece_errors: u64,
    /// Keys copied, by database number.
    pub copied_by_db: Vec<u64>,
    /// Keys of destinations followed through Sentinel that were lost (to be sent again), by
    /// the destination's index in the ring.
    pub lost_by_node: Vec<u64>,
    pub last_error: String,
}

impl Tally {
    /// Keys lost with their destinations, in all.
    pub fn lost(&self) -> u64 {
        self.lost_by_node.iter().sum()
    }

    /// Counts `keys` keys lost with the destination at `index`.
    fn lose(&mut self, index: usize, keys: u64) {
        if self.lost_by_node.len() <= index {
            self.lost_by_node.resize(index + 1, 0);
        }
        self.lost_by_node[index] += keys;
    }
}

/// What a request's reply means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A `RESTORE`: `+OK` copied, `-BUSYKEY` skipped, another error failed.
    Key,
    /// A `SET ... NX` (or a `SET` that replaces): `+OK` copied, a null skipped (the key is
    /// there already), an error failed.
    Set,
    /// A piece of a big key, or the upkeep of its temporary key: only errors count.
    Piece,
    /// The `RENAMENX` that puts a big key in place: `:1` copied, `:0` skipped.
    Rename,
    /// A `SHARD.APPLY` of this many strings: `:k` copied k and skipped the rest (there
    /// already), an error failed them all.
    Batch(u32),
}

impl Expect {
    /// How many keys the request carries (0 for a piece).
    pub fn keys(self) -> u64 {
        match self {
            Expect::Piece => 0,
            Expect::Key | Expect::Set | Expect::Rename => 1,
            Expect::Batch(n) => u64::from(n),
        }
    }

    /// How much the request weighs in the keys in flight: its keys, or one for a piece.
    fn weight(self) -> usize {
        usize::try_from(self.keys()).unwrap_or(usize::MAX).max(1)
    }

    /// Counts the request as failed, or as lost with its destination (`lost`: the node's
    /// index).
    fn fail(self, tally: &mut Tally, lost: Option<usize>) {
        match (self, lost) {
            (Expect::Piece, _) => tally.piece_errors += 1,
            (keys, Some(index)) => tally.lose(index, keys.keys()),
            (keys, None) => tally.failed += keys.keys(),
        }
    }
}

/// A destination: its node's name and index in the ring, its address, and whether that
/// address comes from Sentinel (a failure to reach it is then a loss to send again).
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub address: String,
    pub index: usize,
    pub followed: bool,
}

struct Dest {
    target: Target,
    db: i32,
    stream: Option<Transport>,
    out: Vec<u8>,
    out_pos: usize,
    /// Bytes and meaning of each request in flight, oldest first (their replies come in this
    /// order).
    in_flight: std::collections::VecDeque<(usize, Expect)>,
    in_flight_bytes: usize,
    /// Keys of the requests in flight (a piece of a big key counts as one).
    in_flight_keys: usize,
    inbuf: Vec<u8>,
    filled: usize,
    scanner: FrameScanner,
    /// Set once the destination failed: its requests fail at once.
    error: Option<String>,
    /// It failed by being lost (a followed destination): its keys count lost, not failed.
    lost: bool,
    last_reply: Instant,
}

/// The connections of one copy pass.
pub struct Shipper {
    /// By address and database.
    dests: HashMap<(String, i32), Dest>,
    /// The database the next requests are for.
    db: i32,
    window: Window,
    timeout: Duration,
    auth: Option<(String, String)>,
    /// TLS toward the destinations (`None`: plain TCP).
    tls: Option<Arc<Tls>>,
    pub tally: Tally,
}

impl Shipper {
    pub fn new(
        window: Window,
        timeout: Duration,
        auth: Option<(String, String)>,
        tls: Option<Arc<Tls>>,
    ) -> Shipper {
        Shipper {
            dests: HashMap::new(),
            db: 0,
            window,
            timeout,
            auth,
            tls,
            tally: Tally::default(),
        }
    }

    /// Keys sent and not answered yet, over all destinations (a piece of a big key counts as
    /// one).
    pub fn in_flight(&self) -> usize {
        self.dests.values().map(|d| d.in_flight_keys).sum()
    }

    /// Queues a `RESTORE` for `target`, waiting first while its window is full.
    pub fn send(&mut self, target: &Target, args: &[&[u8]]) {
        self.send_as(target, args, Expect::Key);
    }

    /// Queues `args` (one command) for `target`, its reply read as `expect` says.
    pub fn send_as(&mut self, target: &Target, args: &[&[u8]], expect: Expect) {
        self.queue(target, expect, |out| encode_command_into(out, args));
    }

    /// Queues one command already encoded in RESP (`ship_thread`: the main thread encodes).
    pub fn send_encoded(&mut self, target: &Target, command: &[u8], expect: Expect) {
        self.queue(target, expect, |out| {
            out.extend_from_slice(command);
            command.len()
        });
    }

    /// Sends and reads what the sockets allow now, without waiting (a thread that ships
    /// between its queue's messages).
    pub fn pump_all(&mut self) {
        for dest in self.dests.values_mut() {
            pump(dest, &mut self.tally, false, self.timeout);
        }
    }

    /// Queues a command that `encode` appends to the output (returning its length).
    fn queue(
        &mut self,
        target: &Target,
        expect: Expect,
        encode: impl FnOnce(&mut Vec<u8>) -> usize,
    ) {
        let at = (target.address.clone(), self.db);
        if !self.dests.contains_key(&at) {
            let dest = self.open(target);
            self.dests.insert(at.clone(), dest);
        }
        let (window, timeout) = (self.window, self.timeout);
        let Some(dest) = self.dests.get_mut(&at) else {
            return;
        };
        if let Some(e) = &dest.error {
            expect.fail(&mut self.tally, dest.lost.then_some(target.index));
            self.tally.last_error = e.clone();
            return;
        }
        if dest.out_pos == dest.out.len() {
            dest.out.clear();
            dest.out_pos = 0;
        }
        let len = encode(&mut dest.out);
        dest.in_flight.push_back((len, expect));
        dest.in_flight_bytes += len;
        dest.in_flight_keys += expect.weight();
        self.tally.bytes_sent += len as u64;
        // Write in large pieces (each write wakes the destination once); wait only while the
        // window is full.
        if dest.out.len() - dest.out_pos >= WRITE_CHUNK {
            pump(dest, &mut self.tally, false, timeout);
        }
        while dest.error.is_none()
            && (dest.in_flight.len() > window.requests || dest.in_flight_bytes > window.bytes)
        {
            pump(dest, &mut self.tally, true, timeout);
        }
    }

    /// Waits until every request has its reply (or its destination failed).
    pub fn finish(&mut self) {
        let timeout = self.timeout;
        for dest in self.dests.values_mut() {
            while dest.error.is_none() && !dest.in_flight.is_empty() {
                pump(dest, &mut self.tally, true, timeout);
            }
        }
    }

    /// The requests sent from now on are for database `db`.
    pub fn select(&mut self, db: i32) {
        self.db = db;
    }

    /// Waits until every request to `target` (in the current database) has its reply (or it
    /// failed).
    pub fn drain(&mut self, target: &Target) {
        let timeout = self.timeout;
        if let Some(dest) = self.dests.get_mut(&(target.address.clone(), self.db)) {
            while dest.error.is_none() && !dest.in_flight.is_empty() {
                pump(dest, &mut self.tally, true, timeout);
            }
        }
    }

    /// Counts a key that could not be put in place at `target` (a big key whose pieces did not
    /// all arrive): lost when its destination was lost, else failed.
    pub fn unfinished(&mut self, target: &Target) {
        let lost = self
            .dests
            .get(&(target.address.clone(), self.db))
            .is_some_and(|d| d.lost);
        let index = lost.then_some(target.index);
        Expect::Key.fail(&mut self.tally, index);
    }

    /// Closes every connection (after `finish`); the next `send` opens them again.
    pub fn close(&mut self) {
        self.dests.clear();
    }

    /// Connects and logs in (blocking, bounded by the timeout), then goes non-blocking.
    fn open(&self, target: &Target) -> Dest {
        let mut dest = Dest {
            target: target.clone(),
            db: self.db,
            stream: None,
            out: Vec::new(),
            out_pos: 0,
            in_flight: Default::default(),
            in_flight_bytes: 0,
            in_flight_keys: 0,
            inbuf: vec![0; 64 * 1024],
            filled: 0,
            scanner: FrameScanner::default(),
            error: None,
            lost: false,
            last_reply: Instant::now(),
        };
        let tls = self.tls.as_ref();
        match connect(
            &target.address,
            self.timeout,
            self.auth.as_ref(),
            self.db,
            tls,
        ) {
            Ok(stream) => dest.stream = Some(stream),
            // Not reached (refused, reset, silent): a followed destination is lost. A refused
            // login or database is this destination's answer, not a failover.
            Err(e) if target.followed && e.kind() != io::ErrorKind::PermissionDenied => {
                dest.lost = true;
                dest.error = Some(format!("{} ({}): {e}", target.name, target.address));
            }
            Err(e) if self.db != 0 => {
                dest.error = Some(format!(
                    "{} ({}), database {}: {e}",
                    target.name, target.address, self.db
                ));
            }
            Err(e) => {
                dest.error = Some(format!("{} ({}): {e}", target.name, target.address));
            }
        }
        if let Some(e) = dest.error.as_deref().filter(|_| dest.stream.is_none()) {
            if e.contains("TLS") {
                crate::net::tls_failure::count_failure(e);
            }
        }
        dest
    }
}

/// A logged-in, non-blocking connection to `address` (in TLS with `tls`, verified before a
/// byte of the login is sent).
fn connect(
    address: &str,
    timeout: Duration,
    auth: Option<&(String, String)>,
    db: i32,
    tls: Option<&Arc<Tls>>,
) -> io::Result<Transport> {
    let mut stream = transport::dial(address, timeout, tls)?;
    let mut hello: Vec<u8> = Vec::new();
    let mut tolerant = Vec::new();
    if let Some((user, password)) = auth {
        let args: Vec<&[u8]> = if user.is_empty() {
            vec![b"AUTH", password.as_bytes()]
        } else {
            vec![b"AUTH", user.as_bytes(), password.as_bytes()]
        };
        hello.extend(encode_command(&args));
        tolerant.push(false);
    }
    if db != 0 {
        let mut n = itoa::Buffer::new();
        hello.extend(encode_command(&[
            b"SELECT".as_slice(),
            n.format(db).as_bytes(),
        ]));
        tolerant.push(false);
    }
    // The destination then never redirects this connection's commands (cluster protocol).
    hello.extend(encode_command(&[b"SHARD.CLUSTER".as_slice(), b"INTERNAL"]));
    tolerant.push(true);
    stream.write_all(&hello)?;
    stream.flush()?;
    // Nothing else is in flight: the reader cannot take bytes of a later reply.
    let mut reader = io::BufReader::new(&mut stream);
    for ok_only in tolerant.iter().map(|t| !t) {
        match crate::net::resp::read_reply(&mut reader) {
            Ok(crate::net::resp::Resp::Error(e)) if ok_only => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    String::from_utf8_lossy(&e).into_owned(),
                ))
            }
            Ok(_) => {}
            Err(e) => return Err(io::Error::other(e.to_string())),
        }
    }
    drop(reader);
    stream.tcp().set_nonblocking(true)?;
    Ok(stream)
}

/// Writes and reads what the socket allows; with `wait`, first sleeps in `poll` until it allows
/// something (failing the destination after `timeout` without a reply).
fn pump(dest: &mut Dest, tally: &mut Tally, wait: bool, timeout: Duration) {
    if dest.error.is_some() {
        return;
    }
    let Some(stream) = dest.stream.as_ref() else {
        return;
    };
    if wait {
        let mut events = libc::POLLIN;
        if dest.out_pos < dest.out.len() || stream.wants_write() {
            events |= libc::POLLOUT;
        }
        let mut fd = libc::pollfd {
            fd: stream.tcp().as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut fd, 1, 100) };
        // A big key's RESTORE takes its destination a while: the silence allowed grows with
        // what is in flight (1 ms per 10 KB, a destination loading at 10 MB/s or faster).
        let allowed = timeout + Duration::from_millis((dest.in_flight_bytes / 10_000) as u64);
        if ready == 0 && dest.last_reply.elapsed() > allowed && !dest.in_flight.is_empty() {
            let e = format!("did not answer within {} ms", timeout.as_millis());
            fail(dest, tally, &e);
            return;
        }
    }
    if let Err(e) = write_out(dest) {
        fail(dest, tally, &format!("cannot send: {e}"));
        return;
    }
    if let Err(e) = read_in(dest, tally) {
        fail(dest, tally, &e);
    }
}

fn write_out(dest: &mut Dest) -> io::Result<()> {
    let Some(stream) = dest.stream.as_mut() else {
        return Ok(());
    };
    while dest.out_pos < dest.out.len() {
        match stream.write(&dest.out[dest.out_pos..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => dest.out_pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    stream.flush_pending().map(|_| ())
}

/// Reads the replies that arrived and counts them.
fn read_in(dest: &mut Dest, tally: &mut Tally) -> Result<(), String> {
    loop {
        if dest.filled == dest.inbuf.len() {
            let grown = dest.inbuf.len() * 2;
            dest.inbuf.resize(grown, 0);
        }
        let Some(stream) = dest.stream.as_mut() else {
            return Ok(());
        };
        match stream.read(&mut dest.inbuf[dest.filled..]) {
            Ok(0) => return Err("closed the connection".into()),
            Ok(n) => dest.filled += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read: {e}")),
        }
        let mut start = 0;
        while let Some(len) = dest
            .scanner
            .scan(&dest.inbuf[start..dest.filled])
            .map_err(|e| format!("sent a bad reply: {e}"))?
        {
            dest.scanner.reset();
            let reply = &dest.inbuf[start..start + len];
            if dest.target.followed && demoted(reply) {
                // A primary demoted (or restarting): this request stays in flight, and `fail`
                // counts it lost with the rest.
                return Err(format!(
                    "answered {}",
                    String::from_utf8_lossy(&reply[1..]).trim_end()
                ));
            }
            let (bytes, expect) = dest.in_flight.pop_front().unwrap_or((0, Expect::Key));
            dest.in_flight_bytes = dest.in_flight_bytes.saturating_sub(bytes);
            dest.in_flight_keys = dest.in_flight_keys.saturating_sub(expect.weight());
            count(reply, expect, tally, &dest.target, dest.db);
            dest.last_reply = Instant::now();
            start += len;
        }
        dest.inbuf.copy_within(start..dest.filled, 0);
        dest.filled -= start;
    }
}

/// Counts one reply.
fn count(reply: &[u8], expect: Expect, tally: &mut Tally, target: &Target, db: i32) {
    if reply.first() == Some(&b'-') && !(expect == Expect::Key && reply.starts_with(b"-BUSYKEY")) {
        expect.fail(tally, None);
        let text = String::from_utf8_lossy(&reply[1..]);
        tally.last_error = format!("{} ({}): {}", target.name, target.address, text.trim_end());
        return;
    }
    let copied = match expect {
        Expect::Key if reply.starts_with(b"-BUSYKEY") => 0,
        Expect::Set if reply.starts_with(b"$-1") || reply.starts_with(b"_") => 0,
        Expect::Rename if reply.starts_with(b":0") => 0,
        Expect::Key | Expect::Set | Expect::Rename => 1,
        Expect::Batch(n) => match integer(reply) {
            Some(k) if k <= u64::from(n) => k,
            _ => {
                expect.fail(tally, None);
                tally.last_error = format!(
                    "{} ({}): SHARD.APPLY gave an unexpected reply",
                    target.name, target.address
                );
                return;
            }
        },
        Expect::Piece => return,
    };
    tally.skipped += expect.keys() - copied;
    if copied == 0 {
        return;
    }
    tally.copied += copied;
    let db = usize::try_from(db).unwrap_or(0);
    if tally.copied_by_db.len() <= db {
        tally.copied_by_db.resize(db + 1, 0);
    }
    tally.copied_by_db[db] += copied;
}

/// Whether a reply says the destination is no longer a primary that takes writes: `READONLY`
/// (demoted by a failover) or `LOADING` (restarting).
fn demoted(reply: &[u8]) -> bool {
    reply.starts_with(b"-READONLY") || reply.starts_with(b"-LOADING")
}

/// The value of an integer reply (`:12\r\n`).
fn integer(reply: &[u8]) -> Option<u64> {
    let digits = reply.strip_prefix(b":")?.strip_suffix(b"\r\n")?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The destination is gone: what it has in flight failed, and so will what is sent to it (lost,
/// for a destination followed through Sentinel).
fn fail(dest: &mut Dest, tally: &mut Tally, why: &str) {
    let reason = format!("{} ({}): {why}", dest.target.name, dest.target.address);
    dest.lost = dest.target.followed;
    let lost = dest.lost.then_some(dest.target.index);
    for (_, expect) in &dest.in_flight {
        expect.fail(tally, lost);
    }
    tally.last_error = reason.clone();
    dest.in_flight.clear();
    dest.in_flight_bytes = 0;
    dest.in_flight_keys = 0;
    dest.stream = None;
    dest.error = Some(reason);
}

#[cfg(test)]
#[path = "ship_tests.rs"]
mod tests;
