//! `SHARD.RING PUSH`: this node's rings sent to every node they name, as one
//! `SHARD.RING INSTALL` each (the same call repeated changes nothing), ending with this node's
//! fleet term (`PUSHED ...`: a node of a newer term refuses the rings, `fleet::unstepped`); the
//! reply maps each node to `OK` or what went wrong there.

use std::sync::Arc;

use futures_util::future::join_all;

use crate::host::error::CmdError;
use crate::net::endpoint::Endpoint;
use crate::net::pool::Link;
use crate::net::resp::Resp;
use crate::reshard::fleet::plan::Install;
use crate::reshard::fleet::reach::{fleet_nodes, link};
use crate::ring::placement::Placement;
use crate::route::forward::{CallReply, NetSteps};
use crate::state::ModuleState;

/// A push about to be sent.
pub struct Push {
    nodes: Vec<Endpoint>,
    args: Vec<Vec<u8>>,
    /// How the push reaches the nodes.
    pub link: Link,
}

impl Push {
    /// The push of this node's rings (`current` is the current ring) to every node they name.
    pub fn prepare(st: &ModuleState, current: &Arc<Placement>) -> Result<Push, CmdError> {
        let nodes: Vec<Endpoint> = fleet_nodes(st, current)?.into_iter().map(|n| n.0).collect();
        let previous = st.rings.previous.as_ref();
        let mut args = Install {
            current: &current.spec,
            previous: previous.map(|p| &p.spec),
            returning: st.rings.returning,
            fence: st.rings.fence,
            settled: st.rings.settled,
        }
        .command();
        args.extend(crate::reshard::fleet::unstepped::pushed_args(
            &st.lease.record,
        ));
        Ok(Push {
            nodes,
            args,
            link: link(st),
        })
    }

    /// Sends the rings to every node but this one, all at once; the reply.
    pub async fn run(self, steps: NetSteps) -> CallReply {
        let Push { nodes, args, .. } = self;
        let replies = join_all(nodes.iter().map(|at| {
            let sent =
                (!at.is_self).then(|| crate::reshard::fleet::durable::send(&steps, at, &args));
            async move {
                match sent {
                    None => Ok(Resp::Simple(b"OK".to_vec())),
                    Some(reply) => reply.await,
                }
            }
        }))
        .await;
        let pairs = nodes
            .iter()
            .zip(replies)
            .map(|(at, reply)| {
                let value = match reply {
                    Ok(Resp::Simple(ok)) => Resp::Simple(ok),
                    Ok(Resp::Error(e)) => Resp::Bulk(
                        format!(
                            "node {} ({}): {}",
                            at.name,
                            at.address,
                            String::from_utf8_lossy(&e)
                        )
                        .into_bytes(),
                    ),
                    Ok(other) => {
                        Resp::Bulk(format!("node {}: replied {other:?}", at.name).into_bytes())
                    }
                    Err(e) => Resp::Bulk(e.to_string().into_bytes()),
                };
                (Resp::Bulk(at.name.clone().into_bytes()), value)
            })
            .collect();
        CallReply::Reply(Resp::Map(pairs))
    }
}
