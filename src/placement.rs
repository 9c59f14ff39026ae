//! The rings this server holds: the current one and, during a resharding, the previous one.
//!
//! A ring is built once per change and never modified, so a lookup only reads it. The
//! `cluster` algo holds no ring: its owner comes from the live cluster's slot map.

use std::sync::Arc;

use crate::ring::{Algo, Ring, RingError, RingSpec};

/// One ring as held by the module: its spec, the built ring (none for `cluster`), its digest.
#[derive(Debug)]
pub struct Placement {
    pub spec: RingSpec,
    pub ring: Option<Ring>,
    pub digest: String,
}

impl Placement {
    pub fn build(spec: RingSpec) -> Result<Placement, RingError> {
        let ring = match spec.algo {
            Algo::Cluster => None,
            _ => Some(Ring::build(&spec)?),
        };
        let digest = spec.digest();
        Ok(Placement { spec, ring, digest })
    }
}

/// The rings and the counter of changes.
#[derive(Debug, Default)]
pub struct RingState {
    pub current: Option<Arc<Placement>>,
    pub previous: Option<Arc<Placement>>,
    /// Grows by one with every change.
    pub epoch: u64,
}

impl RingState {
    /// Replaces the current ring.
    pub fn set(&mut self, placement: Placement) {
        self.current = Some(Arc::new(placement));
        self.epoch += 1;
    }
}
