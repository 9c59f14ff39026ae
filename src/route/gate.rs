//! The gate on a ring owner's routed commands while its rings are unchecked. A server back from
//! a load (an RDB or AOF older than the fleet's last ring change) or a replica promoted before a
//! fleet operation's last ring reached it may hold rings older than its peers': its routed
//! writes, acknowledged by those rings, would land where the fleet's newer rings own nothing
//! (the nemesis test lost acknowledged list elements this way, issue 33), and its routed reads
//! would miss what the newer rings' owner acknowledged, whether they send the key to another
//! node or call it this node's own (the nemesis test's bad reads, through a replica just
//! promoted). So after a load or a promotion, a server whose rings name other nodes closes the
//! gate until it has checked them against its peers (`reshard::fleet::repair`, at most twice
//! `call-timeout-ms`); meanwhile `SHARD.CALL` refuses every keyed command (the filter lets
//! none through as a plain command) and so does the cluster protocol, with `TRYAGAIN`.
//! Commands other nodes forward to it, and plain commands of a client that routes nothing, are
//! not touched. One atomic load on the hot path.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::host::error::CmdError;

static UNCHECKED: AtomicBool = AtomicBool::new(false);

/// Whether this node's rings are being checked (its routed commands are refused meanwhile).
pub fn closed() -> bool {
    UNCHECKED.load(Ordering::Relaxed)
}

/// Closes (`true`) or lifts (`false`) the gate.
pub fn set(closed: bool) {
    UNCHECKED.store(closed, Ordering::Relaxed);
}

/// The text of the refusal, after its code.
pub const TEXT: &str = "this node's rings are being checked against its peers after a restart or a promotion: retry in a moment";

/// The refusal of a routed command while the gate is closed.
pub fn refusal() -> CmdError {
    CmdError::code("TRYAGAIN", TEXT)
}
