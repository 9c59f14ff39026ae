//! The byte stream of every connection the module opens to another server: plain TCP, or TLS
//! over it when `shard.tls` is on (settings and library choice: `tls`). The event-loop
//! connections of routed calls (`conn`), the copy child's pipelines (`reshard::ship`) and the
//! Sentinel watcher's blocking queries (`watcher`) all hold a `Transport`, so no path can talk
//! in clear on a TLS fleet.
//!
//! It works on non-blocking and blocking sockets alike. `write` takes plaintext (during the
//! handshake it is kept, never sent, until the peer is verified) and sends what the socket
//! takes; records the socket did not take wait inside and `wants_write` says so, so the owner
//! asks for the writable event (or `POLLOUT`) and calls `flush_pending`. `read` gives
//! plaintext, driving the handshake as records arrive; `WouldBlock` means "nothing yet".
//! A peer refused during the handshake is an `InvalidData` error carrying a `tls::TlsFailure`
//! that says why.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::ClientConnection;

use super::tls::{self, Tls, TlsFailure};

/// A connection's stream.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

/// TLS over a TCP socket.
pub struct TlsStream {
    tcp: TcpStream,
    conn: ClientConnection,
    /// The name the peer must carry (for errors).
    name: String,
    started: Instant,
    /// The handshake finished and was counted.
    done: bool,
}

impl Transport {
    /// Wraps a TCP socket (connected or connecting): in TLS when `tls` is given, the peer
    /// being verified against `host` (or the configured server name).
    pub fn new(tcp: TcpStream, tls: Option<&Arc<Tls>>, host: &str) -> io::Result<Transport> {
        let Some(tls) = tls else {
            return Ok(Transport::Plain(tcp));
        };
        let name = tls.name_for(host).map_err(io::Error::other)?;
        let shown = name.to_str().into_owned();
        let mut conn = ClientConnection::new(Arc::clone(&tls.config), name)
            .map_err(|e| failure(format!("TLS: {e}")))?;
        // The owner bounds what it queues; rustls must not refuse plaintext mid-handshake.
        conn.set_buffer_limit(None);
        Ok(Transport::Tls(Box::new(TlsStream {
            tcp,
            conn,
            name: shown,
            started: Instant::now(),
            done: false,
        })))
    }

    pub fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(t) => &t.tcp,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }

    /// Still in the TLS handshake.
    pub fn handshaking(&self) -> bool {
        match self {
            Transport::Plain(_) => false,
            Transport::Tls(t) => t.conn.is_handshaking(),
        }
    }

    /// TLS records are waiting for the socket to take them.
    pub fn wants_write(&self) -> bool {
        match self {
            Transport::Plain(_) => false,
            Transport::Tls(t) => t.conn.wants_write(),
        }
    }

    /// Sends the records waiting. `Ok(false)`: the socket is full, some still wait.
    pub fn flush_pending(&mut self) -> io::Result<bool> {
        match self {
            Transport::Plain(_) => Ok(true),
            Transport::Tls(t) => t.flush_pending(),
        }
    }

    /// Finishes the handshake on a blocking socket (bounded by its timeouts).
    pub fn handshake(&mut self) -> io::Result<()> {
        let Transport::Tls(t) = self else {
            return Ok(());
        };
        while t.conn.is_handshaking() {
            while t.conn.wants_write() {
                t.conn.write_tls(&mut t.tcp)?;
            }
            if !t.conn.is_handshaking() {
                break;
            }
            if t.conn.read_tls(&mut t.tcp)? == 0 {
                return Err(closed_in_handshake());
            }
            t.process()?;
        }
        while t.conn.wants_write() {
            t.conn.write_tls(&mut t.tcp)?;
        }
        t.note_done();
        Ok(())
    }
}

fn failure(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, TlsFailure(why))
}

fn closed_in_handshake() -> io::Error {
    failure(
        "TLS handshake failed: the connection was closed (does it speak TLS, and trust this \
         node's certificate?)"
            .to_string(),
    )
}

impl TlsStream {
    fn flush_pending(&mut self) -> io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.tcp) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Processes the records read; a refused peer becomes a `TlsFailure` (and is told so with
    /// an alert, best effort).
    fn process(&mut self) -> io::Result<()> {
        if let Err(e) = self.conn.process_new_packets() {
            let _ = self.conn.write_tls(&mut self.tcp);
            return Err(failure(tls::explain(&e, &self.name)));
        }
        self.note_done();
        Ok(())
    }

    fn note_done(&mut self) {
        if !self.done && !self.conn.is_handshaking() {
            self.done = true;
            let us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
            tls::count_handshake(us);
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let t = match self {
            Transport::Plain(s) => return s.read(buf),
            Transport::Tls(t) => t,
        };
        loop {
            match t.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Closed without TLS's close_notify: a close all the same.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            let n = t.conn.read_tls(&mut t.tcp)?;
            t.process()?;
            if t.conn.wants_write() {
                // Handshake replies or alerts: what the socket does not take waits.
                t.flush_pending()?;
            }
            if n == 0 && t.conn.is_handshaking() {
                return Err(closed_in_handshake());
            }
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let t = match self {
            Transport::Plain(s) => return s.write(buf),
            Transport::Tls(t) => t,
        };
        if !t.flush_pending()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = t.conn.writer().write(buf)?;
        t.flush_pending()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            Transport::Tls(t) => {
                if t.flush_pending()? {
                    Ok(())
                } else {
                    Err(io::ErrorKind::WouldBlock.into())
                }
            }
        }
    }
}

/// A blocking connection to `address` (`host:port`), its TLS handshake done when `tls` is
/// given, reads and writes bounded by `timeout`. Nothing is sent before the peer is verified.
pub fn dial(address: &str, timeout: Duration, tls: Option<&Arc<Tls>>) -> io::Result<Transport> {
    let addr: SocketAddr = address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
    let host = super::topology::split_address(address)
        .map(|(h, _)| h)
        .unwrap_or_else(|| addr.ip().to_string());
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut transport = Transport::new(stream, tls, &host)?;
    transport.handshake()?;
    Ok(transport)
}
