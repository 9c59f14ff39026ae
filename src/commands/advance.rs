//! `SHARD.ADVANCE ms`: a master's (or the AOF's) high-water mark, as SHARD.GENKEY propagates
//! it (`genkey::propagate_high_water`).

use crate::command;
use crate::host::register::{arg, Arg, CommandSpec, Kind};
use redis_module::ContextFlags;

use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::int_in;
use crate::state;

/// `SHARD.ADVANCE ms`: applies a master's (or the AOF's) high-water mark. Internal: refused
/// from ordinary clients, who could otherwise push the generator ahead of the clock.
pub fn advance(call: &Call) -> CmdResult {
    let flags = call.ctx.get_flags();
    if !flags.contains(ContextFlags::REPLICATED) && !flags.contains(ContextFlags::LOADING) {
        return Err(CmdError::err(
            "shard.advance is internal: it carries the generator's high-water mark from a master or the AOF",
        ));
    }
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.advance"));
    }
    let ms = int_in(call.args.get(1), "the high-water mark", 0, i64::MAX)?;
    let mut st = state::lock();
    let st = &mut *st;
    st.generator.advance_past_ms(&st.keys.layout, ms);
    // On a replica, replayed from its primary's stream: passed on to its own AOF, which a
    // module command that changes no key reaches only by replicating itself (a restart of
    // the replica from its AOF then keeps the mark).
    if !flags.contains(ContextFlags::LOADING) {
        call.ctx.replicate_verbatim();
    }
    call.reply.ok();
    Ok(())
}

static ARGS: &[Arg] = &[arg(c"high-water-ms", Kind::UnixTime)];

/// `SHARD.ADVANCE`: how Redis registers and documents it.
pub static COMMAND: CommandSpec = command! {
    name: "shard.advance",
    handler: advance,
    flags: "write",
    arity: 2,
    summary: "Internal: carries the generator's high-water mark to replicas and the AOF",
    complexity: "O(1)",
    args: ARGS,
    acl: "admin dangerous slow",
};
