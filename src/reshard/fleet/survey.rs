//! `SHARD.RING CHECK`: every node of the current and previous rings asked for its state at
//! once, side by side: whether they all hold this node's rings (`agree`), and each node's
//! address, rings, job, keys and memory, its weight's share of the ring beside its share of
//! the keyspace.

use std::sync::Arc;

use crate::host::error::CmdError;
use crate::net::endpoint::Endpoint;
use crate::net::pool::Link;
use crate::net::resp::Resp;
use crate::reshard::fleet::coordinator;
use crate::reshard::fleet::node_state::NodeState;
use crate::reshard::fleet::reach::{fleet_nodes, link};
use crate::ring::placement::Placement;
use crate::route::forward::{CallReply, NetSteps};
use crate::state::ModuleState;

/// What this node knows of one node before asking it.
struct Row {
    at: Endpoint,
    ring: &'static str,
    weight: u32,
    weight_share: f64,
    share: f64,
}

/// A check about to be made.
pub struct Survey {
    rows: Vec<Row>,
    digest: String,
    previous_digest: String,
    /// How the check reaches the nodes.
    pub link: Link,
}

impl Survey {
    /// The check of the nodes of `current` (the current ring) and of the previous ring.
    pub fn prepare(st: &ModuleState, current: &Arc<Placement>) -> Result<Survey, CmdError> {
        let shares = current
            .ring
            .as_ref()
            .map(|r| r.shares())
            .unwrap_or_default();
        let total_weight: u64 = current.spec.nodes.iter().map(|n| u64::from(n.weight)).sum();
        let rows: Vec<Row> = fleet_nodes(st, current)?
            .into_iter()
            .map(|(at, in_current, in_previous)| {
                let index = current.spec.node_index(&at.name);
                let weight = in_current.map_or(0, |n| n.weight);
                Row {
                    ring: match (in_current.is_some(), in_previous) {
                        (true, true) => "both",
                        (true, false) => "current",
                        _ => "previous",
                    },
                    weight,
                    weight_share: f64::from(weight) / total_weight.max(1) as f64,
                    share: index.and_then(|i| shares.get(i).copied()).unwrap_or(0.0),
                    at,
                }
            })
            .collect();
        let previous_digest = st
            .rings
            .previous
            .as_ref()
            .map(|p| p.digest.clone())
            .unwrap_or_default();
        Ok(Survey {
            rows,
            digest: current.digest.clone(),
            previous_digest,
            link: link(st),
        })
    }

    /// Asks every node; the reply.
    pub async fn run(self, steps: NetSteps) -> CallReply {
        let Survey {
            rows,
            digest,
            previous_digest,
            ..
        } = self;
        let endpoints: Vec<Endpoint> = rows.iter().map(|r| r.at.clone()).collect();
        let states = coordinator::ask_states(&steps, &endpoints).await;
        let agree = states.iter().all(|s| {
            s.as_ref()
                .is_ok_and(|s| s.digest == digest && s.previous_digest == previous_digest)
        });
        let bulk = |s: &str| Resp::Bulk(s.as_bytes().to_vec());
        let int = |n: u64| Resp::Int(i64::try_from(n).unwrap_or(i64::MAX));
        let fraction = |f: f64| Resp::Bulk(format!("{f:.6}").into_bytes());
        let nodes = rows
            .iter()
            .zip(states)
            .map(|(row, state)| {
                let (st, error) = match state {
                    Ok(st) => (st, String::new()),
                    Err(e) => (NodeState::default(), e),
                };
                let reachable = error.is_empty();
                let fields = vec![
                    ("address", bulk(&row.at.address)),
                    ("ring", bulk(row.ring)),
                    ("reachable", bulk(if reachable { "yes" } else { "no" })),
                    ("error", bulk(&error)),
                    ("digest", bulk(&st.digest)),
                    ("previous_digest", bulk(&st.previous_digest)),
                    ("returning", bulk(if st.returning { "yes" } else { "no" })),
                    ("settled", bulk(if st.settled { "yes" } else { "no" })),
                    ("job", bulk(&st.job)),
                    ("job_state", bulk(&st.job_state)),
                    ("keys", int(st.keys)),
                    ("used_memory", int(st.used_memory)),
                    ("weight", int(u64::from(row.weight))),
                    ("weight_share", fraction(row.weight_share)),
                    ("share", fraction(row.share)),
                ];
                // With its key index: its keys per range of buckets it owns wholly, and those
                // of buckets it owns in part or not at all.
                let mut fields = fields;
                match &st.keys_by_share {
                    Some(by) => {
                        let ranges = by
                            .ranges
                            .iter()
                            .map(|&(first, last, keys)| {
                                Resp::Array(vec![
                                    int(u64::from(first)),
                                    int(u64::from(last)),
                                    int(keys),
                                ])
                            })
                            .collect();
                        fields.push(("key_ranges", Resp::Array(ranges)));
                        fields.push(("keys_in_part_buckets", int(by.in_part)));
                        fields.push(("keys_not_owned", int(by.not_owned)));
                    }
                    None => fields.push(("key_ranges", bulk("unknown: no key index there"))),
                }
                let map = fields.into_iter().map(|(k, v)| (bulk(k), v)).collect();
                (bulk(&row.at.name), Resp::Map(map))
            })
            .collect();
        CallReply::Reply(Resp::Map(vec![
            (bulk("agree"), bulk(if agree { "yes" } else { "no" })),
            (bulk("digest"), bulk(&digest)),
            (bulk("nodes"), Resp::Map(nodes)),
        ]))
    }
}
