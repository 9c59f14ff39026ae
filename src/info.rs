//! The `shard` section of INFO.

use std::os::raw::c_longlong;

use redis_module::{InfoContext, RedisResult};
use redis_module_macros::info_command_handler;

use crate::clock;
use crate::host::info::InfoSection;
use crate::route::stats;
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
    let section = InfoSection::open(ctx);
    section.str("layout", keys.layout.name());
    section.int("node_id", int(keys.node_id));
    section.int("epoch_ms", keys.layout.epoch_ms);
    section.int("unit_ms", int(keys.layout.unit_ms));
    section.str("encoding", keys.encoding.name());
    section.int("keys_generated", int(stats.generated));
    section.int("ticks_borrowed", int(stats.borrowed));
    section.int("clock_backsteps", int(stats.backsteps));
    section.int("genkey_refused", int(stats.refused));
    section.int("drift_ms", st.generator.drift_ms(&keys.layout, now));
    section.int("max_drift_ms", keys.max_drift_ms);
    let high_water_ms = st.generator.high_water_ms(&keys.layout).unwrap_or(0);
    section.int("high_water_ms", high_water_ms);
    let rings = &st.rings;
    section.int("ring_epoch", int(rings.epoch));
    section.str(
        "ring_algo",
        rings
            .current
            .as_ref()
            .map_or("none", |c| c.spec.algo.name()),
    );
    section.int(
        "ring_nodes",
        rings
            .current
            .as_ref()
            .map_or(0, |c| int(c.spec.nodes.len() as u64)),
    );
    section.str(
        "ring_digest",
        rings.current.as_ref().map_or("", |c| c.digest.as_str()),
    );
    section.int("resharding_open", i64::from(rings.previous.is_some()));
    let current = crate::reshard::current::lock();
    let job = &current.job;
    section.str("reshard_state", job.state.name());
    section.int("reshard_scanned", int(job.scanned()));
    section.int("reshard_copied", int(job.copied()));
    section.int("reshard_skipped", int(job.skipped()));
    section.int("reshard_deleted", int(job.deleted()));
    section.int("reshard_failed", int(job.failed()));
    section.str("reshard_last_error", &job.last_error);
    section.int("reshard_passes", int(job.passes));
    section.int("reshard_elapsed_ms", int(job.elapsed_ms));
    section.int("reshard_keys_total", int(job.keys_total));
    section.int("reshard_percent", int(job.percent()));
    section.int("reshard_keys_per_sec", int(job.keys_per_sec));
    section.int("reshard_eta_ms", int(job.eta_ms));
    section.int("reshard_bytes_sent", int(job.bytes_sent()));
    section.int(
        "reshard_in_flight",
        int(crate::reshard::copy_job::in_flight_now(job)),
    );
    section.int("reshard_max_rate", int(job.max_rate));
    section.str("reshard_paused", if job.paused { "yes" } else { "no" });
    section.int("reshard_max_step_us", int(job.max_step_us));
    section.str("reshard_keys_from", job.keys_from);
    section.int("reshard_passes_forked", int(job.passes_forked));
    section.int("reshard_passes_stepped", int(job.passes_stepped));
    let (applied, applied_skipped) = crate::host::strings::applied();
    section.int("applied_strings", int(applied));
    section.int("applied_skipped", int(applied_skipped));
    let index = crate::index::status();
    section.str("key_index", index.phase.name());
    section.int("key_index_keys", int(index.keys as u64));
    section.int("key_index_builds", int(index.builds));
    section.int("key_index_restarts", int(index.restarts));
    section.int("key_index_bytes", int(index.bytes as u64));
    section.str("reshard_by_db", &job.by_db_text());
    section.str("ring_returning", if rings.returning { "yes" } else { "no" });
    // The fleet operation this node coordinates: its phase (`none` when there is none), whether
    // it is being driven, and its last problem.
    let fleet = current.fleet.as_ref();
    section.str("fleet_phase", fleet.map_or("none", |f| f.phase.name()));
    section.str(
        "fleet_running",
        if crate::reshard::fleet::coordinator::running() {
            "yes"
        } else {
            "no"
        },
    );
    section.str("fleet_error", fleet.map_or("", |f| f.error.as_str()));
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
    let (handshakes, handshake_avg_us, tls_failures, tls_last_error) =
        crate::net::tls_failure::stats();
    section.str("tls", if tls_on { "yes" } else { "no" });
    section.int("tls_handshakes", int(handshakes));
    section.int("tls_handshake_avg_us", int(handshake_avg_us));
    section.int("tls_failures", int(tls_failures));
    section.str("tls_last_error", &tls_last_error);
    section.str("tls_config_error", &tls_config_error);
    let (failovers, subscribed, sentinel_error) = crate::topology::nodes::summary();
    section.int("failovers_seen", int(failovers));
    section.str("sentinel_subscribed", if subscribed { "yes" } else { "no" });
    section.str("sentinel_error", &sentinel_error);
    for (name, address) in &nodes {
        section.str(&format!("node_{}_address", field_name(name)), address);
    }
    let (locks_held, longest_lock_ms, in_doubt) = crate::txn::owner::info();
    section.int("txn_locks_held", int(locks_held));
    section.int("txn_longest_lock_ms", int(longest_lock_ms));
    section.int("txn_in_doubt", int(in_doubt));
    section.int("txn_unacked", int(crate::txn::owner::acked::unacked()));
    let calls = stats::stats();
    section.int("call_local", int(calls.local));
    section.int("call_forwarded", int(calls.forwarded));
    section.int("call_fallbacks", int(calls.fallbacks));
    section.int("call_copies", int(calls.copies));
    section.int("call_timeouts", int(calls.timeouts));
    section.int("call_errors", int(calls.errors));
    section.int("call_noreplicas", int(calls.noreplicas));
    let (connections, in_flight) = crate::net::pool::counts();
    section.int("call_connections", int(connections as u64));
    section.int("call_in_flight", int(in_flight as u64));
    section.int("replica_reads", int(calls.replica_reads));
    section.int("replica_fallbacks", int(calls.replica_fallbacks));
    for (node, (errors, timeouts)) in &calls.per_node {
        let field = field_name(node);
        section.int(&format!("call_errors_{field}"), int(*errors));
        section.int(&format!("call_timeouts_{field}"), int(*timeouts));
    }
    // Transactions this node coordinated, and the decisions it holds.
    let [committed, watch, lock, error] = crate::txn::coord::clients::counters();
    section.int("txn_committed", int(committed));
    section.int("txn_aborted_watch", int(watch));
    section.int("txn_aborted_lock", int(lock));
    section.int("txn_aborted_error", int(error));
    let (decisions, _) = crate::txn::coord::book::with(|b| b.counts());
    section.int("txn_decisions_held", int(decisions as u64));
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
