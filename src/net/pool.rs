//! Pipelined connections to other nodes, driven by the server's own event loop on its main
//! thread: the one connection layer every routed call goes through.
//!
//! Per node, per RESP version of the callers and per database one long-lived non-blocking
//! connection. Requests are queued on it and written back to back: everything queued during
//! one turn of the event loop leaves in one `write`, just before the server sleeps (the
//! `BEFORE_SLEEP` event); a request queued after that point (a client unblocked in the same
//! turn sends its next call; a transaction's `COMMIT`s, held past the AOF write,
//! `txn::coord::turn`) leaves with the next turn's, and the loop is woken once for that turn
//! (`wake_next_turn`). Replies are matched to requests in order; each waiter is told
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
//!
//! This file holds the pool and its turns of the event loop: the requests queued, the flush
//! before the server sleeps, the deadlines, and the connections by node, RESP version and
//! database. One connection's state and I/O are `conn`'s, its first words `handshake`'s, what
//! happens to connections from outside (a socket ready, a close, an address learned)
//! `pool_events`', and the connections of their own for requests that hold their connection
//! (`SHARD.CALL WAIT`) `lanes`'.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::net::conn::{Conn, Pending, State};
use crate::net::endpoint::{Endpoint, StepError, StepErrorKind};
use crate::net::pool_events::resolve_in_background;
use crate::net::resp::{encode_command, Resp};
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

/// The deadline of a request with no time limit (WAIT's timeout 0): far enough never to come.
const NO_LIMIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Who gets a reply: an opaque number the caller chose (see `forward`).
pub type Waiter = u64;

/// What a request came to.
pub type Outcome = Result<Resp, StepError>;

/// A connection's number in the pool.
pub(super) type ConnId = usize;

/// Which of the connections to a node (for one RESP version and database) a connection is: 0
/// the shared pipelined one every request goes on; 1 and up the connections of their own that
/// requests holding their connection take, one call at a time (`lanes`).
pub(super) type Lane = u16;

/// Every connection, the main thread's only.
#[derive(Default)]
pub(super) struct Net {
    pub(super) conns: HashMap<ConnId, Conn>,
    /// Database 0's connections by node address, for RESP2 callers (`[0]`) and RESP3 ones
    /// (`[1]`).
    pub(super) by_node: [HashMap<String, ConnId>; 2],
    /// The other databases' connections, and the connections of their own (`lanes`), by
    /// database, RESP3 and lane, then by node address.
    pub(super) by_node_db: HashMap<(u32, bool, Lane), HashMap<String, ConnId>>,
    pub(super) next_id: ConnId,
    /// Connections with requests to write at the next flush.
    pub(super) dirty: Vec<ConnId>,
    /// The server has passed its `BEFORE_SLEEP` in this turn of the loop: requests queued now
    /// wait for the next turn's flush.
    pub(super) after_flush: bool,
    /// The loop was asked to wake at once for the next turn (`wake_next_turn`).
    pub(super) wake_asked: bool,
    /// The earliest deadline of any request in flight.
    pub(super) next_deadline: Option<Instant>,
    /// When the event loop last woke up: deadlines count from there (one clock read per turn
    /// of the loop, not per request).
    pub(super) woke: Option<Instant>,
}

thread_local! {
    pub(super) static NET: RefCell<Net> = RefCell::new(Net::default());
}

/// What the pool reports upward, set once at load by the layers above (`lib.rs`): the network
/// knows no ring and no routed call, so replies and failures go to whoever registered.
#[derive(Clone, Copy)]
pub struct Hooks {
    /// Hands replies and failures to their waiters (`route::forward`).
    pub deliver: fn(Vec<(Waiter, Outcome)>),
    /// Asks for the address of the named node, which has none yet (`topology::watcher`).
    pub wake_resolver: fn(&str),
    /// Why a node's address is not known, for a request that waited for it in vain.
    pub resolver_error: fn(&str) -> String,
}

fn ignore(_: Vec<(Waiter, Outcome)>) {}
fn nothing(_: &str) {}
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

pub(super) fn hooks() -> Hooks {
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
pub(super) type Deliveries = Vec<(Waiter, Outcome)>;

/// Queues `args` for the node `at`; `deliver` is later called with `waiter` and the reply or
/// the error (never from inside this function).
pub fn request(at: &Endpoint, link: &Link, args: &[impl AsRef<[u8]>], waiter: Waiter) {
    let bytes = encode_command(args);
    let mut failed: Deliveries = Vec::new();
    NET.with(|net| {
        let mut net = net.borrow_mut();
        match net.connection(at, link, 0) {
            Ok(id) => net.enqueue(
                id,
                link.timeout,
                vec![(bytes, waiter, Some(Duration::ZERO))],
            ),
            Err(e) => failed.push((waiter, Err(e))),
        }
    });
    (hooks().deliver)(failed);
}

thread_local! {
    /// A test's kill (`kill_after_writing`): the waiter of the request whose write ends the
    /// process.
    static KILL_AFTER: std::cell::Cell<Option<Waiter>> = const { std::cell::Cell::new(None) };
}

/// For a test (`SHARD.DEBUG TXN-HOLD kill-after-commit`): this process kills itself (SIGKILL,
/// as `kill -9`) right after the bytes of the request of `waiter` are written to its socket
/// (the first request so marked: a later one does not move the kill).
pub fn kill_after_writing(waiter: Waiter) {
    KILL_AFTER.with(|k| {
        if k.get().is_none() {
            k.set(Some(waiter));
        }
    });
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
        net.wake_asked = false;
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
                let (key, link, lane) = (net.pool_key(conn), conn.link.clone(), conn.lane);
                let pool = net.pool(&link, lane);
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
    /// The connections for `link`'s RESP version and database, and `lane`, by node address.
    pub(super) fn pool(&mut self, link: &Link, lane: Lane) -> &mut HashMap<String, ConnId> {
        if link.db == 0 && lane == 0 {
            &mut self.by_node[usize::from(link.resp3)]
        } else {
            self.by_node_db
                .entry((link.db, link.resp3, lane))
                .or_default()
        }
    }

    /// The key `at`'s connections are pooled under: its address, or its name while Sentinel
    /// has not given its address yet (looked up without allocating: this runs for every
    /// forwarded request).
    pub(super) fn with_key<R>(at: &Endpoint, f: impl FnOnce(&str) -> R) -> R {
        let waiting_key = (at.port == 0).then(|| awaiting_key(&at.name));
        f(waiting_key.as_deref().unwrap_or(at.address.as_str()))
    }

    /// Queues requests (encoded, each with its waiter and its time beyond the call timeout
    /// `timeout` of their caller's link, `None` for no limit) on connection `id`, back to
    /// back; they leave at the next flush. The deadlines are the requests' own, not those of
    /// the link that opened the connection.
    pub(super) fn enqueue(
        &mut self,
        id: ConnId,
        timeout: Duration,
        requests: Vec<(Vec<u8>, Waiter, Option<Duration>)>,
    ) {
        let base = self.woke.unwrap_or_else(Instant::now);
        let after_flush = self.after_flush;
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let was_empty = conn.unsent.is_empty();
        let mut earliest = None;
        for (request, waiter, extra) in requests {
            let call = base + timeout;
            // No limit: the request may hold its connection for as long as it takes (WAIT's
            // timeout 0); a far deadline keeps one comparison for every request.
            let deadline = extra
                .and_then(|extra| call.checked_add(extra))
                .unwrap_or_else(|| call.checked_add(NO_LIMIT).unwrap_or(call));
            earliest = Some(earliest.map_or(deadline, |d: Instant| d.min(deadline)));
            conn.unsent.push_back(Pending {
                waiter: Some(waiter),
                request,
                deadline,
                timeout,
                resent: false,
                step: None,
            });
        }
        let ready = conn.state == State::Ready;
        // After this turn's flush, the request waits for the next one, and the loop is asked
        // once per turn to wake at once (a one-shot on the server's module pipe): the next
        // turn's flush then writes it with everything else queued for that node, where a
        // writable event per connection cost two `epoll_ctl` and a write of its own. Without
        // the one-shot API, the socket's writable event.
        if let Some(d) = earliest {
            self.next_deadline = Some(self.next_deadline.map_or(d, |n| n.min(d)));
        }
        if ready && was_empty {
            self.dirty.push(id);
            if after_flush && !self.wake_next_turn() {
                if let Some(conn) = self.conns.get_mut(&id) {
                    conn.want_writable();
                }
            }
        }
    }

    /// Asks the event loop to start its next turn at once (once per turn); false if it
    /// cannot.
    fn wake_next_turn(&mut self) -> bool {
        if !self.wake_asked {
            self.wake_asked = crate::host::event_loop::on_main_thread(|()| {}, ());
        }
        self.wake_asked
    }

    /// The connection to `at` for `link`'s RESP version and database in `lane`, opened if
    /// there is none.
    pub(super) fn connection(
        &mut self,
        at: &Endpoint,
        link: &Link,
        lane: Lane,
    ) -> Result<ConnId, StepError> {
        let unknown = at.port == 0;
        let found = Net::with_key(at, |key| self.pool(link, lane).get(key).copied());
        if let Some(id) = found {
            return Ok(id);
        }
        let id = self.next_id;
        self.next_id += 1;
        Net::with_key(at, |key| self.pool(link, lane).insert(key.to_string(), id));
        let mut conn = Conn::new(id, at, link, lane);
        if unknown {
            // A Sentinel node whose address the watcher has not given yet.
            conn.state = State::AwaitSentinel;
            let name = conn.at.name.clone();
            self.conns.insert(id, conn);
            (hooks().wake_resolver)(&name);
            return Ok(id);
        }
        match at.host.parse::<IpAddr>() {
            Ok(ip) => {
                if let Err(e) = conn.connect(SocketAddr::new(ip, at.port)) {
                    conn.unregister();
                    self.pool(link, lane).remove(at.address.as_str());
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
    pub(super) fn flush(&mut self, id: ConnId, failed: &mut Deliveries) {
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
        let kill = KILL_AFTER.with(std::cell::Cell::get);
        let mut killing = false;
        while let Some(p) = conn.unsent.pop_front() {
            conn.out.extend_from_slice(&p.request);
            killing |= kill.is_some() && p.waiter == kill;
            conn.in_flight.push_back(p);
            conn.used = true;
        }
        match conn.write_out() {
            Err(e) => {
                let e = conn.io_error("cannot send", &e);
                self.fail(id, &e, failed);
            }
            Ok(()) if killing && conn.out_pos >= conn.out.len() => {
                // SAFETY: a signal to this very process; nothing is handed to it.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            Ok(()) => {}
        }
    }

    /// Fails the requests of every connection with an expired request, and closes those
    /// connections: their replies can no longer be matched to anything later. Any request of
    /// a connection may be the one expired: requests of different timeouts share it, so the
    /// first one queued is not always the first one due.
    pub(super) fn expire(&mut self, failed: &mut Deliveries) {
        let now = Instant::now();
        let expired: Vec<(ConnId, StepError)> = self
            .conns
            .values()
            .filter_map(|c| {
                let due = c
                    .in_flight
                    .iter()
                    .chain(&c.unsent)
                    .filter(|p| p.deadline <= now)
                    .min_by_key(|p| p.deadline)?;
                let ms = due.timeout.as_millis();
                let why = if c.state == State::AwaitSentinel {
                    let known = (hooks().resolver_error)(&c.at.name);
                    format!(
                        "its address did not come from Sentinel within {ms} ms{}{}",
                        if known.is_empty() { "" } else { ": " },
                        known
                    )
                } else if c.stream.as_ref().is_some_and(Transport::handshaking) {
                    let why = format!(
                        "TLS handshake did not complete within {ms} ms (does the node speak TLS?)"
                    );
                    crate::net::tls_failure::count_failure(&format!(
                        "node {} ({}): {why}",
                        c.at.name, c.at.address
                    ));
                    why
                } else {
                    format!("did not answer within {ms} ms")
                };
                let e = StepError::of_kind(&c.at, why, StepErrorKind::Timeout);
                Some((c.id, e))
            })
            .collect();
        for (id, e) in expired {
            self.fail(id, &e, failed);
        }
        self.next_deadline = self
            .conns
            .values()
            .flat_map(|c| c.in_flight.iter().chain(&c.unsent).map(|p| p.deadline))
            .min();
    }

    /// Closes a connection and fails everything it carried with `e`.
    pub(super) fn fail(&mut self, id: ConnId, e: &StepError, failed: &mut Deliveries) {
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
    pub(super) fn pool_key(&self, conn: &Conn) -> String {
        if conn.state == State::AwaitSentinel {
            awaiting_key(&conn.at.name)
        } else {
            conn.at.address.clone()
        }
    }

    pub(super) fn remove(&mut self, id: ConnId) -> Option<Conn> {
        let mut conn = self.conns.remove(&id)?;
        let key = self.pool_key(&conn);
        let pool = self.pool(&conn.link, conn.lane);
        if pool.get(key.as_str()) == Some(&id) {
            pool.remove(key.as_str());
        }
        conn.unregister();
        Some(conn)
    }
}
