//! The network: how the module talks to other servers. It knows no ring and no command of the
//! module; what it reports upward (replies, an address it needs) goes through the callbacks
//! registered at load (`pool::Hooks`).
//!
//! - `resp`, `frame`: the RESP wire format (values, and where a reply ends in a byte stream).
//! - `endpoint`: who a request goes to and why it failed (`Endpoint`, `StepError`).
//! - `transport`: the byte stream of every connection, plain TCP or TLS; `tls`: the TLS
//!   configuration in force; `tls_failure`: why a handshake failed, and the counters.
//! - `pool`: the pipelined connections driven by the server's event loop (queues, the flush
//!   before sleeping, deadlines); `conn`: one connection's state and socket I/O; `handshake`:
//!   its first words (HELLO, SELECT, SHARD.CLUSTER INTERNAL); `pool_events`: sockets ready,
//!   closes, addresses learned; `lanes`: connections of their own for requests that hold
//!   their connection (a command then `WAIT`).
//! - `blocking_client`: a blocking connection for a thread that may wait (the topology
//!   watcher).
//! - `source`: the address every connection leaves from (the server's `bind-source-addr`).
//!
//! May import: `host` (the event loop, replies) and nothing else of the crate. No raw module
//! API here.

pub mod blocking_client;
pub mod conn;
pub mod endpoint;
pub mod frame;
pub mod handshake;
pub mod lanes;
pub mod pool;
pub mod pool_events;
pub mod resp;
pub mod source;
pub mod tls;
pub mod tls_failure;
pub mod transport;
