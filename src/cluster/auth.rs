//! Who the cluster protocol's emulated commands (`CLUSTER ...`, `READONLY`, `READWRITE`,
//! `ASKING`, and `INFO` where it shows the cluster section) are authorised as.
//!
//! The server checks the command the filter leaves, not the one the client sent. So the
//! filter makes them `SHARD.EMULATE command arg ...`, a `no-auth` command that the server lets
//! through without its own check, and whose handler checks what the server would have checked
//! for the plain command: that the client has authenticated, and that its user may run the
//! plain command (for the `CLUSTER` family, `SHARD.CLUSTER`'s grant will do too, the one earlier
//! versions asked for). The one thing a module cannot read is whether a client whose user is
//! `default` has authenticated: the server gives that user to a client that has not
//! authenticated yet. So a command goes to `SHARD.EMULATE` only when the filter knows that the
//! client has: its user is another (Valkey and Redis 7.2+, whose filters know the client), or
//! the `default` user lets everyone in (`on nopass`). Otherwise it becomes a command the
//! server checks as usual: `SHARD.CLUSTER ...` for the `CLUSTER` family (as before), and for
//! `INFO`, `SHARD.INFO ...` where that refuses nobody whom `INFO` lets in, else `INFO` stays
//! the server's own (`cluster_enabled:0`).
//!
//! What the filter reads (the `default` user's flags, which users may run what) is read again
//! every second while the protocol is on, on a timer; the handler reads the `default` user's
//! flags again itself, so a stale reading only ever sends a command the checked way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::host::acl::{self, Caller, Permission};
use crate::host::command::Call;
use crate::host::error::{CmdError, CmdResult};

/// The commands the protocol emulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emulated {
    /// `CLUSTER sub ...`.
    Cluster,
    /// `READONLY`, `READWRITE`, `ASKING`.
    Connection,
    /// `INFO [section ...]` that shows the cluster section.
    Info,
}

/// What the filter makes of an emulated command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `SHARD.EMULATE command arg ...`: authorised as the plain command by its handler.
    Emulate,
    /// `SHARD.CLUSTER ...` or `SHARD.INFO ...`: checked by the server as those.
    Checked,
    /// Left as it is: the server's own `INFO`.
    Untouched,
}

/// The `default` user is `on` and `nopass`: no client is ever unauthenticated.
static DEFAULT_OPEN: AtomicBool = AtomicBool::new(false);
/// The `default` user may run `SHARD.INFO` if it may run `INFO`.
static DEFAULT_INFO_OK: AtomicBool = AtomicBool::new(false);
/// Every user that may run `INFO` may run `SHARD.INFO`.
static ALL_INFO_OK: AtomicBool = AtomicBool::new(false);
/// The timer that reads them again is armed.
static WATCHING: AtomicBool = AtomicBool::new(false);

const EVERY: Duration = Duration::from_secs(1);

/// The protocol was turned on: read the users now and every second while it stays on.
pub fn watch() {
    if !WATCHING.swap(true, Ordering::Relaxed)
        && !crate::host::context::after(Duration::ZERO, tick, ())
    {
        WATCHING.store(false, Ordering::Relaxed);
    }
}

fn tick(_: &redis_module::Context, (): ()) {
    if !crate::cluster::protocol::enabled() {
        WATCHING.store(false, Ordering::Relaxed);
        return;
    }
    refresh();
    if !crate::host::context::after(EVERY, tick, ()) {
        WATCHING.store(false, Ordering::Relaxed);
    }
}

/// Reads the `default` user's flags and which users may run `INFO` and `SHARD.INFO`.
fn refresh() {
    DEFAULT_OPEN.store(acl::default_user_open() == Some(true), Ordering::Relaxed);
    let info_ok = |user: &[u8]| {
        acl::permission(user, &[b"info"]) != Permission::Allowed
            || acl::permission(user, &[b"shard.info"]) == Permission::Allowed
    };
    DEFAULT_INFO_OK.store(info_ok(b"default"), Ordering::Relaxed);
    let users = acl::users();
    ALL_INFO_OK.store(
        !users.is_empty() && users.iter().all(|u| info_ok(u)),
        Ordering::Relaxed,
    );
}

/// Where the filter sends an emulated command of a client whose user is `user` (`None`: the
/// filter cannot tell, Redis 7.0).
pub fn route(kind: Emulated, user: Option<&[u8]>) -> Route {
    let open = DEFAULT_OPEN.load(Ordering::Relaxed);
    let authenticated = match user {
        Some(u) => u != b"default" || open,
        None => open,
    };
    if authenticated {
        return Route::Emulate;
    }
    match kind {
        Emulated::Cluster | Emulated::Connection => Route::Checked,
        // Here the user is `default` (when known): `SHARD.INFO` only if it refuses nobody
        // `INFO` lets in.
        Emulated::Info => {
            let ok = match user {
                Some(_) => DEFAULT_INFO_OK.load(Ordering::Relaxed),
                None => ALL_INFO_OK.load(Ordering::Relaxed),
            };
            if ok {
                Route::Checked
            } else {
                Route::Untouched
            }
        }
    }
}

/// Whether route-plain's filter hands the command of the client whose user `user` gives
/// (`None`: the filter cannot tell, Redis 7.0) over as `SHARD.PLAINAS`, authorised as the
/// command it carries (`commands::plain`): its user is not `default` (a client gets another
/// user only by authenticating). The `default` user's commands go to `SHARD.PLAIN`, which the
/// server checks as itself: whether such a client has authenticated is known only to the
/// server (a client that connected while `default` was `nopass` has, whatever its flags are
/// now), and reading the user's flags on every command costs an `ACL GETUSER`.
pub fn known_authenticated(user: impl FnOnce() -> Option<Vec<u8>>) -> bool {
    user().is_some_and(|u| u != b"default")
}

/// `SHARD.PLAINAS`'s check, in place of the server's: the client has authenticated (as
/// `authorise` checks it). The command it carries is checked by the routing, as `SHARD.CALL`'s.
pub fn authenticated_caller(call: &Call) -> Result<Caller, CmdError> {
    let caller = acl::caller(call);
    authenticated(&caller)?;
    Ok(caller)
}

/// `SHARD.EMULATE`'s check, in place of the server's: the client has authenticated (its user
/// is not `default`, or the `default` user lets everyone in; a caller with no user, a module's
/// own call, needs none), and it may run the command (`permitted`). Gives the caller.
pub fn authorise(
    call: &Call,
    plain: &[&[u8]],
    grant: Option<&[&[u8]]>,
) -> Result<Caller, CmdError> {
    let caller = acl::caller(call);
    authenticated(&caller)?;
    permitted_as(&caller, plain, grant)?;
    Ok(caller)
}

fn authenticated(caller: &Caller) -> CmdResult {
    let Caller::User(user) = caller else {
        return Ok(());
    };
    if user == b"default" {
        let open = acl::default_user_open() == Some(true);
        DEFAULT_OPEN.store(open, Ordering::Relaxed);
        if !open {
            // Reached only if the default user changed since the filter's reading (or the
            // command was sent as it is): the next one is checked by the server.
            return Err(CmdError::code(
                "TRYAGAIN",
                "the default user needs a password now, and this connection may not have authenticated: send the command again",
            ));
        }
    }
    Ok(())
}

/// Whether the calling user may run the plain command `plain` (the command's name first), or
/// `grant` (the module command earlier versions asked to be granted), by its ACL rules. A
/// subcommand this server does not have (`CLUSTER MYSHARDID` on Redis 7.0) is allowed to a
/// user who may run the whole command. A caller with no user (a module's own call) may, as the
/// server lets it. Gives the caller.
pub fn permitted(
    call: &Call,
    plain: &[&[u8]],
    grant: Option<&[&[u8]]>,
) -> Result<Caller, CmdError> {
    let caller = acl::caller(call);
    permitted_as(&caller, plain, grant)?;
    Ok(caller)
}

fn permitted_as(caller: &Caller, plain: &[&[u8]], grant: Option<&[&[u8]]>) -> CmdResult {
    let Caller::User(user) = caller else {
        return Ok(());
    };
    let allowed = match acl::permission(user, plain) {
        Permission::Allowed => true,
        Permission::Unknown if plain.len() > 1 => {
            acl::permission(user, &plain[..1]) == Permission::Allowed
        }
        _ => false,
    } || grant.is_some_and(|g| acl::permission(user, g) == Permission::Allowed);
    if allowed {
        return Ok(());
    }
    Err(CmdError::code(
        "NOPERM",
        format!(
            "this user has no permissions to run the '{}' command",
            display_name(plain)
        ),
    ))
}

/// A command as the server names it in a refusal: `info`, `cluster|slots`.
pub fn display_name(plain: &[&[u8]]) -> String {
    let lower = |b: &[u8]| String::from_utf8_lossy(b).to_ascii_lowercase();
    match plain {
        [name, sub, ..] if name.eq_ignore_ascii_case(b"cluster") => {
            format!("{}|{}", lower(name), lower(sub))
        }
        [name, ..] => lower(name),
        [] => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_client_known_to_have_authenticated_skips_the_servers_check() {
        DEFAULT_OPEN.store(false, Ordering::Relaxed);
        DEFAULT_INFO_OK.store(true, Ordering::Relaxed);
        ALL_INFO_OK.store(false, Ordering::Relaxed);
        assert_eq!(route(Emulated::Cluster, Some(b"app")), Route::Emulate);
        assert_eq!(route(Emulated::Info, Some(b"app")), Route::Emulate);
        assert_eq!(route(Emulated::Cluster, Some(b"default")), Route::Checked);
        assert_eq!(route(Emulated::Connection, None), Route::Checked);
        assert_eq!(route(Emulated::Info, Some(b"default")), Route::Checked);
        assert_eq!(route(Emulated::Info, None), Route::Untouched);
        DEFAULT_OPEN.store(true, Ordering::Relaxed);
        assert_eq!(route(Emulated::Info, None), Route::Emulate);
        assert_eq!(route(Emulated::Cluster, Some(b"default")), Route::Emulate);
        DEFAULT_OPEN.store(false, Ordering::Relaxed);
    }

    #[test]
    fn refusals_name_the_plain_command() {
        assert_eq!(display_name(&[b"CLUSTER", b"Slots"]), "cluster|slots");
        assert_eq!(display_name(&[b"INFO", b"cluster"]), "info");
        assert_eq!(display_name(&[b"READONLY"]), "readonly");
    }
}
