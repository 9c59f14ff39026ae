//! A command's description, written once beside its handler ([`CommandSpec`], made by the
//! [`command!`](crate::command) macro): its name, entry point, flags, arity, summary,
//! complexity, arguments and ACL categories; and the registration of a table of them with
//! Redis, container commands (`SHARD.RING`) with real subcommands (`shard.ring|get`) so that ACL
//! rules can name each one. `COMMAND INFO` and `COMMAND DOCS` show what is given here
//! (`RedisModule_SetCommandInfo`, Redis 7.0); the ACL categories are given where the server has
//! `RedisModule_SetCommandACLCategories` (Redis 7.2+, Valkey). No command of this module
//! declares key positions: none takes a key of this server's keyspace as such.

use std::ffi::CStr;
use std::mem::size_of;
use std::os::raw::c_int;
use std::ptr;

use redis_module::{raw, Context};

/// The C entry point of a command (made by `command_fn!`).
pub type Entry = unsafe extern "C" fn(
    *mut raw::RedisModuleCtx,
    *mut *mut raw::RedisModuleString,
    c_int,
) -> c_int;

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

/// One argument of a command, as `COMMAND DOCS` shows it.
#[derive(Clone, Copy)]
pub struct Arg {
    pub name: &'static CStr,
    pub kind: Kind,
    pub token: Option<&'static CStr>,
    pub optional: bool,
    pub multiple: bool,
    pub subargs: &'static [Arg],
}

/// A required argument.
pub const fn arg(name: &'static CStr, kind: Kind) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
        subargs: &[],
    }
}

/// An optional argument introduced by its token.
pub const fn opt(name: &'static CStr, token: &'static CStr, kind: Kind) -> Arg {
    Arg {
        token: Some(token),
        optional: true,
        ..arg(name, kind)
    }
}

/// A required argument introduced by its token (a choice of a `oneof`).
pub const fn tok(name: &'static CStr, token: &'static CStr, kind: Kind) -> Arg {
    Arg {
        token: Some(token),
        ..arg(name, kind)
    }
}

/// An optional pure token (`REPLACE`).
pub const fn flag(name: &'static CStr, token: &'static CStr) -> Arg {
    opt(name, token, Kind::Token)
}

/// Any number of arguments (at least one unless `optional`).
pub const fn many(name: &'static CStr, kind: Kind, optional: bool) -> Arg {
    Arg {
        optional,
        multiple: true,
        ..arg(name, kind)
    }
}

/// A choice of one of `subargs` (`tok`s), required.
pub const fn one_of(name: &'static CStr, subargs: &'static [Arg]) -> Arg {
    Arg {
        subargs,
        ..arg(name, Kind::OneOf)
    }
}

/// A repeated group of arguments (`name address weight ...`), at least one unless `optional`.
pub const fn block(name: &'static CStr, subargs: &'static [Arg], optional: bool) -> Arg {
    Arg {
        subargs,
        ..many(name, Kind::Block, optional)
    }
}

/// A command or a container's subcommand.
pub struct CommandSpec {
    /// The full name: `shard.genkey`, or `shard.ring|get` for a subcommand.
    pub name: &'static str,
    /// `None` for a container (its subcommands run).
    pub entry: Option<Entry>,
    pub flags: &'static CStr,
    pub arity: c_int,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub args: &'static [Arg],
    /// ACL categories where the server can set them for module commands (Redis 7.2 and later,
    /// Valkey). Chosen so that the common rules mean what a Redis user expects: whatever changes
    /// rings, runs or stops a resharding job, or moves the generator (`SHARD.ADVANCE`) is
    /// `admin dangerous slow` and nothing else, so `+@read`/`+@write` never reach it and
    /// `-@admin`/`-@dangerous` take it away. Servers give a module command only the categories
    /// set here (not those of its flags: `write` on CLEANUP puts it in no `@write`).
    pub acl: &'static CStr,
    pub subcommands: &'static [&'static CommandSpec],
}

/// A command's description, beside its handler:
///
/// ```ignore
/// pub static COMMAND: CommandSpec = command! {
///     name: "shard.genkey", handler: genkey, flags: "write deny-oom fast", arity: -1,
///     summary: "...", complexity: "O(1)", args: ARGS, acl: "write fast",
/// };
/// ```
///
/// A container names no handler and lists its subcommands (`subcommands: &[&SET, &GET]`).
#[macro_export]
macro_rules! command {
    (name: $name:literal, handler: $handler:path, flags: $flags:literal, arity: $arity:expr,
     summary: $summary:literal, complexity: $complexity:literal, args: $args:expr,
     acl: $acl:literal $(,)?) => {
        $crate::host::register::CommandSpec {
            name: $name,
            entry: Some($crate::command_fn!($name, $handler)),
            flags: $crate::host::register::c_str(concat!($flags, "\0")),
            arity: $arity,
            summary: $crate::host::register::c_str(concat!($summary, "\0")),
            complexity: $crate::host::register::c_str(concat!($complexity, "\0")),
            args: $args,
            acl: $crate::host::register::c_str(concat!($acl, "\0")),
            subcommands: &[],
        }
    };
    (name: $name:literal, container, summary: $summary:literal, subcommands: $subs:expr $(,)?) => {
        $crate::host::register::CommandSpec {
            name: $name,
            entry: None,
            flags: c"",
            arity: -2,
            summary: $crate::host::register::c_str(concat!($summary, "\0")),
            complexity: c"Depends on the subcommand",
            args: &[],
            acl: c"",
            subcommands: $subs,
        }
    };
}

/// A NUL-terminated literal as a `CStr`, at compile time (`command!`).
pub const fn c_str(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("not a NUL-terminated string without inner NUL"),
    }
}

/// Registers every command and subcommand of `table`, each with its documentation and ACL
/// categories; an error names the one that failed.
pub fn register_all(ctx: &Context, table: &[&CommandSpec]) -> Result<(), String> {
    // SAFETY: called from OnLoad, after the module API was initialised.
    let (create, get_command, create_sub) = unsafe {
        (
            raw::RedisModule_CreateCommand.ok_or("RedisModule_CreateCommand is missing")?,
            raw::RedisModule_GetCommand.ok_or("RedisModule_GetCommand is missing")?,
            raw::RedisModule_CreateSubcommand
                .ok_or("RedisModule_CreateSubcommand is missing: shard needs Redis 7.0 or later")?,
        )
    };
    let ok = raw::REDISMODULE_OK as c_int;
    for spec in table {
        let name_c = std::ffi::CString::new(spec.name).map_err(|e| e.to_string())?;
        // SAFETY: every pointer is a NUL-terminated string that outlives the call, or a valid
        // entry point.
        let status = unsafe {
            create(
                ctx.ctx,
                name_c.as_ptr(),
                spec.entry,
                spec.flags.as_ptr(),
                0,
                0,
                0,
            )
        };
        if status != ok {
            return Err(format!("failed to create command {}", spec.name));
        }
        // SAFETY: the command was just created under this name.
        let parent = unsafe { get_command(ctx.ctx, name_c.as_ptr()) };
        if parent.is_null() {
            return Err(format!("failed to find command {}", spec.name));
        }
        // SAFETY: parent is a command of this module.
        unsafe { describe(parent, spec)? };
        for sub in spec.subcommands {
            let short = sub.name.rsplit('|').next().unwrap_or(sub.name);
            let short_c = std::ffi::CString::new(short).map_err(|e| e.to_string())?;
            // SAFETY: parent is a live command of this module; strings outlive the call.
            let status = unsafe {
                create_sub(
                    parent,
                    short_c.as_ptr(),
                    sub.entry,
                    sub.flags.as_ptr(),
                    0,
                    0,
                    0,
                )
            };
            if status != ok {
                return Err(format!("failed to create subcommand {}", sub.name));
            }
            let full_c = std::ffi::CString::new(sub.name).map_err(|e| e.to_string())?;
            // SAFETY: the subcommand exists now under its full name.
            let sub_command = unsafe { get_command(ctx.ctx, full_c.as_ptr()) };
            if sub_command.is_null() {
                return Err(format!("failed to find subcommand {}", sub.name));
            }
            // SAFETY: sub_command is a command of this module.
            unsafe { describe(sub_command, sub)? };
        }
    }
    Ok(())
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
unsafe fn describe(
    command: *mut raw::RedisModuleCommand,
    spec: &CommandSpec,
) -> Result<(), String> {
    let name = spec.name;
    // SAFETY: the API table is filled at load and read-only after.
    let set_info = unsafe { raw::RedisModule_SetCommandInfo }
        .ok_or("RedisModule_SetCommandInfo is missing")?;
    let mut arena = ArgArena::default();
    let args = arena.build(spec.args);
    // SAFETY: plain data; unset fields are NULL.
    let mut info: raw::RedisModuleCommandInfo = unsafe { std::mem::zeroed() };
    info.version = &INFO_VERSION;
    info.summary = spec.summary.as_ptr();
    info.complexity = spec.complexity.as_ptr();
    info.since = c"0.1.0".as_ptr();
    info.arity = spec.arity;
    info.args = args;
    // SAFETY: `command` is ours; `info` and the arena live until Redis has copied them.
    if unsafe { set_info(command, &info) } != raw::REDISMODULE_OK as c_int {
        return Err(format!(
            "RedisModule_SetCommandInfo refused the documentation of {name}"
        ));
    }
    // SAFETY: as above; the categories are a 'static C string.
    unsafe {
        if let Some(set_acl) = raw::RedisModule_SetCommandACLCategories {
            if !spec.acl.is_empty()
                && set_acl(command, spec.acl.as_ptr()) != raw::REDISMODULE_OK as c_int
            {
                return Err(format!("the ACL categories of {name} were refused"));
            }
        }
    }
    Ok(())
}
