//! Each client's transaction at this node, by client id: its txid (taken at its first
//! `SHARD.WATCH`, or at `SHARD.EXEC`), the keys it watches by owner, and, between
//! `SHARD.MULTI` and `SHARD.EXEC`/`SHARD.DISCARD`, its queue (and whether a command was
//! refused at queue time: `EXECABORT`). A client that disconnects is forgotten (`forget`),
//! its watches dropped at their owners. While any client is inside `SHARD.MULTI`, the command
//! filter turns no `SHARD.CALL` into the plain command (`route::filter::hold_rewrites`): the
//! filter cannot tell the client on every server, and a queued call must reach its handler.
//! Also here: the transactions' counters of `INFO shard`. Main thread only.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHashMap;

use crate::net::endpoint::Endpoint;
use crate::txn::coord::plan::Queued;
use crate::txn::coord::queue::Entry;

/// One client's transaction.
#[derive(Debug, Default)]
pub struct Client {
    pub txid: Option<String>,
    /// The keys watched, by owner (the order they were watched in).
    pub watched: Vec<(Endpoint, Vec<Vec<u8>>)>,
    /// Inside `SHARD.MULTI`: the commands queued.
    pub queue: Option<Queue>,
}

#[derive(Debug, Default)]
pub struct Queue {
    pub commands: Vec<Queued>,
    /// Every queued command whole, with its keys: what a gathered transaction runs.
    pub entries: Vec<Entry>,
    /// A command over keys of several owners that does not split was queued: the whole
    /// transaction is gathered at `SHARD.EXEC` (`gather::exec_gathered`).
    pub gathered: bool,
    /// A command was refused at queue time: `SHARD.EXEC` replies `EXECABORT`.
    pub refused: bool,
}

thread_local! {
    static CLIENTS: RefCell<FxHashMap<u64, Client>> = RefCell::default();
}

/// The client's transaction, made if it has none, for the length of `f`.
pub fn with<R>(id: u64, f: impl FnOnce(&mut Client) -> R) -> R {
    CLIENTS.with(|c| {
        let mut clients = c.borrow_mut();
        let client = clients.entry(id).or_default();
        let was_queueing = client.queue.is_some();
        let out = f(client);
        let queueing = client.queue.is_some();
        if queueing != was_queueing {
            crate::route::filter::hold_rewrites(queueing);
        }
        if client.txid.is_none() && client.watched.is_empty() && !queueing {
            clients.remove(&id);
        }
        out
    })
}

/// Whether the client is inside `SHARD.MULTI` (a cheap look: no entry is made).
pub fn queueing(id: u64) -> bool {
    CLIENTS.with(|c| c.borrow().get(&id).is_some_and(|c| c.queue.is_some()))
}

/// Ends the client's transaction: its state as it was, for the caller to finish.
pub fn take(id: u64) -> Client {
    with(id, std::mem::take)
}

/// A client disconnected: its transaction is dropped, its watches at their owners too.
pub fn forget(id: u64) {
    let gone = take(id);
    if let Some(txid) = gone.txid {
        crate::txn::coord::exec::unwatch_later(&txid, &gone.watched);
    }
}

/// The counters of `INFO shard`.
pub static COMMITTED: AtomicU64 = AtomicU64::new(0);
pub static ABORTED_WATCH: AtomicU64 = AtomicU64::new(0);
pub static ABORTED_LOCK: AtomicU64 = AtomicU64::new(0);
pub static ABORTED_ERROR: AtomicU64 = AtomicU64::new(0);

pub fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// (committed, aborted on a watched key, aborted on locks, aborted on an error).
pub fn counters() -> [u64; 4] {
    [&COMMITTED, &ABORTED_WATCH, &ABORTED_LOCK, &ABORTED_ERROR].map(|c| c.load(Ordering::Relaxed))
}
