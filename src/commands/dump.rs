//! `SHARD.DUMP key`: a key's `DUMP` payload and its `PTTL`, read in one step, or nil when the
//! key is missing. Internal: SHARD.CALL's copy-before-write on a TLS fleet reads the key with
//! it from its previous owner and writes it to the new one with `RESTORE`, both over the
//! module's own (TLS) connections, where `MIGRATE` would open the server's own connection
//! (plain TCP unless the server has `tls-cluster yes`, and never checking the peer's name).

use crate::command;
use crate::host::register::{arg, Arg, CommandSpec, Kind};
use redis_module::RedisValue;

use crate::commands::{Call, CmdError, CmdResult};

pub fn dump(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.dump"));
    }
    let key = call.args.get(1);
    let failed =
        |what: &str, e: redis_module::RedisError| CmdError::err(format!("{what} failed: {e}"));
    let payload = match call
        .ctx
        .call("DUMP", &[key])
        .map_err(|e| failed("DUMP", e))?
    {
        // A payload that happens to be valid UTF-8 comes back as a "simple string": every
        // string form is the payload, and only a null reply means the key is missing.
        RedisValue::StringBuffer(b) => b,
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s.into_bytes(),
        RedisValue::BulkRedisString(s) => s.as_slice().to_vec(),
        RedisValue::Null => {
            call.reply.null();
            return Ok(());
        }
        other => {
            return Err(CmdError::err(format!(
                "DUMP gave an unexpected reply: {other:?}"
            )))
        }
    };
    let pttl = match call
        .ctx
        .call("PTTL", &[key])
        .map_err(|e| failed("PTTL", e))?
    {
        RedisValue::Integer(n) => n,
        _ => -1,
    };
    call.reply.array(2);
    call.reply.bulk(&payload);
    call.reply.int(pttl);
    Ok(())
}

static ARGS: &[Arg] = &[arg(c"key", Kind::Str)];

/// `SHARD.DUMP`: how Redis registers and documents it.
pub static COMMAND: CommandSpec = command! {
    name: "shard.dump",
    handler: dump,
    flags: "readonly",
    arity: 2,
    summary: "Internal: a key's DUMP payload and PTTL in one step, for the copy-before-write of SHARD.CALL over TLS",
    complexity: "O(1) to access the key and additional O(N*M) to serialize it",
    args: ARGS,
    acl: "read slow",
};
