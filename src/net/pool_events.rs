//! What happens to the pool's connections from outside, on the main thread: a socket ready
//! (connected, writable, readable: `Sockets`, called by the event loop), a node closing a
//! connection (its requests sent again on a new one when that is safe, else failed), and an
//! address learned for a connection that waited for it (a resolver thread's answer, or
//! Sentinel's through `pool::topology_changed`).

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use crate::host::event_loop::{self, Ready, SocketEvents};
use crate::net::conn::{Pending, State};
use crate::net::endpoint::StepError;
use crate::net::pool::{hooks, ConnId, Deliveries, Net, NET};
use crate::net::transport::Transport;

impl Net {
    /// Sentinel's answer for a connection waiting for its node's address.
    pub(super) fn sentinel_answered(
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
        let (link, lane) = (conn.link.clone(), conn.lane);
        self.pool(&link, lane).entry(address).or_insert(id);
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
    pub(super) fn connect_known(
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

    /// The node closed the connection: its requests are sent again on a new one when that is
    /// safe (see the module comment), else failed.
    pub(super) fn closed(&mut self, id: ConnId, cause: io::Error, failed: &mut Deliveries) {
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
            // On a new connection of the same lane: a command and its WAIT stay together, and
            // alone.
            let id = match self.connection(&at, &link, conn.lane) {
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
    pub(super) fn on_event(&mut self, id: ConnId, ready: Ready, failed: &mut Deliveries) {
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
        if ready.writable {
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
        if ready.readable {
            self.read(id, failed);
        }
    }

    pub(super) fn read(&mut self, id: ConnId, failed: &mut Deliveries) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let closed = match conn.read_in() {
            Ok(true) => None,
            Ok(false) => Some(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Err(e) => {
                if let Some(why) = crate::net::tls_failure::failure(&e) {
                    // A refused peer: never a reason to send the requests again.
                    let e = StepError::new(&conn.at, why);
                    crate::net::tls_failure::count_failure(&e.to_string());
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

/// The pool's sockets, as the event loop knows them.
pub(super) struct Sockets;

impl SocketEvents for Sockets {
    fn ready(id: ConnId, ready: Ready) {
        let mut failed: Deliveries = Vec::new();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            NET.with(|net| net.borrow_mut().on_event(id, ready, &mut failed));
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
}

/// Looks a host name up on a thread of its own (a DNS query must never hold the server), then
/// carries the answer back to the main thread.
pub(super) fn resolve_in_background(id: ConnId, host: String, port: u16) {
    struct Resolved {
        id: ConnId,
        addr: io::Result<SocketAddr>,
    }
    fn back_on_main_thread(resolved: Resolved) {
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
            event_loop::on_main_thread(back_on_main_thread, Resolved { id, addr });
        });
    if let Err(e) = spawned {
        redis_module::logging::log_warning(format!("shard: cannot start a resolver: {e}"));
    }
}
