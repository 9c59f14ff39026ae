//! SHARD.CALL carried out: the facts of a call gathered (where each key lives, from one look at
//! the rings; the client's database and RESP version; `shard.read-from`; the field dictionary),
//! the caller's ACL checked, the pure decision made (`decide`), and the decision executed:
//! here through RedisModule_Call as the calling user, or with the client blocked while one
//! node, a replica, the plan of fallbacks and copies (`steps`) or the parts of a split command
//! (`split`) answer over the module's connections (`forward`). Under `SHARD.CALL WAIT` each
//! write is waited for at its owner, and the call's reply is decided from the counts
//! (`wait`).
//!
//! Every path runs in the database the client has selected: locally the command runs in the
//! client's database; on other nodes the requests go over connections of that database
//! (`net::pool`), and a copy-before-write copies into it.

use std::sync::Arc;

use redis_module::ContextFlags;

use crate::host::command::Call;
use crate::host::error::CmdError;
use crate::host::{acl, caller};
use crate::net::endpoint::{Endpoint, StepError};
use crate::net::pool::{link_timeout, Link};
use crate::net::resp::{read_reply, ReplyResp, Resp};
use crate::ring::placement::{Mark, Placement};
use crate::route::command_table::Carried;
use crate::route::decide::{decide, refuse_blocking, Facts, Placed, Route, Split};
use crate::route::fields::{self, FieldDict, FieldsInReply};
use crate::route::forward::{self, CallReply, NetSteps};
use crate::route::split::{self, Part, Splittable};
use crate::route::stats;
use crate::route::steps::{execute, CommandKind, Plan, Routed};
use crate::route::wait::{self, Acked, Wait};
use crate::route::{filter, replica};
use crate::state;
use crate::topology::nodes::ReadFrom;

/// A keyed command routed by a server Sentinel has passed over (`topology::nodes::passed_over`)
/// is refused: the fleet's steps go to the primary Sentinel names, so this server's rings may be
/// older than the fleet's. A write they send to a key's old owner would be run there (the
/// module's connections are obeyed) after the key's copy left, then deleted by the cleanup, and
/// a read there misses what the new owner acknowledged since (the nemesis test found both). Its
/// own node's keys are no safer: a key its rings still call its node's may be another node's
/// now (a shrink that took its node out: the nemesis test's bad reads, Redis seed 1234), and the
/// primary Sentinel names runs what the module's connections send it without asking its rings.
fn refuse_passed_over(keys: &[crate::route::decide::Placed]) -> Result<(), CmdError> {
    if keys.is_empty() {
        return Ok(());
    }
    refuse_if_passed_over(&state::lock())
}

/// The refusal of a keyed command routed by a server Sentinel has passed over (see
/// `refuse_passed_over`), read from the state held.
pub fn refuse_if_passed_over(st: &state::ModuleState) -> Result<(), CmdError> {
    let me = st.config.ring.self_name.as_str();
    if me.is_empty() || !crate::topology::nodes::passed_over(me) {
        return Ok(());
    }
    Err(CmdError::code(
        "TRYAGAIN",
        format!("this server is no longer the primary Sentinel names for {me}: its rings may be older than the fleet's, so it routes no keyed command; send it to the node's primary"),
    ))
}

/// How a routed call reaches other nodes: the call timeout and credentials of the settings,
/// the client's RESP version and database.
pub fn link_for(call: &Call, st: &state::ModuleState) -> Link {
    Link {
        timeout: link_timeout(st.config.call_timeout_ms),
        auth: st.config.auth(),
        resp3: call.ctx.get_flags().contains(ContextFlags::FLAGS_RESP3),
        db: caller::selected_db(call),
    }
}

/// What `route` did with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Replied, or the client is blocked until its reply.
    Routed,
    /// Nothing done: the keys have several owners and the command does not split; the caller
    /// gathers it (`txn::coord::gather`, which sits above routing).
    Gather,
}

/// Routes the command `call` carries (`SHARD.CALL [WAIT n t] command key ...`, read into
/// `command`) and replies, now or once the client is unblocked; `wait` is what its writes
/// wait for.
pub fn route(call: &Call, command: &Carried, wait: Option<Wait>) -> Result<Handled, CmdError> {
    let start = command.start;
    let flags = call.ctx.get_flags();
    if crate::route::blocking::blocks(call, command) {
        // Inside MULTI (or where a client cannot block) a blocking command would hold a
        // connection every call to its node shares: refused, as before; else it waits at its
        // owner on a connection of its own.
        if wait.is_some()
            || flags.contains(ContextFlags::MULTI)
            || flags.contains(ContextFlags::DENY_BLOCKING)
        {
            refuse_blocking(true, &command.name_text, &call.args, start)?;
        }
        return crate::route::blocking::route(call, command).map(|()| Handled::Routed);
    }
    let (keys, link, mark) = place(call, command)?;
    let settled = mark == Mark::Settled;
    // The user's ACL is checked here for every path, so a refusal reads the same (NOPERM)
    // whether the keys are local or not; with WAIT in front, WAIT's too.
    if wait.is_some() {
        acl::check_caller_in(call, 1..start, "wait")?;
    }
    acl::check_caller(call, start, &command.name_text)?;
    let translation = Translation::of(call, start);
    let kind = CommandKind::of(command.name, command.meta.readonly);
    // Rings unchecked after a load or a promotion (`gate`): no keyed command is placed by them,
    // a read no more than a write. A read sent by them to another node, or of a key they call
    // this node's own, could miss what the fleet's newer rings' owner acknowledged (the nemesis
    // test's bad reads, through a replica just promoted and a node back from an old AOF).
    if crate::route::gate::closed() && (kind != CommandKind::Read || !keys.is_empty()) {
        return Err(crate::route::gate::refusal());
    }
    refuse_passed_over(&keys)?;
    // A read writes nothing to wait for: it runs as without WAIT.
    let wait = wait.filter(|_| kind != CommandKind::Read);
    let decision = decide(Facts {
        name: &command.name_text,
        kind,
        splittable: split::splittable_routed(command.name),
        keys,
        returning: matches!(mark, Mark::Returning | Mark::Fence),
        fence: mark == Mark::Fence,
        settled,
        read_from: crate::topology::nodes::read_from(),
        translated: translation.is_some(),
        can_wait: !flags.contains(ContextFlags::DENY_BLOCKING)
            && !flags.contains(ContextFlags::MULTI),
        released: flags.contains(ContextFlags::DENY_BLOCKING)
            && !flags.contains(ContextFlags::MULTI)
            && !flags.contains(ContextFlags::LUA),
        replicated: wait.is_some(),
    })?;
    let started = match (decision, translation) {
        (Route::Gather, _) => return Ok(Handled::Gather),
        (Route::Here, _) => {
            stats::count(|s| s.local += 1);
            caller::pass_through(call, command.name, start + 1)?;
            return Ok(Handled::Routed);
        }
        (Route::HereTranslated, Some(t)) => {
            stats::count(|s| s.local += 1);
            let reply = run_here(call, &t.stored)?;
            call.reply
                .resp(&fields::maxify_reply(&t.dict, t.how, reply));
            return Ok(Handled::Routed);
        }
        (
            Route::Plan {
                current,
                previous,
                translated: true,
            },
            Some(t),
        ) => {
            let Translation { dict, stored, how } = t;
            let key = stored.get(1).cloned().unwrap_or_default();
            let plan = Plan {
                args: stored,
                key,
                kind,
                current,
                previous,
                wait,
                settled,
            };
            forward::run(call, link, move |steps| async move {
                match run_plan(steps, plan).await {
                    CallReply::Reply(r) => CallReply::Reply(fields::maxify_reply(&dict, how, r)),
                    err => err,
                }
            })
        }
        (
            Route::HereTranslated
            | Route::Plan {
                translated: true, ..
            },
            None,
        ) => {
            return Err(CmdError::err("internal error: no field dictionary"));
        }
        (Route::Forward(to), _) => forward::forward(call, &to, &link, &inner(call, start)),
        (Route::Replica { primary, mode }, _) => {
            let args = owned(&inner(call, start));
            forward::run(call, link, move |steps| async move {
                match replica::read(&steps, &primary, &args, mode).await {
                    Ok(reply) => {
                        stats::count(|s| s.forwarded += 1);
                        CallReply::Reply(reply)
                    }
                    Err(e) => CallReply::failed(&e),
                }
            })
        }
        (Route::Split(split), _) => {
            let (how, replica) = (split.how, split.replica);
            let parts = split_parts(call, start, split, (kind, wait), settled)?;
            forward::run(call, link, move |steps| {
                run_parts(steps, parts, how, (replica, wait))
            })
        }
        (
            Route::Plan {
                current, previous, ..
            },
            _,
        ) => {
            let first = command.positions.first();
            let key = first
                .map_or(&[][..], |&p| call.args.get(p + start))
                .to_vec();
            let plan = Plan {
                args: owned(&inner(call, start)),
                key,
                kind,
                current,
                previous,
                wait,
                settled,
            };
            forward::run(call, link, move |steps| run_plan(steps, plan))
        }
    };
    started.map_err(CmdError::err)?;
    Ok(Handled::Routed)
}

/// What `place` found: each key's owners, how to reach them, and the rings' mark.
type Placing = (Vec<Placed>, Link, Mark);

/// Where each key of the call lives, from one look at the rings; how to reach the nodes (the
/// client's database and RESP version); how the rings are marked: returning (a cancelled
/// resharding brings keys back, or a fleet operation's fence), or settled (the copies are
/// done).
fn place(call: &Call, command: &Carried) -> Result<Placing, CmdError> {
    let st = state::lock();
    let current = st.current_ring()?;
    let self_name = st.config.ring.self_name.as_str();
    let mut keys = Vec::with_capacity(command.positions.len());
    for &pos in &command.positions {
        let key = call.args.get(pos + command.start);
        let owner = endpoint(current, key, self_name)?;
        let previous = match &st.rings.previous {
            Some(p) => Some(endpoint(p, key, self_name)?).filter(|e| e.name != owner.name),
            None => None,
        };
        keys.push(Placed {
            current: owner,
            previous,
        });
    }
    Ok((keys, link_for(call, &st), st.rings.mark()))
}

/// The parts of a split command (the call's command at `start`), each with its plan; this
/// node's parts run here at once, without a hop to itself.
fn split_parts(
    call: &Call,
    start: usize,
    split: Split,
    (kind, wait): (CommandKind, Option<Wait>),
    settled: bool,
) -> Result<Vec<PlannedPart>, CmdError> {
    let Split {
        how,
        targets,
        target_of_key,
        ..
    } = split;
    let parts = split::split(&inner(call, start), how, &target_of_key);
    let mut planned = Vec::with_capacity(parts.len());
    for part in parts {
        let Some(target) = targets.get(part.owner) else {
            return Err(CmdError::err("internal error: a part without an owner"));
        };
        let here = if target.here {
            Some(run_here(call, &part.args)?)
        } else {
            None
        };
        let plan = Plan {
            args: part.args.clone(),
            key: part.args.get(1).cloned().unwrap_or_default(),
            kind,
            current: target.current.clone(),
            previous: target.previous.clone(),
            wait,
            settled,
        };
        planned.push(PlannedPart { plan, part, here });
    }
    Ok(planned)
}

/// The field dictionary's translation of a hash command: the dictionary, the arguments with
/// the short names to store, and where the reply names fields.
struct Translation {
    dict: Arc<FieldDict>,
    stored: Vec<Vec<u8>>,
    how: FieldsInReply,
}

impl Translation {
    /// The translation of the call's command (at `start`), when a dictionary is in force and
    /// it is a hash command.
    fn of(call: &Call, start: usize) -> Option<Translation> {
        let dict = fields::current()?;
        let inner = inner(call, start);
        let (positions, how) = fields::hash_command(&inner)?;
        let stored = fields::minify_args(&dict, &inner, &positions);
        Some(Translation { dict, stored, how })
    }
}

/// The carried command's arguments (from `start` on), its name first.
fn inner<'a>(call: &Call<'a>, start: usize) -> Vec<&'a [u8]> {
    (start..call.args.len()).map(|i| call.args.get(i)).collect()
}

fn owned(args: &[&[u8]]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.to_vec()).collect()
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

/// Runs `args` here, as the calling user, replicated like the command itself, and returns the
/// reply (an error reply is a reply).
pub fn run_here(call: &Call, args: &[Vec<u8>]) -> Result<Resp, CmdError> {
    caller::run_as_caller(call, args, |mut bytes| {
        read_reply(&mut bytes).map_err(|e| CmdError::err(e.to_string()))
    })
}

async fn run_plan(steps: NetSteps, plan: Plan) -> CallReply {
    match execute(&plan, &steps).await {
        Ok(routed) => {
            stats::count(|s| {
                s.forwarded += 1;
                s.fallbacks += u64::from(routed.fallback);
                s.copies += u64::from(routed.copied);
            });
            replied(plan.wait, routed.reply, &routed.acks)
        }
        Err(e) => CallReply::failed(&e),
    }
}

/// The client's reply: the command's, unless the call waited for replicas and too few
/// acknowledged a write (`NOREPLICAS`).
fn replied(wait: Option<Wait>, reply: Resp, acks: &[Acked]) -> CallReply {
    let Some(wait) = wait else {
        return CallReply::Reply(reply);
    };
    match wait::verdict(wait, reply, acks) {
        Ok(reply) => CallReply::Reply(reply),
        Err(line) => {
            stats::count(|s| s.noreplicas += 1);
            CallReply::Error(line)
        }
    }
}

/// One part of a split command: a plan of its own (a key that moves runs by the single-key
/// rules), where its keys go in the merged reply, and its reply if it ran here already.
struct PlannedPart {
    plan: Plan,
    part: Part,
    here: Option<Resp>,
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
        (None, Some(mode)) => replica::read(steps, &plan.current, &plan.args, mode).await?,
        (None, None) => return execute(plan, steps).await,
    };
    Ok(Routed {
        reply,
        fallback: false,
        copied: false,
        acks: Vec::new(),
    })
}

async fn run_parts(
    steps: NetSteps,
    mut parts: Vec<PlannedPart>,
    how: Splittable,
    (replica, wait): (Option<ReadFrom>, Option<Wait>),
) -> CallReply {
    let keys: usize = parts.iter().map(|p| p.part.positions.len()).sum();
    let runs = parts
        .iter_mut()
        .map(|p| part_reply(&steps, &p.plan, p.here.take(), replica));
    let outcomes = futures_util::future::join_all(runs).await;
    let mut replies: Vec<Resp> = Vec::with_capacity(outcomes.len());
    let mut acks: Vec<Acked> = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(routed) => {
                stats::count(|s| {
                    s.fallbacks += u64::from(routed.fallback);
                    s.copies += u64::from(routed.copied);
                });
                replies.push(routed.reply);
                acks.extend(routed.acks);
            }
            Err(e) => return CallReply::failed(&e),
        }
    }
    stats::count(|s| s.forwarded += 1);
    let parts: Vec<Part> = parts.into_iter().map(|p| p.part).collect();
    replied(wait, split::merge(how.merge, &parts, replies, keys), &acks)
}
