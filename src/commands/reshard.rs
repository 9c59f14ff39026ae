//! `SHARD.RESHARD COPY|CLEANUP|STATUS|STOP|THROTTLE|PAUSE|RESUME`: the background jobs that
//! move keys between nodes (`reshard::jobs`); and `START|CANCEL|HANDOVER|PLAN`, the fleet
//! operations (`reshard::fleet`), whose part of STATUS and RESUME is here too. COPY, CLEANUP and
//! STOP sent by a fleet coordinator end with its term (`TERM ...`, `fleet::fencing`).

use crate::command;
use crate::host::register::{arg, block, flag, opt, Arg, CommandSpec, Kind};
use std::sync::Arc;

use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::{int_in, is, ArgList};
use crate::net::resp::ReplyResp;
use crate::reshard::fleet::operation::{self, Start};
use crate::reshard::fleet::{coordinator, fencing, reach, status};
use crate::reshard::jobs::{self, CopyOptions};
use crate::reshard::{is_member, JobKind};
use crate::ring::lease::Claim;
use crate::ring::placement::Placement;
use crate::ring::RingSpec;
use crate::route::forward;
use crate::state::{self, ModuleState};

const DEFAULT_BATCH: usize = 100;
const MAX_BATCH: i64 = 10_000;
const DEFAULT_TIMEOUT_MS: u64 = 1000;
const MAX_RATE: i64 = 1_000_000_000;

/// Reads `COPY [BATCH n] [TIMEOUT ms] [REPLACE]` (credentials come from the configuration).
pub fn parse_copy<A: ArgList + ?Sized>(args: &A) -> Result<CopyOptions, CmdError> {
    let mut options = CopyOptions {
        batch: DEFAULT_BATCH,
        timeout_ms: DEFAULT_TIMEOUT_MS,
        replace: false,
        auth: None,
        max_rate: 0,
        big: crate::reshard::pieces::Limits::default(),
        leaving: None,
    };
    let mut cursor = args.cursor(2);
    while let Some(arg) = cursor.next_arg() {
        if is(arg, "BATCH") {
            options.batch =
                int_in(cursor.value_of("BATCH")?, "BATCH", 1, MAX_BATCH)?.unsigned_abs() as usize;
        } else if is(arg, "TIMEOUT") {
            options.timeout_ms =
                int_in(cursor.value_of("TIMEOUT")?, "TIMEOUT", 1, 600_000)?.unsigned_abs();
        } else if is(arg, "REPLACE") {
            options.replace = true;
        } else if is(arg, "MAXRATE") {
            options.max_rate =
                int_in(cursor.value_of("MAXRATE")?, "MAXRATE", 0, MAX_RATE)?.unsigned_abs();
        } else {
            return Err(CmdError::unknown_option("shard.reshard|copy", arg));
        }
    }
    Ok(options)
}

/// Reads `CLEANUP [BATCH n] [LEFT]`: the batch, and whether this node has left the ring.
pub fn parse_cleanup<A: ArgList + ?Sized>(args: &A) -> Result<(usize, bool), CmdError> {
    let mut batch = DEFAULT_BATCH;
    let mut left = false;
    let mut cursor = args.cursor(2);
    while let Some(arg) = cursor.next_arg() {
        if is(arg, "BATCH") {
            batch =
                int_in(cursor.value_of("BATCH")?, "BATCH", 1, MAX_BATCH)?.unsigned_abs() as usize;
        } else if is(arg, "LEFT") {
            left = true;
        } else {
            return Err(CmdError::unknown_option("shard.reshard|cleanup", arg));
        }
    }
    Ok((batch, left))
}

/// A step's arguments without its `TERM ...` (`fleet::fencing`), and the term.
fn without_term<'a>(call: &'a Call) -> Result<(Vec<&'a [u8]>, Option<Claim>), CmdError> {
    let (n, term) = fencing::split_term(&call.args, 2)?;
    Ok(((0..n).map(|i| call.args.get(i)).collect(), term))
}

/// `SHARD.RESHARD COPY [BATCH n] [TIMEOUT ms] [REPLACE] [TERM ...]`.
pub fn copy(call: &Call) -> CmdResult {
    let (args, term) = without_term(call)?;
    let mut options = parse_copy(args.as_slice())?;
    // A copy that would move a key a transaction locks waits for the lock to end.
    crate::txn::owner::owned::refuse_copied_locks()?;
    fencing::accept_step(call.ctx, term.as_ref(), &[])?;
    let (ring, self_name, rings) = {
        let st = state::lock();
        let (ring, self_name) = job_inputs(&st)?;
        let in_previous = st
            .rings
            .previous
            .as_ref()
            .and_then(|p| p.ring.as_ref())
            .is_some_and(|r| is_member(r, &self_name));
        let in_current = ring.ring.as_ref().is_some_and(|r| is_member(r, &self_name));
        if !in_current && !in_previous {
            return Err(CmdError::err(format!(
                "self '{self_name}' names no node of the current or previous ring: CONFIG SET shard.self to this server's node name"
            )));
        }
        options.auth = st.config.auth();
        options.leaving = st.rings.previous.clone();
        options.big = crate::reshard::pieces::Limits {
            bytes: usize::try_from(st.config.big_key_bytes).unwrap_or(1 << 20),
            elements: usize::try_from(st.config.big_key_elements).unwrap_or(4096),
        };
        (ring, self_name, ring_digests(&st))
    };
    jobs::start(call.ctx, JobKind::Copy, ring, self_name, options).map_err(CmdError::err)?;
    started(term.as_ref(), rings);
    call.reply.ok();
    Ok(())
}

/// `SHARD.RESHARD CLEANUP [BATCH n] [LEFT] [TERM ...]`: deletes local keys this node does not
/// own; with LEFT, on a node that has left the ring, every key.
pub fn cleanup(call: &Call) -> CmdResult {
    let (args, term) = without_term(call)?;
    let (batch, left) = parse_cleanup(args.as_slice())?;
    fencing::accept_step(call.ctx, term.as_ref(), &[])?;
    let (ring, self_name, rings) = {
        let st = state::lock();
        if st.rings.previous.is_some() {
            return Err(CmdError::err(
                "a resharding is open: SHARD.RING COMMIT it before CLEANUP (keys are still read from the previous owner)",
            ));
        }
        let (ring, self_name) = job_inputs(&st)?;
        if !left && !ring.ring.as_ref().is_some_and(|r| is_member(r, &self_name)) {
            return Err(CmdError::err(format!(
                "self '{self_name}' names no node of the ring: cleanup would delete every key; set shard.self to this server's node name (or, on a node that has left the fleet, CLEANUP LEFT)"
            )));
        }
        (ring, self_name, ring_digests(&st))
    };
    let options = CopyOptions {
        batch,
        timeout_ms: 0,
        replace: false,
        auth: None,
        max_rate: 0,
        big: crate::reshard::pieces::Limits::default(),
        leaving: None,
    };
    jobs::start(call.ctx, JobKind::Cleanup, ring, self_name, options).map_err(CmdError::err)?;
    started(term.as_ref(), rings);
    call.reply.ok();
    Ok(())
}

/// The digests of this node's current and previous rings ("" when none).
fn ring_digests(st: &ModuleState) -> (String, String) {
    let digest = |p: &Option<Arc<Placement>>| p.as_ref().map(|p| p.digest.clone());
    (
        digest(&st.rings.current).unwrap_or_default(),
        digest(&st.rings.previous).unwrap_or_default(),
    )
}

/// The job just started is marked with the fleet step's term and the rings it runs on, which
/// the coordinator reads back (`fleet::checks::job_verdict`).
fn started(term: Option<&Claim>, rings: (String, String)) {
    let mut current = crate::reshard::current::lock();
    current.job.term = term.map_or(0, |t| t.term);
    current.job.rings = rings;
}

/// The ring and the `self` name a job needs, or why it cannot start.
fn job_inputs(st: &ModuleState) -> Result<(Arc<Placement>, String), CmdError> {
    if jobs::running() {
        return Err(CmdError::err(
            "a resharding job is already running: see SHARD.RESHARD STATUS, or SHARD.RESHARD STOP it",
        ));
    }
    let ring = Arc::clone(crate::commands::whereis::current_ring(st)?);
    if ring.ring.is_none() {
        return Err(CmdError::err(
            "the cluster algo is resharded by Redis Cluster itself, not by shard",
        ));
    }
    let self_name = st.config.ring.self_name.clone();
    if self_name.is_empty() {
        return Err(CmdError::err(
            "self is not set: CONFIG SET shard.self to this server's node name in the ring",
        ));
    }
    Ok((ring, self_name))
}

/// `SHARD.RESHARD STATUS`: the state and counters of the last or running job.
pub fn status(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.reshard|status"));
    }
    let current = crate::reshard::current::lock();
    let job = &current.job;
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let reply = &call.reply;
    reply.map(24);
    reply.field_bulk("state", job.state.name().as_bytes());
    reply.field_opt(
        "job",
        job.kind.map(|k| match k {
            JobKind::Copy => b"copy".as_slice(),
            JobKind::Cleanup => b"cleanup".as_slice(),
        }),
    );
    reply.field_int("scanned", int(job.scanned()));
    reply.field_int("copied", int(job.copied()));
    reply.field_int("skipped", int(job.skipped()));
    reply.field_int("deleted", int(job.deleted()));
    reply.field_int("failed", int(job.failed()));
    reply.field_bulk("last_error", job.last_error.as_bytes());
    reply.field_int("passes", int(job.passes));
    reply.field_int("elapsed_ms", int(job.elapsed_ms));
    reply.field_int("max_step_us", int(job.max_step_us));
    reply.field_bulk("keys_from", job.keys_from.as_bytes());
    reply.field_int("passes_forked", int(job.passes_forked));
    reply.field_int("passes_stepped", int(job.passes_stepped));
    reply.field_int("keys_total", int(job.keys_total));
    reply.field_int("percent", int(job.percent()));
    reply.field_int("keys_per_sec", int(job.keys_per_sec));
    reply.field_int("eta_ms", int(job.eta_ms));
    reply.field_int("bytes_sent", int(job.bytes_sent()));
    reply.field_int(
        "in_flight",
        int(crate::reshard::copy_job::in_flight_now(job)),
    );
    reply.field_int("max_rate", int(job.max_rate));
    reply.field_bulk("paused", if job.paused { b"yes" } else { b"no" });
    // Keys copied (or deleted) by database: `db0=750,db3=12`.
    reply.field_bulk("by_db", job.by_db_text().as_bytes());
    reply.bulk(b"fleet");
    reply.resp(&status::fleet_status(current.fleet.as_ref()));
    Ok(())
}

/// `SHARD.RESHARD STOP [TERM ...]`: stops the running job after its current batch.
pub fn stop(call: &Call) -> CmdResult {
    let (args, term) = without_term(call)?;
    if args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.reshard|stop"));
    }
    fencing::accept_step(call.ctx, term.as_ref(), &[])?;
    if !jobs::request_stop() {
        return Err(CmdError::err("no resharding job is running"));
    }
    call.reply.ok();
    Ok(())
}

/// `SHARD.RESHARD THROTTLE keys-per-second`: limits the running job (0: no limit).
pub fn throttle(call: &Call) -> CmdResult {
    if call.args.len() != 3 {
        return Err(CmdError::wrong_arity("shard.reshard|throttle"));
    }
    let rate = int_in(call.args.get(2), "keys-per-second", 0, MAX_RATE)?.unsigned_abs();
    if !jobs::throttle(rate) {
        return Err(CmdError::err("no resharding job is running"));
    }
    call.reply.ok();
    Ok(())
}

/// `SHARD.RESHARD PAUSE`: the running job stops where it is and closes its connections.
pub fn pause(call: &Call) -> CmdResult {
    set_paused(call, "shard.reshard|pause", true)
}

/// `SHARD.RESHARD RESUME`: a paused job goes on from where it stopped, and an interrupted fleet
/// operation (a restart or failover of its coordinator, a node it gave up on, a plan handed to
/// this node) goes on from its phase under a new term, once no other coordinator's lease runs
/// (`operation::resume`: the reply waits for the nodes' answers).
pub fn resume(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.reshard|resume"));
    }
    // Everything that can refuse is checked before anything resumes.
    let plan = reach::plan_to_resume()?;
    let running_plan = coordinator::running();
    let job = jobs::set_paused(false);
    if let Some(reach) = plan {
        return operation::resume(call, reach);
    }
    if !job && !running_plan {
        // No plan to drive here: the one whose rings the fleet holds, if any (`adopt`).
        return operation::adopt(call);
    }
    call.reply.ok();
    Ok(())
}

fn set_paused(call: &Call, name: &str, paused: bool) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity(name));
    }
    if !jobs::set_paused(paused) {
        return Err(CmdError::err("no resharding job is running"));
    }
    call.reply.ok();
    Ok(())
}

/// Reads `START`'s ring, `MAXRATE`, and whether the ring's nodes give their slots (`SLOTS`).
fn parse_start(call: &Call) -> Result<(RingSpec, u64, bool), CmdError> {
    let mut args: Vec<&[u8]> = (0..call.args.len()).map(|i| call.args.get(i)).collect();
    let mut max_rate = 0;
    if args.len() >= 2 && is(args[args.len() - 2], "MAXRATE") {
        max_rate = int_in(args[args.len() - 1], "MAXRATE", 0, 1_000_000_000)?.unsigned_abs();
        args.truncate(args.len() - 2);
    }
    let (spec, hashtag_given) = crate::commands::ring_args::parse_spec_with_default_tag(
        args.as_slice(),
        "shard.reshard|start",
    )?;
    operation::check_target(&spec)?;
    let first_node = if hashtag_given { 5 } else { 3 };
    let given = RingSpec::fields_give_slots(args.get(first_node..).unwrap_or_default());
    Ok((spec, max_rate, given))
}

/// `SHARD.RESHARD START algo [HASHTAG rule] name host:port weight [SLOTS ranges] ...
/// [MAXRATE n]`: checks the fleet, then grows or shrinks it to the given ring in the background.
/// From a `slots` ring to a `slots` ring given by weights alone, the ring gone to is the one
/// that moves the fewest slots (`RingSpec::moving_fewest_slots_from`).
pub fn start(call: &Call) -> CmdResult {
    let (new, max_rate, slots_given) = parse_start(call)?;
    let new = if slots_given {
        new
    } else {
        moving_fewest_slots(new)?
    };
    let start = {
        let st = state::lock();
        let current = crate::commands::whereis::current_ring(&st);
        operation::prepare_start(&st, current, new, max_rate)?
    };
    match start {
        Start::Resume(reach) => operation::resume(call, reach),
        Start::New(plan, reach) => {
            let link = reach.link.clone();
            forward::run(call, link, move |steps| {
                operation::begin(steps, plan, reach)
            })
            .map_err(CmdError::err)
        }
    }
}

/// The ring START goes to: `new`, with the slot map that moves the fewest slots when it is a
/// `slots` ring without one and the fleet is on a `slots` ring. The map is computed from the
/// ring the fleet starts from: the unfinished plan's old ring if there is one (so that START
/// repeated finds the same ring, and resumes), else this node's current ring.
fn moving_fewest_slots(new: RingSpec) -> Result<RingSpec, CmdError> {
    let from = {
        let st = state::lock();
        let planned = crate::reshard::current::lock()
            .fleet
            .as_ref()
            .filter(|p| !p.phase.finished())
            .map(|p| p.old.clone());
        planned.or_else(|| st.rings.current.as_ref().map(|c| c.spec.clone()))
    };
    match from {
        Some(from) => new.moving_fewest_slots_from(&from).map_err(CmdError::err),
        None => Ok(new),
    }
}

/// `SHARD.RESHARD CANCEL`: returns the fleet to the old ring, in the background. The request is
/// replicated (as the plan with its cancel flag) before the reply, so a coordinator restarted
/// at once still cancels on RESUME. A plan not being driven is driven again (as RESUME does),
/// unless the fleet turns out to have committed past it (refused: RESUME finishes it).
pub fn cancel(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.reshard|cancel"));
    }
    let (reach, bytes) = operation::request_cancel()?;
    call.ctx
        .replicate("SHARD.RESHARD", &[&b"PLAN"[..], &bytes[..]][..]);
    operation::resume_cancel(call, reach)
}

/// `SHARD.RESHARD HANDOVER`: the coordinator stops driving at its next step and releases its
/// lease at every node (STATUS: `running` no, `lease` released), so that RESUME on a node that
/// holds the plan (a replica, or one given it with PLAN) goes on at once.
pub fn handover(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.reshard|handover"));
    }
    operation::handover()?;
    call.reply.ok();
    Ok(())
}

/// `SHARD.RESHARD PLAN [bytes]`: with bytes, the coordinator's plan, as it makes it durable
/// (replicated; the AOF replays it), or a plan handed to this node; while this node drives its
/// plan, its state holds the newest already. Without: this node's plan's bytes (nil: none).
pub fn save_plan(call: &Call) -> CmdResult {
    match call.args.len() {
        2 => {
            match operation::read_plan() {
                Some(bytes) => call.reply.bulk(&bytes),
                None => call.reply.null(),
            }
            Ok(())
        }
        3 => {
            operation::save_plan(call.ctx, call.args.get(2))?;
            call.ctx.replicate_verbatim();
            call.reply.ok();
            Ok(())
        }
        _ => Err(CmdError::wrong_arity("shard.reshard|plan")),
    }
}

pub static RESHARD: CommandSpec = command! {
    name: "shard.reshard",
    container,
    summary: "Runs the background jobs that move keys between nodes",
    subcommands: &[&RESHARD_COPY, &RESHARD_CLEANUP, &RESHARD_STATUS, &RESHARD_STOP, &RESHARD_THROTTLE, &RESHARD_PAUSE, &RESHARD_RESUME, &RESHARD_START, &RESHARD_CANCEL, &RESHARD_HANDOVER, &RESHARD_PLAN],
};

pub static RESHARD_COPY: CommandSpec = command! {
    name: "shard.reshard|copy",
    handler: copy,
    flags: "admin may-replicate",
    arity: -2,
    summary: "Copies, in the background, the local keys that belong to other nodes",
    complexity: "O(1) to start; the job is O(N) with N the keys",
    args: COPY_ARGS,
    acl: "admin dangerous slow",
};

pub static RESHARD_CLEANUP: CommandSpec = command! {
    name: "shard.reshard|cleanup",
    handler: cleanup,
    flags: "admin write",
    arity: -2,
    summary: "Deletes, in the background, the local keys that belong to other nodes",
    complexity: "O(1) to start; the job is O(N) with N the keys",
    args: CLEANUP_ARGS,
    acl: "admin dangerous slow",
};

pub static RESHARD_STATUS: CommandSpec = command! {
    name: "shard.reshard|status",
    handler: status,
    flags: "readonly fast",
    arity: 2,
    summary: "Shows the state and counters of the resharding job",
    complexity: "O(1)",
    args: &[],
    acl: "read fast",
};

pub static RESHARD_STOP: CommandSpec = command! {
    name: "shard.reshard|stop",
    handler: stop,
    flags: "admin may-replicate",
    arity: -2,
    summary: "Stops the running resharding job after its current batch",
    complexity: "O(1)",
    args: STOP_ARGS,
    acl: "admin dangerous slow",
};

pub static RESHARD_THROTTLE: CommandSpec = command! {
    name: "shard.reshard|throttle",
    handler: throttle,
    flags: "admin",
    arity: 3,
    summary: "Limits the running resharding job to a number of keys per second (0: no limit)",
    complexity: "O(1)",
    args: THROTTLE_ARGS,
    acl: "admin dangerous slow",
};

pub static RESHARD_PAUSE: CommandSpec = command! {
    name: "shard.reshard|pause",
    handler: pause,
    flags: "admin",
    arity: 2,
    summary: "Pauses the running resharding job where it is, closing its connections",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RESHARD_RESUME: CommandSpec = command! {
    name: "shard.reshard|resume",
    handler: resume,
    flags: "admin may-replicate blocking deny-script",
    arity: 2,
    summary: "Resumes a paused resharding job, and an interrupted fleet operation, from where they stopped (under a new term, once no other coordinator's lease runs)",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RESHARD_START: CommandSpec = command! {
    name: "shard.reshard|start",
    handler: start,
    flags: "admin may-replicate blocking deny-script",
    arity: -3,
    summary: "Grows or shrinks the fleet to the given ring: checks every node, then opens, copies, commits and cleans up in the background; from a slots ring to one given by weights alone, moves the fewest slots (or SLOTS gives the map)",
    complexity: "O(N) with N the nodes to start; the operation is O(K) with K the keys",
    args: START_ARGS,
    acl: "admin dangerous slow",
};

pub static RESHARD_CANCEL: CommandSpec = command! {
    name: "shard.reshard|cancel",
    handler: cancel,
    flags: "admin may-replicate blocking deny-script",
    arity: 2,
    summary: "Returns the fleet to the old ring (before COMMIT), bringing back the writes made since",
    complexity: "O(1) to start",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RESHARD_HANDOVER: CommandSpec = command! {
    name: "shard.reshard|handover",
    handler: handover,
    flags: "admin may-replicate",
    arity: 2,
    summary: "Stops this node's fleet coordinator at its next step and releases its lease, so RESUME elsewhere goes on at once",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RESHARD_PLAN: CommandSpec = command! {
    name: "shard.reshard|plan",
    handler: save_plan,
    flags: "admin may-replicate",
    arity: -2,
    summary: "Stores a fleet plan (sent by the coordinator to itself, replicated; or handed to this node), or without one replies this node's plan",
    complexity: "O(N) with N the nodes",
    args: PLAN_ARGS,
    acl: "admin dangerous slow",
};

static COPY_ARGS: &[Arg] = &[
    opt(c"batch", c"BATCH", Kind::Int),
    opt(c"timeout", c"TIMEOUT", Kind::Int),
    flag(c"replace", c"REPLACE"),
    opt(c"keys-per-second", c"MAXRATE", Kind::Int),
    crate::commands::ring::TERM_ARG,
];

static STOP_ARGS: &[Arg] = &[crate::commands::ring::TERM_ARG];

static THROTTLE_ARGS: &[Arg] = &[arg(c"keys-per-second", Kind::Int)];

static CLEANUP_ARGS: &[Arg] = &[
    opt(c"batch", c"BATCH", Kind::Int),
    flag(c"left", c"LEFT"),
    crate::commands::ring::TERM_ARG,
];

static START_ARGS: &[Arg] = &[
    arg(c"algo", Kind::Str),
    opt(c"rule", c"HASHTAG", Kind::Str),
    block(c"node", crate::commands::ring::NODE_FIELDS, false),
    opt(c"keys-per-second", c"MAXRATE", Kind::Int),
];

static PLAN_ARGS: &[Arg] = &[Arg {
    optional: true,
    ..arg(c"plan", Kind::Str)
}];
