//! Transactions across nodes (docs/transactions.md): `SHARD.WATCH` ... `SHARD.EXEC` for any
//! client on any node, whatever node owns each key. Two roles:
//!
//! - `owner/`: the owner's side of the protocol (`SHARD.TXN WATCH|UNWATCH|APPLY|PREPARE|COMMIT|
//!   ABORT`): the watch table and what marks a watched key written (the command filter, the
//!   module's own writes, expiries and evictions, flushes), the lock table and the prepared
//!   parts (durable: replicated, in the AOF and the RDB aux field), clients waiting for a lock,
//!   and the asking of the coordinator about a part in doubt.
//! - `coord/`: the coordinator's side: the client's queue, the phases, the durable decisions;
//!   it answers `SHARD.TXN STATUS` (`commands::txn_coord`, and through [`set_status_hook`]
//!   for an owner of this node in doubt).
//!
//! Also here: the answer to `SHARD.TXN STATUS`, and the transactions' bytes in the RDB aux
//! field (each role a tagged section of its own, so that either may add its records without
//! a new format of `persist`).

use std::cell::Cell;

pub mod coord;
pub mod owner;

/// What the coordinator of a txid says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Commit,
    Abort,
    Pending,
}

impl Decision {
    pub fn name(self) -> &'static str {
        match self {
            Decision::Commit => "commit",
            Decision::Abort => "abort",
            Decision::Pending => "pending",
        }
    }

    /// Reads `commit`, `abort` or `pending` (any case).
    pub fn parse(text: &[u8]) -> Option<Decision> {
        [Decision::Commit, Decision::Abort, Decision::Pending]
            .into_iter()
            .find(|d| text.eq_ignore_ascii_case(d.name().as_bytes()))
    }
}

/// The coordinator's answer for a txid it knows (`None`: it does not).
pub type StatusHook = fn(&str) -> Option<Decision>;

thread_local! {
    static STATUS: Cell<Option<StatusHook>> = const { Cell::new(None) };
}

/// Sets who answers `SHARD.TXN STATUS` (the coordinator's side, at load).
pub fn set_status_hook(hook: StatusHook) {
    STATUS.with(|s| s.set(Some(hook)));
}

/// `SHARD.TXN STATUS txid`: the coordinator's decision; until the coordinator's side answers,
/// `commit` for a txid applied here, else `pending`.
pub fn status(txid: &str) -> Decision {
    STATUS
        .with(Cell::get)
        .and_then(|hook| hook(txid))
        .unwrap_or_else(|| owner::status(txid))
}

/// The section tag of the owner's records.
const OWNER: u8 = 1;
/// The section tag of the coordinator's decisions (`coord::book`).
const COORD: u8 = 2;

/// The transactions' durable bytes (`None` when there is nothing to keep): tagged sections,
/// each a tag byte, a u64 length and the section's bytes.
pub fn durable_bytes() -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut section = |tag: u8, bytes: Vec<u8>| {
        out.push(tag);
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(&bytes);
    };
    let owner = owner::durable_records();
    if !owner.is_empty() {
        section(OWNER, owner.encode());
    }
    let (commits, aborts) = coord::book::with(|b| b.counts());
    if commits + aborts > 0 {
        section(COORD, coord::book::with(|b| b.encode()));
    }
    (!out.is_empty()).then_some(out)
}

/// The transactions' records read from their durable bytes, to be put in place
/// ([`Durable::restore`]) once everything else of the load was read.
pub struct Durable {
    owner: owner::durable::Records,
    coord: coord::book::Book,
}

impl Durable {
    /// Puts the records in place of the tables' (an RDB at start, a primary's at a full sync).
    pub fn restore(self) {
        owner::restore_records(self.owner);
        coord::book::restore(self.coord);
    }
}

/// Reads the transactions' durable bytes of a load (none: no records); every section is read
/// before anything changes.
pub fn decode_durable(bytes: Option<&[u8]>) -> Result<Durable, String> {
    let now = crate::clock::monotonic_ms();
    let mut owner = owner::durable::Records::default();
    let mut coord = coord::book::Book::default();
    if let Some(bytes) = bytes {
        let mut r = crate::persist::Reader::new(bytes);
        while r.pos < bytes.len() {
            let tag = r.byte("transactions' section tag")?;
            let section = r.sized("transactions' section")?;
            match tag {
                OWNER => owner = owner::durable::Records::decode(section, now)?,
                COORD => coord = coord::book::Book::decode(section)?,
                other => {
                    return Err(format!(
                        "an unknown transactions' section {other}: the data was written by another version of shard"
                    ))
                }
            }
        }
    }
    Ok(Durable { owner, coord })
}
