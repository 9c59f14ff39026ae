//! `SHARD.RING SET|GET|BEGIN|SETTLE|COMMIT|ABORT`: the rings held in module memory; and the
//! fleet's part of `SHARD.RING`: `INSTALL` (both rings at once, a fleet operation's step), `STATE`
//! (this node, for the coordinator), `LEASE` (a coordinator's claim, renewal or release of its
//! term, `reshard::fleet::fencing`), `PUSH` and `CHECK` (this node's rings to, and every node's
//! state from, the fleet: `reshard::fleet`).

use crate::command;
use crate::host::register::{arg, block, flag, one_of, opt, tok, Arg, CommandSpec, Kind};

pub use crate::commands::ring_args::{parse_ring, parse_spec};
use crate::commands::whereis::current_ring;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::is;
use crate::net::resp::ReplyResp;
use crate::reshard::fleet::push::Push;
use crate::reshard::fleet::survey::Survey;
use crate::reshard::fleet::{fencing, journal, node_state, unstepped};
use crate::reshard::jobs;
use crate::ring::placement::{Mark, Placement};
use crate::ring::{format_ranges, Algo, RingSpec};
use crate::route::forward;
use crate::state;

/// `SHARD.RING SET algo [HASHTAG rule] name host:port weight [SLOTS ranges] [...] [TERM n]`:
/// replaces the ring whole (`SLOTS`: a `slots` ring's explicit slot map, given on every node).
/// `TERM`: the fleet term the change is made under (none: 0), refused when older than this
/// node's, as is any change by hand while a coordinator's lease runs here (`fleet::unstepped`).
pub fn set(call: &Call) -> CmdResult {
    let _step =
        crate::host::latency::step_with_cpu(c"shard-ring-install", c"shard-ring-install-cpu");
    let (placement, term) = parse_ring(call, "shard.ring|set")?;
    unstepped::check_by_hand(call.ctx, term)?;
    refuse_moving_locks(call, &[&placement])?;
    crate::cluster::protocol::check_ring_change(call, &placement)?;
    if jobs::running() {
        return Err(CmdError::err(
            "a resharding job is running: wait for it or SHARD.RESHARD STOP it first",
        ));
    }
    state::lock().rings.set(placement).map_err(CmdError::err)?;
    crate::index::ring_changed();
    call.ctx.replicate_verbatim();
    call.reply.ok();
    Ok(())
}

/// `SHARD.RING BEGIN algo [HASHTAG rule] name host:port weight [SLOTS ranges] [...] [TERM n]`:
/// opens a resharding to the ring exactly as given (a `slots` ring without `SLOTS` is the
/// contiguous split, as SET makes it: every node of a resharding by hand must hold the same
/// ring); `TERM` as SET's.
pub fn begin(call: &Call) -> CmdResult {
    let _step =
        crate::host::latency::step_with_cpu(c"shard-ring-install", c"shard-ring-install-cpu");
    let (placement, term) = parse_ring(call, "shard.ring|begin")?;
    unstepped::check_by_hand(call.ctx, term)?;
    refuse_moving_locks(call, &[&placement])?;
    crate::cluster::protocol::check_ring_change(call, &placement)?;
    let current_is_cluster = state::lock()
        .rings
        .current
        .as_ref()
        .is_some_and(|c| c.ring.is_none());
    if placement.ring.is_none() || current_is_cluster {
        return Err(CmdError::err(
            "the cluster algo is resharded by Redis Cluster itself (redis-cli --cluster reshard), not by shard",
        ));
    }
    if jobs::running() {
        return Err(CmdError::err(
            "a resharding job is running: wait for it or SHARD.RESHARD STOP it first",
        ));
    }
    state::lock()
        .rings
        .begin(placement)
        .map_err(CmdError::err)?;
    call.ctx.replicate_verbatim();
    call.reply.ok();
    Ok(())
}

/// `SHARD.RING SETTLE [TERM n]` (`TERM` as SET's): the open resharding's copies are done (COMMIT's first step, by hand):
/// routed calls read and write a moving key at its new owner only, and a delete still reaches
/// both owners, so that once every node has settled, a node that commits (and deletes at the
/// new owner alone) leaves no copy that another node reads or copies back.
pub fn settle(call: &Call) -> CmdResult {
    change(
        call,
        "shard.ring|settle",
        crate::ring::placement::RingState::settle,
    )
}

/// `SHARD.RING COMMIT [TERM n]`: drops the previous ring and closes the resharding.
pub fn commit(call: &Call) -> CmdResult {
    change(
        call,
        "shard.ring|commit",
        crate::ring::placement::RingState::commit,
    )
}

/// `SHARD.RING ABORT [TERM n]`: puts the previous ring back as current.
pub fn abort(call: &Call) -> CmdResult {
    by_hand(call, "shard.ring|abort")?;
    let previous = state::lock().rings.previous.clone();
    if let Some(previous) = previous {
        crate::cluster::protocol::check_ring_change(call, &previous)?;
    }
    apply_change(call, crate::ring::placement::RingState::abort)
}

/// A change by hand without a ring (`SHARD.RING <verb> [TERM n]`), its term checked.
fn by_hand(call: &Call, command: &str) -> CmdResult {
    let (n, term) = unstepped::split_hand_term(&call.args, 2)?;
    if n != 2 {
        return Err(CmdError::wrong_arity(command));
    }
    unstepped::check_by_hand(call.ctx, term)
}

fn change(
    call: &Call,
    command: &str,
    apply: fn(&mut crate::ring::placement::RingState) -> Result<(), &'static str>,
) -> CmdResult {
    by_hand(call, command)?;
    apply_change(call, apply)
}

/// Applies a change by hand (its arguments checked) to the rings, and replicates it.
fn apply_change(
    call: &Call,
    apply: fn(&mut crate::ring::placement::RingState) -> Result<(), &'static str>,
) -> CmdResult {
    let _step =
        crate::host::latency::step_with_cpu(c"shard-ring-install", c"shard-ring-install-cpu");
    if jobs::running() {
        return Err(CmdError::err(
            "a resharding job is running: wait for it or SHARD.RESHARD STOP it first",
        ));
    }
    apply(&mut state::lock().rings).map_err(CmdError::err)?;
    crate::index::ring_changed();
    call.ctx.replicate_verbatim();
    call.reply.ok();
    Ok(())
}

/// Refuses (`TRYAGAIN`) a ring change that would move a key a transaction locks here, until
/// the lock ends; a replica or an AOF follows what its primary did.
fn refuse_moving_locks(call: &Call, rings: &[&Placement]) -> CmdResult {
    if !fencing::from_client(call.ctx) {
        return Ok(());
    }
    crate::txn::owner::owned::refuse_moving_locks(rings)
}

/// `SHARD.RING GET`: algo, hashtag, epoch, digest and nodes of the current ring (with each
/// node's slots on a `slots` ring).
pub fn get(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.ring|get"));
    }
    let st = state::lock();
    let current = current_ring(&st)?;
    let reply = &call.reply;
    reply.map(6);
    reply.field_bulk("algo", current.spec.algo.name().as_bytes());
    reply.field_bulk("hashtag", current.spec.hashtag.name().as_bytes());
    reply.field_int("epoch", i64::try_from(st.rings.epoch).unwrap_or(i64::MAX));
    reply.field_bulk("digest", current.digest.as_bytes());
    reply.bulk(b"nodes");
    reply_nodes(call, current);
    reply.bulk(b"previous");
    match &st.rings.previous {
        None => reply.null(),
        Some(previous) => {
            reply.map(4);
            reply.field_bulk("algo", previous.spec.algo.name().as_bytes());
            reply.field_bulk("hashtag", previous.spec.hashtag.name().as_bytes());
            reply.field_bulk("digest", previous.digest.as_bytes());
            reply.bulk(b"nodes");
            reply_nodes(call, previous);
        }
    }
    Ok(())
}

fn reply_nodes(call: &Call, placement: &Placement) {
    let reply = &call.reply;
    // A `slots` ring's nodes also show their slots, as SLOTS takes them.
    let slots = placement.ring.as_ref().and_then(|r| r.slot_ranges());
    reply.array(placement.spec.nodes.len());
    for (i, node) in placement.spec.nodes.iter().enumerate() {
        let ranges = slots.and_then(|s| s.get(i));
        reply.map(if ranges.is_some() { 6 } else { 5 });
        reply.field_bulk("name", node.name.as_bytes());
        reply.field_bulk("address", node.address.as_bytes());
        reply.field_int("weight", i64::from(node.weight));
        // The address in use (Sentinel's for a `sentinel` node, nil while unknown), and the
        // replicas known for reads.
        let resolved = match node.via_sentinel() {
            true => crate::topology::nodes::address_of(&node.name),
            false => Some(node.address.clone()),
        };
        reply.field_opt("resolved", resolved.as_ref().map(|a| a.as_bytes()));
        let replicas = crate::topology::nodes::replicas_of(&node.name);
        reply.bulk(b"replicas");
        reply.array(replicas.len());
        for r in &replicas {
            reply.bulk(r.as_bytes());
        }
        if let Some(ranges) = ranges {
            reply.field_bulk("slots", format_ranges(ranges).as_bytes());
        }
    }
}

/// `SHARD.RING INSTALL current [previous] [RETURNING|FENCE|SETTLED] [TERM ...]`: both rings at
/// once, as canonical texts (a fleet operation's step: the same call repeated changes nothing).
/// `RETURNING`: a cancel brings keys back; `FENCE`: a fleet operation's fence (the same rings
/// and refusals, which then name the fence); `SETTLED`: the copies are done (`SETTLE`). `TERM`:
/// the coordinator's term, refused when this node follows a newer one (`fleet::fencing`);
/// replicated with the rings. `PUSHED ...` instead: rings pushed from another node, under its
/// term (no suffix: term 0), refused when older than this node's or while the holder's lease
/// runs here (`fleet::unstepped`).
pub fn install(call: &Call) -> CmdResult {
    let _step =
        crate::host::latency::step_with_cpu(c"shard-ring-install", c"shard-ring-install-cpu");
    let (n, pushed) = unstepped::split_pushed(&call.args, 3)?;
    let (n, term) = match pushed {
        Some(_) => (n, None),
        None => fencing::split_term(&call.args, 3)?,
    };
    let mark = Mark::WORDS
        .iter()
        .find(|(word, _)| n > 3 && is(call.args.get(n - 1), word))
        .map_or(Mark::Open, |&(_, mark)| mark);
    let texts = n - usize::from(mark != Mark::Open);
    if !(3..=4).contains(&texts) {
        return Err(CmdError::wrong_arity("shard.ring|install"));
    }
    let build = |i: usize| -> Result<Placement, CmdError> {
        let spec = crate::persist::parse_canonical(call.args.get(i))
            .map_err(|e| CmdError::err(format!("ring {}: {e}", i - 1)))?;
        if spec.algo == Algo::Cluster {
            return Err(CmdError::err(
                "the cluster algo is not installed by shard's fleet operations",
            ));
        }
        Placement::build(spec).map_err(CmdError::err)
    };
    let current = build(2)?;
    let previous = if texts == 4 { Some(build(3)?) } else { None };
    // Checked before the term is taken, so that a refused step changes nothing.
    if mark != Mark::Open && previous.is_none() {
        return Err(CmdError::err(
            "RETURNING, FENCE and SETTLED need a previous ring: the ring the keys move from",
        ));
    }
    let mut installed = vec![&current];
    installed.extend(previous.as_ref());
    refuse_moving_locks(call, &installed)?;
    // A step of an older term is refused before anything else is looked at.
    let brought: Vec<&RingSpec> = std::iter::once(&current.spec)
        .chain(previous.as_ref().map(|p| &p.spec))
        .collect();
    let adopt = match &term {
        Some(_) => None,
        None => unstepped::check_push(call.ctx, pushed.as_ref())?,
    };
    fencing::accept_step(call.ctx, term.as_ref(), &brought)?;
    crate::cluster::protocol::check_ring_change(call, &current)?;
    if jobs::running() {
        return Err(CmdError::err(
            "a resharding job is running: wait for it or SHARD.RESHARD STOP it first",
        ));
    }
    let text = format!(
        "rings {} (previous {}) {:?} installed, term {}",
        journal::short(&current.spec.digest()),
        previous.as_ref().map_or_else(
            || "none".to_string(),
            |p| journal::short(&p.spec.digest()).to_string()
        ),
        mark,
        term.as_ref()
            .map(|t| t.term)
            .or(pushed.as_ref().map(|p| p.term))
            .unwrap_or(0)
    );
    {
        let mut st = state::lock();
        st.rings
            .install(current, previous, mark)
            .map_err(CmdError::err)?;
        if let Some(record) = adopt {
            st.lease.adopt(record);
        }
    }
    journal::note(&text);
    crate::index::ring_changed();
    call.ctx.replicate_verbatim();
    call.reply.ok();
    Ok(())
}

/// `SHARD.RING STATE`: this node's rings, job, key count and memory, for the coordinator and
/// `SHARD.RING CHECK`.
pub fn node_state(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.ring|state"));
    }
    call.reply.resp(&node_state::this_node(call.ctx));
    Ok(())
}

/// `SHARD.RING LEASE term lease-ms name address run-id [RELEASE]`: a fleet coordinator's term
/// at this node: its claim of a new term (followed at once) or a renewal of its lease, or with
/// `RELEASE` the holder handing its term over; refused when this node follows a newer term
/// (`fleet::fencing`). A change of the record is replicated.
pub fn lease(call: &Call) -> CmdResult {
    let n = call.args.len();
    if !(7..=8).contains(&n) {
        return Err(CmdError::wrong_arity("shard.ring|lease"));
    }
    let claim = fencing::parse_claim(&call.args, 2)?;
    let how = match n {
        8 if is(call.args.get(7), "RELEASE") => crate::ring::lease::How::Release,
        8 => {
            return Err(CmdError::unknown_option(
                "shard.ring|lease",
                call.args.get(7),
            ))
        }
        _ => crate::ring::lease::How::Step,
    };
    if fencing::accept(call.ctx, &claim, how)? {
        call.ctx.replicate_verbatim();
    }
    call.reply.ok();
    Ok(())
}

/// `SHARD.RING PUSH`: sends this node's rings to every node they name, under its term.
pub fn push(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.ring|push"));
    }
    let push = {
        let st = state::lock();
        let current = current_ring(&st)?;
        Push::prepare(&st, current)?
    };
    let link = push.link.clone();
    let started = forward::run(call, link, move |steps| push.run(steps));
    started.map_err(CmdError::err)
}

/// `SHARD.RING CHECK`: every node's rings, job, keys and memory, whether they all agree, and each
/// node's share of the keyspace beside its weight's.
pub fn check(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.ring|check"));
    }
    let survey = {
        let st = state::lock();
        let current = current_ring(&st)?;
        Survey::prepare(&st, current)?
    };
    let link = survey.link.clone();
    let started = forward::run(call, link, move |steps| survey.run(steps));
    started.map_err(CmdError::err)
}

pub static RING: CommandSpec = command! {
    name: "shard.ring",
    container,
    summary: "Manages the ring of nodes held in module memory",
    subcommands: &[&RING_SET, &RING_GET, &RING_BEGIN, &RING_SETTLE, &RING_COMMIT, &RING_ABORT, &RING_INSTALL, &RING_STATE, &RING_LEASE, &RING_PUSH, &RING_CHECK],
};

pub static RING_SET: CommandSpec = command! {
    name: "shard.ring|set",
    handler: set,
    flags: "admin may-replicate",
    arity: -3,
    summary: "Replaces the ring; a slots ring may give each node its slot ranges (SLOTS 0-4095,8192-9000)",
    complexity: "O(N log N) with N the points of the ring",
    args: RING_ARGS,
    acl: "admin dangerous slow",
};

pub static RING_GET: CommandSpec = command! {
    name: "shard.ring|get",
    handler: get,
    flags: "readonly fast",
    arity: 2,
    summary: "Shows the ring, its epoch and digest (and each node's slots on a slots ring)",
    complexity: "O(N) with N the nodes",
    args: &[],
    acl: "read fast",
};

pub static RING_BEGIN: CommandSpec = command! {
    name: "shard.ring|begin",
    handler: begin,
    flags: "admin may-replicate",
    arity: -3,
    summary: "Opens a resharding: the given ring (exactly as given, SLOTS included) becomes current, the old one previous",
    complexity: "O(N log N) with N the points of the ring",
    args: RING_ARGS,
    acl: "admin dangerous slow",
};

pub static RING_SETTLE: CommandSpec = command! {
    name: "shard.ring|settle",
    handler: settle,
    flags: "admin may-replicate",
    arity: -2,
    summary: "Marks the open resharding's copies done: a moving key is read and written at its new owner only, deleted at both (COMMIT's first step)",
    complexity: "O(1)",
    args: BY_HAND_ARGS,
    acl: "admin dangerous slow",
};

pub static RING_COMMIT: CommandSpec = command! {
    name: "shard.ring|commit",
    handler: commit,
    flags: "admin may-replicate",
    arity: -2,
    summary: "Closes the resharding, dropping the previous ring",
    complexity: "O(1)",
    args: BY_HAND_ARGS,
    acl: "admin dangerous slow",
};

pub static RING_ABORT: CommandSpec = command! {
    name: "shard.ring|abort",
    handler: abort,
    flags: "admin may-replicate",
    arity: -2,
    summary: "Closes the resharding, putting the previous ring back",
    complexity: "O(1)",
    args: BY_HAND_ARGS,
    acl: "admin dangerous slow",
};

pub static RING_INSTALL: CommandSpec = command! {
    name: "shard.ring|install",
    handler: install,
    flags: "admin may-replicate",
    arity: -3,
    summary: "Installs the current and previous rings whole, as canonical texts (a fleet operation's step)",
    complexity: "O(N log N) with N the points of the rings",
    args: INSTALL_ARGS,
    acl: "admin dangerous slow",
};

pub static RING_STATE: CommandSpec = command! {
    name: "shard.ring|state",
    handler: node_state,
    flags: "readonly",
    arity: 2,
    summary: "Shows this node's ring digests, job, key count and memory",
    complexity: "O(1)",
    args: &[],
    acl: "read",
};

pub static RING_LEASE: CommandSpec = command! {
    name: "shard.ring|lease",
    handler: lease,
    flags: "admin may-replicate",
    arity: -7,
    summary: "A fleet coordinator's term at this node: claims it or renews its lease, or with RELEASE hands it over (sent by the coordinator)",
    complexity: "O(1)",
    args: LEASE_ARGS,
    acl: "admin dangerous slow",
};

pub static RING_PUSH: CommandSpec = command! {
    name: "shard.ring|push",
    handler: push,
    flags: "admin blocking deny-script",
    arity: 2,
    summary: "Sends this node's rings to every node named in them",
    complexity: "O(N) with N the nodes",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RING_CHECK: CommandSpec = command! {
    name: "shard.ring|check",
    handler: check,
    flags: "admin blocking deny-script",
    arity: 2,
    summary: "Asks every node for its rings, job, keys and memory; shows whether they agree and each node's share of the keyspace",
    complexity: "O(N) with N the nodes",
    args: &[],
    acl: "admin dangerous slow",
};

static RING_ARGS: &[Arg] = &[
    arg(c"algo", Kind::Str),
    opt(c"rule", c"HASHTAG", Kind::Str),
    block(c"node", NODE_FIELDS, true),
    opt(c"term", c"TERM", Kind::Int),
];

/// `TERM n`: the fleet term a change by hand is made under.
static BY_HAND_ARGS: &[Arg] = &[opt(c"term", c"TERM", Kind::Int)];

pub(crate) static NODE_FIELDS: &[Arg] = &[
    arg(c"name", Kind::Str),
    arg(c"address", Kind::Str),
    arg(c"weight", Kind::Int),
    opt(c"ranges", c"SLOTS", Kind::Str),
];

static INSTALL_ARGS: &[Arg] = &[
    arg(c"current", Kind::Str),
    Arg {
        optional: true,
        ..arg(c"previous", Kind::Str)
    },
    Arg {
        optional: true,
        ..one_of(
            c"mark",
            &[
                tok(c"returning", c"RETURNING", Kind::Token),
                tok(c"fence", c"FENCE", Kind::Token),
                tok(c"settled", c"SETTLED", Kind::Token),
            ],
        )
    },
    TERM_ARG,
    Arg {
        name: c"pushed",
        token: Some(c"PUSHED"),
        subargs: PUSHED_FIELDS,
        ..TERM_ARG
    },
];

/// `PUSHED term lease-ms holder address run-id released`: the pushing node's fleet term, at the
/// end of an INSTALL that `SHARD.RING PUSH` sends.
const PUSHED_FIELDS: &[Arg] = &[
    arg(c"term", Kind::Int),
    arg(c"lease-ms", Kind::Int),
    arg(c"holder", Kind::Str),
    arg(c"address", Kind::Str),
    arg(c"run-id", Kind::Str),
    arg(c"released", Kind::Str),
];

/// `TERM term lease-ms holder address run-id`: a fleet coordinator's term, at the end of each
/// step it sends.
pub(crate) const TERM_ARG: Arg = Arg {
    name: c"term",
    kind: Kind::Block,
    token: Some(c"TERM"),
    optional: true,
    multiple: false,
    subargs: TERM_FIELDS,
};

const TERM_FIELDS: &[Arg] = &[
    arg(c"term", Kind::Int),
    arg(c"lease-ms", Kind::Int),
    arg(c"holder", Kind::Str),
    arg(c"address", Kind::Str),
    arg(c"run-id", Kind::Str),
];

static LEASE_ARGS: &[Arg] = &[
    arg(c"term", Kind::Int),
    arg(c"lease-ms", Kind::Int),
    arg(c"holder", Kind::Str),
    arg(c"address", Kind::Str),
    arg(c"run-id", Kind::Str),
    flag(c"release", c"RELEASE"),
];
