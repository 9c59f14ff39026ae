//! The network: the RESP wire format (`resp`, `frame`), the byte stream of every connection
//! the module opens, plain or TLS (`transport`, `tls`), and the pool of pipelined connections
//! driven by the server's event loop (`pool`).

pub mod blocking_client;
pub mod conn;
pub mod endpoint;
pub mod frame;
pub mod handshake;
pub mod pool;
pub mod pool_events;
pub mod resp;
pub mod tls;
pub mod tls_failure;
pub mod transport;
