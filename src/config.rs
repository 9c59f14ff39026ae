//! Module configurations (`CONFIG SET shard.x`, `loadmodule ... x value`, `shard.x` in
//! redis.conf). A change is checked whole against every capability (the key settings, the
//! sentinels, TLS, the cluster protocol, Shardjs's dictionaries) before anything changes; then
//! the state takes it and each capability that keeps its own copy of a setting gets it
//! (`apply`). Nothing is half-applied: a refused value leaves everything as it was.

use redis_module::configuration::{ConfigurationContext, ConfigurationValue};
use redis_module::{RedisError, RedisString};

use std::sync::Arc;

use crate::keys::KeySettings;
use crate::state::{self, Config, ModuleState};

/// Applies a configuration change whole, or refuses it and changes nothing.
///
/// A change of `ring-file`, `ring-algo` or `ring-hashtag` while a ring file is named loads
/// the file again and replaces the current ring.
fn change_in(st: &mut ModuleState, change: impl FnOnce(&mut Config)) -> Result<(), String> {
    let mut next = st.config.clone();
    change(&mut next);
    if !st.loaded {
        st.config = next;
        return Ok(());
    }
    let keys = KeySettings::resolve(&next.keys)?;
    check_topology(&next)?;
    check_key_index(&next)?;
    crate::route::plain::check(&next.route_plain)?;
    check_yes_no("atomic-mset", &next.atomic_mset)?;
    check_copy_fork(&next.copy_fork)?;
    check_tls(&st.config, &next)?;
    let tls = tls_update(st, &next)?;
    crate::cluster::protocol::check_config(&next, st.rings.current.as_deref())?;
    check_shardjs_config(&next, &keys)?;
    let ring = if next.ring.source_differs(&st.config.ring) {
        if st.rings.previous.is_some() && !next.ring.file.is_empty() {
            return Err(crate::ring::placement::RESHARDING_OPEN.into());
        }
        crate::state::ring_from_file(&next)?
    } else {
        None
    };
    // Replicas are looked up at once when reads may now go to them or the maps list them.
    let look = next.read_from != st.config.read_from
        || next.cluster_protocol != st.config.cluster_protocol;
    st.install(next, keys, ring);
    apply(&st.config);
    if look {
        crate::topology::watcher::wake();
    }
    if let Some(tls) = tls {
        crate::net::tls::install(tls);
    }
    Ok(())
}

/// The TLS configuration to put in force for `next`, `None` to keep the one in force:
/// built again when a TLS setting was set. Settings that do not fit together while TLS is
/// on (a certificate whose key is still the old one: the other of the pair may follow in the
/// same `CONFIG SET`) keep the previous configuration in force; `refresh_tls` checks them
/// again once the command is done. A file that does not read is refused before this.
fn tls_update(
    st: &mut ModuleState,
    next: &Config,
) -> Result<Option<Option<Arc<crate::net::tls::Tls>>>, String> {
    if next.tls == st.config.tls && next.tls_files == st.config.tls_files {
        return Ok(None);
    }
    if next.tls != "yes" {
        st.tls_config_error = None;
        return Ok(Some(None));
    }
    match build_tls(next) {
        Ok(tls) => {
            st.tls_config_error = None;
            Ok(Some(Some(Arc::new(tls))))
        }
        Err(e) if e.combination && st.config.tls == "yes" => {
            st.tls_config_error = Some(e.message);
            Ok(None)
        }
        Err(e) => Err(e.message),
    }
}

/// Builds the TLS configuration again (the server's `tls-*` files or the module's changed):
/// after a `CONFIG SET` of either, so a certificate and its key set in one command are
/// checked together. On failure the configuration in force stays, and the log and INFO
/// (`tls_config_error`) say why.
fn refresh_tls_in(st: &mut ModuleState) {
    if st.config.tls != "yes" {
        return;
    }
    match build_tls(&st.config) {
        Ok(tls) => {
            st.tls_config_error = None;
            crate::net::tls::install(Some(Arc::new(tls)));
        }
        Err(e) => {
            redis_module::logging::log_warning(format!(
                "shard: the TLS settings are not in force ({e}); new connections keep the \
                 previous certificate"
            ));
            st.tls_config_error = Some(e.message);
        }
    }
}

/// Checks the configuration given at load time and loads the ring file if one is named;
/// from now on every change is checked.
fn finish_load_in(st: &mut ModuleState) -> Result<(), String> {
    let keys = KeySettings::resolve(&st.config.keys)?;
    check_topology(&st.config)?;
    check_key_index(&st.config)?;
    crate::route::plain::check(&st.config.route_plain)?;
    check_yes_no("atomic-mset", &st.config.atomic_mset)?;
    check_copy_fork(&st.config.copy_fork)?;
    check_tls(&Config::default(), &st.config)?;
    check_shardjs_config(&st.config, &keys)?;
    let ring = crate::state::ring_from_file(&st.config)?;
    let tls = if st.config.tls == "yes" {
        let built = build_tls(&st.config).map_err(|e| format!("shard.tls yes: {e}"))?;
        Some(Arc::new(built))
    } else {
        None
    };
    st.install(st.config.clone(), keys, ring);
    apply(&st.config);
    crate::net::tls::install(tls);
    follow_source_address();
    st.loaded = true;
    Ok(())
}

/// The module's connections leave from the server's own `bind-source-addr` (`net::source`).
/// Main thread only.
fn follow_source_address() {
    crate::net::source::set(&crate::host::context::server_config("bind-source-addr"));
}

/// Builds the TLS configuration again (after a `CONFIG SET` of the module's or the server's
/// TLS files); on failure the configuration in force stays and INFO says why.
pub fn refresh_tls() {
    refresh_tls_in(&mut state::lock());
}

/// Checks the configuration given at load time and loads the ring file if one is named; from
/// now on every change is checked.
pub fn finish_load() -> Result<(), String> {
    finish_load_in(&mut state::lock())
}

/// Follows `CONFIG SET`: the TLS configuration is built again after a change of a TLS file,
/// the module's or the server's own (whose files the module's fall back to), so that files
/// rewritten in place are read again and settings left waiting for the rest of the command
/// are checked whole; and the module's connections leave from the server's
/// `bind-source-addr` after a change of it.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn follow_config_set(ctx: *mut redis_module::raw::RedisModuleCtx) {
    fn changed(names: &[&[u8]]) {
        if names
            .iter()
            .any(|n| n.starts_with(b"tls-") || n.starts_with(b"shard.tls"))
        {
            refresh_tls();
        }
        if names.contains(&b"bind-source-addr".as_slice()) {
            follow_source_address();
        }
    }
    // SAFETY: as the caller promises.
    unsafe { crate::host::events::on_config_change(ctx, changed) };
}

/// Puts the settings in force in each capability that keeps its own copy (read on hot paths
/// without the state's lock).
fn apply(config: &Config) {
    crate::cluster::protocol::set_enabled(config.cluster_protocol == "yes");
    crate::index::set_wanted(config.key_index == "yes");
    crate::route::plain::set_enabled(config.route_plain == "yes");
    crate::route::split::set_atomic_mset(config.atomic_mset == "yes");
    // Checked before: the mode parses.
    crate::reshard::copy_steps::Mode::parse(&config.copy_fork)
        .unwrap_or(crate::reshard::copy_steps::Mode::Auto)
        .set();
    // Checked before: the mode parses.
    crate::topology::nodes::set_read_from(
        crate::topology::nodes::ReadFrom::parse(&config.read_from)
            .unwrap_or(crate::topology::nodes::ReadFrom::Primary),
    );
    // Checked before: the dictionary parses.
    crate::route::fields::install(
        crate::route::fields::FieldDict::parse(&config.fields).unwrap_or_default(),
    );
}

/// Checks the special keys (each type known to the configured `types`, or a number a Shardjs
/// type holds) and the field dictionary.
fn check_shardjs_config(config: &Config, keys: &KeySettings) -> Result<(), String> {
    for k in crate::keys::shardjs::parse_special_keys(&config.special_keys)
        .map_err(|e| format!("special-keys: {e}"))?
    {
        crate::state::special_key_type(keys, &k.key_type)
            .map_err(|e| format!("special-keys: {e}"))?;
    }
    crate::route::fields::FieldDict::parse(&config.fields).map_err(|e| format!("fields: {e}"))?;
    Ok(())
}

/// The TLS configuration of `config`'s settings, over the server's own `tls-*` files.
fn build_tls(config: &Config) -> Result<crate::net::tls::Tls, crate::net::tls::BuildError> {
    crate::net::tls::build(&config.tls_files, &server_tls())
}

/// A text configuration: how to read and write its field.
pub struct TextConfig {
    get: fn(&Config) -> String,
    set: fn(&mut Config, String),
}

/// A numeric configuration.
pub struct IntConfig {
    get: fn(&Config) -> i64,
    set: fn(&mut Config, i64),
}

impl ConfigurationValue<RedisString> for TextConfig {
    fn get(&self, _: &ConfigurationContext) -> RedisString {
        RedisString::create(None, (self.get)(&state::lock().config))
    }

    fn set(&self, _: &ConfigurationContext, value: RedisString) -> Result<(), RedisError> {
        let text = value.try_as_str()?.to_owned();
        change_in(&mut state::lock(), |c| (self.set)(c, text)).map_err(RedisError::String)
    }
}

impl ConfigurationValue<i64> for IntConfig {
    fn get(&self, _: &ConfigurationContext) -> i64 {
        (self.get)(&state::lock().config)
    }

    fn set(&self, _: &ConfigurationContext, value: i64) -> Result<(), RedisError> {
        change_in(&mut state::lock(), |c| (self.set)(c, value)).map_err(RedisError::String)
    }
}

/// A configuration bound to one field of `Config`.
macro_rules! config_field {
    ($name:ident: TextConfig => $($field:ident).+) => {
        pub static $name: TextConfig = TextConfig {
            get: |c| c.$($field).+.clone(),
            set: |c, v| c.$($field).+ = v,
        };
    };
    ($name:ident: IntConfig => $($field:ident).+) => {
        pub static $name: IntConfig = IntConfig {
            get: |c| c.$($field).+,
            set: |c, v| c.$($field).+ = v,
        };
    };
}

config_field!(LAYOUT: TextConfig => keys.layout);
config_field!(EPOCH: TextConfig => keys.epoch);
config_field!(CUSTOM_LAYOUT: TextConfig => keys.custom_layout);
config_field!(ENCODING: TextConfig => keys.encoding);
config_field!(TYPES: TextConfig => keys.types);
config_field!(NODE_ID: IntConfig => keys.node_id);
config_field!(NODE_COUNT: IntConfig => keys.node_count);
config_field!(MAX_DRIFT_MS: IntConfig => keys.max_drift_ms);
config_field!(NODE_BITS: IntConfig => keys.node_bits);
config_field!(RING_FILE: TextConfig => ring.file);
config_field!(RING_ALGO: TextConfig => ring.algo);
config_field!(RING_HASHTAG: TextConfig => ring.hashtag);
config_field!(SELF: TextConfig => ring.self_name);
config_field!(CALL_TIMEOUT_MS: IntConfig => call_timeout_ms);
config_field!(BIG_KEY_BYTES: IntConfig => big_key_bytes);
config_field!(BIG_KEY_ELEMENTS: IntConfig => big_key_elements);
config_field!(AUTH_USER: TextConfig => auth_user);
config_field!(AUTH_PASSWORD: TextConfig => auth_password);
config_field!(CLUSTER_PROTOCOL: TextConfig => cluster_protocol);
config_field!(KEY_INDEX: TextConfig => key_index);
config_field!(ROUTE_PLAIN: TextConfig => route_plain);
config_field!(ATOMIC_MSET: TextConfig => atomic_mset);
config_field!(COPY_FORK: TextConfig => copy_fork);
config_field!(SPECIAL_KEYS: TextConfig => special_keys);
config_field!(FIELDS: TextConfig => fields);
config_field!(SENTINELS: TextConfig => sentinels);
config_field!(SENTINEL_USER: TextConfig => sentinel_user);
config_field!(SENTINEL_PASSWORD: TextConfig => sentinel_password);
config_field!(READ_FROM: TextConfig => read_from);
config_field!(TOPOLOGY_REFRESH_MS: IntConfig => topology_refresh_ms);
config_field!(FLEET_LEASE_MS: IntConfig => fleet_lease_ms);
config_field!(TXN_LOCK_MS: IntConfig => txn_lock_ms);
config_field!(TLS: TextConfig => tls);
config_field!(TLS_CERT_FILE: TextConfig => tls_files.cert_file);
config_field!(TLS_KEY_FILE: TextConfig => tls_files.key_file);
config_field!(TLS_CA_CERT_FILE: TextConfig => tls_files.ca_cert_file);
config_field!(TLS_CA_CERT_DIR: TextConfig => tls_files.ca_cert_dir);
config_field!(TLS_SERVER_NAME: TextConfig => tls_files.server_name);

/// Every configuration name, as accepted in `loadmodule` arguments.
pub const NAMES: &[&str] = &[
    "layout",
    "node-id",
    "epoch",
    "custom-layout",
    "encoding",
    "types",
    "node-count",
    "max-drift-ms",
    "node-bits",
    "ring-file",
    "ring-algo",
    "ring-hashtag",
    "self",
    "auth-user",
    "auth-password",
    "call-timeout-ms",
    "big-key-bytes",
    "big-key-elements",
    "cluster-protocol",
    "key-index",
    "route-plain",
    "atomic-mset",
    "copy-fork",
    "special-keys",
    "fields",
    "sentinels",
    "sentinel-user",
    "sentinel-password",
    "read-from",
    "topology-refresh-ms",
    "fleet-lease-ms",
    "txn-lock-ms",
    "tls",
    "tls-cert-file",
    "tls-key-file",
    "tls-ca-cert-file",
    "tls-ca-cert-dir",
    "tls-server-name",
];

/// Checks the high-availability settings: the sentinels' addresses and where reads go.
/// A setting that is `yes` or `no`.
fn check_yes_no(name: &str, value: &str) -> Result<(), String> {
    match value {
        "yes" | "no" => Ok(()),
        other => Err(format!("{name} is yes or no, not '{other}'")),
    }
}

/// `copy-fork` is `yes`, `no` or `auto`.
fn check_copy_fork(value: &str) -> Result<(), String> {
    match crate::reshard::copy_steps::Mode::parse(value) {
        Some(_) => Ok(()),
        None => Err(format!("copy-fork is yes, no or auto, not '{value}'")),
    }
}

/// `key-index` is `yes` or `no`.
pub fn check_key_index(c: &Config) -> Result<(), String> {
    match c.key_index.as_str() {
        "yes" | "no" => Ok(()),
        other => Err(format!("key-index is yes or no, not '{other}'")),
    }
}

pub fn check_topology(c: &Config) -> Result<(), String> {
    crate::topology::sentinel::parse_sentinels(&c.sentinels)?;
    if crate::topology::nodes::ReadFrom::parse(&c.read_from).is_none() {
        return Err(format!(
            "shard.read-from must be primary, replica or replica-preferred, got '{}'",
            c.read_from
        ));
    }
    Ok(())
}

/// Checks the TLS settings that changed from `prev` to `next`, each on its own: `shard.tls`
/// is `yes` or `no`, a file setting names a file that reads and holds what it should.
pub fn check_tls(prev: &Config, next: &Config) -> Result<(), String> {
    if next.tls != "yes" && next.tls != "no" {
        return Err(format!("shard.tls must be yes or no, got '{}'", next.tls));
    }
    let (a, b) = (&prev.tls_files, &next.tls_files);
    let files = [
        ("shard.tls-cert-file", &a.cert_file, &b.cert_file),
        ("shard.tls-key-file", &a.key_file, &b.key_file),
        ("shard.tls-ca-cert-file", &a.ca_cert_file, &b.ca_cert_file),
        ("shard.tls-ca-cert-dir", &a.ca_cert_dir, &b.ca_cert_dir),
    ];
    for (setting, _, path) in files.iter().filter(|(_, old, new)| old != new) {
        crate::net::tls::check_file(setting, path)?;
    }
    crate::net::tls::check_server_name(&b.server_name)
}

/// The server's own TLS settings (`CONFIG GET tls-*`), which the module's fall back to. Main
/// thread only.
pub fn server_tls() -> crate::net::tls::ServerTls {
    crate::net::tls::ServerTls::read(crate::host::context::server_config)
}

/// Checks `loadmodule` arguments: name/value pairs of known configurations.
pub fn check_module_args(args: &[Vec<u8>]) -> Result<(), String> {
    if !args.len().is_multiple_of(2) {
        return Err(
            "module arguments must be name value pairs, e.g. 'node-id 3 layout snowflake'".into(),
        );
    }
    for name in args.iter().step_by(2) {
        if !NAMES.iter().any(|n| n.as_bytes() == name.as_slice()) {
            return Err(format!(
                "unknown module argument '{}': expected one of {}",
                String::from_utf8_lossy(name),
                NAMES.join(", ")
            ));
        }
    }
    Ok(())
}
