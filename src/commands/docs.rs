//! What `COMMAND INFO` and `COMMAND DOCS` show for each command: summary, complexity, arity and
//! arguments, given to Redis with RedisModule_SetCommandInfo (Redis 7.0), and the ACL
//! categories given with RedisModule_SetCommandACLCategories where the server has it (7.2+).

use std::ffi::CStr;
use std::mem::size_of;
use std::os::raw::c_int;
use std::ptr;

use redis_module::raw;

/// The type of an argument.
#[derive(Clone, Copy)]
pub enum Kind {
    Str,
    Int,
    Key,
    UnixTime,
    Token,
    OneOf,
    Block,
}

/// One argument of a command.
#[derive(Clone, Copy)]
pub struct Arg {
    pub name: &'static CStr,
    pub kind: Kind,
    pub token: Option<&'static CStr>,
    pub optional: bool,
    pub multiple: bool,
    pub subargs: &'static [Arg],
}

const fn arg(name: &'static CStr, kind: Kind) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
        subargs: &[],
    }
}

const fn opt(name: &'static CStr, token: &'static CStr, kind: Kind) -> Arg {
    Arg {
        name,
        kind,
        token: Some(token),
        optional: true,
        multiple: false,
        subargs: &[],
    }
}

/// A required argument introduced by its token (a choice of a `oneof`).
const fn tok(name: &'static CStr, token: &'static CStr, kind: Kind) -> Arg {
    Arg {
        name,
        kind,
        token: Some(token),
        optional: false,
        multiple: false,
        subargs: &[],
    }
}

const fn flag(name: &'static CStr, token: &'static CStr) -> Arg {
    Arg {
        name,
        kind: Kind::Token,
        token: Some(token),
        optional: true,
        multiple: false,
        subargs: &[],
    }
}

/// A command's documentation.
pub struct Doc {
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub arity: c_int,
    pub args: &'static [Arg],
    /// ACL categories where the server can set them for module commands (Redis 7.2 and later,
    /// Valkey). Chosen so that the common rules mean what a Redis user expects: whatever changes
    /// rings, runs or stops a resharding job, or moves the generator (`SHARD.ADVANCE`) is
    /// `admin dangerous slow` and nothing else, so `+@read`/`+@write` never reach it and
    /// `-@admin`/`-@dangerous` take it away. Servers give a module command only the categories
    /// set here (not those of its flags: `write` on CLEANUP puts it in no `@write`).
    pub acl: &'static CStr,
}

const NODE_TRIPLET: &[Arg] = &[
    arg(c"name", Kind::Str),
    arg(c"address", Kind::Str),
    arg(c"weight", Kind::Int),
];
const RING_ARGS: &[Arg] = &[
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
const LAYOUT_ARGS: [Arg; 2] = [
    opt(c"layout", c"LAYOUT", Kind::Str),
    opt(c"epoch", c"EPOCH", Kind::UnixTime),
];

/// The documentation of a command or subcommand, by its full name (`shard.ring|set`).
pub fn doc(name: &str) -> Option<Doc> {
    static GENKEY: &[Arg] = &[
        opt(c"type", c"TYPE", Kind::Str),
        opt(c"count", c"COUNT", Kind::Int),
    ];
    static DECODE: &[Arg] = &[arg(c"key", Kind::Str), LAYOUT_ARGS[0], LAYOUT_ARGS[1]];
    static ENCODE: &[Arg] = &[
        LAYOUT_ARGS[0],
        LAYOUT_ARGS[1],
        Arg {
            name: c"when",
            kind: Kind::OneOf,
            token: None,
            optional: false,
            multiple: false,
            subargs: &[
                tok(c"time", c"TIME", Kind::UnixTime),
                tok(c"offset", c"OFFSET", Kind::Int),
            ],
        },
        opt(c"node", c"NODE", Kind::Int),
        opt(c"seq", c"SEQ", Kind::Int),
        opt(c"type", c"TYPE", Kind::Str),
        opt(c"suffix", c"SUFFIX", Kind::Str),
    ];
    static KEY: &[Arg] = &[arg(c"key", Kind::Str)];
    static CALL: &[Arg] = &[
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
    static ADVANCE: &[Arg] = &[arg(c"high-water-ms", Kind::UnixTime)];
    static NAME: &[Arg] = &[arg(c"name", Kind::Str)];
    static RETYPE: &[Arg] = &[arg(c"key", Kind::Str), arg(c"type", Kind::Str)];
    static FIELDS: &[Arg] = &[Arg {
        name: c"field",
        kind: Kind::Str,
        token: None,
        optional: false,
        multiple: true,
        subargs: &[],
    }];
    static CLUSTER: &[Arg] = &[
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
    static REDIRECT: &[Arg] = &[
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
    static COPY: &[Arg] = &[
        opt(c"batch", c"BATCH", Kind::Int),
        opt(c"timeout", c"TIMEOUT", Kind::Int),
        flag(c"replace", c"REPLACE"),
        opt(c"keys-per-second", c"MAXRATE", Kind::Int),
    ];
    static THROTTLE: &[Arg] = &[arg(c"keys-per-second", Kind::Int)];
    static CLEANUP: &[Arg] = &[opt(c"batch", c"BATCH", Kind::Int), flag(c"left", c"LEFT")];
    static INSTALL: &[Arg] = &[
        arg(c"current", Kind::Str),
        Arg {
            optional: true,
            ..arg(c"previous", Kind::Str)
        },
        flag(c"returning", c"RETURNING"),
    ];
    static START: &[Arg] = &[
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
    static PLAN: &[Arg] = &[arg(c"plan", Kind::Str)];
    let d = |summary, complexity, arity, args, acl| {
        Some(Doc {
            summary,
            complexity,
            arity,
            args,
            acl,
        })
    };
    match name {
        "shard.genkey" => d(
            c"Issues time-sorted unique keys, drawn atomically in the server",
            c"O(N) with N the COUNT, O(1) without",
            -1,
            GENKEY,
            c"write fast",
        ),
        "shard.decode" => d(
            c"Takes a key apart: time, node, sequence, type",
            c"O(1)",
            -2,
            DECODE,
            c"read fast",
        ),
        "shard.encode" => d(
            c"Puts a key together from its fields",
            c"O(1)",
            -1,
            ENCODE,
            c"read fast",
        ),
        "shard.whereis" => d(
            c"Names the node that owns a key",
            c"O(log N) with N the points of the ring",
            2,
            KEY,
            c"read fast",
        ),
        "shard.locate" => d(
            c"Tells which node owns a key, its address, the hashed part and the deciding point",
            c"O(log N) with N the points of the ring",
            2,
            KEY,
            c"read fast",
        ),
        "shard.call" => d(
            c"Runs a command on the owner of its keys (multi-key commands split by owner)",
            c"Depends on the command",
            -3,
            CALL,
            c"",
        ),
        "shard.specialkey" => d(
            c"The fixed key of a special key of the special-keys configuration (Shardjs)",
            c"O(N) with N the special keys",
            2,
            NAME,
            c"read fast",
        ),
        "shard.retype" => d(
            c"The same key with another type (Shardjs's changeKeyType)",
            c"O(1)",
            3,
            RETYPE,
            c"read fast",
        ),
        "shard.minify" => d(
            c"The stored (short) names of hash fields, from the fields dictionary",
            c"O(N) with N the fields",
            -2,
            FIELDS,
            c"read fast",
        ),
        "shard.maxify" => d(
            c"The names clients see for stored hash fields, from the fields dictionary",
            c"O(N) with N the fields",
            -2,
            FIELDS,
            c"read fast",
        ),
        "shard.cluster" => d(
            c"What CLUSTER, READONLY, READWRITE and ASKING answer when shard.cluster-protocol is yes",
            c"O(N) with N the nodes; COUNTKEYSINSLOT and GETKEYSINSLOT O(N) with N the keys",
            -2,
            CLUSTER,
            c"connection slow",
        ),
        "shard.redirect" => d(
            c"A keyed command for another node's slot, when shard.cluster-protocol is yes: MOVED, ASK, CROSSSLOT or run here",
            c"Depends on the command",
            -2,
            REDIRECT,
            c"read write slow",
        ),
        "shard.dump" => d(
            c"Internal: a key's DUMP payload and PTTL in one step, for the copy-before-write of SHARD.CALL over TLS",
            c"O(1) to access the key and additional O(N*M) to serialize it",
            2,
            KEY,
            c"read slow",
        ),
        "shard.advance" => d(
            c"Internal: carries the generator's high-water mark to replicas and the AOF",
            c"O(1)",
            2,
            ADVANCE,
            c"admin dangerous slow",
        ),
        "shard.debug" => d(
            c"Debugging: PANIC proves the panic guard (needs enable-debug-command)",
            c"O(1)",
            2,
            &[],
            c"admin dangerous slow",
        ),
        "shard.ring" => d(
            c"Manages the ring of nodes held in module memory",
            c"Depends on the subcommand",
            -2,
            &[],
            c"",
        ),
        "shard.ring|set" => d(
            c"Replaces the ring",
            c"O(N log N) with N the points of the ring",
            -3,
            RING_ARGS,
            c"admin dangerous slow",
        ),
        "shard.ring|get" => d(
            c"Shows the ring, its epoch and digest",
            c"O(N) with N the nodes",
            2,
            &[],
            c"read fast",
        ),
        "shard.ring|begin" => d(
            c"Opens a resharding: the given ring becomes current, the old one previous",
            c"O(N log N) with N the points of the ring",
            -3,
            RING_ARGS,
            c"admin dangerous slow",
        ),
        "shard.ring|commit" => d(
            c"Closes the resharding, dropping the previous ring",
            c"O(1)",
            2,
            &[],
            c"admin dangerous slow",
        ),
        "shard.ring|abort" => d(
            c"Closes the resharding, putting the previous ring back",
            c"O(1)",
            2,
            &[],
            c"admin dangerous slow",
        ),
        "shard.reshard" => d(
            c"Runs the background jobs that move keys between nodes",
            c"Depends on the subcommand",
            -2,
            &[],
            c"",
        ),
        "shard.reshard|copy" => d(
            c"Copies, in the background, the local keys that belong to other nodes",
            c"O(1) to start; the job is O(N) with N the keys",
            -2,
            COPY,
            c"admin dangerous slow",
        ),
        "shard.reshard|cleanup" => d(
            c"Deletes, in the background, the local keys that belong to other nodes",
            c"O(1) to start; the job is O(N) with N the keys",
            -2,
            CLEANUP,
            c"admin dangerous slow",
        ),
        "shard.reshard|status" => d(
            c"Shows the state and counters of the resharding job",
            c"O(1)",
            2,
            &[],
            c"read fast",
        ),
        "shard.reshard|stop" => d(
            c"Stops the running resharding job after its current batch",
            c"O(1)",
            2,
            &[],
            c"admin dangerous slow",
        ),
        "shard.reshard|throttle" => d(
            c"Limits the running resharding job to a number of keys per second (0: no limit)",
            c"O(1)",
            3,
            THROTTLE,
            c"admin dangerous slow",
        ),
        "shard.reshard|pause" => d(
            c"Pauses the running resharding job where it is, closing its connections",
            c"O(1)",
            2,
            &[],
            c"admin dangerous slow",
        ),
        "shard.reshard|resume" => d(
            c"Resumes a paused resharding job, and an interrupted fleet operation, from where they stopped",
            c"O(1)",
            2,
            &[],
            c"admin dangerous slow",
        ),
        "shard.reshard|start" => d(
            c"Grows or shrinks the fleet to the given ring: checks every node, then opens, copies, commits and cleans up in the background",
            c"O(N) with N the nodes to start; the operation is O(K) with K the keys",
            -3,
            START,
            c"admin dangerous slow",
        ),
        "shard.reshard|cancel" => d(
            c"Returns the fleet to the old ring (before COMMIT), bringing back the writes made since",
            c"O(1) to start",
            2,
            &[],
            c"admin dangerous slow",
        ),
        "shard.reshard|plan" => d(
            c"Stores the coordinator's plan (sent by the coordinator to itself; replicated)",
            c"O(N) with N the nodes",
            3,
            PLAN,
            c"admin dangerous slow",
        ),
        "shard.ring|install" => d(
            c"Installs the current and previous rings whole, as canonical texts (a fleet operation's step)",
            c"O(N log N) with N the points of the rings",
            -3,
            INSTALL,
            c"admin dangerous slow",
        ),
        "shard.ring|state" => d(
            c"Shows this node's ring digests, job, key count and memory",
            c"O(1)",
            2,
            &[],
            c"read",
        ),
        "shard.ring|push" => d(
            c"Sends this node's rings to every node named in them",
            c"O(N) with N the nodes",
            2,
            &[],
            c"admin dangerous slow",
        ),
        "shard.ring|check" => d(
            c"Asks every node for its rings, job, keys and memory; shows whether they agree and each node's share of the keyspace",
            c"O(N) with N the nodes",
            2,
            &[],
            c"admin dangerous slow",
        ),
        _ => None,
    }
}

static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
};

/// Arrays of raw arguments, kept alive while Redis copies them.
#[derive(Default)]
struct ArgArena {
    arrays: Vec<Vec<raw::RedisModuleCommandArg>>,
}

impl ArgArena {
    /// A NULL-terminated raw array for `args` (and their subarguments).
    fn build(&mut self, args: &[Arg]) -> *mut raw::RedisModuleCommandArg {
        if args.is_empty() {
            return ptr::null_mut();
        }
        let mut out: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(args.len() + 1);
        for a in args {
            let subargs = self.build(a.subargs);
            let mut flags = 0;
            if a.optional {
                flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int;
            }
            if a.multiple {
                flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int;
            }
            // SAFETY: the struct is plain data; zero is a valid "unset" for every field.
            let mut raw_arg: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
            raw_arg.name = a.name.as_ptr();
            raw_arg.type_ = match a.kind {
                Kind::Str => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                Kind::Int => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                Kind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
                Kind::UnixTime => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME,
                Kind::Token => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                Kind::OneOf => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
                Kind::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            };
            raw_arg.key_spec_index = -1;
            raw_arg.token = a.token.map_or(ptr::null(), CStr::as_ptr);
            raw_arg.flags = flags;
            raw_arg.subargs = subargs;
            out.push(raw_arg);
        }
        // SAFETY: as above: the all-zero entry terminates the array.
        out.push(unsafe { std::mem::zeroed() });
        let p = out.as_mut_ptr();
        self.arrays.push(out);
        p
    }
}

/// Gives Redis the documentation (and, where possible, the ACL categories) of a command.
///
/// # Safety
/// `command` must be a command of this module, as RedisModule_GetCommand returned it.
pub unsafe fn describe(command: *mut raw::RedisModuleCommand, name: &str) -> Result<(), String> {
    let Some(doc) = doc(name) else {
        return Ok(());
    };
    let set_info =
        raw::RedisModule_SetCommandInfo.ok_or("RedisModule_SetCommandInfo is missing")?;
    let mut arena = ArgArena::default();
    let args = arena.build(doc.args);
    // SAFETY: plain data; unset fields are NULL.
    let mut info: raw::RedisModuleCommandInfo = std::mem::zeroed();
    info.version = &INFO_VERSION;
    info.summary = doc.summary.as_ptr();
    info.complexity = doc.complexity.as_ptr();
    info.since = c"0.1.0".as_ptr();
    info.arity = doc.arity;
    info.args = args;
    if set_info(command, &info) != raw::REDISMODULE_OK as c_int {
        return Err(format!(
            "RedisModule_SetCommandInfo refused the documentation of {name}"
        ));
    }
    if let Some(set_acl) = raw::RedisModule_SetCommandACLCategories {
        if !doc.acl.is_empty() && set_acl(command, doc.acl.as_ptr()) != raw::REDISMODULE_OK as c_int
        {
            return Err(format!("the ACL categories of {name} were refused"));
        }
    }
    Ok(())
}
