//! The cluster protocol on a fleet of plain servers (`shard.cluster-protocol yes`): every Redis
//! Cluster client library can then route itself over the fleet. This file owns the switch and
//! the ring the protocol serves: whether it is on, which rings clients can follow (a `slots`
//! ring with Redis Cluster's hash tags), the checks that keep it so, the view of the current
//! ring that `CLUSTER SLOTS/SHARDS/NODES/...` show (`replies`), and the address a redirect
//! names. The filter's verdict on each command is `filter`'s; `SHARD.REDIRECT`'s is
//! `redirect`'s.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis_module::ContextFlags;

use crate::cluster::replies::{ClusterView, Me};
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};
use crate::ring::placement::Placement;
use crate::ring::HashTag;
use crate::state;
use crate::state::Config;
use crate::topology;

static ENABLED: AtomicBool = AtomicBool::new(false);
/// When the protocol was last turned on (Unix ms): the emulated links' creation time.
static ENABLED_AT: AtomicU64 = AtomicU64::new(0);

pub fn set_enabled(on: bool) {
    let was = ENABLED.swap(on, Ordering::Relaxed);
    if on && !was {
        let now = crate::clock::now_ms().and_then(|ms| u64::try_from(ms).ok());
        ENABLED_AT.store(now.unwrap_or(0), Ordering::Relaxed);
        crate::cluster::auth::watch();
    }
}

/// When the protocol was last turned on, in Unix ms (`CLUSTER LINKS`' `create-time`).
pub fn enabled_at_ms() -> u64 {
    ENABLED_AT.load(Ordering::Relaxed)
}

/// Whether the protocol is on (and so the filter must look at every command).
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A ring cluster clients can follow: 16384 slots, CRC16, Redis Cluster's hash tags.
pub fn eligible(p: &Placement) -> bool {
    p.ring
        .as_ref()
        .is_some_and(|r| r.slot_ranges().is_some() && r.spec().hashtag == HashTag::Cluster)
}

/// Checks `cluster-protocol` against the current ring (`None`: at load, before any ring).
pub fn check_config(next: &Config, current: Option<&Placement>) -> Result<(), String> {
    match next.cluster_protocol.as_str() {
        "no" => Ok(()),
        "yes" => match current {
            Some(p) if eligible(p) => Ok(()),
            _ => Err("cluster-protocol yes needs a current ring of the slots algo with the cluster hash-tag rule (SHARD.RING SET slots name host:port weight ...)".into()),
        },
        other => Err(format!("cluster-protocol is yes or no, not '{other}'")),
    }
}

/// Refuses a ring change that would leave the protocol on over a ring clients cannot follow.
pub fn check_ring_change(call: &Call, next_current: &Placement) -> CmdResult {
    let replicated = call.ctx.get_flags().contains(ContextFlags::REPLICATED);
    if enabled() && !replicated && !eligible(next_current) {
        return Err(CmdError::err(
            "cluster-protocol is yes: the current ring must stay a slots ring with the cluster hash-tag rule; CONFIG SET shard.cluster-protocol no first",
        ));
    }
    Ok(())
}

/// The view of the current ring, with the replicas the topology knows, for SHARD.CLUSTER.
pub fn view() -> Result<ClusterView, CmdError> {
    let st = state::lock();
    let current = st
        .rings
        .current
        .as_ref()
        .filter(|p| eligible(p))
        .ok_or_else(|| CmdError::err("cluster-protocol needs a slots ring"))?;
    let ring = current
        .ring
        .as_ref()
        .ok_or_else(|| CmdError::err("cluster-protocol needs a slots ring"))?;
    let self_name = st.config.ring.self_name.as_str();
    let me = if topology::nodes::is_replica() {
        match topology::me::shard(ring.spec(), self_name) {
            Some(shard) => Me::Replica {
                shard: shard.to_string(),
                address: topology::me::find_self(&topology::nodes::replicas_of(shard)),
            },
            None => Me::Nobody,
        }
    } else {
        Me::Primary(self_name.to_string())
    };
    ClusterView::of(ring, &me, topology::nodes::replicas_of)
        .ok_or_else(|| CmdError::err("cluster-protocol needs a slots ring"))
}

/// The refusal of a key of this server's own `sentinel` node while Sentinel does not name this
/// server as that node's primary (a restarted old primary, or one failed over away from):
/// (`MOVED`, `slot host:port`) to the primary Sentinel names, or (`TRYAGAIN`, why) while it
/// has named none yet. The server never runs such a key's commands as the owner.
pub fn not_named(slot: u16, n: &crate::ring::NodeSpec) -> (&'static str, String) {
    if topology::nodes::address_of(&n.name)
        .is_some_and(|a| crate::net::endpoint::split_address(&a).is_some())
    {
        return ("MOVED", format!("{slot} {}", address_in_use(n)));
    }
    (
        "TRYAGAIN",
        format!(
            "this node is not the primary Sentinel names for {} (Sentinel has named none yet)",
            n.name
        ),
    )
}

/// `host:port` of a node as a redirect names it: Sentinel's address now for a `sentinel` node.
pub fn address_in_use(n: &crate::ring::NodeSpec) -> String {
    let at = crate::topology::nodes::endpoint_of(n, "");
    format!("{}:{}", at.host, at.port)
}
