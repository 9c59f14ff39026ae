//! Pipelined connections to other nodes, driven by the server's own event loop on its main
//! thread: the one connection layer every routed call goes through.
//!
//! Per node, per RESP version of the callers and per database one long-lived non-blocking
//! connection. Requests are queued on it and written back to back: everything queued during
//! one turn of the event loop leaves in one `write`, just before the server sleeps (the
//! `BEFORE_SLEEP` event); a request queued after that point (a client unblocked in the same
//! turn sends its next call) asks for the socket's writable event, so it leaves at the next
//! turn without a wake-up pipe. Replies are matched to requests in order; each waiter is told
//! as soon as its reply is whole, so nothing waits for a batch.
//!
//! Why the event loop and not threads: the main thread decides every call anyway (ring, ACL,
//! blocking the client) and must unblock the client on the main thread; with the sockets on
//! the same thread there is no hand-over, no lock and no wake-up per request. The
//! measurements that decided it are in `bench/findings.md` ("Where a forwarded call's time
//! goes"). The old design (four blocking worker threads, one round trip each at a time)
//! capped a node at four forwarded commands in flight.
//!
//! Why a connection per database, and not one per node that switches with `SELECT` in front
//! of a request: a connection's database is fixed by its handshake, before any request is
//! written, so a request can never run in another database than its caller's. A `SELECT`
//! pipelined in front of requests could fail (the node has fewer databases, its ACL denies
//! `SELECT`) after the requests behind it had already been written: they would run, writes
//! included, in the connection's previous database. Database 0's connections send no `SELECT`
//! and are looked up in their own table, so callers of database 0 pay nothing for the others;
//! a caller of another database opens one more connection per node and database in use. A
//! node that refuses the database fails the requests of that connection with an error naming
//! the node and the database.
//!
//! What the old design guaranteed still holds: authentication (`HELLO` with `AUTH`, answered
//! before any request is written), reconnection after a failure, a timeout per request that
//! names the node, and at-most-once: a request is sent again on a new connection only when the
//! node closed a connection that had been idle, before a single byte of a reply to the requests
//! written after that idle time (the race of a server's `timeout` closing idle clients).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::raw::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::raw;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::net::endpoint::{Endpoint, StepError, StepErrorKind};
use crate::net::frame::FrameScanner;
use crate::net::resp::{encode_command, read_reply, Resp};
use crate::net::tls::Tls;
use crate::net::transport::Transport;

/// How the module reaches other nodes: the call timeout, the credentials, the RESP version,
/// and the database the requests run in (the calling client's).
#[derive(Debug, Clone)]
pub struct Link {
    pub timeout: Duration,
    pub auth: Option<(String, String)>,
    pub resp3: bool,
    pub db: u32,
}

/// Timeout of forwarded calls from the configuration.
pub fn link_timeout(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms.max(1)).unwrap_or(1000))
}

/// Who gets a reply: an opaque number the caller chose (see `forward`).
pub type Waiter = u64;

/// What a request came to.
pub type Outcome = Result<Resp, StepError>;

/// The largest read per `read` call, and how much a buffer keeps when idle.
const READ_CHUNK: usize = 64 * 1024;

type ConnId = usize;

struct Pending {
    /// `None`: a step of the connection's own handshake.
    waiter: Option<Waiter>,
    request: Vec<u8>,
    deadline: Instant,
    /// Already sent once on a connection that closed unanswered: never sent a third time.
    resent: bool,
    /// The handshake step this is (`None` for a request).
    step: Option<Handshake>,
}

/// The steps of a connection's handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handshake {
    /// `HELLO` with the RESP version and the credentials.
    Hello,
    /// `SELECT db`, on a connection for a database other than 0.
    Select,
    /// `SHARD.CLUSTER INTERNAL`.
    Internal,
}

impl Handshake {
    /// Whether the step's error reply does not matter (`SHARD.CLUSTER INTERNAL` to a node of an
    /// older version); the other steps' errors refuse the connection, and requests wait for
    /// their replies.
    fn tolerant(self) -> bool {
        self == Handshake::Internal
    }

    /// Why the connection is refused, when the step got the error reply `e`.
    fn refused(self, db: u32, e: &[u8]) -> String {
        let e = String::from_utf8_lossy(e);
        match self {
            Handshake::Select if e.starts_with("NOAUTH") => {
                format!("cannot select database {db}: {e}: set shard.auth-password (and shard.auth-user)")
            }
            Handshake::Select => format!("cannot select database {db}: {e}"),
            Handshake::Hello | Handshake::Internal => format!("handshake refused: {e}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for Sentinel to give the address of a `sentinel` node (`route::watcher`).
    AwaitSentinel,
    /// Waiting for the address of a host name (a resolver thread).
    Resolving,
    /// A non-blocking connect under way.
    Connecting,
    /// Connected; the handshake's reply not yet in.
    Handshaking,
    Ready,
}

struct Conn {
    id: ConnId,
    at: Endpoint,
    link: Link,
    state: State,
    stream: Option<Transport>,
    /// The TLS configuration in force when the connection was made (`None`: plain TCP): a
    /// rotated certificate serves the connections made after it.
    tls: Option<Arc<Tls>>,
    /// Requests not yet written (in order), then those written and unanswered.
    unsent: VecDeque<Pending>,
    in_flight: VecDeque<Pending>,
    out: Vec<u8>,
    out_pos: usize,
    /// Bytes read: `inbuf[..filled]`; the rest is room for the next read.
    inbuf: Vec<u8>,
    filled: usize,
    scanner: FrameScanner,
    /// Events registered with the event loop.
    readable: bool,
    writable: bool,
    /// Bytes of replies received since the connection last had nothing in flight, and
    /// whether it had been idle (used, then quiet) before that: together they decide whether
    /// a close may be answered by sending the requests again.
    reply_bytes_since_idle: usize,
    was_idle: bool,
    used: bool,
    /// Out of the pool (`shard.tls` was turned on or off): closes once its requests are
    /// answered.
    retiring: bool,
}

/// Every connection, the main thread's only.
#[derive(Default)]
struct Net {
    conns: HashMap<ConnId, Conn>,
    /// Database 0's connections by node address, for RESP2 callers (`[0]`) and RESP3 ones
    /// (`[1]`).
    by_node: [HashMap<String, ConnId>; 2],
    /// The other databases' connections, by database and RESP3, then by node address.
    by_node_db: HashMap<(u32, bool), HashMap<String, ConnId>>,
    next_id: ConnId,
    /// Connections with requests to write at the next flush.
    dirty: Vec<ConnId>,
    /// The server has passed its `BEFORE_SLEEP` in this turn of the loop: requests queued now
    /// ask for the writable event instead.
    after_flush: bool,
    /// The earliest deadline of any request in flight.
    next_deadline: Option<Instant>,
    /// When the event loop last woke up: deadlines count from there (one clock read per turn
    /// of the loop, not per request).
    woke: Option<Instant>,
}

thread_local! {
    static NET: RefCell<Net> = RefCell::new(Net::default());
}

/// What the pool reports upward, set once at load by the layers above (`lib.rs`): the network
/// knows no ring and no routed call, so replies and failures go to whoever registered.
#[derive(Clone, Copy)]
pub struct Hooks {
    /// Hands replies and failures to their waiters (`route::forward`).
    pub deliver: fn(Vec<(Waiter, Outcome)>),
    /// Asks for the address of a node that has none yet (`topology::watcher`).
    pub wake_resolver: fn(),
    /// Why a node's address is not known, for a request that waited for it in vain.
    pub resolver_error: fn(&str) -> String,
}

fn ignore(_: Vec<(Waiter, Outcome)>) {}
fn nothing() {}
fn no_reason(_: &str) -> String {
    String::new()
}

thread_local! {
    static HOOKS: std::cell::Cell<Hooks> = const {
        std::cell::Cell::new(Hooks { deliver: ignore, wake_resolver: nothing, resolver_error: no_reason })
    };
}

/// Registers what the pool reports upward (once, at load).
pub fn set_hooks(hooks: Hooks) {
    HOOKS.with(|h| h.set(hooks));
}

fn hooks() -> Hooks {
    HOOKS.with(|h| h.get())
}

/// What the topology learned, for the connections: failovers (node, old address, new address),
/// and addresses learned (or not) for nodes that had none.
#[derive(Debug, Default)]
pub struct TopologyChange {
    pub moved: Vec<(String, String, String)>,
    pub known: Vec<(String, Result<String, String>)>,
}

/// What the event handlers found for the waiters: delivered after `NET` is released, since a
/// waiter may queue its next request at once.
type Deliveries = Vec<(Waiter, Outcome)>;

/// Queues `args` for the node `at`; `deliver` is later called with `waiter` and the reply or
/// the error (never from inside this function).
pub fn request(at: &Endpoint, link: &Link, args: &[impl AsRef<[u8]>], waiter: Waiter) {
    let bytes = encode_command(args);
    let mut failed: Deliveries = Vec::new();
    NET.with(|net| {
        let mut net = net.borrow_mut();
        let id = match net.connection(at, link) {
            Ok(id) => id,
            Err(e) => {
                failed.push((waiter, Err(e)));
                return;
            }
        };
        let deadline = net.woke.unwrap_or_else(Instant::now) + link.timeout;
        net.next_deadline = Some(net.next_deadline.map_or(deadline, |d| d.min(deadline)));
        let after_flush = net.after_flush;
        let Some(conn) = net.conns.get_mut(&id) else {
            return;
        };
        conn.unsent.push_back(Pending {
            waiter: Some(waiter),
            request: bytes,
            deadline,
            resent: false,
            step: None,
        });
        if conn.state != State::Ready {
            return;
        }
        if after_flush {
            conn.want_writable();
        } else if conn.unsent.len() == 1 {
            net.dirty.push(id);
        }
    });
    (hooks().deliver)(failed);
}

/// Writes what every connection has queued: at `BEFORE_SLEEP`, once per turn of the loop.
pub fn before_sleep() {
    let mut failed: Deliveries = Vec::new();
    NET.with(|net| {
        let mut net = net.borrow_mut();
        net.after_flush = true;
        let dirty = std::mem::take(&mut net.dirty);
        for id in dirty {
            net.flush(id, &mut failed);
        }
        if net.next_deadline.is_some_and(|d| Instant::now() >= d) {
            net.expire(&mut failed);
        }
    });
    (hooks().deliver)(failed);
}

/// The loop woke up: requests queued from now on go out at the next `BEFORE_SLEEP`.
pub fn after_sleep() {
    NET.with(|net| {
        let mut net = net.borrow_mut();
        net.after_flush = false;
        net.woke = Some(Instant::now());
    });
}

/// Connections open, and requests in flight or queued (for INFO).
pub fn counts() -> (usize, usize) {
    NET.with(|net| {
        let net = net.borrow();
        let pending = net
            .conns
            .values()
            .map(|c| c.unsent.len() + c.in_flight.len())
            .sum();
        (net.conns.len(), pending)
    })
}

/// The pool key of a connection waiting for a Sentinel node's address (`\u{1}` cannot start
/// an address or a node name).
fn awaiting_key(name: &str) -> String {
    format!("\u{1}{name}")
}

/// `shard.tls` was turned on or off: no new request goes on a connection of the other kind.
/// Idle connections close now; busy ones leave the pool and close once their requests are
/// answered (their callers get their replies).
pub fn retire_all() {
    NET.with(|net| {
        let mut net = net.borrow_mut();
        let ids: Vec<ConnId> = net.conns.keys().copied().collect();
        for id in ids {
            let idle = net
                .conns
                .get(&id)
                .is_some_and(|c| c.in_flight.is_empty() && c.unsent.is_empty());
            if idle {
                net.remove(id);
            } else if let Some(conn) = net.conns.get(&id) {
                let (key, link) = (net.pool_key(conn), conn.link.clone());
                let pool = net.pool(&link);
                if pool.get(key.as_str()) == Some(&id) {
                    pool.remove(key.as_str());
                }
                if let Some(conn) = net.conns.get_mut(&id) {
                    conn.retiring = true;
                }
            }
        }
    });
}

/// Acts on what the topology watcher learned (on the main thread): the connections to a
/// primary that failed over are closed, failing their calls with an error naming the node (the
/// next call goes to the new primary); the connections waiting for a Sentinel node's address
/// connect to it, or fail with the reason none came.
pub fn topology_changed(applied: TopologyChange) {
    let mut failed: Deliveries = Vec::new();
    NET.with(|net| {
        let mut net = net.borrow_mut();
        for (name, old, new) in &applied.moved {
            redis_module::logging::log_notice(format!(
                "shard: node {name} failed over from {old} to {new} (Sentinel)"
            ));
            let gone: Vec<(ConnId, Endpoint)> = net
                .conns
                .values()
                .filter(|c| c.at.name == *name && c.at.address == *old)
                .map(|c| (c.id, c.at.clone()))
                .collect();
            for (id, at) in gone {
                let e = StepError::new(
                    &at,
                    format!("failed over to {new}: the call may or may not have run on {old}"),
                );
                net.fail(id, &e, &mut failed);
            }
        }
        for (name, address) in applied.known {
            let waiting: Vec<ConnId> = net
                .conns
                .values()
                .filter(|c| c.state == State::AwaitSentinel && c.at.name == name)
                .map(|c| c.id)
                .collect();
            for id in waiting {
                net.sentinel_answered(id, &address, &mut failed);
            }
        }
    });
    (hooks().deliver)(failed);
}

impl Net {
    /// Sentinel's answer for a connection waiting for its node's address.
    fn sentinel_answered(
        &mut self,
        id: ConnId,
        address: &Result<String, String>,
        failed: &mut Deliveries,
    ) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let target = match address {
            Ok(a) => crate::net::endpoint::split_address(a)
                .map(|(host, port)| (host, port, a.clone()))
                .ok_or_else(|| format!("Sentinel gave an address that is not host:port: {a}")),
            Err(e) => Err(e.clone()),
        };
        let (host, port, address) = match target {
            Ok(t) => t,
            Err(why) => {
                let e = StepError::new(&conn.at, why);
                self.fail(id, &e, failed);
                return;
            }
        };
        // Pooled under its address from now on, unless another connection already is.
        let Some(mut conn) = self.remove(id) else {
            return;
        };
        conn.at.host = host.clone();
        conn.at.port = port;
        conn.at.address = address.clone();
        conn.state = State::Resolving;
        let link = conn.link.clone();
        self.pool(&link).entry(address).or_insert(id);
        let Ok(ip) = host.parse::<IpAddr>() else {
            // A host name (Sentinel's `resolve-hostnames yes`): looked up off the main thread.
            self.conns.insert(id, conn);
            resolve_in_background(id, host, port);
            return;
        };
        self.conns.insert(id, conn);
        self.connect_known(id, Ok(SocketAddr::new(ip, port)), failed);
    }

    /// Connects a connection whose address has just become known (or fails it with why it
    /// did not), and writes what it has queued if it is ready at once.
    fn connect_known(
        &mut self,
        id: ConnId,
        addr: Result<SocketAddr, StepError>,
        failed: &mut Deliveries,
    ) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        match addr.and_then(|a| conn.connect(a)) {
            Err(e) => self.fail(id, &e, failed),
            Ok(()) => {
                if conn.state == State::Ready {
                    self.flush(id, failed);
                }
            }
        }
    }

    /// The connections for `link`'s RESP version and database, by node address.
    fn pool(&mut self, link: &Link) -> &mut HashMap<String, ConnId> {
        if link.db == 0 {
            &mut self.by_node[usize::from(link.resp3)]
        } else {
            self.by_node_db.entry((link.db, link.resp3)).or_default()
        }
    }

    /// The connection to `at` for `link`'s RESP version and database, opened if there is none.
    fn connection(&mut self, at: &Endpoint, link: &Link) -> Result<ConnId, StepError> {
        let unknown = at.port == 0;
        // Looked up without allocating: this runs for every forwarded request.
        let waiting_key = unknown.then(|| awaiting_key(&at.name));
        let key = waiting_key.as_deref().unwrap_or(at.address.as_str());
        if let Some(&id) = self.pool(link).get(key) {
            return Ok(id);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.pool(link).insert(key.to_string(), id);
        let mut conn = Conn {
            id,
            at: at.clone(),
            link: link.clone(),
            state: State::Resolving,
            stream: None,
            tls: crate::net::tls::current(),
            unsent: VecDeque::new(),
            in_flight: VecDeque::new(),
            out: Vec::new(),
            out_pos: 0,
            inbuf: Vec::new(),
            filled: 0,
            scanner: FrameScanner::default(),
            readable: false,
            writable: false,
            reply_bytes_since_idle: 0,
            was_idle: false,
            used: false,
            retiring: false,
        };
        if unknown {
            // A Sentinel node whose address the watcher has not given yet.
            conn.state = State::AwaitSentinel;
            self.conns.insert(id, conn);
            (hooks().wake_resolver)();
            return Ok(id);
        }
        match at.host.parse::<IpAddr>() {
            Ok(ip) => {
                if let Err(e) = conn.connect(SocketAddr::new(ip, at.port)) {
                    conn.unregister();
                    self.pool(link).remove(at.address.as_str());
                    return Err(e);
                }
                self.conns.insert(id, conn);
            }
            Err(_) => {
                self.conns.insert(id, conn);
                resolve_in_background(id, at.host.clone(), at.port);
            }
        }
        Ok(id)
    }

    /// Writes the queued requests of a ready connection.
    fn flush(&mut self, id: ConnId, failed: &mut Deliveries) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.state != State::Ready {
            return;
        }
        if conn.in_flight.is_empty() {
            conn.was_idle = conn.used;
            conn.reply_bytes_since_idle = 0;
        }
        while let Some(p) = conn.unsent.pop_front() {
            conn.out.extend_from_slice(&p.request);
            conn.in_flight.push_back(p);
            conn.used = true;
        }
        if let Err(e) = conn.write_out() {
            let e = conn.io_error("cannot send", &e);
            self.fail(id, &e, failed);
        }
    }

    /// Fails the requests of every connection with an expired request, and closes those
    /// connections: their replies can no longer be matched to anything later.
    fn expire(&mut self, failed: &mut Deliveries) {
        let now = Instant::now();
        let expired: Vec<(ConnId, StepError)> = self
            .conns
            .values()
            .filter(|c| {
                c.in_flight
                    .front()
                    .or(c.unsent.front())
                    .is_some_and(|p| p.deadline <= now)
            })
            .map(|c| {
                let why = if c.state == State::AwaitSentinel {
                    let known = (hooks().resolver_error)(&c.at.name);
                    format!(
                        "its address did not come from Sentinel within {} ms{}{}",
                        c.link.timeout.as_millis(),
                        if known.is_empty() { "" } else { ": " },
                        known
                    )
                } else if c.stream.as_ref().is_some_and(Transport::handshaking) {
                    let why = format!(
                        "TLS handshake did not complete within {} ms (does the node speak TLS?)",
                        c.link.timeout.as_millis()
                    );
                    crate::net::tls::count_failure(&format!(
                        "node {} ({}): {why}",
                        c.at.name, c.at.address
                    ));
                    why
                } else {
                    format!("did not answer within {} ms", c.link.timeout.as_millis())
                };
                let e = StepError::of_kind(&c.at, why, StepErrorKind::Timeout);
                (c.id, e)
            })
            .collect();
        for (id, e) in expired {
            self.fail(id, &e, failed);
        }
        self.next_deadline = self
            .conns
            .values()
            .filter_map(|c| c.in_flight.front().or(c.unsent.front()).map(|p| p.deadline))
            .min();
    }

    /// Closes a connection and fails everything it carried with `e`.
    fn fail(&mut self, id: ConnId, e: &StepError, failed: &mut Deliveries) {
        let Some(mut conn) = self.remove(id) else {
            return;
        };
        for p in conn.in_flight.drain(..).chain(conn.unsent.drain(..)) {
            if let Some(w) = p.waiter {
                failed.push((w, Err(e.clone())));
            }
        }
    }

    /// The key a connection is pooled under.
    fn pool_key(&self, conn: &Conn) -> String {
        if conn.state == State::AwaitSentinel {
            awaiting_key(&conn.at.name)
        } else {
            conn.at.address.clone()
        }
    }

    fn remove(&mut self, id: ConnId) -> Option<Conn> {
        let mut conn = self.conns.remove(&id)?;
        let key = self.pool_key(&conn);
        let pool = self.pool(&conn.link);
        if pool.get(key.as_str()) == Some(&id) {
            pool.remove(key.as_str());
        }
        conn.unregister();
        Some(conn)
    }

    /// The node closed the connection: its requests are sent again on a new one when that is
    /// safe (see the module comment), else failed.
    fn closed(&mut self, id: ConnId, cause: io::Error, failed: &mut Deliveries) {
        let Some(mut conn) = self.remove(id) else {
            return;
        };
        if conn
            .in_flight
            .iter()
            .chain(&conn.unsent)
            .all(|p| p.waiter.is_none())
        {
            return; // closed while idle (or in its handshake): nothing to tell anyone
        }
        let unanswered = conn.reply_bytes_since_idle == 0 && conn.scanner_empty();
        let resend = conn.was_idle && unanswered && conn.in_flight.iter().all(|p| !p.resent);
        if resend {
            let (at, link) = (conn.at.clone(), conn.link.clone());
            let mut requeue: Vec<Pending> = conn.in_flight.drain(..).collect();
            requeue.extend(conn.unsent.drain(..));
            let id = match self.connection(&at, &link) {
                Ok(id) => id,
                Err(e) => {
                    failed.extend(
                        requeue
                            .into_iter()
                            .filter_map(|p| p.waiter)
                            .map(|w| (w, Err(e.clone()))),
                    );
                    return;
                }
            };
            for p in &mut requeue {
                p.resent = p.waiter.is_some();
            }
            let ready = match self.conns.get_mut(&id) {
                Some(new) => {
                    new.unsent
                        .extend(requeue.into_iter().filter(|p| p.waiter.is_some()));
                    new.state == State::Ready
                }
                None => false,
            };
            if ready {
                self.dirty.push(id);
            }
            return;
        }
        let what = if conn.reply_bytes_since_idle == 0 && conn.scanner_empty() {
            "closed the connection without answering"
        } else {
            "closed the connection in the middle of a reply"
        };
        let e = StepError::new(&conn.at, format!("{what}: {cause}"));
        for p in conn.in_flight.drain(..).chain(conn.unsent.drain(..)) {
            if let Some(w) = p.waiter {
                failed.push((w, Err(e.clone())));
            }
        }
    }

    /// The socket of `id` can be read, written, or finished connecting.
    fn on_event(&mut self, id: ConnId, mask: c_int, failed: &mut Deliveries) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.state == State::Connecting {
            match conn.connected() {
                Ok(()) => {}
                Err(e) => {
                    let e = conn.io_error("cannot connect", &e);
                    self.fail(id, &e, failed);
                    return;
                }
            }
            if conn.state == State::Ready {
                self.flush(id, failed);
            }
            return;
        }
        if mask & raw::REDISMODULE_EVENTLOOP_WRITABLE as c_int != 0 {
            if conn.out_pos < conn.out.len()
                || conn.stream.as_ref().is_some_and(Transport::wants_write)
            {
                if let Err(e) = conn.write_out() {
                    let e = conn.io_error("cannot send", &e);
                    self.fail(id, &e, failed);
                    return;
                }
            } else {
                conn.stop_writable();
                self.flush(id, failed);
            }
        }
        if mask & raw::REDISMODULE_EVENTLOOP_READABLE as c_int != 0 {
            self.read(id, failed);
        }
    }

    fn read(&mut self, id: ConnId, failed: &mut Deliveries) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let closed = match conn.read_in() {
            Ok(true) => None,
            Ok(false) => Some(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Err(e) => {
                if let Some(why) = crate::net::tls::failure(&e) {
                    // A refused peer: never a reason to send the requests again.
                    let e = StepError::new(&conn.at, why);
                    crate::net::tls::count_failure(&e.to_string());
                    self.fail(id, &e, failed);
                    return;
                }
                Some(e)
            }
        };
        // Handshake records (or an alert) the read produced, and requests written during the
        // handshake, go out now.
        if closed.is_none() && conn.stream.as_ref().is_some_and(Transport::wants_write) {
            if let Err(e) = conn.write_out() {
                let e = conn.io_error("cannot send", &e);
                self.fail(id, &e, failed);
                return;
            }
        }
        // Whole replies first: a node may answer and then close.
        let became_ready = match conn.take_replies(failed) {
            Ok(ready) => ready,
            Err(e) => {
                self.fail(id, &e, failed);
                return;
            }
        };
        if let Some(cause) = closed {
            self.closed(id, cause, failed);
            return;
        }
        if conn.retiring && conn.in_flight.is_empty() && conn.unsent.is_empty() {
            self.remove(id);
            return;
        }
        if became_ready {
            self.flush(id, failed);
        }
    }
}

impl Conn {
    fn connect(&mut self, addr: SocketAddr) -> Result<(), StepError> {
        let at = self.at.clone();
        let fail = |e: io::Error| StepError::new(&at, format!("cannot connect: {e}"));
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(fail)?;
        socket.set_nonblocking(true).map_err(fail)?;
        socket.set_nodelay(true).map_err(fail)?;
        let started = socket.connect(&SockAddr::from(addr));
        let in_progress = match started {
            Ok(()) => false,
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => true,
            Err(e) => return Err(fail(e)),
        };
        // The peer's name is the ring address's host (or shard.tls-server-name), not the IP
        // it resolved to.
        let transport = Transport::new(TcpStream::from(socket), self.tls.as_ref(), &at.host)
            .map_err(|e| StepError::new(&at, format!("TLS: {e}")))?;
        self.stream = Some(transport);
        if in_progress {
            self.state = State::Connecting;
            self.want_writable();
            Ok(())
        } else {
            self.connected().map_err(fail)
        }
    }

    /// The connect finished (or failed): start the handshake.
    fn connected(&mut self) -> io::Result<()> {
        let stream = self
            .stream
            .as_ref()
            .ok_or(io::ErrorKind::NotConnected)?
            .tcp();
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
        // Not yet connected (a spurious wake-up): wait for the next event.
        if self.state == State::Connecting && stream.peer_addr().is_err() {
            return Ok(());
        }
        self.stop_writable();
        self.register(raw::REDISMODULE_EVENTLOOP_READABLE as c_int)?;
        self.readable = true;
        let steps = handshake(&self.link);
        // Requests wait for the steps whose failure refuses the connection (credentials, the
        // database); the others are answered in turn, ahead of the first requests.
        self.state = if steps.iter().any(|(_, step)| !step.tolerant()) {
            State::Handshaking
        } else {
            State::Ready
        };
        for (args, step) in steps {
            self.out.extend_from_slice(&encode_command(&args));
            self.in_flight.push_back(Pending {
                waiter: None,
                request: Vec::new(),
                deadline: Instant::now() + self.link.timeout,
                resent: false,
                step: Some(step),
            });
        }
        self.write_out()
    }

    /// Writes as much of `out` as the socket takes; asks for the writable event for the rest.
    fn write_out(&mut self) -> io::Result<()> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        while self.out_pos < self.out.len() {
            match stream.write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.want_writable();
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if !stream.flush_pending()? {
            self.want_writable();
        }
        self.out.clear();
        self.out_pos = 0;
        if self.out.capacity() > READ_CHUNK {
            self.out.shrink_to(READ_CHUNK);
        }
        Ok(())
    }

    /// Reads what the socket has. `Ok(false)`: the node closed the connection.
    fn read_in(&mut self) -> io::Result<bool> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(false);
        };
        loop {
            if self.inbuf.len() - self.filled < READ_CHUNK / 4 {
                let grown = (self.inbuf.len() * 2).max(READ_CHUNK);
                self.inbuf.resize(grown, 0);
            }
            match stream.read(&mut self.inbuf[self.filled..]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.filled += n;
                    self.reply_bytes_since_idle += n;
                    if self.filled < self.inbuf.len() {
                        return Ok(true);
                    }
                }
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(true),
                    io::ErrorKind::Interrupted => {}
                    _ => return Err(e),
                },
            }
        }
    }

    /// Hands every whole reply to its waiter. `Ok(true)` when the handshake just succeeded.
    fn take_replies(&mut self, out: &mut Deliveries) -> Result<bool, StepError> {
        let mut consumed = 0;
        let mut became_ready = false;
        loop {
            let frame = self
                .scanner
                .scan(&self.inbuf[consumed..self.filled])
                .map_err(|e| StepError::new(&self.at, e.to_string()))?;
            let Some(len) = frame else {
                break;
            };
            let bytes = &self.inbuf[consumed..consumed + len];
            let reply =
                read_reply(&mut &bytes[..]).map_err(|e| StepError::new(&self.at, e.to_string()))?;
            consumed += len;
            self.scanner.reset();
            let Some(p) = self.in_flight.pop_front() else {
                return Err(StepError::new(&self.at, "a reply nobody asked for"));
            };
            match p.waiter {
                // The node wants credentials this module was not given: say which node.
                Some(w) => out.push((w, self.authenticated(reply))),
                None => {
                    match (reply, p.step) {
                        (Resp::Error(e), Some(step)) if !step.tolerant() => {
                            return Err(StepError::new(&self.at, step.refused(self.link.db, &e)));
                        }
                        _ => {}
                    }
                    let waiting = self
                        .in_flight
                        .iter()
                        .any(|next| next.step.is_some_and(|s| !s.tolerant()));
                    if self.state == State::Handshaking && !waiting {
                        self.state = State::Ready;
                        became_ready = true;
                    }
                }
            }
        }
        self.inbuf.copy_within(consumed..self.filled, 0);
        self.filled -= consumed;
        if self.filled == 0 && self.inbuf.len() > 4 * READ_CHUNK {
            self.inbuf = Vec::new();
        }
        if self.in_flight.is_empty() {
            self.reply_bytes_since_idle = 0;
        }
        Ok(became_ready)
    }

    /// A reply, or the error naming the node when the node asks for credentials.
    fn authenticated(&self, reply: Resp) -> Outcome {
        match reply {
            Resp::Error(e) if e.starts_with(b"NOAUTH") => Err(StepError::new(
                &self.at,
                format!(
                    "{}: set shard.auth-password (and shard.auth-user)",
                    String::from_utf8_lossy(&e)
                ),
            )),
            reply => Ok(reply),
        }
    }

    fn scanner_empty(&self) -> bool {
        self.filled == 0
    }

    fn io_error(&self, what: &str, e: &io::Error) -> StepError {
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => StepError::of_kind(
                &self.at,
                format!("did not answer within {} ms", self.link.timeout.as_millis()),
                StepErrorKind::Timeout,
            ),
            _ => StepError::new(&self.at, format!("{what}: {e}")),
        }
    }

    fn fd(&self) -> Option<c_int> {
        self.stream.as_ref().map(|s| s.tcp().as_raw_fd())
    }

    fn register(&self, mask: c_int) -> io::Result<()> {
        let fd = self.fd().ok_or(io::ErrorKind::NotConnected)?;
        // SAFETY: a live socket of this module; the callback finds the connection by the id
        // carried in `user_data` and ignores ids that are gone.
        let ok = unsafe {
            let add = raw::RedisModule_EventLoopAdd.ok_or(io::ErrorKind::Unsupported)?;
            add(fd, mask, Some(on_socket_event), self.id as *mut c_void)
        };
        if ok == raw::REDISMODULE_OK as c_int {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn want_writable(&mut self) {
        if !self.writable
            && self
                .register(raw::REDISMODULE_EVENTLOOP_WRITABLE as c_int)
                .is_ok()
        {
            self.writable = true;
        }
    }

    fn stop_writable(&mut self) {
        if self.writable {
            // SAFETY: reading the API table Redis filled at load; a live socket of this module.
            unsafe {
                if let (Some(fd), Some(del)) = (self.fd(), raw::RedisModule_EventLoopDel) {
                    del(fd, raw::REDISMODULE_EVENTLOOP_WRITABLE as c_int);
                }
            }
            self.writable = false;
        }
    }

    /// Removes the socket from the event loop (before it is closed, so a reused fd is safe).
    fn unregister(&mut self) {
        let mask =
            (raw::REDISMODULE_EVENTLOOP_READABLE | raw::REDISMODULE_EVENTLOOP_WRITABLE) as c_int;
        if self.readable || self.writable {
            // SAFETY: reading the API table Redis filled at load; a live socket of this module.
            unsafe {
                if let (Some(fd), Some(del)) = (self.fd(), raw::RedisModule_EventLoopDel) {
                    del(fd, mask);
                }
            }
        }
        self.readable = false;
        self.writable = false;
    }
}

/// What a new connection says first: `HELLO` for RESP3 or credentials, then `SELECT db`
/// for a database other than 0 (an error of either refuses the connection), then
/// `SHARD.CLUSTER INTERNAL`, so that a node with the cluster protocol on never redirects
/// this module's own requests (an error there is ignored).
fn handshake(link: &Link) -> Vec<(Vec<Vec<u8>>, Handshake)> {
    let mut steps = Vec::new();
    if link.resp3 || link.auth.is_some() {
        let mut hello = vec![
            b"HELLO".to_vec(),
            if link.resp3 { b"3" } else { b"2" }.to_vec(),
        ];
        if let Some((user, password)) = &link.auth {
            let user = if user.is_empty() { "default" } else { user };
            hello.extend([
                b"AUTH".to_vec(),
                user.as_bytes().to_vec(),
                password.as_bytes().to_vec(),
            ]);
        }
        steps.push((hello, Handshake::Hello));
    }
    if link.db != 0 {
        let db = link.db.to_string().into_bytes();
        steps.push((vec![b"SELECT".to_vec(), db], Handshake::Select));
    }
    steps.push((
        vec![b"SHARD.CLUSTER".to_vec(), b"INTERNAL".to_vec()],
        Handshake::Internal,
    ));
    steps
}

extern "C" fn on_socket_event(_fd: c_int, user_data: *mut c_void, mask: c_int) {
    let id = user_data as ConnId;
    let mut failed: Deliveries = Vec::new();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        NET.with(|net| net.borrow_mut().on_event(id, mask, &mut failed));
    }));
    if outcome.is_err() {
        redis_module::logging::log_warning(
            "shard: internal error in a routed connection; it was dropped",
        );
        NET.with(|net| {
            if let Ok(mut net) = net.try_borrow_mut() {
                if let Some(at) = net.conns.get(&id).map(|c| c.at.clone()) {
                    let e = StepError::new(&at, "internal error; see the Redis log");
                    net.fail(id, &e, &mut failed);
                }
            }
        });
    }
    (hooks().deliver)(failed);
}

/// Looks a host name up on a thread of its own (a DNS query must never hold the server), then
/// carries the answer back to the main thread.
fn resolve_in_background(id: ConnId, host: String, port: u16) {
    struct Resolved {
        id: ConnId,
        addr: io::Result<SocketAddr>,
    }
    extern "C" fn back_on_main_thread(data: *mut c_void) {
        // SAFETY: made by Box::into_raw below, handed over exactly once.
        let resolved = unsafe { Box::from_raw(data.cast::<Resolved>()) };
        let mut failed: Deliveries = Vec::new();
        NET.with(|net| {
            let mut net = net.borrow_mut();
            let Some(conn) = net.conns.get(&resolved.id) else {
                return;
            };
            if conn.state != State::Resolving {
                return;
            }
            let addr = resolved.addr.map_err(|e| {
                StepError::new(&conn.at, format!("the address does not resolve: {e}"))
            });
            net.connect_known(resolved.id, addr, &mut failed);
        });
        (hooks().deliver)(failed);
    }
    let spawned = std::thread::Builder::new()
        .name("shard-resolve".into())
        .spawn(move || {
            let addr = (host.as_str(), port).to_socket_addrs().and_then(|mut a| {
                a.next()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))
            });
            let data = Box::into_raw(Box::new(Resolved { id, addr }));
            // SAFETY: the one-shot runs `back_on_main_thread` once on the main thread, which
            // takes the box back.
            unsafe {
                if let Some(add) = raw::RedisModule_EventLoopAddOneShot {
                    add(Some(back_on_main_thread), data.cast());
                }
            }
        });
    if let Err(e) = spawned {
        redis_module::logging::log_warning(format!("shard: cannot start a resolver: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(resp3: bool, auth: bool, db: u32) -> Link {
        Link {
            timeout: Duration::from_millis(100),
            auth: auth.then(|| (String::new(), "pw".to_string())),
            resp3,
            db,
        }
    }

    fn steps(link: &Link) -> Vec<(String, Handshake)> {
        handshake(link)
            .into_iter()
            .map(|(args, step)| {
                let words: Vec<String> = args
                    .iter()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                (words.join(" "), step)
            })
            .collect()
    }

    #[test]
    fn database_0_says_no_select() {
        assert_eq!(
            steps(&link(false, false, 0)),
            [("SHARD.CLUSTER INTERNAL".into(), Handshake::Internal)]
        );
        assert_eq!(
            steps(&link(true, true, 0)),
            [
                ("HELLO 3 AUTH default pw".into(), Handshake::Hello),
                ("SHARD.CLUSTER INTERNAL".into(), Handshake::Internal)
            ]
        );
    }

    #[test]
    fn other_databases_select_after_the_credentials_and_wait_for_it() {
        let got = steps(&link(false, true, 15));
        assert_eq!(
            got,
            [
                ("HELLO 2 AUTH default pw".into(), Handshake::Hello),
                ("SELECT 15".into(), Handshake::Select),
                ("SHARD.CLUSTER INTERNAL".into(), Handshake::Internal)
            ]
        );
        assert!(!Handshake::Select.tolerant() && Handshake::Internal.tolerant());
        assert_eq!(
            steps(&link(false, false, 3))[0],
            ("SELECT 3".into(), Handshake::Select)
        );
    }

    #[test]
    fn a_refused_select_names_the_database() {
        assert_eq!(
            Handshake::Select.refused(5, b"ERR DB index is out of range"),
            "cannot select database 5: ERR DB index is out of range"
        );
        assert!(Handshake::Select
            .refused(5, b"NOAUTH Authentication required.")
            .ends_with("set shard.auth-password (and shard.auth-user)"));
        assert_eq!(
            Handshake::Hello.refused(0, b"WRONGPASS no"),
            "handshake refused: WRONGPASS no"
        );
    }
}
