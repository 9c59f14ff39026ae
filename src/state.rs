//! The module's state: configuration, resolved settings and the generator, in one place.
//!
//! Redis calls commands, configuration callbacks and INFO on its main thread; the state sits
//! behind a mutex that is never contended and survives a caught panic (no poisoning).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use lazy_static::lazy_static;

use crate::config::Config;
use crate::keys::{Generator, KeySettings};
use crate::persist::Persisted;
use crate::ring::placement::{Placement, RingState};
use crate::ring::{Algo, HashTag, RingSpec};

/// Everything the module keeps between calls.
#[derive(Default)]
pub struct ModuleState {
    /// The configuration as set.
    pub config: Config,
    /// The configuration, checked and resolved.
    pub keys: KeySettings,
    pub generator: Generator,
    pub rings: RingState,
    /// The high-water mark last propagated as SHARD.ADVANCE: the mark only moves when the tick
    /// does, so replicas and the AOF get it once per tick, not once per call.
    pub propagated_high_water: Option<i64>,
    /// Why the TLS settings as set are not in force (a certificate whose key does not match):
    /// the previous configuration serves until they are mended.
    pub tls_config_error: Option<String>,
    /// False while Redis applies the configuration at load time: values are only stored then,
    /// and checked together once all are in.
    loaded: bool,
}

lazy_static! {
    static ref STATE: Mutex<ModuleState> = Mutex::new(ModuleState::default());
}

/// The state, for the length of one callback.
pub fn lock() -> MutexGuard<'static, ModuleState> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ModuleState {
    /// Applies a configuration change whole, or refuses it and changes nothing.
    ///
    /// A change of `ring-file`, `ring-algo` or `ring-hashtag` while a ring file is named loads
    /// the file again and replaces the current ring.
    pub fn change_config(&mut self, change: impl FnOnce(&mut Config)) -> Result<(), String> {
        let mut next = self.config.clone();
        change(&mut next);
        if !self.loaded {
            self.config = next;
            return Ok(());
        }
        let keys = KeySettings::resolve(&next.keys)?;
        crate::config::check_topology(&next)?;
        crate::config::check_tls(&self.config, &next)?;
        let tls = self.tls_update(&next)?;
        crate::cluster::protocol::check_config(&next, self.rings.current.as_deref())?;
        check_shardjs_config(&next, &keys)?;
        let ring = if next.ring.source_differs(&self.config.ring) {
            if self.rings.previous.is_some() && !next.ring.file.is_empty() {
                return Err(crate::ring::placement::RESHARDING_OPEN.into());
            }
            ring_from_file(&next)?
        } else {
            None
        };
        self.install(next, keys, ring);
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
        &mut self,
        next: &Config,
    ) -> Result<Option<Option<Arc<crate::net::tls::Tls>>>, String> {
        if next.tls == self.config.tls && next.tls_files == self.config.tls_files {
            return Ok(None);
        }
        if next.tls != "yes" {
            self.tls_config_error = None;
            return Ok(Some(None));
        }
        match build_tls(next) {
            Ok(tls) => {
                self.tls_config_error = None;
                Ok(Some(Some(Arc::new(tls))))
            }
            Err(e) if e.combination && self.config.tls == "yes" => {
                self.tls_config_error = Some(e.message);
                Ok(None)
            }
            Err(e) => Err(e.message),
        }
    }

    /// Builds the TLS configuration again (the server's `tls-*` files or the module's changed):
    /// after a `CONFIG SET` of either, so a certificate and its key set in one command are
    /// checked together. On failure the configuration in force stays, and the log and INFO
    /// (`tls_config_error`) say why.
    pub fn refresh_tls(&mut self) {
        if self.config.tls != "yes" {
            return;
        }
        match build_tls(&self.config) {
            Ok(tls) => {
                self.tls_config_error = None;
                crate::net::tls::install(Some(Arc::new(tls)));
            }
            Err(e) => {
                redis_module::logging::log_warning(format!(
                    "shard: the TLS settings are not in force ({e}); new connections keep the \
                     previous certificate"
                ));
                self.tls_config_error = Some(e.message);
            }
        }
    }

    /// Checks the configuration given at load time and loads the ring file if one is named;
    /// from now on every change is checked.
    pub fn finish_load(&mut self) -> Result<(), String> {
        let keys = KeySettings::resolve(&self.config.keys)?;
        crate::config::check_topology(&self.config)?;
        crate::config::check_tls(&Config::default(), &self.config)?;
        check_shardjs_config(&self.config, &keys)?;
        let ring = ring_from_file(&self.config)?;
        let tls = if self.config.tls == "yes" {
            let built = build_tls(&self.config).map_err(|e| format!("shard.tls yes: {e}"))?;
            Some(Arc::new(built))
        } else {
            None
        };
        self.install(self.config.clone(), keys, ring);
        crate::net::tls::install(tls);
        self.loaded = true;
        Ok(())
    }

    fn install(&mut self, config: Config, keys: KeySettings, ring: Option<Placement>) {
        if let Some(placement) = ring {
            // Checked by the caller: a ring file never replaces an open resharding's rings.
            let _ = self.rings.set(placement);
        }
        if keys.layout != self.keys.layout || keys.node_id != self.keys.node_id {
            self.generator.rebase(&self.keys.layout, &keys.layout);
        }
        crate::cluster::protocol::set_enabled(config.cluster_protocol == "yes");
        // Checked before: the mode parses.
        crate::topology::nodes::set_read_from(
            crate::topology::nodes::ReadFrom::parse(&config.read_from)
                .unwrap_or(crate::topology::nodes::ReadFrom::Primary),
        );
        // Checked before: the dictionary parses.
        crate::route::fields::install(
            crate::route::fields::FieldDict::parse(&config.fields).unwrap_or_default(),
        );
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
            fleet: None,
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
        // The stored rings replace ours; a data set saved before any ring was set keeps the
        // ring of the ring file, if one is configured.
        if current.is_some() || self.config.ring.file.is_empty() {
            self.rings = RingState {
                current,
                previous,
                epoch: persisted.ring_epoch.max(self.rings.epoch),
                returning: persisted.returning,
            };
        }
        Ok(())
    }
}

/// The ring of the configured ring file, if one is named.
/// Checks the special keys (each type known to the configured `types`, or a number a Shardjs
/// type holds) and the field dictionary.
fn check_shardjs_config(config: &Config, keys: &KeySettings) -> Result<(), String> {
    for k in crate::keys::shardjs::parse_special_keys(&config.special_keys)
        .map_err(|e| format!("special-keys: {e}"))?
    {
        special_key_type(keys, &k.key_type).map_err(|e| format!("special-keys: {e}"))?;
    }
    crate::route::fields::FieldDict::parse(&config.fields).map_err(|e| format!("fields: {e}"))?;
    Ok(())
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

/// The TLS configuration of `config`'s settings, over the server's own `tls-*` files.
fn build_tls(config: &Config) -> Result<crate::net::tls::Tls, crate::net::tls::BuildError> {
    crate::net::tls::build(&config.tls_files, &crate::config::server_tls())
}

fn ring_from_file(config: &Config) -> Result<Option<Placement>, String> {
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
        spec = crate::commands::ring::with_shardjs_default(spec).map_err(|e| e.to_string())?;
    }
    Placement::build(spec).map(Some).map_err(|e| e.to_string())
}
