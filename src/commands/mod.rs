//! The command handlers: each reads its arguments, calls one capability and replies. Every
//! command enters through `host::command::dispatch`, which runs the handler under
//! `catch_unwind`, so a bug becomes an `ERR` reply and a warning in the Redis log instead of
//! aborting redis-server. Handlers compute first and reply last, so an error never follows a
//! half-written reply.

pub mod advance;
pub mod apply;
pub mod call;
pub mod cluster;
pub mod debug;
pub mod decode;
pub mod dump;
pub mod emulate;
pub mod encode;
pub mod genkey;
pub mod hotkeys;
pub mod multi;
pub mod outside;
#[cfg(test)]
mod parse_tests;
pub mod plain;
pub mod registry;
pub mod reshard;
pub mod ring;
pub mod ring_args;
pub mod shardjs;
pub mod txn;
pub mod txn_coord;
pub mod whereis;

pub use crate::host::args::{self, Args};
pub use crate::host::command::{Call, Handler};
pub use crate::host::error::{CmdError, CmdResult};
pub use crate::host::reply::Reply;
