//! Module configurations (`CONFIG SET shard.x`, `loadmodule ... x value`, `shard.x` in
//! redis.conf). Each one edits the configuration held in the state, which checks the whole
//! combination before accepting a value.

use redis_module::configuration::{ConfigurationContext, ConfigurationValue};
use redis_module::{RedisError, RedisString};

use crate::keys::KeyConfig;
use crate::state;

/// Every configuration value as set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub keys: KeyConfig,
    pub ring: RingConfig,
    /// The user shard authenticates as toward other nodes (MIGRATE); empty for `default`.
    pub auth_user: String,
    /// The password shard authenticates with toward other nodes; empty for none.
    pub auth_password: String,
    /// How long SHARD.CALL waits for another node.
    pub call_timeout_ms: i64,
    /// A copy sends a key in pieces when its value is larger than this many bytes...
    pub big_key_bytes: i64,
    /// ... or a collection of more than this many elements.
    pub big_key_elements: i64,
    /// `yes`: the node answers the cluster commands from its `slots` ring and redirects keyed
    /// commands for other nodes' slots (`route::cluster_glue`); `no` (the default): plain.
    pub cluster_protocol: String,
    /// Shardjs's special keys: `name:offset:type ...` (`SHARD.SPECIALKEY name`).
    pub special_keys: String,
    /// Shardjs's field-name dictionary: `long:short ...` (hash commands through SHARD.CALL).
    pub fields: String,
    /// The sentinels that give the addresses of ring nodes written `sentinel`: `host:port ...`.
    pub sentinels: String,
    /// The user and password toward the sentinels (the password empty for none).
    pub sentinel_user: String,
    pub sentinel_password: String,
    /// Where SHARD.CALL's reads go: `primary`, `replica` or `replica-preferred`.
    pub read_from: String,
    /// How often Sentinel (and, for reads from replicas, each primary's ROLE) is asked again.
    pub topology_refresh_ms: i64,
    /// `yes`: every connection to another server speaks TLS (`route::tls`).
    pub tls: String,
    /// The TLS files, empty for the server's own `tls-*` setting of the same name.
    pub tls_files: crate::net::tls::TlsFiles,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            keys: KeyConfig::default(),
            ring: RingConfig::default(),
            auth_user: String::new(),
            auth_password: String::new(),
            call_timeout_ms: 1000,
            big_key_bytes: 1 << 20,
            big_key_elements: 4096,
            cluster_protocol: "no".into(),
            special_keys: String::new(),
            fields: String::new(),
            sentinels: String::new(),
            sentinel_user: String::new(),
            sentinel_password: String::new(),
            read_from: "primary".into(),
            topology_refresh_ms: 1000,
            tls: "no".into(),
            tls_files: Default::default(),
        }
    }
}

impl Config {
    /// The credentials toward other nodes, `(user, password)`, when a password is set.
    pub fn auth(&self) -> Option<(String, String)> {
        (!self.auth_password.is_empty())
            .then(|| (self.auth_user.clone(), self.auth_password.clone()))
    }
}

/// Where the ring comes from at load time, and which node this server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingConfig {
    /// A ring file, one `name host:port weight` per line; empty for none.
    pub file: String,
    /// The algorithm of the ring file's ring.
    pub algo: String,
    /// The hash-tag rule of the ring file's ring; empty for the algorithm's own.
    pub hashtag: String,
    /// The name of this server's node in the ring.
    pub self_name: String,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            file: String::new(),
            algo: "ketama".into(),
            hashtag: String::new(),
            self_name: String::new(),
        }
    }
}

impl RingConfig {
    /// True when the ring file's ring would be different.
    pub fn source_differs(&self, other: &RingConfig) -> bool {
        self.file != other.file || self.algo != other.algo || self.hashtag != other.hashtag
    }
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
        state::lock()
            .change_config(|c| (self.set)(c, text))
            .map_err(RedisError::String)
    }
}

impl ConfigurationValue<i64> for IntConfig {
    fn get(&self, _: &ConfigurationContext) -> i64 {
        (self.get)(&state::lock().config)
    }

    fn set(&self, _: &ConfigurationContext, value: i64) -> Result<(), RedisError> {
        state::lock()
            .change_config(|c| (self.set)(c, value))
            .map_err(RedisError::String)
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
config_field!(SPECIAL_KEYS: TextConfig => special_keys);
config_field!(FIELDS: TextConfig => fields);
config_field!(SENTINELS: TextConfig => sentinels);
config_field!(SENTINEL_USER: TextConfig => sentinel_user);
config_field!(SENTINEL_PASSWORD: TextConfig => sentinel_password);
config_field!(READ_FROM: TextConfig => read_from);
config_field!(TOPOLOGY_REFRESH_MS: IntConfig => topology_refresh_ms);
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
    "special-keys",
    "fields",
    "sentinels",
    "sentinel-user",
    "sentinel-password",
    "read-from",
    "topology-refresh-ms",
    "tls",
    "tls-cert-file",
    "tls-key-file",
    "tls-ca-cert-file",
    "tls-ca-cert-dir",
    "tls-server-name",
];

/// Checks the high-availability settings: the sentinels' addresses and where reads go.
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
    let detached = crate::route::filter::detached();
    if detached.is_null() {
        return Default::default();
    }
    let ctx = redis_module::Context::new(detached);
    crate::net::tls::ServerTls::read(|name| match ctx.call("CONFIG", &["GET", name]) {
        Ok(redis_module::RedisValue::Array(v)) => match v.get(1) {
            Some(
                redis_module::RedisValue::BulkString(s) | redis_module::RedisValue::SimpleString(s),
            ) => s.clone(),
            Some(redis_module::RedisValue::StringBuffer(b)) => {
                String::from_utf8_lossy(b).into_owned()
            }
            Some(redis_module::RedisValue::BulkRedisString(s)) => s.to_string_lossy(),
            _ => String::new(),
        },
        _ => String::new(),
    })
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
