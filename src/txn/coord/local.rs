//! The owner side of this very node, called without the network when a transaction's part is
//! this node's (`docs/transactions.md`: "the coordinator may be an owner too"). The owner side
//! registers its entry points at load (`set`, from the glue); until it does, or when an entry
//! point declines (`None`), the request goes over a connection to this node's own address, as
//! to any owner.

use std::cell::Cell;

use crate::net::resp::Resp;

/// The owner side's entry points, for database `db`.
#[derive(Clone, Copy)]
pub struct LocalOwner {
    /// A `SHARD.TXN` request (`SHARD.TXN` first) run here: its reply.
    pub control: fn(&[Vec<u8>], u32) -> Option<Resp>,
}

fn no_control(_: &[Vec<u8>], _: u32) -> Option<Resp> {
    None
}

thread_local! {
    static LOCAL: Cell<LocalOwner> = const {
        Cell::new(LocalOwner { control: no_control })
    };
}

/// Registers the owner side's entry points (once, at load).
pub fn set(owner: LocalOwner) {
    LOCAL.with(|l| l.set(owner));
}

pub fn get() -> LocalOwner {
    LOCAL.with(Cell::get)
}
