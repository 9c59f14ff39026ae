//! One connection of the pool: its state (waiting for an address, resolving, connecting,
//! handshaking, ready), its requests (queued, then written and unanswered, in order), and its
//! socket on the event loop: a non-blocking connect, the handshake's steps written first
//! (`handshake`), writes of what the socket takes, reads, and each whole reply handed to its
//! waiter. What the pool does with a connection is `pool`'s; what happens to it from outside
//! (a socket ready, a close) is `pool_events`'.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::host::event_loop::{self, Ready};
use crate::net::endpoint::{Endpoint, StepError, StepErrorKind};
use crate::net::frame::FrameScanner;
use crate::net::handshake::{self, Handshake};
use crate::net::pool::{ConnId, Deliveries, Lane, Link, Outcome, Waiter};
use crate::net::pool_events::Sockets;
use crate::net::resp::{encode_command, read_reply, Resp};
use crate::net::tls::Tls;
use crate::net::transport::Transport;

/// The largest read per `read` call, and how much a buffer keeps when idle.
const READ_CHUNK: usize = 64 * 1024;

pub(super) struct Pending {
    /// `None`: a step of the connection's own handshake.
    pub(super) waiter: Option<Waiter>,
    pub(super) request: Vec<u8>,
    /// When it fails unanswered: its own call timeout (and extra time) from when it was
    /// queued. Each request carries its own: the requests of one connection may come from
    /// links of different timeouts (a routed call's, a fleet request's), and the call
    /// timeout may have changed since the connection opened.
    pub(super) deadline: Instant,
    /// The call timeout the deadline was counted from, for the error.
    pub(super) timeout: std::time::Duration,
    /// Already sent once on a connection that closed unanswered: never sent a third time.
    pub(super) resent: bool,
    /// The handshake step this is (`None` for a request).
    pub(super) step: Option<Handshake>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Waiting for Sentinel to give the address of a `sentinel` node (`topology::watcher`).
    AwaitSentinel,
    /// Waiting for the address of a host name (a resolver thread).
    Resolving,
    /// A non-blocking connect under way.
    Connecting,
    /// Connected; the handshake's reply not yet in.
    Handshaking,
    Ready,
}

pub(super) struct Conn {
    pub(super) id: ConnId,
    pub(super) at: Endpoint,
    pub(super) link: Link,
    /// Which of the node's connections this is: the shared one (0), or one of its own.
    pub(super) lane: Lane,
    pub(super) state: State,
    pub(super) stream: Option<Transport>,
    /// The TLS configuration in force when the connection was made (`None`: plain TCP): a
    /// rotated certificate serves the connections made after it.
    pub(super) tls: Option<Arc<Tls>>,
    /// Requests not yet written (in order), then those written and unanswered.
    pub(super) unsent: VecDeque<Pending>,
    pub(super) in_flight: VecDeque<Pending>,
    pub(super) out: Vec<u8>,
    pub(super) out_pos: usize,
    /// Bytes read: `inbuf[..filled]`; the rest is room for the next read.
    pub(super) inbuf: Vec<u8>,
    pub(super) filled: usize,
    pub(super) scanner: FrameScanner,
    /// Events registered with the event loop.
    pub(super) readable: bool,
    pub(super) writable: bool,
    /// Bytes of replies received since the connection last had nothing in flight, and
    /// whether it had been idle (used, then quiet) before that: together they decide whether
    /// a close may be answered by sending the requests again.
    pub(super) reply_bytes_since_idle: usize,
    pub(super) was_idle: bool,
    pub(super) used: bool,
    /// Out of the pool (`shard.tls` was turned on or off): closes once its requests are
    /// answered.
    pub(super) retiring: bool,
}

impl Conn {
    /// A connection to `at` for `link` in `lane`, not yet connected (it starts by resolving).
    pub(super) fn new(id: ConnId, at: &Endpoint, link: &Link, lane: Lane) -> Conn {
        Conn {
            id,
            at: at.clone(),
            link: link.clone(),
            lane,
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
        }
    }

    pub(super) fn connect(&mut self, addr: SocketAddr) -> Result<(), StepError> {
        let at = self.at.clone();
        let fail = |e: io::Error| StepError::new(&at, format!("cannot connect: {e}"));
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(fail)?;
        socket.set_nonblocking(true).map_err(fail)?;
        socket.set_nodelay(true).map_err(fail)?;
        crate::net::source::bind(&socket, &addr).map_err(fail)?;
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
    pub(super) fn connected(&mut self) -> io::Result<()> {
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
        self.register(Ready::READABLE)?;
        self.readable = true;
        let steps = handshake::steps(&self.link);
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
                timeout: self.link.timeout,
                resent: false,
                step: Some(step),
            });
        }
        self.write_out()
    }

    /// Writes as much of `out` as the socket takes; asks for the writable event for the rest.
    pub(super) fn write_out(&mut self) -> io::Result<()> {
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
    pub(super) fn read_in(&mut self) -> io::Result<bool> {
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
    pub(super) fn take_replies(&mut self, out: &mut Deliveries) -> Result<bool, StepError> {
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
    pub(super) fn authenticated(&self, reply: Resp) -> Outcome {
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

    pub(super) fn scanner_empty(&self) -> bool {
        self.filled == 0
    }

    pub(super) fn io_error(&self, what: &str, e: &io::Error) -> StepError {
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => StepError::of_kind(
                &self.at,
                format!("did not answer within {} ms", self.link.timeout.as_millis()),
                StepErrorKind::Timeout,
            ),
            _ => StepError::new(&self.at, format!("{what}: {e}")),
        }
    }

    pub(super) fn fd(&self) -> Option<RawFd> {
        self.stream.as_ref().map(|s| s.tcp().as_raw_fd())
    }

    /// Asks the event loop for `what` on the socket; the events come to `pool_events`.
    fn register(&self, what: Ready) -> io::Result<()> {
        let fd = self.fd().ok_or(io::ErrorKind::NotConnected)?;
        event_loop::watch::<Sockets>(fd, what, self.id)
    }

    pub(super) fn want_writable(&mut self) {
        if !self.writable && self.register(Ready::WRITABLE).is_ok() {
            self.writable = true;
        }
    }

    pub(super) fn stop_writable(&mut self) {
        if self.writable {
            if let Some(fd) = self.fd() {
                event_loop::unwatch(fd, Ready::WRITABLE);
            }
            self.writable = false;
        }
    }

    /// Removes the socket from the event loop (before it is closed, so a reused fd is safe).
    pub(super) fn unregister(&mut self) {
        if self.readable || self.writable {
            if let Some(fd) = self.fd() {
                event_loop::unwatch(fd, Ready::BOTH);
            }
        }
        self.readable = false;
        self.writable = false;
    }
}
