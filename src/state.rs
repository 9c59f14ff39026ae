//! The module's state: the settings as set, the key settings resolved from them, the
//! generator and the rings, in one place.
//!
//! Redis calls commands, configuration callbacks and INFO on its main thread; the state sits
//! behind a mutex that is never contended and survives a caught panic (no poisoning). It
//! imports no capability: `config` checks a change against every capability and applies it to
//! them; the resharding job and the fleet plan live in `reshard::current`.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use lazy_static::lazy_static;

use crate::host::error::CmdError;
use crate::keys::{Entropy, Generators, KeyConfig, KeySettings};
use crate::net::tls::TlsFiles;
use crate::persist::Persisted;
use crate::ring::lease::Lease;
use crate::ring::placement::{Placement, RingState};
use crate::ring::{Algo, HashTag, RingSpec};

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
    /// `yes`: the index of keys by ring bucket is kept (`index`).
    pub key_index: String,
    /// `route-plain`: `yes` routes plain clients' commands as if the fleet were one server.
    pub route_plain: String,
    /// `atomic-mset`: `yes` gathers an MSET over several owners as one transaction.
    pub atomic_mset: String,
    /// `copy-fork`: whether a copy pass forks (`yes`, `no`, `auto`: `reshard::copy_steps`).
    pub copy_fork: String,
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
    /// How long a fleet coordinator's lease runs at a node after it last heard from it.
    pub fleet_lease_ms: i64,
    /// How long a command of a key a transaction locks waits for the lock before `TRYAGAIN`,
    /// and how long a coordinator retries a transaction whose keys other transactions lock.
    pub txn_lock_ms: i64,
    /// `yes`: every connection to another server speaks TLS (`route::tls`).
    pub tls: String,
    /// The TLS files, empty for the server's own `tls-*` setting of the same name.
    pub tls_files: TlsFiles,
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
            key_index: "no".into(),
            route_plain: "no".into(),
            atomic_mset: "no".into(),
            copy_fork: "auto".into(),
            special_keys: String::new(),
            fields: String::new(),
            sentinels: String::new(),
            sentinel_user: String::new(),
            sentinel_password: String::new(),
            read_from: "primary".into(),
            topology_refresh_ms: 1000,
            fleet_lease_ms: 10_000,
            txn_lock_ms: 5000,
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

/// Everything the module keeps between calls.
#[derive(Default)]
pub struct ModuleState {
    /// The configuration as set.
    pub config: Config,
    /// The configuration, checked and resolved.
    pub keys: KeySettings,
    /// The configured layout's generator, and those of the layouts GENKEY LAYOUT asked for.
    pub generator: Generators,
    /// The random bits of uuidv7 and ulid IDs (seeded from the OS at the first one).
    pub entropy: Entropy,
    pub rings: RingState,
    /// The term of the fleet operation this node follows, and its holder's lease (durable with
    /// the rings).
    pub lease: Lease,
    /// The high-water mark last propagated as SHARD.ADVANCE: the mark only moves when the tick
    /// does, so replicas and the AOF get it once per tick, not once per call.
    pub propagated_high_water: Option<i64>,
    /// Why the TLS settings as set are not in force (a certificate whose key does not match):
    /// the previous configuration serves until they are mended.
    pub tls_config_error: Option<String>,
    /// False while Redis applies the configuration at load time: values are only stored then,
    /// and checked together once all are in.
    pub loaded: bool,
    /// What `OUTSIDE` was last computed from (`outside_of`).
    outside_from: OutsideFrom,
}

/// The rings and the name `OUTSIDE` was computed from: the rings by address (an `Arc` is
/// replaced, never changed in place; holding them keeps their addresses from being reused by a
/// later ring, so that an equal address is the same ring), the name by value.
#[derive(Default)]
struct OutsideFrom {
    current: Option<Arc<Placement>>,
    previous: Option<Arc<Placement>>,
    self_name: String,
}

/// Grows by one each time the rings or this node's name change (`update_outside`, under the
/// state's lock): what the command filter's copy of them (`route::local_view`) is checked
/// against, one atomic load a command.
static RINGS_GENERATION: AtomicU64 = AtomicU64::new(0);

/// The count of changes of the rings and of this node's name so far. Read under the state's
/// lock, it names the rings and name that lock shows.
#[inline(always)]
pub fn rings_generation() -> u64 {
    RINGS_GENERATION.load(Ordering::Acquire)
}

/// Whether this server is outside its rings: `shard.self` is set, a ring of shard's own is, and
/// neither the current ring nor the previous one names this node (a node that left the ring in
/// a shrink, or has not joined it yet). Kept up to date each time the state is released after
/// a change (`StateGuard`), so that the command filter reads it with one atomic load.
static OUTSIDE: AtomicBool = AtomicBool::new(false);

/// Whether this server's rings name it in neither ring (`OUTSIDE`).
#[inline(always)]
pub fn outside() -> bool {
    OUTSIDE.load(Ordering::Relaxed)
}

impl ModuleState {
    /// Computes `OUTSIDE` again when the rings or the name changed since the last time.
    fn update_outside(&mut self) {
        let same = |a: Option<&Arc<Placement>>, b: Option<&Arc<Placement>>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if same(
            self.rings.current.as_ref(),
            self.outside_from.current.as_ref(),
        ) && same(
            self.rings.previous.as_ref(),
            self.outside_from.previous.as_ref(),
        ) && self.config.ring.self_name == self.outside_from.self_name
        {
            return;
        }
        let me = self.config.ring.self_name.as_str();
        let names_me =
            |p: Option<&Arc<Placement>>| p.is_some_and(|p| p.spec.node_index(me).is_some());
        let outside = !me.is_empty()
            && self
                .rings
                .current
                .as_ref()
                .is_some_and(|p| p.ring.is_some())
            && !names_me(self.rings.current.as_ref())
            && !names_me(self.rings.previous.as_ref());
        OUTSIDE.store(outside, Ordering::Relaxed);
        self.outside_from = OutsideFrom {
            current: self.rings.current.clone(),
            previous: self.rings.previous.clone(),
            self_name: me.to_string(),
        };
        RINGS_GENERATION.fetch_add(1, Ordering::Release);
    }
}

lazy_static! {
    static ref STATE: Mutex<ModuleState> = Mutex::new(ModuleState::default());
}

/// The state, for the length of one callback.
pub fn lock() -> StateGuard {
    StateGuard {
        guard: STATE.lock().unwrap_or_else(PoisonError::into_inner),
        changed: false,
    }
}

/// The state held: what `lock` gives. Released after a change (a mutable borrow), it brings
/// `OUTSIDE` up to date, whichever command, step or load changed the rings or the name.
pub struct StateGuard {
    guard: MutexGuard<'static, ModuleState>,
    changed: bool,
}

impl Deref for StateGuard {
    type Target = ModuleState;

    fn deref(&self) -> &ModuleState {
        &self.guard
    }
}

impl DerefMut for StateGuard {
    fn deref_mut(&mut self) -> &mut ModuleState {
        self.changed = true;
        &mut self.guard
    }
}

impl Drop for StateGuard {
    fn drop(&mut self) {
        if self.changed {
            self.guard.update_outside();
        }
    }
}

impl ModuleState {
    /// The current ring, or the error that says how to set one (`NORING`).
    pub fn current_ring(&self) -> Result<&Arc<Placement>, CmdError> {
        self.rings.current.as_ref().ok_or_else(|| {
            CmdError::code(
                "NORING",
                "no ring is set: use SHARD.RING SET algo name host:port weight [...], or the ring-file configuration",
            )
        })
    }

    /// Puts a checked configuration in place: the ring of its ring file, if it gave one, and
    /// the generator moved to the new layout or node without going back.
    pub fn install(&mut self, config: Config, keys: KeySettings, ring: Option<Placement>) {
        if let Some(placement) = ring {
            // Checked by the caller: a ring file never replaces an open resharding's rings.
            let _ = self.rings.set(placement);
        }
        // A change of layout, epoch, node or node width moves the generator past every
        // millisecond used: the new layout's first key sorts after the old layout's last.
        if keys.layout != self.keys.layout || keys.node_id != self.keys.node_id {
            self.generator.rebase(&self.keys.layout, &keys.layout);
        }
        self.config = config;
        self.keys = keys;
    }
}

impl ModuleState {
    /// What survives a restart: the high-water mark and the rings.
    pub fn snapshot(&self) -> Persisted {
        Persisted {
            high_water_ms: self.generator.high_water_ms(&self.keys.layout),
            ring_epoch: self.rings.epoch,
            current: self.rings.current.as_ref().map(|p| p.spec.clone()),
            previous: self.rings.previous.as_ref().map(|p| p.spec.clone()),
            returning: self.rings.returning,
            fence: self.rings.fence,
            settled: self.rings.settled,
            fleet: None,
            lease: self.lease.record.clone(),
            txn: None,
        }
    }

    /// Takes the persisted state (an RDB at start, or a master's at a full sync): the
    /// generator moves past the stored high-water mark, the rings are replaced.
    pub fn restore(&mut self, persisted: Persisted) -> Result<(), String> {
        let build = |spec: Option<RingSpec>| -> Result<Option<Arc<Placement>>, String> {
            spec.map(|s| Placement::build(s).map(Arc::new).map_err(|e| e.to_string()))
                .transpose()
        };
        let current = build(persisted.current)?;
        let previous = build(persisted.previous)?;
        if let Some(ms) = persisted.high_water_ms {
            self.generator.advance_past_ms(&self.keys.layout, ms);
        }
        self.lease = Lease::restored(persisted.lease, crate::clock::monotonic_ms());
        // The stored rings replace ours; a data set saved before any ring was set keeps the
        // ring of the ring file, if one is configured.
        if current.is_some() || self.config.ring.file.is_empty() {
            self.rings = RingState {
                current,
                previous,
                epoch: persisted.ring_epoch.max(self.rings.epoch),
                returning: persisted.returning || persisted.fence,
                fence: persisted.fence,
                settled: persisted.settled,
            };
        }
        Ok(())
    }
}

/// A special key's type: a configured type name, or a number of 0..=3843.
pub fn special_key_type(keys: &KeySettings, name: &str) -> Result<u64, String> {
    if let Some(n) = keys.types.number_of(name.as_bytes()) {
        return Ok(n);
    }
    match name.parse::<u64>() {
        Ok(n) if n <= crate::keys::layout::SHARDJS_FIELD_MAX => Ok(n),
        _ => Err(format!(
            "type '{name}' is neither a configured type name (types) nor a number of 0..3843"
        )),
    }
}

/// The ring of the configured ring file, if one is named.
pub fn ring_from_file(config: &Config) -> Result<Option<Placement>, String> {
    let rc = &config.ring;
    let algo = Algo::parse(rc.algo.as_bytes()).map_err(|e| format!("ring-algo: {e}"))?;
    if !rc.hashtag.is_empty() {
        HashTag::parse(rc.hashtag.as_bytes()).map_err(|e| format!("ring-hashtag: {e}"))?;
    }
    if rc.file.is_empty() {
        return Ok(None);
    }
    if algo == Algo::Cluster {
        return Err(
            "ring-algo cluster takes no ring file: the live cluster's slot map is the ring".into(),
        );
    }
    let content =
        std::fs::read(&rc.file).map_err(|e| format!("cannot read ring file {}: {e}", rc.file))?;
    let hashtag = (!rc.hashtag.is_empty()).then_some(rc.hashtag.as_bytes());
    let mut spec = RingSpec::from_file(rc.algo.as_bytes(), hashtag, &rc.file, &content)
        .map_err(|e| e.to_string())?;
    if hashtag.is_none() && config.keys.layout.eq_ignore_ascii_case("shardjs") {
        spec = spec.with_shardjs_default().map_err(|e| e.to_string())?;
    }
    Placement::build(spec).map(Some).map_err(|e| e.to_string())
}
