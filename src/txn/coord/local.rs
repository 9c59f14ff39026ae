//! The owner side of this very node, called without the network when a transaction's part is
//! this node's (`docs/transactions.md`: "the coordinator may be an owner too"): a watch, an
//! unwatch, and one owner's block (`APPLY`) run inside the client's own `SHARD.WATCH` or
//! `SHARD.EXEC`, which then replies at once (no loopback connection, no blocked client). The
//! owner side registers its entry points at load (`set`, from the glue); until it does, or
//! when an entry point declines (`None`), the request goes over a connection to this node's
//! own address, as to any owner. A prepare and a commit of several owners run in the
//! background, where there is no command's context to run and replicate them in: they go
//! over the network, to this node too.

use std::cell::Cell;

use crate::host::command::Call;
use crate::host::error::CmdError;
use crate::net::resp::Resp;
use crate::txn::coord::wire::Command;

/// `SHARD.TXN WATCH txid ttl-ms key...` here; `None`: not registered.
pub type Watch = fn(&Call, &str, u64, &[Vec<u8>]) -> Option<()>;

/// `SHARD.TXN APPLY txid watched commands` here: its reply, or its refusal.
pub type Apply = fn(&Call, &str, &[Vec<u8>], &[Command]) -> Option<Applied>;

/// What one owner's block here came to.
pub type Applied = Result<Resp, CmdError>;

/// The owner side's entry points. Each runs in the command context of `call` (the client's
/// database; commands run as the client, replicated with its command).
#[derive(Clone, Copy)]
pub struct LocalOwner {
    pub watch: Watch,
    /// `SHARD.TXN UNWATCH txid` here (needs no context).
    pub unwatch: fn(&str) -> Option<()>,
    pub apply: Apply,
}

fn no_watch(_: &Call, _: &str, _: u64, _: &[Vec<u8>]) -> Option<()> {
    None
}

fn no_unwatch(_: &str) -> Option<()> {
    None
}

fn no_apply(_: &Call, _: &str, _: &[Vec<u8>], _: &[Command]) -> Option<Applied> {
    None
}

thread_local! {
    static LOCAL: Cell<LocalOwner> = const {
        Cell::new(LocalOwner { watch: no_watch, unwatch: no_unwatch, apply: no_apply })
    };
}

/// Registers the owner side's entry points (once, at load).
pub fn set(owner: LocalOwner) {
    LOCAL.with(|l| l.set(owner));
}

pub fn get() -> LocalOwner {
    LOCAL.with(Cell::get)
}
