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
//!
//! A replica whose link to its primary is not up (back from a restart and not synced yet, its
//! primary gone) holds the rings it loaded or last had: the fleet's steps reach it only through
//! that link, and a step counts done at its node once the replicas linked then have it
//! (`reshard::fleet::durable`), so while it is unlinked its rings may be older than the fleet's.
//! It refuses `SHARD.CALL`'s keyed commands the same way (`unlinked`) until the link is up
//! again (the server's `MASTER_LINK_CHANGE` event), or it is promoted. Why (the nemesis test,
//! Valkey seed 1171234040): a replica restarted from its AOF just before a grow began routed
//! writes by the rings before it, mid-grow, while it waited for its full sync: an `RPUSH` of a
//! key the grow had copied away was acknowledged at its old owner and deleted by the cleanup.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::host::error::CmdError;

static UNCHECKED: AtomicBool = AtomicBool::new(false);

/// This server is a replica whose link to its primary is not up.
static UNLINKED: AtomicBool = AtomicBool::new(false);

/// Whether this node routes no keyed command now: its rings are being checked, or it is a
/// replica whose link to its primary is down.
pub fn closed() -> bool {
    UNCHECKED.load(Ordering::Relaxed) || UNLINKED.load(Ordering::Relaxed)
}

/// Whether this node's rings are being checked (`reshard::fleet::repair`).
pub fn unchecked() -> bool {
    UNCHECKED.load(Ordering::Relaxed)
}

/// Closes (`true`) or lifts (`false`) the gate of the rings' check.
pub fn set(closed: bool) {
    UNCHECKED.store(closed, Ordering::Relaxed);
}

/// Records whether this server is a replica whose link to its primary is not up.
pub fn set_unlinked(unlinked: bool) {
    UNLINKED.store(unlinked, Ordering::Relaxed);
}

/// The text of the refusal, after its code, while the rings are checked.
pub const TEXT: &str = "this node's rings are being checked against its peers after a restart or a promotion: retry in a moment";

/// The text of the refusal, after its code, at a replica whose link is down.
pub const UNLINKED_TEXT: &str = "this replica's link to its primary is down or still syncing: its rings may be older than the fleet's, so it routes no keyed command; retry in a moment, or send it to a primary";

/// The text of the refusal while the gate is closed, after its code.
pub fn text() -> &'static str {
    if UNCHECKED.load(Ordering::Relaxed) {
        TEXT
    } else {
        UNLINKED_TEXT
    }
}

/// The refusal of a routed command while the gate is closed.
pub fn refusal() -> CmdError {
    CmdError::code("TRYAGAIN", text())
}
