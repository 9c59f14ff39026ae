//! The module's commands, as Redis registers them: each command's description
//! (`host::register::CommandSpec`: name, flags, arity, summary, complexity, arguments, ACL
//! categories) sits beside its handler; this file lists them, in the order `COMMAND` shows
//! them, and holds the containers `SHARD.RING` and `SHARD.RESHARD`.

use crate::command;
use crate::commands::{advance, debug, decode, dump, encode, genkey, shardjs, whereis};
use crate::host::register::{arg, flag, opt, Arg, CommandSpec, Kind};

/// Every command of the module.
pub fn table() -> [&'static CommandSpec; 17] {
    [
        &genkey::COMMAND,
        &decode::COMMAND,
        &encode::COMMAND,
        &shardjs::SPECIALKEY,
        &shardjs::RETYPE,
        &shardjs::MINIFY,
        &shardjs::MAXIFY,
        &whereis::WHEREIS,
        &whereis::LOCATE,
        &CALL,
        &CLUSTER,
        &REDIRECT,
        &debug::COMMAND,
        &dump::COMMAND,
        &advance::COMMAND,
        &RING,
        &RESHARD,
    ]
}

/// Registers every command and subcommand; an error names the one that failed.
pub fn register_all(ctx: &redis_module::Context) -> Result<(), String> {
    crate::host::register::register_all(ctx, &table())
}

pub static RING: CommandSpec = command! {
    name: "shard.ring",
    container,
    summary: "Manages the ring of nodes held in module memory",
    subcommands: &[&RING_SET, &RING_GET, &RING_BEGIN, &RING_COMMIT, &RING_ABORT, &RING_INSTALL, &RING_STATE, &RING_PUSH, &RING_CHECK],
};

pub static RESHARD: CommandSpec = command! {
    name: "shard.reshard",
    container,
    summary: "Runs the background jobs that move keys between nodes",
    subcommands: &[&RESHARD_COPY, &RESHARD_CLEANUP, &RESHARD_STATUS, &RESHARD_STOP, &RESHARD_THROTTLE, &RESHARD_PAUSE, &RESHARD_RESUME, &RESHARD_START, &RESHARD_CANCEL, &RESHARD_PLAN],
};

pub static CALL: CommandSpec = command! {
    name: "shard.call",
    handler: crate::commands::call::call,
    flags: "may-replicate deny-script blocking",
    arity: -3,
    summary: "Runs a command on the owner of its keys (multi-key commands split by owner)",
    complexity: "Depends on the command",
    args: CALL_ARGS,
    acl: "",
};

pub static CLUSTER: CommandSpec = command! {
    name: "shard.cluster",
    handler: crate::commands::cluster::cluster,
    flags: "fast allow-stale allow-loading",
    arity: -2,
    summary: "What CLUSTER, READONLY, READWRITE and ASKING answer when shard.cluster-protocol is yes",
    complexity: "O(N) with N the nodes; COUNTKEYSINSLOT and GETKEYSINSLOT O(N) with N the keys",
    args: CLUSTER_ARGS,
    acl: "connection slow",
};

pub static REDIRECT: CommandSpec = command! {
    name: "shard.redirect",
    handler: crate::commands::cluster::redirect,
    flags: "may-replicate deny-script blocking",
    arity: -2,
    summary: "A keyed command for another node's slot, when shard.cluster-protocol is yes: MOVED, ASK, CROSSSLOT or run here",
    complexity: "Depends on the command",
    args: REDIRECT_ARGS,
    acl: "read write slow",
};

pub static RING_SET: CommandSpec = command! {
    name: "shard.ring|set",
    handler: crate::commands::ring::set,
    flags: "admin",
    arity: -3,
    summary: "Replaces the ring",
    complexity: "O(N log N) with N the points of the ring",
    args: RING_ARGS,
    acl: "admin dangerous slow",
};

pub static RING_GET: CommandSpec = command! {
    name: "shard.ring|get",
    handler: crate::commands::ring::get,
    flags: "readonly fast",
    arity: 2,
    summary: "Shows the ring, its epoch and digest",
    complexity: "O(N) with N the nodes",
    args: &[],
    acl: "read fast",
};

pub static RING_BEGIN: CommandSpec = command! {
    name: "shard.ring|begin",
    handler: crate::commands::ring::begin,
    flags: "admin",
    arity: -3,
    summary: "Opens a resharding: the given ring becomes current, the old one previous",
    complexity: "O(N log N) with N the points of the ring",
    args: RING_ARGS,
    acl: "admin dangerous slow",
};

pub static RING_COMMIT: CommandSpec = command! {
    name: "shard.ring|commit",
    handler: crate::commands::ring::commit,
    flags: "admin",
    arity: 2,
    summary: "Closes the resharding, dropping the previous ring",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RING_ABORT: CommandSpec = command! {
    name: "shard.ring|abort",
    handler: crate::commands::ring::abort,
    flags: "admin",
    arity: 2,
    summary: "Closes the resharding, putting the previous ring back",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RING_INSTALL: CommandSpec = command! {
    name: "shard.ring|install",
    handler: crate::commands::ring::install,
    flags: "admin",
    arity: -3,
    summary: "Installs the current and previous rings whole, as canonical texts (a fleet operation's step)",
    complexity: "O(N log N) with N the points of the rings",
    args: INSTALL_ARGS,
    acl: "admin dangerous slow",
};

pub static RING_STATE: CommandSpec = command! {
    name: "shard.ring|state",
    handler: crate::commands::ring::node_state,
    flags: "readonly",
    arity: 2,
    summary: "Shows this node's ring digests, job, key count and memory",
    complexity: "O(1)",
    args: &[],
    acl: "read",
};

pub static RING_PUSH: CommandSpec = command! {
    name: "shard.ring|push",
    handler: crate::commands::ring::push,
    flags: "admin blocking deny-script",
    arity: 2,
    summary: "Sends this node's rings to every node named in them",
    complexity: "O(N) with N the nodes",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RING_CHECK: CommandSpec = command! {
    name: "shard.ring|check",
    handler: crate::commands::ring::check,
    flags: "admin blocking deny-script",
    arity: 2,
    summary: "Asks every node for its rings, job, keys and memory; shows whether they agree and each node's share of the keyspace",
    complexity: "O(N) with N the nodes",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RESHARD_COPY: CommandSpec = command! {
    name: "shard.reshard|copy",
    handler: crate::commands::reshard::copy,
    flags: "admin",
    arity: -2,
    summary: "Copies, in the background, the local keys that belong to other nodes",
    complexity: "O(1) to start; the job is O(N) with N the keys",
    args: COPY_ARGS,
    acl: "admin dangerous slow",
};

pub static RESHARD_CLEANUP: CommandSpec = command! {
    name: "shard.reshard|cleanup",
    handler: crate::commands::reshard::cleanup,
    flags: "admin write",
    arity: -2,
    summary: "Deletes, in the background, the local keys that belong to other nodes",
    complexity: "O(1) to start; the job is O(N) with N the keys",
    args: CLEANUP_ARGS,
    acl: "admin dangerous slow",
};

pub static RESHARD_STATUS: CommandSpec = command! {
    name: "shard.reshard|status",
    handler: crate::commands::reshard::status,
    flags: "readonly fast",
    arity: 2,
    summary: "Shows the state and counters of the resharding job",
    complexity: "O(1)",
    args: &[],
    acl: "read fast",
};

pub static RESHARD_STOP: CommandSpec = command! {
    name: "shard.reshard|stop",
    handler: crate::commands::reshard::stop,
    flags: "admin",
    arity: 2,
    summary: "Stops the running resharding job after its current batch",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RESHARD_THROTTLE: CommandSpec = command! {
    name: "shard.reshard|throttle",
    handler: crate::commands::reshard::throttle,
    flags: "admin",
    arity: 3,
    summary: "Limits the running resharding job to a number of keys per second (0: no limit)",
    complexity: "O(1)",
    args: THROTTLE_ARGS,
    acl: "admin dangerous slow",
};

pub static RESHARD_PAUSE: CommandSpec = command! {
    name: "shard.reshard|pause",
    handler: crate::commands::reshard::pause,
    flags: "admin",
    arity: 2,
    summary: "Pauses the running resharding job where it is, closing its connections",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RESHARD_RESUME: CommandSpec = command! {
    name: "shard.reshard|resume",
    handler: crate::commands::reshard::resume,
    flags: "admin",
    arity: 2,
    summary: "Resumes a paused resharding job, and an interrupted fleet operation, from where they stopped",
    complexity: "O(1)",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RESHARD_START: CommandSpec = command! {
    name: "shard.reshard|start",
    handler: crate::commands::reshard::start,
    flags: "admin blocking deny-script",
    arity: -3,
    summary: "Grows or shrinks the fleet to the given ring: checks every node, then opens, copies, commits and cleans up in the background",
    complexity: "O(N) with N the nodes to start; the operation is O(K) with K the keys",
    args: START_ARGS,
    acl: "admin dangerous slow",
};

pub static RESHARD_CANCEL: CommandSpec = command! {
    name: "shard.reshard|cancel",
    handler: crate::commands::reshard::cancel,
    flags: "admin",
    arity: 2,
    summary: "Returns the fleet to the old ring (before COMMIT), bringing back the writes made since",
    complexity: "O(1) to start",
    args: &[],
    acl: "admin dangerous slow",
};

pub static RESHARD_PLAN: CommandSpec = command! {
    name: "shard.reshard|plan",
    handler: crate::commands::reshard::save_plan,
    flags: "admin",
    arity: 3,
    summary: "Stores the coordinator's plan (sent by the coordinator to itself; replicated)",
    complexity: "O(N) with N the nodes",
    args: PLAN_ARGS,
    acl: "admin dangerous slow",
};

static NODE_TRIPLET: &[Arg] = &[
    arg(c"name", Kind::Str),
    arg(c"address", Kind::Str),
    arg(c"weight", Kind::Int),
];

static CALL_ARGS: &[Arg] = &[
    arg(c"command", Kind::Str),
    arg(c"key", Kind::Str),
    Arg {
        name: c"arg",
        kind: Kind::Str,
        token: None,
        optional: true,
        multiple: true,
        subargs: &[],
    },
];

static CLUSTER_ARGS: &[Arg] = &[
    arg(c"subcommand", Kind::Str),
    Arg {
        name: c"arg",
        kind: Kind::Str,
        token: None,
        optional: true,
        multiple: true,
        subargs: &[],
    },
];

static REDIRECT_ARGS: &[Arg] = &[
    arg(c"command", Kind::Str),
    Arg {
        name: c"arg",
        kind: Kind::Str,
        token: None,
        optional: true,
        multiple: true,
        subargs: &[],
    },
];

static RING_ARGS: &[Arg] = &[
    arg(c"algo", Kind::Str),
    opt(c"rule", c"HASHTAG", Kind::Str),
    Arg {
        name: c"node",
        kind: Kind::Block,
        token: None,
        optional: true,
        multiple: true,
        subargs: NODE_TRIPLET,
    },
];

static INSTALL_ARGS: &[Arg] = &[
    arg(c"current", Kind::Str),
    Arg {
        optional: true,
        ..arg(c"previous", Kind::Str)
    },
    flag(c"returning", c"RETURNING"),
];

static COPY_ARGS: &[Arg] = &[
    opt(c"batch", c"BATCH", Kind::Int),
    opt(c"timeout", c"TIMEOUT", Kind::Int),
    flag(c"replace", c"REPLACE"),
    opt(c"keys-per-second", c"MAXRATE", Kind::Int),
];

static CLEANUP_ARGS: &[Arg] = &[opt(c"batch", c"BATCH", Kind::Int), flag(c"left", c"LEFT")];

static THROTTLE_ARGS: &[Arg] = &[arg(c"keys-per-second", Kind::Int)];

static START_ARGS: &[Arg] = &[
    arg(c"algo", Kind::Str),
    opt(c"rule", c"HASHTAG", Kind::Str),
    Arg {
        name: c"node",
        kind: Kind::Block,
        token: None,
        optional: false,
        multiple: true,
        subargs: NODE_TRIPLET,
    },
    opt(c"keys-per-second", c"MAXRATE", Kind::Int),
];

static PLAN_ARGS: &[Arg] = &[arg(c"plan", Kind::Str)];
