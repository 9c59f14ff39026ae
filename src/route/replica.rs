//! Reads at replicas (`shard.read-from replica|replica-preferred`): a read runs at a replica
//! of its owner, picked in turn from what the topology knows; under `replica-preferred` the
//! primary answers when no replica is known or the one picked does not answer (or answers
//! that it cannot serve), under `replica` that is an error naming the node. A read that comes
//! before the node's replicas were ever looked up (right after `CONFIG SET shard.read-from`,
//! which asks the watcher to look at once) waits for that first answer, up to the call
//! timeout, instead of failing.

use crate::net::endpoint::{Endpoint, StepError};
use crate::net::resp::Resp;
use crate::route::forward::NetSteps;
use crate::route::stats;
use crate::topology::nodes::ReadFrom;

/// Runs the read `args` at a replica of `primary` (or at `primary`, by `mode`'s rule).
pub async fn read(
    steps: &NetSteps,
    primary: &Endpoint,
    args: &[Vec<u8>],
    mode: ReadFrom,
) -> Result<Resp, StepError> {
    wait_for_replicas(steps, primary).await;
    let why = match crate::topology::nodes::pick_replica(primary) {
        Ok(replica) => match steps.send(&replica, args).await {
            Ok(reply) if !cannot_serve(&reply) => {
                stats::count(|s| s.replica_reads += 1);
                return Ok(reply);
            }
            Ok(reply) => format!(
                "replica {} cannot serve reads: {}",
                replica.address,
                String::from_utf8_lossy(reply.error_text().unwrap_or_default())
            ),
            Err(e) => format!("replica {} did not answer: {}", replica.address, e.message),
        },
        Err(why) => why,
    };
    if mode == ReadFrom::Replica {
        return Err(StepError::new(
            primary,
            format!("no replica to read from (shard.read-from replica): {why}"),
        ));
    }
    stats::count(|s| s.replica_fallbacks += 1);
    steps.send(primary, args).await
}

/// A replica's error replies that mean "ask someone else": still loading, or cut off from its
/// primary with `replica-serve-stale-data no`.
fn cannot_serve(reply: &Resp) -> bool {
    reply
        .error_text()
        .is_some_and(|e| e.starts_with(b"LOADING") || e.starts_with(b"MASTERDOWN"))
}

/// Waits, polling every 5 ms up to the call timeout, until the replicas of `primary` have been
/// looked up once (known, or an error).
async fn wait_for_replicas(steps: &NetSteps, primary: &Endpoint) {
    use crate::topology::nodes::replicas_pending;
    if !replicas_pending(&primary.name) {
        return;
    }
    crate::topology::watcher::wake();
    let timeout = crate::state::lock().config.call_timeout_ms.max(1);
    let step = std::time::Duration::from_millis(5);
    let rounds = u64::try_from(timeout).unwrap_or(1000) / 5 + 1;
    for _ in 0..rounds {
        steps.sleep(step).await;
        if !replicas_pending(&primary.name) {
            return;
        }
    }
}
