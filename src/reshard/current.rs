//! The resharding work of this node now: its copy or cleanup job, and the plan of the fleet
//! operation it coordinates (`SHARD.RESHARD START`). Kept here, not in the module's state
//! (`crate::state`), because the state sits below the capabilities: it holds the settings, the
//! rings and the generator, and imports none of them.
//!
//! Reached from the main thread only (commands, timers, INFO, RDB callbacks), behind a mutex
//! that is never contended and survives a caught panic (no poisoning).

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::reshard::fleet::plan::FleetPlan;
use crate::reshard::Job;

/// The job and the fleet plan.
#[derive(Default)]
pub struct Current {
    /// The last or running resharding job.
    pub job: Job,
    /// The fleet operation this node coordinates, kept until another starts.
    pub fleet: Option<FleetPlan>,
}

lazy_static::lazy_static! {
    static ref CURRENT: Mutex<Current> = Mutex::new(Current::default());
}

/// The job and the fleet plan, for the length of one callback.
pub fn lock() -> MutexGuard<'static, Current> {
    CURRENT.lock().unwrap_or_else(PoisonError::into_inner)
}
