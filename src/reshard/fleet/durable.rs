//! A fleet operation's step counted done at a node only once that node's replicas have it.
//!
//! Why: Redis replicates asynchronously, so a step (`SHARD.RING INSTALL ... TERM ...`, a
//! job's start) that a node's primary acknowledged may not have reached its replica yet; if
//! Sentinel then promotes that replica (the primary killed or paused), the node has lost the
//! step, and a coordinator that counted it done would never send it again: the fleet ends on
//! split rings. So a step goes to the node on a connection of its own (`net::lanes`, as
//! `SHARD.CALL WAIT`) followed by `WAIT k timeout` on the same connection, `k` the replicas
//! connected to that primary now (its `ROLE`, asked first; at most one), and a `WAIT` that
//! comes back short is a failure of the step: the coordinator sends it again later (steps are
//! idempotent), by then to the new primary if Sentinel promoted one (the endpoint is resolved
//! through Sentinel at every send). A node that has no replica connected waits for none, unless
//! it is a `sentinel` node of which Sentinel lists a replica it could promote (linked to the
//! primary now or not: an old primary Sentinel has not turned into a replica yet, a replica
//! still syncing or whose link broke): that one may be promoted without the step, so the step
//! waits for a replica and is sent again until one has it or Sentinel has promoted (the nemesis
//! test, Valkey seed 7: a grow's settle and commit steps counted done at n0's primary while its
//! replica was syncing; Sentinel promoted that replica, which held the plan in `copy` and open
//! rings while the other nodes had committed).

use crate::net::endpoint::{Endpoint, StepError};
use crate::net::resp::Resp;
use crate::route::forward::NetSteps;
use crate::route::wait::Wait;

/// How long a step waits for the node's replica to acknowledge it.
pub const REPLICA_WAIT_MS: i64 = 2000;

/// Sends the step `args` to `at` and waits for its replica (see the module's doc): the step's
/// reply (an error reply as it came), or an error when the replica did not acknowledge it.
pub async fn send(steps: &NetSteps, at: &Endpoint, args: &[Vec<u8>]) -> Result<Resp, StepError> {
    send_at_least(steps, at, args, least_for(&at.name)).await
}

/// The replicas a step at the node called `name` waits for even when its primary's `ROLE`
/// lists none: one for a `sentinel` node whose replicas Sentinel could promote (or whose
/// replicas are not looked up yet), none for another node.
pub fn least_for(name: &str) -> i64 {
    let sentinel = crate::state::lock().rings.via_sentinel(name);
    least(name, sentinel)
}

/// `least_for` of a node whose being a `sentinel` node the caller knows (`sentinel`).
pub fn least(name: &str, sentinel: bool) -> i64 {
    i64::from(
        sentinel
            && (crate::topology::nodes::replicas_pending(name)
                || crate::topology::nodes::promotable_replicas(name) > 0),
    )
}

/// `least` for data only a node's primary holds (a resharding's copies, `landed`): a replica
/// that is down now counts too. A ring step a replica lacks is repaired when it is promoted
/// (its rings are checked with the fleet's first); copies it lacks are lost, and Sentinel may
/// promote a replica that comes back from its own AOF before it has synced (the nemesis test,
/// Valkey seed 1171234040: a grow's copies to n3 counted landed while n3's replica was down,
/// the replica restarted and was promoted, and reads of `list:7` missed 186 acknowledged
/// elements after the cleanup).
pub fn least_for_data(name: &str, sentinel: bool) -> i64 {
    i64::from(crate::topology::nodes::replica_expected(name, sentinel))
}

/// `send`, waiting for at least `least` replicas (at most one) even when `ROLE` lists none
/// connected: a node that should have a replica and has none linked now counts nothing done
/// (`landed`: a copy's keys at a primary whose replica is not following it).
pub async fn send_at_least(
    steps: &NetSteps,
    at: &Endpoint,
    args: &[Vec<u8>],
    least: i64,
) -> Result<Resp, StepError> {
    let replicas = replicas_to_wait_for(steps, at).await.max(least.min(1));
    if replicas == 0 {
        return steps.send(at, args).await;
    }
    let wait = Wait {
        replicas,
        timeout_ms: REPLICA_WAIT_MS,
    };
    let (command, waited) = steps.send_waited(at, args, wait);
    let reply = command.await?;
    if reply.is_error() {
        // Nothing applied to wait for; WAIT's reply, when it comes, goes nowhere.
        return Ok(reply);
    }
    match waited.await? {
        Resp::Int(n) if n >= replicas => Ok(reply),
        Resp::Int(n) => Err(StepError::new(
            at,
            format!(
                "the step ran at its primary, but {n} of {replicas} replicas acknowledged it within {REPLICA_WAIT_MS} ms: not counted done, sent again"
            ),
        )),
        other => Err(StepError::new(
            at,
            format!("the step ran, but WAIT replied {other:?}: not counted done, sent again"),
        )),
    }
}

/// The replicas to wait for at `at`: those its `ROLE` lists (connected and in sync), at most
/// one; none when it is not a primary. When `ROLE` gets no answer, the replicas the topology
/// watcher knows of it.
pub async fn replicas_to_wait_for(steps: &NetSteps, at: &Endpoint) -> i64 {
    match steps.send(at, &[b"ROLE".to_vec()]).await {
        Ok(reply) => match role_replicas(&reply) {
            Some(n) => n.min(1),
            None => known_replicas(at),
        },
        Err(_) => known_replicas(at),
    }
}

fn known_replicas(at: &Endpoint) -> i64 {
    i64::from(!crate::topology::nodes::replicas_of(&at.name).is_empty())
}

/// The replicas a `ROLE` reply lists: `Some(0)` for a replica or a sentinel, `None` for a reply
/// that is not `ROLE`'s (an error: refused by the ACL).
pub fn role_replicas(reply: &Resp) -> Option<i64> {
    let Resp::Array(items) = reply else {
        return None;
    };
    match items.as_slice() {
        [Resp::Bulk(role) | Resp::Simple(role), _, Resp::Array(replicas), ..]
            if role.as_slice() == b"master" =>
        {
            Some(i64::try_from(replicas.len()).unwrap_or(i64::MAX))
        }
        [Resp::Bulk(_) | Resp::Simple(_), ..] => Some(0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles() {
        let bulk = |s: &str| Resp::Bulk(s.as_bytes().to_vec());
        let replica = Resp::Array(vec![bulk("127.0.0.1"), bulk("7001"), bulk("10")]);
        let master = |n: usize| {
            Resp::Array(vec![
                bulk("master"),
                Resp::Int(10),
                Resp::Array(vec![replica.clone(); n]),
            ])
        };
        assert_eq!(role_replicas(&master(0)), Some(0));
        assert_eq!(role_replicas(&master(2)), Some(2));
        let slave = Resp::Array(vec![
            bulk("slave"),
            bulk("127.0.0.1"),
            Resp::Int(7000),
            bulk("connected"),
            Resp::Int(10),
        ]);
        assert_eq!(role_replicas(&slave), Some(0));
        assert_eq!(role_replicas(&Resp::Error(b"NOPERM".to_vec())), None);
    }
}
