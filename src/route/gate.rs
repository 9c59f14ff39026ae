//! The gate on a ring owner's writes while its rings are unchecked. A server back from a load
//! (an RDB or AOF older than the fleet's last ring change) or a replica promoted before a fleet
//! operation's last ring reached it may hold rings older than its peers': its routed writes,
//! acknowledged by those rings, would land where the fleet's newer rings own nothing (the
//! nemesis test lost acknowledged list elements this way, issue 33). So after a load or a
//! promotion, a server whose rings name other nodes closes the gate until it has checked them
//! against its peers (`reshard::fleet::repair`); meanwhile `SHARD.CALL` refuses every write and
//! delete (the filter lets none through as a plain command) and the cluster protocol's writes
//! are refused with `TRYAGAIN`; a read is served when its keys are this node's, refused when its
//! rings would send it to another node (`route::call`). One atomic load on the hot path.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::host::error::CmdError;

static UNCHECKED: AtomicBool = AtomicBool::new(false);

/// Whether this node's rings are being checked (its writes are refused meanwhile).
pub fn closed() -> bool {
    UNCHECKED.load(Ordering::Relaxed)
}

/// Closes (`true`) or lifts (`false`) the gate.
pub fn set(closed: bool) {
    UNCHECKED.store(closed, Ordering::Relaxed);
}

/// The text of the refusal, after its code.
pub const TEXT: &str = "this node's rings are being checked against its peers after a restart or a promotion: retry in a moment";

/// The refusal of a write while the gate is closed.
pub fn refusal() -> CmdError {
    CmdError::code("TRYAGAIN", TEXT)
}
