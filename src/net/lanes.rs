//! Connections of their own, for requests that hold their connection: `SHARD.CALL WAIT`'s
//! command followed by `WAIT numreplicas timeout`, which blocks the connection it runs on at
//! the node until enough replicas acknowledge (up to its timeout, or for ever).
//!
//! Why not the shared connection: every other call to that node is pipelined on it, and its
//! replies come back in order, so each of them would wait behind the `WAIT` (head-of-line).
//! Why the command and its `WAIT` on one connection: `WAIT` counts the acknowledgements of
//! the offset of its own client's last write, so it must follow the write on the same
//! connection, and nothing else may run on that connection in between.
//!
//! So each node has, beside its shared connection (lane 0), up to `LANES` connections of
//! their own (lanes 1 to `LANES`, per RESP version and database like the shared one): a call
//! takes the first whose connection carries no request (or that has none yet: it opens), and
//! holds it until its replies are in; the connections stay open for the next calls. When all
//! `LANES` are busy, the call fails at once with an error naming the node (queueing it behind
//! another call's `WAIT` would make its own wait, and its timeout, depend on that one).

use std::time::Duration;

use crate::net::endpoint::{Endpoint, StepError, StepErrorKind};
use crate::net::pool::{hooks, Deliveries, Lane, Link, Net, Waiter, NET};
use crate::net::resp::encode_command;

/// The connections of their own a node may have, per RESP version and database: the calls
/// that may wait for that node's replicas at the same time.
pub const LANES: Lane = 32;

/// The lane of the control requests of transactions (`SHARD.TXN`, which never wait at the
/// node): one pipelined connection per node of their own, so that they never queue behind a
/// routed command waiting for a transaction's lock on the shared one (`txn::coord`).
pub const CONTROL: Lane = LANES + 1;

/// Queues `args` for `at` on its control connection (`CONTROL`), given `extra` beyond the call
/// timeout (a transaction's block, whose reply waits for the owner's replica); the reply, or
/// the error, goes to `waiter` as `pool::request`'s do.
pub fn request_control(
    at: &Endpoint,
    link: &Link,
    args: &[Vec<u8>],
    waiter: Waiter,
    extra: Duration,
) {
    let mut failed: Deliveries = Vec::new();
    NET.with(|net| {
        let mut net = net.borrow_mut();
        match net.connection(at, link, CONTROL) {
            Ok(id) => net.enqueue(
                id,
                link.timeout,
                vec![(encode_command(args), waiter, Some(extra))],
            ),
            Err(e) => failed.push((waiter, Err(e))),
        }
    });
    (hooks().deliver)(failed);
}

/// One request that holds its connection: its arguments, who gets the reply, and how long it
/// may take beyond the call timeout (`None`: no limit).
pub struct Held<'a> {
    pub args: &'a [Vec<u8>],
    pub waiter: Waiter,
    pub extra: Option<Duration>,
}

/// Queues `requests` back to back for `at` on a connection of their own (no other request
/// goes on it while they are in flight); each reply, or the error, goes to its waiter as
/// `pool::request`'s do (never from inside this function).
pub fn request_alone(at: &Endpoint, link: &Link, requests: &[Held]) {
    let mut failed: Deliveries = Vec::new();
    NET.with(|net| {
        let mut net = net.borrow_mut();
        let id = net
            .free_lane(at, link)
            .and_then(|lane| net.connection(at, link, lane));
        match id {
            Ok(id) => {
                let queued = requests
                    .iter()
                    .map(|r| (encode_command(r.args), r.waiter, r.extra))
                    .collect();
                net.enqueue(id, link.timeout, queued);
            }
            Err(e) => failed.extend(requests.iter().map(|r| (r.waiter, Err(e.clone())))),
        }
    });
    (hooks().deliver)(failed);
}

/// Closes the connection of its own that carries `waiter`'s request (a blocked command whose
/// client went away): the node sees its client disconnect and stops waiting, so nothing is
/// popped for it. The request fails with `why`, as every request of a closed connection does.
pub fn cancel(waiter: Waiter, why: &str) {
    let mut failed: Deliveries = Vec::new();
    NET.with(|net| {
        let mut net = net.borrow_mut();
        let carrying = net.conns.iter().find_map(|(id, conn)| {
            (conn.lane >= 1
                && conn.lane <= LANES
                && conn
                    .in_flight
                    .iter()
                    .chain(&conn.unsent)
                    .any(|p| p.waiter == Some(waiter)))
            .then_some(*id)
        });
        if let Some(id) = carrying {
            let at = net.conns.get(&id).map(|c| c.at.clone());
            if let Some(at) = at {
                let e = StepError::new(&at, why.to_string());
                net.fail(id, &e, &mut failed);
            }
        }
    });
    (hooks().deliver)(failed);
}

impl Net {
    /// The first lane to `at` whose connection carries no request, or has not been opened.
    fn free_lane(&mut self, at: &Endpoint, link: &Link) -> Result<Lane, StepError> {
        for lane in 1..=LANES {
            let id = Net::with_key(at, |key| self.pool(link, lane).get(key).copied());
            let Some(id) = id else {
                return Ok(lane);
            };
            let free = self.conns.get(&id).is_none_or(|c| {
                c.in_flight
                    .iter()
                    .chain(&c.unsent)
                    .all(|p| p.waiter.is_none())
            });
            if free {
                return Ok(lane);
            }
        }
        Err(StepError::of_kind(
            at,
            format!(
                "{LANES} calls wait for its replicas already (SHARD.CALL WAIT, per RESP version and database): retry when one is done"
            ),
            StepErrorKind::Busy,
        ))
    }
}
