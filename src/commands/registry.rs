//! The module's commands, as Redis registers them: each command's description
//! (`host::register::CommandSpec`: name, flags, arity, summary, complexity, arguments, ACL
//! categories) sits beside its handler, the containers `SHARD.RING` and `SHARD.RESHARD` beside
//! their subcommands' handlers; this file lists them all.

use crate::commands::{
    advance, apply, call, cluster, debug, decode, dump, emulate, encode, genkey, hotkeys, multi,
    outside, plain, reshard, ring, shardjs, txn, whereis,
};
use crate::host::register::CommandSpec;

/// Every command of the module.
pub fn table() -> [&'static CommandSpec; 31] {
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
        &hotkeys::COMMAND,
        &call::CALL,
        &cluster::CLUSTER,
        &cluster::REDIRECT,
        &emulate::EMULATE,
        &emulate::INFO,
        &outside::COMMAND,
        &plain::COMMAND,
        &plain::AUTHORISED,
        &debug::COMMAND,
        &dump::COMMAND,
        &apply::COMMAND,
        &advance::COMMAND,
        &ring::RING,
        &reshard::RESHARD,
        &txn::TXN,
        &txn::LOCKED,
        &multi::WATCH,
        &multi::UNWATCH,
        &multi::MULTI,
        &multi::DISCARD,
        &multi::EXEC,
    ]
}

/// Registers every command and subcommand; an error names the one that failed.
pub fn register_all(ctx: &redis_module::Context) -> Result<(), String> {
    crate::host::register::register_all(ctx, &table())
}
