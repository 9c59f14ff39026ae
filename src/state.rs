//! The module's state: configuration, resolved settings and the generator, in one place.
//!
//! Redis calls commands, configuration callbacks and INFO on its main thread; the state sits
//! behind a mutex that is never contended and survives a caught panic (no poisoning).

use std::sync::{Mutex, MutexGuard, PoisonError};

use lazy_static::lazy_static;

use crate::keys::{Generator, KeyConfig, KeySettings};

/// Everything the module keeps between calls.
#[derive(Default)]
pub struct ModuleState {
    /// The configuration as set.
    pub config: KeyConfig,
    /// The configuration, checked and resolved.
    pub keys: KeySettings,
    pub generator: Generator,
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
    pub fn change_config(&mut self, change: impl FnOnce(&mut KeyConfig)) -> Result<(), String> {
        let mut next = self.config.clone();
        change(&mut next);
        if !self.loaded {
            self.config = next;
            return Ok(());
        }
        let keys = KeySettings::resolve(&next)?;
        self.install(next, keys);
        Ok(())
    }

    /// Checks the configuration given at load time; from now on every change is checked.
    pub fn finish_load(&mut self) -> Result<(), String> {
        let keys = KeySettings::resolve(&self.config)?;
        self.install(self.config.clone(), keys);
        self.loaded = true;
        Ok(())
    }

    fn install(&mut self, config: KeyConfig, keys: KeySettings) {
        if keys.layout != self.keys.layout || keys.node_id != self.keys.node_id {
            self.generator.rebase(&self.keys.layout, &keys.layout);
        }
        self.config = config;
        self.keys = keys;
    }
}
