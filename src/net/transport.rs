//! The byte stream of every connection the module opens to another server: plain TCP, or TLS
//! over it when `shard.tls` is on (settings and library choice: `tls`). The event-loop
//! connections of routed calls (`pool`, `conn`), the copy child's pipelines
//! (`reshard::ship`) and the Sentinel watcher's blocking queries (`blocking_client`) all hold
//! a `Transport`, so no path can talk in clear on a TLS fleet.
//!
//! It works on non-blocking and blocking sockets alike. `write` takes plaintext (during the
//! handshake it is kept, never sent, until the peer is verified) and sends what the socket
//! takes; records the socket did not take wait inside and `wants_write` says so, so the owner
//! asks for the writable event (or `POLLOUT`) and calls `flush_pending`. `read` gives
//! plaintext, driving the handshake as records arrive; `WouldBlock` means "nothing yet".
//! A peer refused during the handshake is an `InvalidData` error carrying a
//! `tls_failure::TlsFailure` that says why.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::ClientConnection;

use crate::net::tls::Tls;
use crate::net::tls_failure::{self, TlsFailure};

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
            return Err(failure(tls_failure::explain(&e, &self.name)));
        }
        self.note_done();
        Ok(())
    }

    fn note_done(&mut self) {
        if !self.done && !self.conn.is_handshaking() {
            self.done = true;
            let us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
            tls_failure::count_handshake(us);
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
    let host = crate::net::endpoint::split_address(address)
        .map(|(h, _)| h)
        .unwrap_or_else(|| addr.ip().to_string());
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    crate::net::source::bind(&socket, &addr)?;
    socket.connect_timeout(&socket2::SockAddr::from(addr), timeout)?;
    let stream = TcpStream::from(socket);
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut transport = Transport::new(stream, tls, &host)?;
    transport.handshake()?;
    Ok(transport)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::path::PathBuf;

    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    use crate::net::tls::{build, ServerTls, TlsFiles};

    struct Ca {
        cert: rcgen::Certificate,
        key: KeyPair,
    }

    fn ca() -> Ca {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("test CA {n}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A certificate of `ca` for `names` (an IP address becomes an IP subjectAltName): (cert
    /// PEM, key PEM).
    fn leaf(ca: &Ca, names: &[&str]) -> (String, String) {
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("shard-transport-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A TLS server thread for one connection: answers every line with `+PONG`; returns its
    /// address.
    fn tls_server(cert: &str, key: &str) -> (String, std::thread::JoinHandle<()>) {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let handle = std::thread::spawn(move || {
            let Ok((tcp, _)) = listener.accept() else {
                return;
            };
            tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
            let mut stream = rustls::StreamOwned::new(conn, tcp);
            let mut buf = [0u8; 1024];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let lines = buf[..n].iter().filter(|&&b| b == b'\n').count();
                for _ in 0..lines {
                    if stream.write_all(b"+PONG\r\n").is_err() {
                        return;
                    }
                }
            }
        });
        (address, handle)
    }

    fn client_tls(ca_pem: &str, name: &str, server_name: &str) -> Arc<Tls> {
        let d = dir(name);
        let ca_file = d.join("ca.crt");
        std::fs::write(&ca_file, ca_pem).unwrap();
        let own = TlsFiles {
            ca_cert_file: ca_file.to_string_lossy().into_owned(),
            server_name: server_name.to_string(),
            ..Default::default()
        };
        Arc::new(build(&own, &ServerTls::default()).unwrap())
    }

    /// Writes `PING` lines on a non-blocking socket and reads until `want` replies or an
    /// error, as the event-loop connections do.
    fn ping_nonblocking(address: &str, tls: &Arc<Tls>, pings: usize) -> io::Result<usize> {
        let tcp = TcpStream::connect(address)?;
        tcp.set_nonblocking(true)?;
        let mut t = Transport::new(tcp, Some(tls), "127.0.0.1")?;
        let out = b"PING\r\n".repeat(pings);
        let mut sent = 0;
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.windows(7).filter(|w| w == b"+PONG\r\n").count() < pings {
            if Instant::now() > deadline {
                return Err(io::ErrorKind::TimedOut.into());
            }
            if sent < out.len() {
                match t.write(&out[sent..]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            t.flush_pending()?;
            let mut buf = [0u8; 4096];
            match t.read(&mut buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(pings)
    }

    #[test]
    fn a_verified_peer_gets_pipelined_requests_on_a_non_blocking_socket() {
        let ca = ca();
        let (cert, key) = leaf(&ca, &["127.0.0.1"]);
        let (address, server) = tls_server(&cert, &key);
        let tls = client_tls(&ca.cert.pem(), "ok", "");
        // Many requests written while the handshake is still under way, and more than one
        // TLS record's worth.
        assert_eq!(ping_nonblocking(&address, &tls, 5000).unwrap(), 5000);
        server.join().unwrap();
    }

    #[test]
    fn a_blocking_dial_verifies_then_talks() {
        let ca = ca();
        let (cert, key) = leaf(&ca, &["127.0.0.1"]);
        let (address, server) = tls_server(&cert, &key);
        let tls = client_tls(&ca.cert.pem(), "dial", "");
        let mut t = dial(&address, Duration::from_secs(5), Some(&tls)).unwrap();
        t.write_all(b"PING\r\n").unwrap();
        t.flush().unwrap();
        let mut buf = [0u8; 7];
        t.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"+PONG\r\n");
        drop(t);
        server.join().unwrap();
    }

    fn refusal(result: io::Result<usize>) -> String {
        let e = result.unwrap_err();
        tls_failure::failure(&e)
            .unwrap_or_else(|| panic!("not a TLS failure: {e}"))
            .to_string()
    }

    #[test]
    fn another_ca_or_another_name_is_refused_with_the_reason() {
        let ca1 = ca();
        let other = ca();
        let (cert, key) = leaf(&other, &["127.0.0.1"]);
        let (address, _server) = tls_server(&cert, &key);
        let why = refusal(ping_nonblocking(
            &address,
            &client_tls(&ca1.cert.pem(), "ca", ""),
            1,
        ));
        assert!(why.contains("not signed by a CA"), "{why}");

        let (cert, key) = leaf(&ca1, &["other.example"]);
        let (address, _server) = tls_server(&cert, &key);
        let why = refusal(ping_nonblocking(
            &address,
            &client_tls(&ca1.cert.pem(), "name", ""),
            1,
        ));
        assert!(why.contains("not valid for 127.0.0.1"), "{why}");

        // The name set in shard.tls-server-name is the one checked.
        let (cert, key) = leaf(&ca1, &["redis.internal"]);
        let (address, server) = tls_server(&cert, &key);
        let tls = client_tls(&ca1.cert.pem(), "sni", "redis.internal");
        assert_eq!(ping_nonblocking(&address, &tls, 3).unwrap(), 3);
        server.join().unwrap();
    }

    #[test]
    fn a_plain_peer_gets_nothing_but_the_client_hello() {
        let ca = ca();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            // What a plain Redis does with a TLS ClientHello: an error line.
            if let Ok(n) = tcp.read(&mut buf) {
                seen.extend_from_slice(&buf[..n]);
                let _ = tcp.write_all(b"-ERR unknown command\r\n");
            }
            while let Ok(n) = tcp.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
            }
            seen
        });
        let tls = client_tls(&ca.cert.pem(), "plain", "");
        let why = refusal(ping_nonblocking(&address, &tls, 1));
        assert!(why.contains("does not speak TLS"), "{why}");
        let seen = server.join().unwrap();
        assert_eq!(seen.first(), Some(&0x16), "a TLS handshake record first");
        assert!(
            !seen.windows(4).any(|w| w == b"PING"),
            "a request crossed in clear"
        );
    }
}
