//! Who a connection goes to, and why a request to it failed: the node's name (for messages
//! an operator can act on) and its address. The network layer knows no ring: where a node is
//! comes from `topology`.

use std::fmt;

/// A node a step runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub address: String,
    /// This server itself (the `self` configuration).
    pub is_self: bool,
}

impl Endpoint {
    /// Another server, the node `name`, at `address` (`host:port`, IPv6 in brackets); `None`
    /// when the address does not parse.
    pub fn remote(name: &str, address: &str) -> Option<Endpoint> {
        let (host, port) = split_address(address)?;
        Some(Endpoint {
            name: name.to_string(),
            host,
            port,
            address: address.to_string(),
            is_self: false,
        })
    }
}

/// `host:port` (IPv6 in brackets) into its parts.
pub fn split_address(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_string(), port.parse().ok()?))
}

/// Why a step failed, as far as what the caller does next is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepErrorKind {
    /// The node did not answer within the call timeout.
    Timeout,
    /// The node closed or reset the connection without answering a byte. On a pooled
    /// connection that is, nearly always, the node closing an idle client just as the request
    /// went out; the caller may send the request once more on a new connection.
    Closed,
    /// Every connection the request could use is taken (`net::lanes`): nothing was sent, and
    /// the same request may succeed a moment later.
    Busy,
    /// Anything else: refused connections, handshake and protocol errors, error replies.
    Failed,
}

/// A step that failed: which node, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    pub node: String,
    pub address: String,
    pub message: String,
    pub kind: StepErrorKind,
}

impl StepError {
    /// A failure of kind [`StepErrorKind::Failed`].
    pub fn new(at: &Endpoint, message: impl Into<String>) -> StepError {
        StepError::of_kind(at, message, StepErrorKind::Failed)
    }

    pub fn of_kind(at: &Endpoint, message: impl Into<String>, kind: StepErrorKind) -> StepError {
        StepError {
            node: at.name.clone(),
            address: at.address.clone(),
            message: message.into(),
            kind,
        }
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} ({}): {}", self.node, self.address, self.message)
    }
}
