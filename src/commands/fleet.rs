//! The fleet operations' commands: `SHARD.RING PUSH|CHECK|STATE|INSTALL` and
//! `SHARD.RESHARD START|CANCEL|PLAN`, plus the coordinator's part of STATUS and RESUME. The
//! plan and its checks are `reshard::fleet`; the driving is `reshard::coordinator`.

use std::sync::Arc;

use futures_util::future::join_all;
use redis_module::RedisValue;

use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::{int_in, is, printable};
use crate::net::pool::{link_timeout, Link};
use crate::reshard::fleet::coordinator::{self, Reach, REQUEST_TIMEOUT};
use crate::reshard::fleet::plan::{check_start, FleetPlan, Install, NodeState};
use crate::reshard::jobs;
use crate::ring::placement::Placement;
use crate::ring::{NodeSpec, RingSpec};
use crate::route::forward::{self, CallReply};
use crate::route::{Endpoint, Resp};
use crate::state::{self, ModuleState};

/// `SHARD.RING STATE`: this node's rings, job, key count and memory, for the coordinator and
/// `SHARD.RING CHECK`.
pub fn node_state(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.ring|state"));
    }
    // INFO first: the state's lock is not held while the server gathers it.
    let keys = crate::reshard::fate::keys_in_keyspace(&info(call, "keyspace"));
    let used_memory = info_field(&info(call, "memory"), "used_memory").unwrap_or(0);
    let st = state::lock();
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let digest =
        |p: &Option<Arc<Placement>>| p.as_ref().map(|p| p.digest.clone()).unwrap_or_default();
    let reply = &call.reply;
    reply.map(15);
    reply.field_bulk("self", st.config.ring.self_name.as_bytes());
    reply.field_bulk("digest", digest(&st.rings.current).as_bytes());
    reply.field_bulk("previous_digest", digest(&st.rings.previous).as_bytes());
    reply.field_int("epoch", int(st.rings.epoch));
    reply.field_bulk("returning", yes_no(st.rings.returning));
    let current = crate::reshard::current::lock();
    let job = &current.job;
    let kind = match job.kind {
        Some(crate::reshard::JobKind::Copy) => "copy",
        Some(crate::reshard::JobKind::Cleanup) => "cleanup",
        None => "",
    };
    reply.field_bulk("job", kind.as_bytes());
    reply.field_bulk("job_state", job.state.name().as_bytes());
    reply.field_int(
        "copied",
        int(if job.kind == Some(crate::reshard::JobKind::Cleanup) {
            job.deleted()
        } else {
            job.copied()
        }),
    );
    reply.field_int("failed", int(job.failed()));
    reply.field_int("percent", int(job.percent()));
    reply.field_bulk("last_error", job.last_error.as_bytes());
    reply.field_bulk("paused", yes_no(job.paused));
    reply.field_int("keys", int(keys));
    reply.field_int("used_memory", int(used_memory));
    reply.field_int(
        "calls_before",
        int(forward::calls_before(st.rings.epoch) as u64),
    );
    Ok(())
}

fn yes_no(b: bool) -> &'static [u8] {
    if b {
        b"yes"
    } else {
        b"no"
    }
}

fn info(call: &Call, section: &str) -> String {
    match call.ctx.call("INFO", &[section]) {
        Ok(RedisValue::SimpleString(text)) | Ok(RedisValue::BulkString(text)) => text,
        Ok(RedisValue::BulkRedisString(text)) => {
            String::from_utf8_lossy(text.as_slice()).into_owned()
        }
        _ => String::new(),
    }
}

fn info_field(info: &str, name: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// `SHARD.RING INSTALL current [previous] [RETURNING]`: both rings at once, as canonical texts
/// (a fleet operation's step: the same call repeated changes nothing).
pub fn install(call: &Call) -> CmdResult {
    let n = call.args.len();
    let returning = n > 3 && is(call.args.get(n - 1), "RETURNING");
    let texts = n - usize::from(returning);
    if !(3..=4).contains(&texts) {
        return Err(CmdError::wrong_arity("shard.ring|install"));
    }
    let build = |i: usize| -> Result<Placement, CmdError> {
        let spec = crate::persist::parse_canonical(call.args.get(i))
            .map_err(|e| CmdError::err(format!("ring {}: {e}", i - 1)))?;
        if spec.algo == crate::ring::Algo::Cluster {
            return Err(CmdError::err(
                "the cluster algo is not installed by shard's fleet operations",
            ));
        }
        Placement::build(spec).map_err(CmdError::err)
    };
    let current = build(2)?;
    let previous = if texts == 4 { Some(build(3)?) } else { None };
    crate::cluster::protocol::check_ring_change(call, &current)?;
    if jobs::running() {
        return Err(CmdError::err(
            "a resharding job is running: wait for it or SHARD.RESHARD STOP it first",
        ));
    }
    state::lock()
        .rings
        .install(current, previous, returning)
        .map_err(CmdError::err)?;
    call.ctx.replicate_verbatim();
    call.reply.ok();
    Ok(())
}

/// How this node reaches the others for a fleet operation.
fn link(st: &ModuleState) -> Link {
    Link {
        timeout: REQUEST_TIMEOUT,
        auth: st.config.auth(),
        resp3: false,
        db: 0,
    }
}

/// A node of the current or previous ring: its endpoint, its spec in the current ring (none if
/// it is only in the previous one), and whether the previous ring names it.
type FleetNode<'a> = (Endpoint, Option<&'a NodeSpec>, bool);

/// The nodes of the current and previous rings, each once.
fn fleet_nodes(st: &ModuleState) -> Result<Vec<FleetNode<'_>>, CmdError> {
    let current = crate::commands::whereis::current_ring(st)?;
    if current.ring.is_none() {
        return Err(CmdError::err(
            "the cluster algo has no ring of shard's own: Redis Cluster holds the slot map",
        ));
    }
    let self_name = st.config.ring.self_name.as_str();
    let mut out: Vec<FleetNode<'_>> = current
        .spec
        .nodes
        .iter()
        .map(|n| {
            (
                crate::topology::nodes::endpoint_of(n, self_name),
                Some(n),
                false,
            )
        })
        .collect();
    if let Some(previous) = &st.rings.previous {
        for n in &previous.spec.nodes {
            match out.iter_mut().find(|(e, _, _)| e.name == n.name) {
                Some(entry) => entry.2 = true,
                None => out.push((
                    crate::topology::nodes::endpoint_of(n, self_name),
                    None,
                    true,
                )),
            }
        }
    }
    Ok(out)
}

/// `SHARD.RING PUSH`: sends this node's rings to every node they name.
pub fn push(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.ring|push"));
    }
    let (nodes, args, link) = {
        let st = state::lock();
        let nodes: Vec<Endpoint> = fleet_nodes(&st)?.into_iter().map(|n| n.0).collect();
        let current = crate::commands::whereis::current_ring(&st)?;
        let previous = st.rings.previous.as_ref();
        let args = Install {
            current: &current.spec,
            previous: previous.map(|p| &p.spec),
            returning: st.rings.returning,
        }
        .command();
        (nodes, args, link(&st))
    };
    let started = {
        forward::run(call, link, move |steps| async move {
            let replies = join_all(nodes.iter().map(|at| {
                let sent = (!at.is_self).then(|| steps.send(at, &args));
                async move {
                    match sent {
                        None => Ok(Resp::Simple(b"OK".to_vec())),
                        Some(reply) => reply.await,
                    }
                }
            }))
            .await;
            let pairs = nodes
                .iter()
                .zip(replies)
                .map(|(at, reply)| {
                    let value = match reply {
                        Ok(Resp::Simple(ok)) => Resp::Simple(ok),
                        Ok(Resp::Error(e)) => Resp::Bulk(
                            format!(
                                "node {} ({}): {}",
                                at.name,
                                at.address,
                                String::from_utf8_lossy(&e)
                            )
                            .into_bytes(),
                        ),
                        Ok(other) => {
                            Resp::Bulk(format!("node {}: replied {other:?}", at.name).into_bytes())
                        }
                        Err(e) => Resp::Bulk(e.to_string().into_bytes()),
                    };
                    (Resp::Bulk(at.name.clone().into_bytes()), value)
                })
                .collect();
            CallReply::Reply(Resp::Map(pairs))
        })
    };
    started.map_err(CmdError::err)
}

/// `SHARD.RING CHECK`: every node's rings, job, keys and memory, whether they all agree, and each
/// node's share of the keyspace beside its weight's.
pub fn check(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.ring|check"));
    }
    struct Row {
        at: Endpoint,
        ring: &'static str,
        weight: u32,
        weight_share: f64,
        share: f64,
    }
    let (rows, digest, previous_digest, link) = {
        let st = state::lock();
        let current = crate::commands::whereis::current_ring(&st)?;
        let shares = current
            .ring
            .as_ref()
            .map(|r| r.shares())
            .unwrap_or_default();
        let total_weight: u64 = current.spec.nodes.iter().map(|n| u64::from(n.weight)).sum();
        let rows: Vec<Row> = fleet_nodes(&st)?
            .into_iter()
            .map(|(at, in_current, in_previous)| {
                let index = current.spec.node_index(&at.name);
                let weight = in_current.map_or(0, |n| n.weight);
                Row {
                    ring: match (in_current.is_some(), in_previous) {
                        (true, true) => "both",
                        (true, false) => "current",
                        _ => "previous",
                    },
                    weight,
                    weight_share: f64::from(weight) / total_weight.max(1) as f64,
                    share: index.and_then(|i| shares.get(i).copied()).unwrap_or(0.0),
                    at,
                }
            })
            .collect();
        let previous_digest = st
            .rings
            .previous
            .as_ref()
            .map(|p| p.digest.clone())
            .unwrap_or_default();
        (rows, current.digest.clone(), previous_digest, link(&st))
    };
    let started = {
        forward::run(call, link, move |steps| async move {
            let endpoints: Vec<Endpoint> = rows.iter().map(|r| r.at.clone()).collect();
            let states = coordinator::ask_states(&steps, &endpoints).await;
            let agree = states.iter().all(|s| {
                s.as_ref()
                    .is_ok_and(|s| s.digest == digest && s.previous_digest == previous_digest)
            });
            let bulk = |s: &str| Resp::Bulk(s.as_bytes().to_vec());
            let int = |n: u64| Resp::Int(i64::try_from(n).unwrap_or(i64::MAX));
            let fraction = |f: f64| Resp::Bulk(format!("{f:.6}").into_bytes());
            let nodes = rows
                .iter()
                .zip(states)
                .map(|(row, state)| {
                    let (st, error) = match state {
                        Ok(st) => (st, String::new()),
                        Err(e) => (NodeState::default(), e),
                    };
                    let reachable = error.is_empty();
                    let fields = vec![
                        ("address", bulk(&row.at.address)),
                        ("ring", bulk(row.ring)),
                        ("reachable", bulk(if reachable { "yes" } else { "no" })),
                        ("error", bulk(&error)),
                        ("digest", bulk(&st.digest)),
                        ("previous_digest", bulk(&st.previous_digest)),
                        ("returning", bulk(if st.returning { "yes" } else { "no" })),
                        ("job", bulk(&st.job)),
                        ("job_state", bulk(&st.job_state)),
                        ("keys", int(st.keys)),
                        ("used_memory", int(st.used_memory)),
                        ("weight", int(u64::from(row.weight))),
                        ("weight_share", fraction(row.weight_share)),
                        ("share", fraction(row.share)),
                    ];
                    let map = fields.into_iter().map(|(k, v)| (bulk(k), v)).collect();
                    (bulk(&row.at.name), Resp::Map(map))
                })
                .collect();
            CallReply::Reply(Resp::Map(vec![
                (bulk("agree"), bulk(if agree { "yes" } else { "no" })),
                (bulk("digest"), bulk(&digest)),
                (bulk("nodes"), Resp::Map(nodes)),
            ]))
        })
    };
    started.map_err(CmdError::err)
}

/// Reads `START`'s ring and `MAXRATE`.
fn parse_start(call: &Call) -> Result<(RingSpec, u64), CmdError> {
    let mut args: Vec<&[u8]> = (0..call.args.len()).map(|i| call.args.get(i)).collect();
    let mut max_rate = 0;
    if args.len() >= 2 && is(args[args.len() - 2], "MAXRATE") {
        max_rate = int_in(args[args.len() - 1], "MAXRATE", 0, 1_000_000_000)?.unsigned_abs();
        args.truncate(args.len() - 2);
    }
    let mut spec = crate::commands::ring::parse_spec(args.as_slice(), "shard.reshard|start")?;
    let hashtag_given = args.len() > 3 && is(args[3], "HASHTAG");
    if !hashtag_given && state::lock().keys.layout.kind == crate::keys::LayoutKind::Shardjs {
        spec = spec.with_shardjs_default().map_err(CmdError::err)?;
    }
    if spec.algo == crate::ring::Algo::Cluster {
        return Err(CmdError::err(
            "the cluster algo is resharded by Redis Cluster itself (redis-cli --cluster reshard), not by shard",
        ));
    }
    Placement::build(spec.clone()).map_err(CmdError::err)?;
    Ok((spec, max_rate))
}

/// How the coordinator reaches the fleet of `plan`, or why this node cannot coordinate it.
fn reach(st: &ModuleState, plan: &FleetPlan) -> Result<Reach, CmdError> {
    let self_name = st.config.ring.self_name.as_str();
    if self_name.is_empty() {
        return Err(CmdError::err(
            "self is not set: CONFIG SET shard.self to this server's node name in the ring",
        ));
    }
    let me = coordinator::endpoint_of(plan, self_name, self_name).ok_or_else(|| {
        CmdError::err(format!(
            "self '{self_name}' names no node of the old or the new ring: run the command on a node of the fleet"
        ))
    })?;
    Ok(Reach {
        link: link(st),
        me,
        quiet: link_timeout(st.config.call_timeout_ms),
    })
}

/// `SHARD.RESHARD START algo [HASHTAG rule] name host:port weight ... [MAXRATE n]`: checks the
/// fleet, then grows or shrinks it to the given ring in the background.
pub fn start(call: &Call) -> CmdResult {
    let (new, max_rate) = parse_start(call)?;
    let (plan, reach) = {
        let st = state::lock();
        let current = crate::reshard::current::lock();
        if let Some(plan) = current.fleet.as_ref().filter(|p| !p.phase.finished()) {
            if plan.new.digest() != new.digest() {
                return Err(CmdError::err(format!(
                    "a fleet operation to ring {} is in phase {}: SHARD.RESHARD RESUME it, or CANCEL it first",
                    plan.new.digest(),
                    plan.phase
                )));
            }
            // The same ring again: resume.
            let reach = reach(&st, plan)?;
            drop(st);
            coordinator::drive(reach);
            call.reply.ok();
            return Ok(());
        }
        let current = crate::commands::whereis::current_ring(&st)?;
        if st.rings.previous.is_some() {
            return Err(CmdError::err(
                "a resharding is open on this node (SHARD.RING BEGIN): COMMIT or ABORT it first",
            ));
        }
        if current.spec.digest() == new.digest() {
            return Err(CmdError::err("the fleet is on this ring already"));
        }
        let plan = FleetPlan::new(current.spec.clone(), new, max_rate);
        let reach = reach(&st, &plan)?;
        (plan, reach)
    };
    if coordinator::running() {
        return Err(CmdError::err(
            "this node is driving a fleet operation already",
        ));
    }
    let link = reach.link.clone();
    let started = {
        forward::run(call, link, move |steps| async move {
            let endpoints = coordinator::endpoints(&plan, &reach.me.name);
            let answers = coordinator::ask_states(&steps, &endpoints).await;
            let problems = check_start(&plan, &answers);
            if !problems.is_empty() {
                return CallReply::Error(format!(
                    "ERR shard.reshard start refused: {}",
                    problems.join("; ")
                ));
            }
            {
                let mut current = crate::reshard::current::lock();
                if current.fleet.as_ref().is_some_and(|p| !p.phase.finished())
                    || coordinator::running()
                {
                    return CallReply::Error(
                        "ERR shard.reshard start: another fleet operation started meanwhile".into(),
                    );
                }
                current.fleet = Some(plan);
            }
            if let Err(e) = coordinator::persist(&steps, &reach).await {
                crate::reshard::current::lock().fleet = None;
                return CallReply::Error(format!("ERR shard.reshard start: {e}"));
            }
            coordinator::drive(reach);
            CallReply::Reply(Resp::Simple(b"OK".to_vec()))
        })
    };
    started.map_err(CmdError::err)
}

/// `SHARD.RESHARD CANCEL`: returns the fleet to the old ring, in the background. The request is
/// replicated (as the plan with its cancel flag) before the reply, so a coordinator restarted
/// at once still cancels on RESUME.
pub fn cancel(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.reshard|cancel"));
    }
    let (reach, bytes) = {
        let st = state::lock();
        let mut current = crate::reshard::current::lock();
        let Some(plan) = current.fleet.as_ref().filter(|p| !p.phase.finished()) else {
            return Err(CmdError::err(
                "no fleet operation to cancel here: CANCEL runs on the node where START ran",
            ));
        };
        let mut next = plan.clone();
        next.request_cancel().map_err(CmdError::err)?;
        let reach = reach(&st, &next)?;
        let bytes = next.encode();
        current.fleet = Some(next);
        (reach, bytes)
    };
    call.ctx
        .replicate("SHARD.RESHARD", &[&b"PLAN"[..], &bytes[..]][..]);
    coordinator::drive(reach);
    call.reply.ok();
    Ok(())
}

/// Whether there is an interrupted fleet operation to resume here, and how to reach its fleet.
pub fn plan_to_resume() -> Result<Option<Reach>, CmdError> {
    let st = state::lock();
    let current = crate::reshard::current::lock();
    let Some(plan) = current.fleet.as_ref().filter(|p| !p.phase.finished()) else {
        return Ok(None);
    };
    if coordinator::running() {
        return Ok(None);
    }
    reach(&st, plan).map(Some)
}

/// `SHARD.RESHARD PLAN bytes`: the coordinator's plan, as it makes it durable (replicated; the
/// AOF replays it). While this node drives the plan, its state holds the newest already.
pub fn save_plan(call: &Call) -> CmdResult {
    if call.args.len() != 3 {
        return Err(CmdError::wrong_arity("shard.reshard|plan"));
    }
    let bytes = call.args.get(2);
    let plan = if bytes.is_empty() {
        None
    } else {
        Some(FleetPlan::decode(bytes).map_err(|e| {
            CmdError::err(format!(
                "not a fleet plan ({e}): {}",
                printable(&bytes[..bytes.len().min(16)])
            ))
        })?)
    };
    if !coordinator::running() {
        crate::reshard::current::lock().fleet = plan;
    }
    call.ctx.replicate_verbatim();
    call.reply.ok();
    Ok(())
}

/// STATUS's `fleet` field: nil, or the coordinator's plan and each node's progress.
pub fn reply_status(call: &Call, fleet: Option<&FleetPlan>) {
    let reply = &call.reply;
    reply.bulk(b"fleet");
    let Some(plan) = fleet else {
        reply.null();
        return;
    };
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    reply.map(7);
    reply.field_bulk("phase", plan.phase.name().as_bytes());
    reply.field_bulk("running", yes_no(coordinator::running()));
    reply.field_bulk("cancel", yes_no(plan.cancel));
    reply.field_bulk("error", plan.error.as_bytes());
    reply.field_bulk("old_digest", plan.old.digest().as_bytes());
    reply.field_bulk("new_digest", plan.new.digest().as_bytes());
    reply.bulk(b"nodes");
    reply.map(plan.nodes.len());
    for n in &plan.nodes {
        reply.bulk(n.name.as_bytes());
        reply.map(8);
        reply.field_bulk("address", n.address.as_bytes());
        reply.field_bulk("role", n.role.name().as_bytes());
        reply.field_bulk("state", n.state.as_bytes());
        reply.field_bulk("step_done", yes_no(n.done));
        reply.field_int("copied", int(n.copied));
        reply.field_int("percent", int(n.percent));
        reply.field_int("attempts", i64::from(n.attempts));
        reply.field_bulk("last_error", n.last_error.as_bytes());
    }
}
