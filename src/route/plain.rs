//! Routing for unchanged clients (`shard.route-plain yes`, issue 43): a plain client's commands
//! on any primary of the fleet run as if the fleet were one server.
//!
//! The command filter's part, on a primary with the setting on:
//! - a keyed command whose keys are all this node's, with no resharding step pending for them,
//!   passes untouched: the server runs it at its own speed (what `SHARD.CALL`'s rewrite of a
//!   local call does, `filter::keys_local`);
//! - any other keyed command the server knows becomes `SHARD.PLAIN command ...`, whose handler
//!   (`commands::plain`) routes it as `SHARD.CALL` would, or runs it here when the module's own
//!   connections sent it (a forwarded command, which the filter cannot tell on Redis 7.0);
//! - the keyless commands the fleet answers (`keyless`: `DBSIZE`, `KEYS`, `SCAN`, `RANDOMKEY`,
//!   the flushes, `SCRIPT`, `FUNCTION`, `PUBLISH`, and `SPUBLISH`) become `SHARD.PLAIN ...` too,
//!   answered from
//!   every node; the others (`PING`, `INFO`, `CONFIG`, `CLIENT`...) stay this server's. With
//!   the cluster protocol on beside it, keyless commands stay each node's own (cluster
//!   clients send them to every node and merge, as with Redis Cluster) but for `PUBLISH`, and
//!   keyed commands for other nodes are routed by the protocol's `SHARD.REDIRECT` rather than
//!   redirected (`cluster::redirect`);
//! - `WATCH`, `UNWATCH`, `MULTI`, `EXEC`, `DISCARD` become `SHARD.WATCH` ... `SHARD.DISCARD`:
//!   the transactions across nodes, which run at this node alone when every key is here
//!   (`docs/transactions.md`). While a client of this node is inside one, every keyed command
//!   goes to `SHARD.PLAIN`, whose handler queues it for that client (the filter cannot tell
//!   which client sent a command on Redis 7.0).
//!
//! Never rewritten: the subscriptions (`SUBSCRIBE`, `SSUBSCRIBE` ...: the connection's own),
//! the module's own commands, commands the server does not know (it refuses
//! them itself), the module's own connections' commands where the filter can tell the client,
//! and everything on a replica: a replica applies its primary's stream, and its clients'
//! reads of its own shard are theirs to make (the fleet routes through primaries).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::host::filter::FilterArgs;
use crate::route::filter::{keys_local, Local};
use crate::route::keyless;

/// The command the filter hands a plain client's routed command to.
pub const COMMAND: &[u8] = b"SHARD.PLAIN";

/// The same, for a client the filter knows has authenticated (a user other than `default`): a
/// `no-auth` command whose handler checks what the server would have checked for the command
/// it carries (a user
/// granted `+get` but not the module's commands runs its plain `GET` of any node's key). Plain
/// transaction commands come this way too (`SHARD.PLAINAS MULTI`), run as `SHARD.MULTI` ...
pub const AUTHORISED: &[u8] = b"SHARD.PLAINAS";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether `shard.route-plain` is `yes` (one load: the filter's first look at every command).
#[inline(always)]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Puts `shard.route-plain` in force.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Checks a value of `shard.route-plain`.
pub fn check(value: &str) -> Result<(), String> {
    match value {
        "yes" | "no" => Ok(()),
        other => Err(format!("route-plain is yes or no, not '{other}'")),
    }
}

/// The quick way for the usual command while `route-plain` is on: a keyed command whose keys
/// the command table fixes, not one treated apart (`CommandMeta::plain_keys`), every key this
/// node's by a ring with no resharding step open (`local_view`), on a primary whose rings are
/// checked, with no transaction across nodes open here and no hash dictionary to apply: true
/// when it is to run as it is. What `rewrite` would find for it, without the state's lock; the
/// caller checks that the filter's other parts have nothing to do with it either.
#[inline]
pub fn passes_as_is(args: &FilterArgs) -> bool {
    if !enabled()
        || crate::topology::nodes::is_replica()
        || crate::route::filter::any_queueing()
        || crate::route::gate::closed()
    {
        return false;
    }
    let Some(name) = args.arg(0) else {
        return false;
    };
    let Some(meta) = crate::route::command_table::known(name) else {
        return false;
    };
    let Some(positions) = meta.plain_keys(args.len()) else {
        return false;
    };
    if crate::route::fields::translates(name)
        || (meta.readonly
            && crate::topology::nodes::read_from() != crate::topology::nodes::ReadFrom::Primary)
    {
        return false;
    }
    crate::route::local_view::all_here(positions.map(|i| args.arg(i))) == Some(true)
}

/// The module's transaction command a plain transaction command becomes (`MULTI` →
/// `SHARD.MULTI` ...), if it is one.
pub fn transaction_verb(name: &[u8]) -> Option<&'static [u8]> {
    if !matches!(name.len(), 4 | 5 | 7) {
        return None;
    }
    let pairs: [(&[u8], &'static [u8]); 5] = [
        (b"multi", b"SHARD.MULTI"),
        (b"exec", b"SHARD.EXEC"),
        (b"discard", b"SHARD.DISCARD"),
        (b"watch", b"SHARD.WATCH"),
        (b"unwatch", b"SHARD.UNWATCH"),
    ];
    pairs
        .iter()
        .find(|(plain, _)| name.eq_ignore_ascii_case(plain))
        .map(|(_, to)| *to)
}

/// The filter's part (`shard.route-plain yes`, on a primary): true when it rewrote the
/// command. `internal` tells the module's own connections by client id, `queueing` the clients
/// inside a transaction across nodes (`SHARD.MULTI`); `cluster`: the cluster
/// protocol is on, whose clients send keyless commands to every node themselves and merge the
/// replies (so they stay each node's own, but for `PUBLISH`, which the protocol's part
/// publishes at every node), and whose part handed this command over already if it leaves.
pub fn rewrite(
    args: &mut FilterArgs,
    internal: impl Fn(u64) -> bool,
    queueing: impl Fn(u64) -> bool,
    authenticated: impl Fn(&FilterArgs) -> bool,
    cluster: bool,
) -> bool {
    if !enabled() || crate::topology::nodes::is_replica() {
        return false;
    }
    let Some(name) = args.arg(0) else {
        return false;
    };
    if name.len() > 6 && name[..6].eq_ignore_ascii_case(b"shard.") {
        return false;
    }
    // Subscriptions are the connection's own; SPUBLISH and SORT with patterns are handed over
    // whatever their keys; then the usual command, a keyed one whose keys are all here, passes
    // with no call to the server (the client's id is asked only for a command handed on).
    if keyless::subscribes(name) {
        return false;
    }
    if !cluster && name.eq_ignore_ascii_case(b"spublish") {
        // Keyed by its channel, but published at every node: shard subscribers are wherever
        // plain clients connected (the cluster protocol's part routes it otherwise).
        return hand_over(args, internal, &authenticated, None);
    }
    if crate::route::command_table::reads_unnamed_keys(args.len(), |i| args.arg(i)) {
        // Refused by the handler: its pattern keys may be anywhere.
        return hand_over(args, internal, &authenticated, None);
    }
    let verb = match transaction_verb(name) {
        Some(verb) => Some(verb),
        None => match keys_local(args, 0) {
            Local::All if !crate::route::filter::any_queueing() => return false,
            Local::Unknown => return false,
            Local::Keyless => {
                let Some(name) = args.arg(0) else {
                    return false;
                };
                // Inside a transaction across nodes, a keyless command is queued as the keyed
                // ones are (the handler queues it); where the filter cannot tell the client
                // (Redis 7.0), only the harmless ones a transaction may carry go to the
                // handler, which runs one at once for a client with no transaction open.
                let queued = crate::route::filter::any_queueing()
                    && match args.client_id() {
                        Some(id) => queueing(id),
                        None => keyless::runs_here(name, args.arg(1)),
                    };
                if !queued && (cluster || keyless::of(name, args.arg(1)).is_none()) {
                    return false;
                }
                None
            }
            _ => None,
        },
    };
    hand_over(args, internal, &authenticated, verb)
}

/// Hands the command to the module: `SHARD.PLAINAS` in front for a client known to have
/// authenticated (`authenticated`), else its transaction command (`verb`) or `SHARD.PLAIN` in
/// front, which the server checks as themselves; never the module's own connections'
/// commands, where the filter can tell them.
fn hand_over(
    args: &mut FilterArgs,
    internal: impl Fn(u64) -> bool,
    authenticated: &impl Fn(&FilterArgs) -> bool,
    verb: Option<&[u8]>,
) -> bool {
    if args.client_id().is_some_and(internal) {
        return false;
    }
    if authenticated(args) {
        args.insert(0, AUTHORISED);
        return true;
    }
    match verb {
        Some(verb) => args.replace(0, verb),
        None => args.insert(0, COMMAND),
    }
    true
}
