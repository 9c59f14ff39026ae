//! `shard`: a Redis module that puts sharding inside Redis.
//!
//! - `keys/`: time-sorted unique keys (layouts, base62, the generator): pure Rust.
//! - `ring/`: where a key lives (ketama, jedis, redis-shard, cluster slots): pure Rust.
//! - `keyindex/`: the key names of each database by ring bucket, packed for memory: pure Rust.
//! - `commands/`: the glue from Redis commands to the core, every call guarded against panics.
//! - `config`, `info`, `state`: module configurations, the INFO section, the shared state.

pub mod clock;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod durability;
pub mod host;
pub mod index;
pub mod info;
pub mod keyindex;
pub mod keys;
pub mod net;
pub mod persist;
pub mod reshard;
pub mod ring;
pub mod route;
pub mod state;
#[cfg(test)]
mod test_rng;
pub mod topology;
pub mod txn;

use host::aux::SHARD_AUX;
use redis_module::configuration::ConfigurationFlags;
use redis_module::{redis_module, Context, RedisString, Status};

/// Logs panics to the Redis log (the handler that caught it replies an error and goes on).
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_else(|| "unknown location".into());
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        redis_module::logging::log_warning(format!("shard: panic at {location}: {message}"));
    }));
}

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    install_panic_hook();
    durability::register();
    let raw_args: Vec<Vec<u8>> = args.iter().map(|a| a.as_slice().to_vec()).collect();
    if let Err(e) = config::check_module_args(&raw_args) {
        ctx.log_warning(&e);
        return Status::Err;
    }
    // SAFETY: OnLoad's own context.
    unsafe { host::context::detach(ctx.ctx) };
    host::latency::refresh_threshold();
    if let Err(e) = config::finish_load() {
        ctx.log_warning(&format!("invalid configuration: {e}"));
        return Status::Err;
    }
    if let Err(e) = commands::registry::register_all(ctx) {
        ctx.log_warning(&e);
        return Status::Err;
    }
    if let Err(e) = route::command_table::learn_all(ctx) {
        ctx.log_warning(&format!(
            "shard: {e}; SHARD.CALL learns each command at its first call"
        ));
    }
    // The transactions' owner side: the module's own writes mark watched keys (the filter and
    // the keyspace changes below do the rest; an expiry or an eviction is found at the check).
    host::writes::set_hook(txn::owner::marks::on_own_command);
    host::blocked::set_run_check(txn::owner::waiters::recheck);
    txn::set_status_hook(txn::coord::status_hook);
    // This node's own parts of a transaction it coordinates run here, inside the client's
    // command, not over a connection to itself.
    txn::coord::local::set(txn::coord::local::LocalOwner {
        watch: |call, txid, ttl_ms, keys| {
            txn::owner::run::watch_here(call, txid, ttl_ms, keys);
            Some(())
        },
        unwatch: |txid| {
            txn::owner::with(|t| t.unwatch(txid));
            Some(())
        },
        apply: |call, txid, watched, cmds| {
            Some(txn::owner::run::apply_here(call, txid, watched, cmds))
        },
    });
    // SAFETY: OnLoad's own context.
    if let Err(e) = unsafe { host::filter::register::<Filter>(ctx.ctx) } {
        ctx.log_warning(&e);
        return Status::Err;
    }
    net::pool::set_hooks(net::pool::Hooks {
        deliver: route::forward::deliver_all,
        wake_resolver: topology::watcher::wake_for,
        resolver_error: topology::nodes::address_error,
    });
    // SAFETY: OnLoad's own context.
    unsafe { config::follow_config_set(ctx.ctx) };
    // SAFETY: OnLoad's own context.
    reshard::fleet::repair::hold_from_env();
    if let Err(e) = unsafe { follow_the_server(ctx.ctx) } {
        ctx.log_warning(&e);
        return Status::Err;
    }
    Status::Ok
}

/// The event loop's turns drive the connections (flush what was queued before the server
/// sleeps, expire late requests after it wakes) and tell the topology watcher what to watch;
/// the server's role says whether it runs its shard's calls; then the watcher starts.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
unsafe fn follow_the_server(ctx: *mut redis_module::raw::RedisModuleCtx) -> Result<(), String> {
    fn keyspace_changed(change: host::events::KeyspaceChange) {
        use host::events::KeyspaceChange;
        // A copy's list of what moves no longer describes a keyspace replaced under it.
        if matches!(
            change,
            KeyspaceChange::LoadStarted | KeyspaceChange::Swapped(..)
        ) {
            reshard::moved::forget();
            reshard::copy_steps::keyspace_replaced();
        }
        index::on_keyspace_change(change);
        txn::owner::on_keyspace_change(change);
        if change == KeyspaceChange::LoadEnded {
            // A primary back from a load: rings older than the fleet's are brought up to date,
            // its writes refused until they are checked.
            reshard::fleet::repair::check_soon();
            txn::coord::exec::resume();
            txn::coord::gather_step::empty_after_load();
        }
    }
    fn role_changed(replica: bool) {
        topology::nodes::set_replica(replica);
        topology::me::refresh();
        // A replica's link comes up later (`master_link_changed`); until then it routes nothing.
        route::gate::set_unlinked(replica);
        if replica {
            // A job counts for no fleet step once its server is demoted.
            reshard::jobs::demoted();
        } else {
            // After a load or a promotion: rings older than the fleet's are brought up to date.
            reshard::fleet::repair::check_soon();
            // A promoted replica carries out the commits its old primary decided.
            txn::coord::exec::resume();
        }
    }
    fn master_link_changed(up: bool) {
        topology::me::refresh();
        route::gate::set_unlinked(!up && topology::nodes::is_replica());
    }
    fn client_gone(id: u64) {
        cluster::clients::forget(id);
        txn::coord::clients::forget(id);
    }
    fn before_sleep(ctx: &redis_module::Context) {
        // First: what a rescued timer queues on the network is flushed in this turn.
        host::timers::rescue_overdue(ctx);
        // Before the pool's flush: an unblock it asks for leaves in this turn.
        route::blocking_moves::check();
        let flush = host::latency::step(c"shard-pool-flush");
        net::pool::before_sleep();
        flush.end();
        topology::watcher::tick();
        // After the pool's flush: the decisions recorded now are in the AOF before their
        // COMMITs leave, at the next turn (`txn::coord::turn`).
        let _turn = host::latency::step(c"shard-txn-turn");
        txn::coord::turn::before_sleep(ctx);
    }
    // SAFETY: as the caller promises.
    unsafe {
        host::events::on_event_loop(ctx, before_sleep, net::pool::after_sleep)?;
        host::events::on_role_change(ctx, role_changed);
        host::events::on_master_link_change(ctx, master_link_changed);
        host::events::follow_replicas(ctx);
        host::events::on_client_gone(ctx, client_gone);
        host::events::on_keyspace_change(ctx, keyspace_changed);
        // A child follows no keyspace event (the parent's records are the parent's).
        host::fork::in_child(|| {
            index::stop_following();
            reshard::dirty::stop_recording();
        });
    }
    // A fleet operation's old and new rings are watched too (their Sentinel nodes' addresses).
    topology::watcher::set_more_rings(|| {
        reshard::current::lock()
            .fleet
            .iter()
            .flat_map(|f| [f.old.clone(), f.new.clone()])
            .collect()
    });
    // A primary Sentinel fails its node over to checks its rings, as a promoted replica does.
    topology::watcher::set_on_named(reshard::fleet::repair::check_soon);
    topology::watcher::start()
}

/// The module's command filter, run on every command a client sends: the cluster protocol's
/// rewrites when it is on, then SHARD.CALL's rewrite of a call whose keys are all here, then
/// the transactions' marks of watched keys and wait for locked ones. One registration with the
/// server for all three (each filter registered costs every command the server's walk to it).
/// What a plain command pays (bench/findings.md, "Plain GET/SET while transactions run"): the
/// first checks of each part, inlined here, without a call: the protocol's flag, the argument
/// count and the name's length and first letter (`SHARD.CALL`), and while keys are watched or
/// locked a length check per argument; only a command one of them retains goes further.
struct Filter;

impl host::filter::Handler for Filter {
    #[inline(always)]
    fn retains(args: &host::filter::FilterArgs) -> bool {
        route::filter::new_command();
        cluster::protocol::enabled()
            || route::plain::enabled()
            || route::filter::may_be_local_call(args)
            || txn::owner::marks::may_matter(args)
            || state::outside()
    }

    fn on_command(args: &mut host::filter::FilterArgs) {
        filter_all(args);
    }
}

/// The parts of the filter, in order, for a command one of their first checks retained (each
/// checks again: the protocol's rewrite changes the command the others see).
#[inline(never)]
fn filter_all(args: &mut host::filter::FilterArgs) {
    // The usual command with route-plain on, a keyed one whose keys are all here, while no
    // other part has anything to do with it: left as it is, at once.
    if !cluster::protocol::enabled()
        && !state::outside()
        && !txn::owner::marks::may_matter(args)
        && route::plain::passes_as_is(args)
    {
        return;
    }
    if cluster::protocol::enabled() {
        cluster::filter::rewrite(args);
    }
    route::filter::rewrite_local_call(args);
    route::plain::rewrite(
        args,
        cluster::clients::is_internal,
        txn::coord::clients::queueing,
        |args| cluster::auth::known_authenticated(|| args.client_user()),
        cluster::protocol::enabled(),
    );
    txn::owner::marks::on_command(args);
    route::outside::rewrite(args, cluster::clients::is_internal);
}

/// Redis's allocator in the module; the system's in `cargo test` and wherever the crate runs
/// outside Redis (benchmarks, fuzzing: the `system-alloc` feature).
#[cfg(not(any(test, feature = "system-alloc")))]
type ModuleAlloc = redis_module::alloc::RedisAlloc;
#[cfg(not(any(test, feature = "system-alloc")))]
const MODULE_ALLOC: ModuleAlloc = redis_module::alloc::RedisAlloc;
#[cfg(any(test, feature = "system-alloc"))]
type ModuleAlloc = std::alloc::System;
#[cfg(any(test, feature = "system-alloc"))]
const MODULE_ALLOC: ModuleAlloc = std::alloc::System;

redis_module! {
    name: "shard",
    version: 1,
    allocator: (ModuleAlloc, MODULE_ALLOC),
    data_types: [SHARD_AUX],
    init: init,
    commands: [],
    configurations: [
        i64: [
            ["node-id", &config::NODE_ID, 0, 0, 1_048_575, ConfigurationFlags::DEFAULT, None],
            ["node-bits", &config::NODE_BITS, 10, 0, 20, ConfigurationFlags::DEFAULT, None],
            ["node-count", &config::NODE_COUNT, 1, 1, 3844, ConfigurationFlags::DEFAULT, None],
            ["max-drift-ms", &config::MAX_DRIFT_MS, 5000, 0, 86_400_000, ConfigurationFlags::DEFAULT, None],
            ["call-timeout-ms", &config::CALL_TIMEOUT_MS, 1000, 1, 600_000, ConfigurationFlags::DEFAULT, None],
            ["big-key-bytes", &config::BIG_KEY_BYTES, 1_048_576, 1024, 536_870_912, ConfigurationFlags::DEFAULT, None],
            ["big-key-elements", &config::BIG_KEY_ELEMENTS, 4096, 16, 1_000_000_000, ConfigurationFlags::DEFAULT, None],
            ["topology-refresh-ms", &config::TOPOLOGY_REFRESH_MS, 1000, 100, 60_000, ConfigurationFlags::DEFAULT, None],
            ["fleet-lease-ms", &config::FLEET_LEASE_MS, 10_000, 1000, 600_000, ConfigurationFlags::DEFAULT, None],
            ["txn-lock-ms", &config::TXN_LOCK_MS, 5000, 1, 600_000, ConfigurationFlags::DEFAULT, None],
        ],
        string: [
            ["layout", &config::LAYOUT, "snowflake", ConfigurationFlags::DEFAULT, None],
            ["epoch", &config::EPOCH, "", ConfigurationFlags::DEFAULT, None],
            ["custom-layout", &config::CUSTOM_LAYOUT, "", ConfigurationFlags::DEFAULT, None],
            ["encoding", &config::ENCODING, "decimal", ConfigurationFlags::DEFAULT, None],
            ["types", &config::TYPES, "", ConfigurationFlags::DEFAULT, None],
            ["ring-file", &config::RING_FILE, "", ConfigurationFlags::DEFAULT, None],
            ["ring-algo", &config::RING_ALGO, "ketama", ConfigurationFlags::DEFAULT, None],
            ["ring-hashtag", &config::RING_HASHTAG, "", ConfigurationFlags::DEFAULT, None],
            ["self", &config::SELF, "", ConfigurationFlags::DEFAULT, None],
            ["auth-user", &config::AUTH_USER, "", ConfigurationFlags::DEFAULT, None],
            ["auth-password", &config::AUTH_PASSWORD, "", ConfigurationFlags::SENSITIVE, None],
            ["cluster-protocol", &config::CLUSTER_PROTOCOL, "no", ConfigurationFlags::DEFAULT, None],
            ["key-index", &config::KEY_INDEX, "no", ConfigurationFlags::DEFAULT, None],
            ["route-plain", &config::ROUTE_PLAIN, "no", ConfigurationFlags::DEFAULT, None],
            ["atomic-mset", &config::ATOMIC_MSET, "no", ConfigurationFlags::DEFAULT, None],
            ["copy-fork", &config::COPY_FORK, "auto", ConfigurationFlags::DEFAULT, None],
            ["special-keys", &config::SPECIAL_KEYS, "", ConfigurationFlags::DEFAULT, None],
            ["fields", &config::FIELDS, "", ConfigurationFlags::DEFAULT, None],
            ["sentinels", &config::SENTINELS, "", ConfigurationFlags::DEFAULT, None],
            ["sentinel-user", &config::SENTINEL_USER, "", ConfigurationFlags::DEFAULT, None],
            ["sentinel-password", &config::SENTINEL_PASSWORD, "", ConfigurationFlags::SENSITIVE, None],
            ["read-from", &config::READ_FROM, "primary", ConfigurationFlags::DEFAULT, None],
            ["tls", &config::TLS, "no", ConfigurationFlags::DEFAULT, None],
            ["tls-cert-file", &config::TLS_CERT_FILE, "", ConfigurationFlags::DEFAULT, None],
            ["tls-key-file", &config::TLS_KEY_FILE, "", ConfigurationFlags::DEFAULT, None],
            ["tls-ca-cert-file", &config::TLS_CA_CERT_FILE, "", ConfigurationFlags::DEFAULT, None],
            ["tls-ca-cert-dir", &config::TLS_CA_CERT_DIR, "", ConfigurationFlags::DEFAULT, None],
            ["tls-server-name", &config::TLS_SERVER_NAME, "", ConfigurationFlags::DEFAULT, None],
        ],
        bool: [],
        enum: [],
        module_args_as_configuration: true,
    ]
}
