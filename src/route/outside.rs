//! A node outside its rings (`state::outside`: neither its current ring nor its previous one
//! names it: it left the ring in a shrink, or has not joined yet) owns no key, so no routed
//! write may create one there: the module's own connections' writes are refused with
//! `TRYAGAIN`, and the sender replies that refusal to its client (not applied).
//!
//! Why (issue 33, the nemesis test, Redis seed 1234): after a shrink's `CLEANUP LEFT` emptied
//! the node that left, a write routed by rings older than the fleet's (a primary Sentinel had
//! passed over, back from `SIGSTOP` before its watcher learnt it, serving the commands its
//! clients had sent meanwhile) still reached that node, which obeys the module's connections:
//! the key stayed there, a stray no ring names, and a later grow that brings the node back
//! would copy or count it; had the client still been waiting, its write would have been
//! acknowledged and lost. The sender cannot know its rings are old; the node that left knows
//! it owns nothing. So the refusal is the receiver's, and the write is never acknowledged and
//! dropped. (Deleting what lands later instead would drop acknowledged writes.)
//!
//! What is refused: a keyed command that may write (not `readonly`), other than `DEL` and
//! `UNLINK`, which create nothing (a settled resharding's delete still reaches the previous
//! owner), nor the module's own commands (the fleet's steps reach a node outside the ring,
//! a later grow's first), nor a blocking command (never forwarded). Only the module's own
//! connections (`SHARD.CLUSTER INTERNAL`) are refused: plain clients, the replication stream
//! and the AOF run as before. The filter cannot tell a command's client on Redis 7.0, so on a
//! node outside its rings it hands such commands to `SHARD.OUTSIDE command ...`, whose handler
//! can (`commands::outside`); where it can tell (Valkey, Redis 7.2+) only the module's own
//! connections' commands go there. The cluster protocol's `SHARD.REDIRECT` asks the same
//! question of the module's connections (`cluster::redirect`).

use crate::host::error::CmdError;
use crate::host::filter::FilterArgs;
use crate::route::command_table;

/// The name of the command the filter hands a write to on a node outside its rings.
pub const COMMAND: &[u8] = b"SHARD.OUTSIDE";

/// The text of the refusal, after its code.
pub const TEXT: &str = "this node is outside its rings (it left the ring, or has not joined it): it owns no key, so it takes no write routed to it; the sender's rings are older than the fleet's, route it again by the fleet's rings";

/// The refusal of a routed write at a node outside its rings.
pub fn refusal() -> CmdError {
    CmdError::code("TRYAGAIN", TEXT)
}

/// Whether a command named `name` may create a key where it runs: a keyed command not flagged
/// `readonly`, neither `DEL` nor `UNLINK`, nor the module's own, nor a blocking one.
pub fn may_create(name: &[u8]) -> bool {
    if name.len() > 6 && name[..6].eq_ignore_ascii_case(b"shard.") {
        return false;
    }
    if name.eq_ignore_ascii_case(b"del") || name.eq_ignore_ascii_case(b"unlink") {
        return false;
    }
    command_table::known(name)
        .is_some_and(|m| !m.readonly && !m.blocking && (m.first > 0 || m.movable))
}

/// The filter's part, on a primary outside its rings: a command that may create a key goes to
/// `SHARD.OUTSIDE` (only the module's own connections' where the filter can tell the client,
/// `internal` saying which are). True when it rewrote.
pub fn rewrite(args: &mut FilterArgs, internal: impl Fn(u64) -> bool) -> bool {
    if !crate::state::outside() || crate::topology::nodes::is_replica() {
        return false;
    }
    let Some(name) = args.arg(0) else {
        return false;
    };
    if !may_create(name) {
        return false;
    }
    if args.client_id().is_some_and(|id| !internal(id)) {
        return false;
    }
    args.insert(0, COMMAND);
    true
}

/// Whether a command the module's own connections sent (`SHARD.OUTSIDE`'s, or the cluster
/// protocol's redirect of one) is refused here: this node is outside its rings and the command
/// may create a key.
pub fn refuses(name: &[u8]) -> bool {
    crate::state::outside() && may_create(name)
}
