//! Reads at replicas (`shard.read-from replica|replica-preferred`): a read runs at a replica
//! of its owner, picked in turn from what the topology knows; under `replica-preferred` the
//! primary answers when no replica is known or the one picked does not answer (or answers
//! that it cannot serve), under `replica` that is an error naming the node.

use crate::net::endpoint::{Endpoint, StepError};
use crate::net::resp::Resp;
use crate::route::forward::{self, NetSteps};
use crate::topology::nodes::ReadFrom;

/// Runs the read `args` at a replica of `primary` (or at `primary`, by `mode`'s rule).
pub async fn read(
    steps: &NetSteps,
    primary: &Endpoint,
    args: &[Vec<u8>],
    mode: ReadFrom,
) -> Result<Resp, StepError> {
    let why = match crate::topology::nodes::pick_replica(primary) {
        Ok(replica) => match steps.send(&replica, args).await {
            Ok(reply) if !cannot_serve(&reply) => {
                forward::count(|s| s.replica_reads += 1);
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
    forward::count(|s| s.replica_fallbacks += 1);
    steps.send(primary, args).await
}

/// A replica's error replies that mean "ask someone else": still loading, or cut off from its
/// primary with `replica-serve-stale-data no`.
fn cannot_serve(reply: &Resp) -> bool {
    reply
        .error_text()
        .is_some_and(|e| e.starts_with(b"LOADING") || e.starts_with(b"MASTERDOWN"))
}
