//! A blocking RESP2 connection with timeouts, for a thread that may wait on the network (the
//! topology watcher): dialled in TLS when it is on (verified before the credentials are sent),
//! authenticated, then one request and its reply at a time, or pushed messages read as they
//! come. The event loop's connections are the pool's (`pool`).

use std::io::{self, BufReader, Write};
use std::sync::Arc;
use std::time::Duration;

use crate::net::resp::{encode_command, read_reply, Resp, RespError};
use crate::net::tls::Tls;
use crate::net::transport::{self, Transport};

/// A blocking RESP2 connection with timeouts.
pub struct Client {
    address: String,
    /// The connection; requests are written through `get_mut`.
    reader: BufReader<Transport>,
}

impl Client {
    /// Connects (in TLS when `tls` is given, verified before the credentials are sent) and
    /// authenticates.
    pub fn open(
        address: &str,
        timeout: Duration,
        auth: Option<&(String, String)>,
        tls: Option<&Arc<Tls>>,
    ) -> Result<Client, String> {
        let stream = transport::dial(address, timeout, tls).map_err(|e| {
            let text = format!("{address}: {e}");
            if crate::net::tls_failure::failure(&e).is_some() {
                crate::net::tls_failure::count_failure(&text);
            }
            text
        })?;
        let mut client = Client {
            address: address.to_string(),
            reader: BufReader::new(stream),
        };
        if let Some((user, password)) = auth {
            let args: Vec<&[u8]> = if user.is_empty() {
                vec![b"AUTH", password.as_bytes()]
            } else {
                vec![b"AUTH", user.as_bytes(), password.as_bytes()]
            };
            if let Resp::Error(e) = client.call(&args)? {
                return Err(format!("{address}: {}", String::from_utf8_lossy(&e)));
            }
        }
        Ok(client)
    }

    pub fn call(&mut self, args: &[&[u8]]) -> Result<Resp, String> {
        let stream = self.reader.get_mut();
        stream
            .write_all(&encode_command(args))
            .and_then(|()| stream.flush())
            .map_err(|e| format!("{}: {e}", self.address))?;
        self.read()
    }

    pub fn read(&mut self) -> Result<Resp, String> {
        read_reply(&mut self.reader).map_err(|e| format!("{}: {e}", self.address))
    }

    /// How long a read waits before it gives up with `WouldBlock` or `TimedOut`.
    pub fn set_read_timeout(&self, timeout: Duration) -> io::Result<()> {
        self.reader.get_ref().tcp().set_read_timeout(Some(timeout))
    }

    /// Whether bytes of a reply are already read and waiting.
    pub fn buffered(&self) -> bool {
        !self.reader.buffer().is_empty()
    }

    /// Reads one pushed message (a subscription's), `Err` as the reader gives it.
    pub fn read_push(&mut self) -> Result<Resp, RespError> {
        read_reply(&mut self.reader)
    }

    pub fn address(&self) -> &str {
        &self.address
    }
}
