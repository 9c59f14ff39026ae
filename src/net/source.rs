//! The address the module's connections to other servers leave from: the server's own
//! `bind-source-addr` (Redis 7.0 and Valkey), so that the module's traffic leaves from the
//! address the server's replication link and Sentinel's links leave from. Unset (the
//! default), the kernel picks it, as for the server's own connections. The setting is read at
//! load and after each `CONFIG SET` of it (`config::follow_config_set`); a connection made
//! after the change leaves from the new address.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::RwLock;

use socket2::{SockAddr, Socket};

static SOURCE: RwLock<Option<IpAddr>> = RwLock::new(None);

/// Takes the server's `bind-source-addr` as `CONFIG GET` gives it: empty (unset) or text that
/// is not an IP address leaves the choice to the kernel.
pub fn set(text: &str) {
    *SOURCE.write().unwrap_or_else(|e| e.into_inner()) = parse(text);
}

fn parse(text: &str) -> Option<IpAddr> {
    text.trim().parse::<IpAddr>().ok()
}

/// The source address in force, if any.
pub fn get() -> Option<IpAddr> {
    *SOURCE.read().unwrap_or_else(|e| e.into_inner())
}

/// Binds `socket`, about to connect to `to`, to the source address in force (port 0: the
/// kernel picks the port); nothing when none is set or it is of the other family.
pub fn bind(socket: &Socket, to: &SocketAddr) -> io::Result<()> {
    bind_from(socket, to, get())
}

fn bind_from(socket: &Socket, to: &SocketAddr, source: Option<IpAddr>) -> io::Result<()> {
    match source {
        Some(ip) if ip.is_ipv4() == to.is_ipv4() => {
            socket.bind(&SockAddr::from(SocketAddr::new(ip, 0)))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Protocol, Type};
    use std::net::TcpListener;

    #[test]
    fn connections_leave_from_the_source_address() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let to = listener.local_addr().unwrap();
        // The setting in force is left alone: other tests' connections run meanwhile.
        let connect = |setting: &str| {
            let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
            bind_from(&s, &to, parse(setting)).unwrap();
            s.connect(&SockAddr::from(to)).unwrap();
            listener.accept().unwrap().1.ip().to_string()
        };
        assert_eq!(connect("127.0.0.7"), "127.0.0.7");
        assert_eq!(connect(" 127.0.0.8 "), "127.0.0.8");
        assert_eq!(connect("::1"), "127.0.0.1"); // another family: not bound
        assert_eq!(connect(""), "127.0.0.1"); // unset: the kernel's choice
        assert_eq!(connect("not-an-address"), "127.0.0.1");
    }
}
