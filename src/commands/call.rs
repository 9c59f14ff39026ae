//! `SHARD.CALL command arg ...`: runs a command on the owner of its keys.
//!
//! The keys are found as the server finds them (its command table and key specs), so any
//! keyed command routes: `GET`, `EVAL ... numkeys`, `XREAD ... STREAMS`, `OBJECT ENCODING`.
//! Keys all here, no resharding step pending: the command filter (`route::filter`) has already
//! made it the plain command, unless this is the first call of that command or its keys move
//! with its arguments; then it runs here through RedisModule_Call, as the calling user.
//! One other owner: the client is blocked and the command forwarded whole. `MGET`, `MSET`,
//! `DEL`, `UNLINK`, `EXISTS`, `TOUCH` over several owners, or with keys that move in a
//! resharding: split into parts, sent at once, merged (`route::split`). A single key during a
//! resharding: the plan of fallbacks and copies (`route::plan`). Anything else with keys on
//! several nodes is refused, naming them.
//!
//! Every path runs in the database the client has selected: locally the plain command and
//! RedisModule_Call run in the client's database; on other nodes the requests go over
//! connections of that database (`route::conn`), and a copy-before-write copies into it.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::io;
use std::os::raw::c_int;

use redis_module::{raw, ContextFlags, RedisValue};

use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::printable;
use crate::net::pool::{link_timeout, Link};
use crate::net::resp::ReplyResp;
use crate::ring::placement::Placement;
use crate::route::command_table::{self, CommandMeta};
use crate::route::forward::{self, CallReply, NetSteps};
use crate::route::split::{self, Part, Splittable};
use crate::route::{execute, read_reply, CommandKind, Endpoint, Plan, Resp, Routed, StepError};
use crate::route::{fields, filter};
use crate::state;
use crate::topology::nodes::ReadFrom;

/// Where one key of the call lives.
struct Placed {
    current: Endpoint,
    /// The previous owner, when a resharding is open and moves this key.
    previous: Option<Endpoint>,
}

pub fn call(call: &Call) -> CmdResult {
    let args = &call.args;
    if args.len() < 2 {
        return Err(CmdError::err(
            "SHARD.CALL needs a command and its key: SHARD.CALL command key [arg ...]",
        ));
    }
    let name = args.get(1);
    let name_text = printable(name).to_ascii_lowercase();
    let meta = command_meta(call, name, &name_text)?;
    let positions = positions_of(call, meta, &name_text)?;
    if meta.blocking && blocks(name, args) {
        return Err(CmdError::err(format!(
            "'{name_text}' can block: SHARD.CALL does not route blocking commands"
        )));
    }

    // Where each key lives, from one look at the rings.
    let (mut placed, link, returning) = {
        let st = state::lock();
        let current = crate::commands::whereis::current_ring(&st)?;
        let self_name = st.config.ring.self_name.as_str();
        let mut placed = Vec::with_capacity(positions.len());
        for &pos in &positions {
            let key = args.get(pos + 1);
            let owner = endpoint(current, key, self_name)?;
            let previous = match &st.rings.previous {
                Some(p) => Some(endpoint(p, key, self_name)?).filter(|e| e.name != owner.name),
                None => None,
            };
            placed.push(Placed {
                current: owner,
                previous,
            });
        }
        let link = Link {
            timeout: link_timeout(st.config.call_timeout_ms),
            auth: st.config.auth(),
            resp3: call.ctx.get_flags().contains(ContextFlags::FLAGS_RESP3),
            db: selected_db(call),
        };
        (placed, link, st.rings.returning)
    };

    // The user's ACL is checked here for every path, so a refusal reads the same (NOPERM)
    // whether the keys are local or not.
    check_acl(call, &name_text)?;
    let moving = placed.iter().any(|p| p.previous.is_some());
    if moving && returning {
        // A cancelled resharding brings these keys back from the new owners (the previous
        // ring's), whose copies are the newest: a write now could be overwritten by the copy
        // coming back, so it is refused until the keys are home; a read prefers the previous
        // owner, where the newest version is while it is there.
        if CommandKind::of(name, meta.readonly) != CommandKind::Read {
            return Err(CmdError::code(
                "TRYAGAIN",
                "a cancelled resharding is bringing this key back to its owner: retry in a moment",
            ));
        }
        for p in &mut placed {
            if let Some(previous) = p.previous.take() {
                p.previous = Some(std::mem::replace(&mut p.current, previous));
            }
        }
    }
    let owners: BTreeSet<&str> = placed.iter().map(|p| p.current.name.as_str()).collect();
    let single_owner = owners.len() == 1;
    // Hash commands under the field dictionary: short names stored, long names replied.
    if let Some(dict) = fields::current() {
        let inner: Vec<&[u8]> = (1..args.len()).map(|i| args.get(i)).collect();
        if let Some((positions, how)) = fields::hash_command(&inner) {
            let stored = fields::minify_args(&dict, &inner, &positions);
            if !moving && placed[0].current.is_self {
                forward::count(|s| s.local += 1);
                let reply = run_here(call, &stored)?;
                call.reply.resp(&fields::maxify_reply(&dict, how, reply));
                return Ok(());
            }
            refuse_waiting(call, &placed[0].current)?;
            let Placed { current, previous } = placed.swap_remove(0);
            let plan = Plan {
                key: stored.get(1).cloned().unwrap_or_default(),
                args: stored,
                kind: CommandKind::of(name, meta.readonly),
                current,
                previous,
            };
            // SAFETY: the context of this call.
            let started = unsafe {
                forward::run(call.ctx.ctx, link, move |steps| async move {
                    match run_plan(steps, plan).await {
                        CallReply::Reply(r) => {
                            CallReply::Reply(fields::maxify_reply(&dict, how, r))
                        }
                        err => err,
                    }
                })
            };
            return started.map_err(CmdError::err);
        }
    }
    let kind = CommandKind::of(name, meta.readonly);
    // Reads that go to a replica of their owner (`shard.read-from`); keys that move in a
    // resharding keep the primaries' fallback rules.
    let replica_reads = match crate::topology::nodes::read_from() {
        ReadFrom::Primary => None,
        mode => (kind == CommandKind::Read && !moving).then_some(mode),
    };
    if !moving && single_owner && placed[0].current.is_self && replica_reads.is_none() {
        forward::count(|s| s.local += 1);
        return call_here(call, name);
    }
    let splittable = split::splittable(name);
    if !single_owner && splittable.is_none() {
        return Err(CmdError::err(format!(
            "the keys of '{name_text}' live on different nodes ({}): SHARD.CALL splits only MGET, MSET, DEL, UNLINK, EXISTS and TOUCH; give the keys one hash tag to keep them together",
            owners.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    if moving && placed.len() > 1 && splittable.is_none() {
        return Err(CmdError::err(format!(
            "the keys of '{name_text}' are moving between nodes in a resharding: SHARD.CALL runs commands with several keys then only if they split by key (MGET, MSET, DEL, UNLINK, EXISTS, TOUCH)"
        )));
    }
    refuse_waiting(call, &placed[0].current)?;
    let inner: Vec<&[u8]> = (1..args.len()).map(|i| args.get(i)).collect();
    let ctx = call.ctx.ctx;
    let started = if let Some(mode) = replica_reads.filter(|_| single_owner) {
        let primary = placed.swap_remove(0).current;
        let args: Vec<Vec<u8>> = inner.iter().map(|a| a.to_vec()).collect();
        // SAFETY: the context of this call.
        unsafe {
            forward::run(ctx, link, move |steps| async move {
                match read_at_replica(&steps, &primary, &args, mode).await {
                    Ok(reply) => {
                        forward::count(|s| s.forwarded += 1);
                        CallReply::Reply(reply)
                    }
                    Err(e) => CallReply::failed(&e),
                }
            })
        }
    } else if !moving && single_owner {
        // One other node runs it whole.
        // SAFETY: the context of this call.
        unsafe { forward::forward(ctx, &placed[0].current, &link, &inner) }
    } else if let Some(how) = splittable.filter(|_| placed.len() > 1) {
        let parts = parts_of(&inner, how, kind, &placed, moving);
        // This node's part runs here at once, without a hop to itself, unless it stores its
        // arguments (MSET: values stored through RedisModule_Call keep no integer encoding,
        // so it goes the way a client's MSET goes, over a connection).
        let mut local = Vec::with_capacity(parts.len());
        for p in &parts {
            let here =
                p.plan.current.is_self && p.plan.previous.is_none() && replica_reads.is_none();
            local.push(if here && how.merge != split::Merge::AllOk {
                Some(run_here(call, &p.plan.args)?)
            } else {
                None
            });
        }
        // SAFETY: the context of this call.
        unsafe {
            forward::run(ctx, link, move |steps| {
                run_parts(steps, parts, local, how, replica_reads)
            })
        }
    } else {
        let Placed { current, previous } = placed.swap_remove(0);
        let plan = Plan {
            args: inner.iter().map(|a| a.to_vec()).collect(),
            key: args.get(positions[0] + 1).to_vec(),
            kind,
            current,
            previous,
        };
        // SAFETY: the context of this call.
        unsafe { forward::run(ctx, link, move |steps| run_plan(steps, plan)) }
    };
    started.map_err(CmdError::err)
}

/// Forwarding blocks the client: refused where the client cannot wait (MULTI, scripts).
fn refuse_waiting(call: &Call, at: &Endpoint) -> CmdResult {
    let flags = call.ctx.get_flags();
    if flags.contains(ContextFlags::DENY_BLOCKING) || flags.contains(ContextFlags::MULTI) {
        return Err(CmdError::err(format!(
            "SHARD.CALL cannot wait for node {} ({}) inside MULTI or a script",
            at.name, at.address
        )));
    }
    Ok(())
}

/// The database the calling client has selected: the one the call runs in, here or at the
/// owner.
fn selected_db(call: &Call) -> u32 {
    // SAFETY: the context of this call.
    let db = unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(call.ctx.ctx)) };
    u32::try_from(db).unwrap_or(0)
}

/// Whether a command flagged `blocking` would block: always, except `XREAD` and `XREADGROUP`
/// without `BLOCK`. A blocking command would hold the connection every call to its node
/// shares, and the client until its timeout.
fn blocks(name: &[u8], args: &super::Args) -> bool {
    let reads_streams =
        name.eq_ignore_ascii_case(b"xread") || name.eq_ignore_ascii_case(b"xreadgroup");
    !reads_streams || (2..args.len()).any(|i| args.get(i).eq_ignore_ascii_case(b"block"))
}

/// One part of a split command: a plan of its own (a key that moves runs by the single-key
/// rules), and where its keys go in the merged reply.
struct PlannedPart {
    plan: Plan,
    part: Part,
}

/// The parts of a splittable command: by owner when no key moves, else one per key.
fn parts_of(
    inner: &[&[u8]],
    how: Splittable,
    kind: CommandKind,
    placed: &[Placed],
    moving: bool,
) -> Vec<PlannedPart> {
    let mut owners: Vec<&Endpoint> = Vec::new();
    let index: Vec<usize> = placed
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if moving {
                owners.push(&p.current);
                return i;
            }
            match owners.iter().position(|o| o.name == p.current.name) {
                Some(at) => at,
                None => {
                    owners.push(&p.current);
                    owners.len() - 1
                }
            }
        })
        .collect();
    split::split(inner, how, &index)
        .into_iter()
        .map(|part| {
            let first = part.positions[0];
            let place = &placed[first];
            let plan = Plan {
                args: part.args.clone(),
                key: part.args.get(1).cloned().unwrap_or_default(),
                kind,
                current: owners[part.owner].clone(),
                previous: if moving { place.previous.clone() } else { None },
            };
            PlannedPart { plan, part }
        })
        .collect()
}

async fn run_plan(steps: NetSteps, plan: Plan) -> CallReply {
    match execute(&plan, &steps).await {
        Ok(routed) => {
            forward::count(|s| {
                s.forwarded += 1;
                s.fallbacks += u64::from(routed.fallback);
                s.copies += u64::from(routed.copied);
            });
            CallReply::Reply(routed.reply)
        }
        Err(e) => CallReply::failed(&e),
    }
}

/// A part's reply: the one it got here already, else its plan's (at a replica of its owner
/// for reads under `shard.read-from`).
async fn part_reply(
    steps: &NetSteps,
    plan: &Plan,
    here: Option<Resp>,
    replica: Option<ReadFrom>,
) -> Result<Routed, StepError> {
    let reply = match (here, replica) {
        (Some(reply), _) => reply,
        (None, Some(mode)) => read_at_replica(steps, &plan.current, &plan.args, mode).await?,
        (None, None) => return execute(plan, steps).await,
    };
    Ok(Routed {
        reply,
        fallback: false,
        copied: false,
    })
}

/// A read run by a replica of `primary`: under `replica-preferred` by the primary when no
/// replica is known or the one picked does not answer (or answers that it cannot serve);
/// under `replica` that is an error naming the node.
async fn read_at_replica(
    steps: &NetSteps,
    primary: &Endpoint,
    args: &[Vec<u8>],
    mode: ReadFrom,
) -> Result<Resp, StepError> {
    let why = match crate::topology::nodes::pick_replica(primary) {
        Ok(replica) => match steps.send(&replica, args).await {
            Ok(reply) if !replica_cannot_serve(&reply) => {
                forward::count(|s| s.replica_reads += 1);
                return Ok(reply);
            }
            Ok(reply) => format!(
                "replica {} cannot serve reads: {}",
                replica.address,
                String::from_utf8_lossy(reply.error_text().unwrap_or_default())
            ),
            Err(e) => format!("replica {} did not answer: {}", replica.address, e.message),
        },
        Err(why) => why,
    };
    if mode == ReadFrom::Replica {
        return Err(StepError::new(
            primary,
            format!("no replica to read from (shard.read-from replica): {why}"),
        ));
    }
    forward::count(|s| s.replica_fallbacks += 1);
    steps.send(primary, args).await
}

/// A replica's error replies that mean "ask someone else": still loading, or cut off from its
/// primary with `replica-serve-stale-data no`.
fn replica_cannot_serve(reply: &Resp) -> bool {
    reply
        .error_text()
        .is_some_and(|e| e.starts_with(b"LOADING") || e.starts_with(b"MASTERDOWN"))
}

async fn run_parts(
    steps: NetSteps,
    parts: Vec<PlannedPart>,
    local: Vec<Option<Resp>>,
    how: Splittable,
    replica: Option<ReadFrom>,
) -> CallReply {
    let keys: usize = parts.iter().map(|p| p.part.positions.len()).sum();
    let runs = parts
        .iter()
        .zip(local)
        .map(|(p, here)| part_reply(&steps, &p.plan, here, replica));
    let outcomes = futures_util::future::join_all(runs).await;
    let mut replies: Vec<Resp> = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        match outcome {
            Ok(routed) => {
                forward::count(|s| {
                    s.fallbacks += u64::from(routed.fallback);
                    s.copies += u64::from(routed.copied);
                });
                replies.push(routed.reply);
            }
            Err(e) => return CallReply::failed(&e),
        }
    }
    forward::count(|s| s.forwarded += 1);
    let parts: Vec<Part> = parts.into_iter().map(|p| p.part).collect();
    CallReply::Reply(split::merge(how.merge, &parts, replies, keys))
}

/// The node that owns `key` in `placement`, as a place to run commands.
fn endpoint(placement: &Placement, key: &[u8], self_name: &str) -> Result<Endpoint, CmdError> {
    let ring = placement.ring.as_ref().ok_or_else(|| {
        CmdError::err(
            "SHARD.CALL needs a ring of shard's own; with the cluster algo use a cluster client",
        )
    })?;
    // The command filter placed this very key a moment ago (it found it was not local).
    let owner = filter::owner_found(key, placement).unwrap_or_else(|| ring.owner(key));
    let node = ring
        .spec()
        .nodes
        .get(owner)
        .ok_or_else(|| CmdError::err("internal error: an owner outside the ring"))?;
    Ok(crate::topology::nodes::endpoint_of(node, self_name))
}

/// The positions of the keys of the command `call` carries after its own name (`SHARD.CALL
/// cmd ...`, `SHARD.REDIRECT cmd ...`), counted from that command's name.
pub fn key_positions(call: &Call) -> Result<Vec<usize>, CmdError> {
    let name = call.args.get(1);
    let name_text = printable(name).to_ascii_lowercase();
    let meta = command_meta(call, name, &name_text)?;
    positions_of(call, meta, &name_text)
}

/// Keys at positions the command table fixes are read from it; the others (EVAL's numkeys,
/// XREAD's STREAMS, a wrong arity) are asked of the server's key specs.
fn positions_of(call: &Call, meta: CommandMeta, name: &str) -> Result<Vec<usize>, CmdError> {
    match meta.fixed_keys(call.args.len() - 1) {
        Some(range) => Ok(range.collect()),
        None => key_spec_positions(call, name),
    }
}

/// The positions of the call's keys among the inner command's arguments (0 is its name), as
/// the server's key specs give them.
fn key_spec_positions(call: &Call, name: &str) -> Result<Vec<usize>, CmdError> {
    use crate::host::command_keys::{positions, NoKeys};
    let no_key = || {
        CmdError::err(format!(
            "'{name}' has no key here: SHARD.CALL routes commands by their keys"
        ))
    };
    let keys = positions(call.ctx, &call.args.raw()[1..]).map_err(|e| match e {
        NoKeys::UnknownCommand => CmdError::err(format!("unknown command '{name}'")),
        NoKeys::WrongArity => CmdError::wrong_arity(name),
        NoKeys::None => no_key(),
    })?;
    if keys.is_empty() {
        return Err(CmdError::err(format!(
            "'{name}' has no key here: SHARD.CALL routes commands by their keys"
        )));
    }
    // The positions count from the inner command's name (the call's arguments count from
    // SHARD.CALL: a key at position p is argument p + 1 of the call).
    Ok(keys)
}

/// Runs the command here, as the calling user, replicated like the command itself: `name`
/// and the call's arguments from the third on (`SHARD.CALL name arg ...`).
pub(crate) fn call_here(call: &Call, name: &[u8]) -> CmdResult {
    let name = CString::new(name).map_err(|_| CmdError::err("a command name with a NUL byte"))?;
    let argv = &call.args.raw()[2..];
    // SAFETY: the strings are the live arguments of this call; the reply is freed after use.
    unsafe {
        let (Some(rm_call), Some(reply_with), Some(free)) = (
            raw::RedisModule_Call,
            raw::RedisModule_ReplyWithCallReply,
            raw::RedisModule_FreeCallReply,
        ) else {
            return Err(CmdError::err("a Redis module API function is missing"));
        };
        let reply = rm_call(
            call.ctx.ctx,
            name.as_ptr(),
            c"vCE!0M".as_ptr(),
            argv.as_ptr().cast_mut(),
            argv.len(),
        );
        if reply.is_null() {
            return Err(CmdError::err(format!(
                "the command could not run: {}",
                io::Error::last_os_error()
            )));
        }
        reply_with(call.ctx.ctx, reply);
        free(reply);
    }
    Ok(())
}

/// Runs `args` here, as the calling user, replicated like the command itself, and returns the
/// reply (an error reply is a reply).
fn run_here(call: &Call, args: &[Vec<u8>]) -> Result<Resp, CmdError> {
    let missing = || CmdError::err("a Redis module API function is missing");
    let (name, rest) = args
        .split_first()
        .ok_or_else(|| CmdError::err("no command"))?;
    let name = CString::new(name.as_slice())
        .map_err(|_| CmdError::err("a command name with a NUL byte"))?;
    // SAFETY: every string created is freed before returning; the reply is freed after use.
    unsafe {
        let rm_call = raw::RedisModule_Call.ok_or_else(missing)?;
        let create = raw::RedisModule_CreateString.ok_or_else(missing)?;
        let free_string = raw::RedisModule_FreeString.ok_or_else(missing)?;
        let proto = raw::RedisModule_CallReplyProto.ok_or_else(missing)?;
        let free_reply = raw::RedisModule_FreeCallReply.ok_or_else(missing)?;
        let ctx = call.ctx.ctx;
        let mut argv: Vec<*mut raw::RedisModuleString> = rest
            .iter()
            .map(|a| create(ctx, a.as_ptr().cast(), a.len()))
            .collect();
        let reply = rm_call(
            ctx,
            name.as_ptr(),
            c"vCE!0M".as_ptr(),
            argv.as_mut_ptr(),
            argv.len(),
        );
        let result = if reply.is_null() {
            Err(CmdError::err(format!(
                "the command could not run: {}",
                io::Error::last_os_error()
            )))
        } else {
            let mut len = 0usize;
            let ptr = proto(reply, &mut len);
            let bytes = if ptr.is_null() {
                &[][..]
            } else {
                std::slice::from_raw_parts(ptr.cast::<u8>(), len)
            };
            let parsed = read_reply(&mut &bytes[..]).map_err(|e| CmdError::err(e.to_string()));
            free_reply(reply);
            parsed
        };
        for s in argv {
            free_string(ctx, s);
        }
        result
    }
}

/// Checks the calling user's ACL for the command as if the client had sent it itself.
fn check_acl(call: &Call, name: &str) -> CmdResult {
    let argv = &call.args.raw()[1..];
    // SAFETY: the user name and module user are freed before returning.
    unsafe {
        let (Some(current_name), Some(from_name), Some(check), Some(free_user), Some(free_string)) = (
            raw::RedisModule_GetCurrentUserName,
            raw::RedisModule_GetModuleUserFromUserName,
            raw::RedisModule_ACLCheckCommandPermissions,
            raw::RedisModule_FreeModuleUser,
            raw::RedisModule_FreeString,
        ) else {
            return Err(CmdError::err(
                "the ACL functions of the module API are missing",
            ));
        };
        let user_name = current_name(call.ctx.ctx);
        if user_name.is_null() {
            return Err(CmdError::err("cannot tell the calling user"));
        }
        let user = from_name(user_name);
        free_string(call.ctx.ctx, user_name);
        if user.is_null() {
            return Err(CmdError::code(
                "NOPERM",
                "the calling user no longer exists",
            ));
        }
        let argc = c_int::try_from(argv.len()).unwrap_or(c_int::MAX);
        let allowed = check(user, argv.as_ptr().cast_mut(), argc) == raw::REDISMODULE_OK as c_int;
        free_user(user);
        if !allowed {
            return Err(CmdError::code(
                "NOPERM",
                format!(
                    "this user has no permissions to run the '{name}' command or to access its key"
                ),
            ));
        }
    }
    Ok(())
}

/// A command's entry in the server's table (`COMMAND INFO`), learnt once per name.
fn command_meta(call: &Call, name: &[u8], name_text: &str) -> Result<CommandMeta, CmdError> {
    if let Some(known) = command_table::known(name) {
        return Ok(known);
    }
    let info = call
        .ctx
        .call("COMMAND", &["INFO", name_text])
        .map_err(|e| CmdError::err(format!("COMMAND INFO {name_text} failed: {e}")))?;
    let entry = match info {
        RedisValue::Array(entries) => entries.into_iter().next(),
        _ => None,
    };
    entry
        .as_ref()
        .and_then(learn_entry)
        .ok_or_else(|| CmdError::err(format!("unknown command '{name_text}'")))
}

/// Learns every command the server has now (at load, so that the command filter rewrites
/// even the first local call of each); commands added later are learnt when first called.
pub fn learn_all(ctx: &redis_module::Context) -> Result<(), String> {
    match ctx.call("COMMAND", &["INFO"]) {
        Ok(RedisValue::Array(entries)) => {
            entries.iter().for_each(|e| {
                learn_entry(e);
            });
            Ok(())
        }
        Ok(_) => Err("COMMAND INFO replied something else than an array".into()),
        Err(e) => Err(format!("COMMAND INFO failed: {e}")),
    }
}

/// Learns one entry of `COMMAND INFO` (name, arity, flags, first, last, step, ...).
fn learn_entry(entry: &RedisValue) -> Option<CommandMeta> {
    let RedisValue::Array(fields) = entry else {
        return None;
    };
    let text = |v: &RedisValue| match v {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s.clone()),
        RedisValue::SimpleStringStatic(s) => Some(s.to_string()),
        RedisValue::BulkRedisString(s) => Some(s.to_string_lossy()),
        _ => None,
    };
    let name = fields.first().and_then(text)?;
    let int = |v: Option<&RedisValue>| match v {
        Some(RedisValue::Integer(n)) => *n,
        _ => 0,
    };
    let flags: Vec<String> = match fields.get(2) {
        Some(RedisValue::Array(flags)) => flags.iter().filter_map(text).collect(),
        _ => Vec::new(),
    };
    let flag_refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let meta = command_table::meta_from_info(
        int(fields.get(1)),
        &flag_refs,
        int(fields.get(3)),
        int(fields.get(4)),
        int(fields.get(5)),
    );
    command_table::learn(name.as_bytes(), meta);
    Some(meta)
}
