//! The `shard` section of INFO.

use std::os::raw::c_longlong;

use redis_module::{raw, InfoContext, RedisResult};
use redis_module_macros::info_command_handler;

use crate::clock;
use crate::route::forward;
use crate::state;

fn int(n: u64) -> c_longlong {
    c_longlong::try_from(n).unwrap_or(c_longlong::MAX)
}

#[info_command_handler]
fn shard_info(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
    let st = state::lock();
    let keys = &st.keys;
    let stats = st.generator.stats();
    let now = clock::now_ms().unwrap_or(0);
    let ctx = ctx.ctx;
    raw::add_info_section(ctx, None);
    raw::add_info_field_str(ctx, "layout", keys.layout.name());
    raw::add_info_field_long_long(ctx, "node_id", int(keys.node_id));
    raw::add_info_field_long_long(ctx, "epoch_ms", keys.layout.epoch_ms);
    raw::add_info_field_long_long(ctx, "unit_ms", int(keys.layout.unit_ms));
    raw::add_info_field_str(ctx, "encoding", keys.encoding.name());
    raw::add_info_field_long_long(ctx, "keys_generated", int(stats.generated));
    raw::add_info_field_long_long(ctx, "ticks_borrowed", int(stats.borrowed));
    raw::add_info_field_long_long(ctx, "clock_backsteps", int(stats.backsteps));
    raw::add_info_field_long_long(ctx, "genkey_refused", int(stats.refused));
    raw::add_info_field_long_long(ctx, "drift_ms", st.generator.drift_ms(&keys.layout, now));
    raw::add_info_field_long_long(ctx, "max_drift_ms", keys.max_drift_ms);
    let high_water_ms = st.generator.high_water_ms(&keys.layout).unwrap_or(0);
    raw::add_info_field_long_long(ctx, "high_water_ms", high_water_ms);
    let rings = &st.rings;
    raw::add_info_field_long_long(ctx, "ring_epoch", int(rings.epoch));
    raw::add_info_field_str(
        ctx,
        "ring_algo",
        rings
            .current
            .as_ref()
            .map_or("none", |c| c.spec.algo.name()),
    );
    raw::add_info_field_long_long(
        ctx,
        "ring_nodes",
        rings
            .current
            .as_ref()
            .map_or(0, |c| int(c.spec.nodes.len() as u64)),
    );
    raw::add_info_field_str(
        ctx,
        "ring_digest",
        rings.current.as_ref().map_or("", |c| c.digest.as_str()),
    );
    raw::add_info_field_long_long(ctx, "resharding_open", i64::from(rings.previous.is_some()));
    let current = crate::reshard::current::lock();
    let job = &current.job;
    raw::add_info_field_str(ctx, "reshard_state", job.state.name());
    raw::add_info_field_long_long(ctx, "reshard_scanned", int(job.scanned()));
    raw::add_info_field_long_long(ctx, "reshard_copied", int(job.copied()));
    raw::add_info_field_long_long(ctx, "reshard_skipped", int(job.skipped()));
    raw::add_info_field_long_long(ctx, "reshard_deleted", int(job.deleted()));
    raw::add_info_field_long_long(ctx, "reshard_failed", int(job.failed()));
    raw::add_info_field_str(ctx, "reshard_last_error", &job.last_error);
    raw::add_info_field_long_long(ctx, "reshard_passes", int(job.passes));
    raw::add_info_field_long_long(ctx, "reshard_elapsed_ms", int(job.elapsed_ms));
    raw::add_info_field_long_long(ctx, "reshard_keys_total", int(job.keys_total));
    raw::add_info_field_long_long(ctx, "reshard_percent", int(job.percent()));
    raw::add_info_field_long_long(ctx, "reshard_keys_per_sec", int(job.keys_per_sec));
    raw::add_info_field_long_long(ctx, "reshard_eta_ms", int(job.eta_ms));
    raw::add_info_field_long_long(ctx, "reshard_bytes_sent", int(job.bytes_sent()));
    raw::add_info_field_long_long(ctx, "reshard_in_flight", int(job.in_flight));
    raw::add_info_field_long_long(ctx, "reshard_max_rate", int(job.max_rate));
    raw::add_info_field_str(ctx, "reshard_paused", if job.paused { "yes" } else { "no" });
    raw::add_info_field_long_long(ctx, "reshard_max_step_us", int(job.max_step_us));
    raw::add_info_field_str(ctx, "reshard_by_db", &job.by_db_text());
    raw::add_info_field_str(
        ctx,
        "ring_returning",
        if rings.returning { "yes" } else { "no" },
    );
    // The fleet operation this node coordinates: its phase (`none` when there is none), whether
    // it is being driven, and its last problem.
    let fleet = current.fleet.as_ref();
    raw::add_info_field_str(ctx, "fleet_phase", fleet.map_or("none", |f| f.phase.name()));
    raw::add_info_field_str(
        ctx,
        "fleet_running",
        if crate::reshard::fleet::coordinator::running() {
            "yes"
        } else {
            "no"
        },
    );
    raw::add_info_field_str(ctx, "fleet_error", fleet.map_or("", |f| f.error.as_str()));
    // Where each node is now (Sentinel's address for a `sentinel` node, empty while unknown).
    let mut nodes: Vec<(String, String)> = Vec::new();
    for placement in [rings.current.as_ref(), rings.previous.as_ref()]
        .into_iter()
        .flatten()
    {
        for n in &placement.spec.nodes {
            if nodes.iter().any(|(name, _)| *name == n.name) {
                continue;
            }
            let address = match n.via_sentinel() {
                true => crate::topology::nodes::address_of(&n.name).unwrap_or_default(),
                false => n.address.clone(),
            };
            nodes.push((n.name.clone(), address));
        }
    }
    let tls_on = st.config.tls == "yes";
    let tls_config_error = st.tls_config_error.clone().unwrap_or_default();
    drop(st);
    let (handshakes, handshake_avg_us, tls_failures, tls_last_error) = crate::net::tls::stats();
    raw::add_info_field_str(ctx, "tls", if tls_on { "yes" } else { "no" });
    raw::add_info_field_long_long(ctx, "tls_handshakes", int(handshakes));
    raw::add_info_field_long_long(ctx, "tls_handshake_avg_us", int(handshake_avg_us));
    raw::add_info_field_long_long(ctx, "tls_failures", int(tls_failures));
    raw::add_info_field_str(ctx, "tls_last_error", &tls_last_error);
    raw::add_info_field_str(ctx, "tls_config_error", &tls_config_error);
    let (failovers, subscribed, sentinel_error) = crate::topology::nodes::summary();
    raw::add_info_field_long_long(ctx, "failovers_seen", int(failovers));
    raw::add_info_field_str(
        ctx,
        "sentinel_subscribed",
        if subscribed { "yes" } else { "no" },
    );
    raw::add_info_field_str(ctx, "sentinel_error", &sentinel_error);
    for (name, address) in &nodes {
        raw::add_info_field_str(ctx, &format!("node_{}_address", field_name(name)), address);
    }
    let calls = forward::stats();
    raw::add_info_field_long_long(ctx, "call_local", int(calls.local));
    raw::add_info_field_long_long(ctx, "call_forwarded", int(calls.forwarded));
    raw::add_info_field_long_long(ctx, "call_fallbacks", int(calls.fallbacks));
    raw::add_info_field_long_long(ctx, "call_copies", int(calls.copies));
    raw::add_info_field_long_long(ctx, "call_timeouts", int(calls.timeouts));
    raw::add_info_field_long_long(ctx, "call_errors", int(calls.errors));
    let (connections, in_flight) = crate::net::pool::counts();
    raw::add_info_field_long_long(ctx, "call_connections", int(connections as u64));
    raw::add_info_field_long_long(ctx, "call_in_flight", int(in_flight as u64));
    raw::add_info_field_long_long(ctx, "replica_reads", int(calls.replica_reads));
    raw::add_info_field_long_long(ctx, "replica_fallbacks", int(calls.replica_fallbacks));
    for (node, (errors, timeouts)) in &calls.per_node {
        let field = field_name(node);
        raw::add_info_field_long_long(ctx, &format!("call_errors_{field}"), int(*errors));
        raw::add_info_field_long_long(ctx, &format!("call_timeouts_{field}"), int(*timeouts));
    }
    Ok(())
}

/// A node name as part of an INFO field name: characters other than letters, digits, `-`,
/// `_` and `.` become `_`.
fn field_name(node: &str) -> String {
    node.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
