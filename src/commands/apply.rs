//! `SHARD.APPLY NX|REPLACE key value expiry [key value expiry ...]`: writes many strings in
//! one command, each with its absolute expiry in Unix ms (0: none); `NX` skips a key already
//! there, `REPLACE` writes over it; a key whose expiry has passed is not written. Replies how
//! many were written.
//!
//! The copy's way in at its destination for strings (`reshard::copy_serialize`): the server
//! dispatches one command per batch instead of one `SET` per key, which is most of a small
//! `SET`'s cost at the destination (bench/findings.md, "The writes a destination applies
//! fastest"). Every expiry is read before anything is written, so bad input changes nothing.

use crate::command;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::is;
use crate::host::register::{arg, block, one_of, tok, Arg, CommandSpec, Kind};
use crate::host::strings::write_string_triples;

pub fn apply(call: &Call) -> CmdResult {
    let n = call.args.len();
    if n < 5 || !(n - 2).is_multiple_of(3) {
        return Err(CmdError::wrong_arity("shard.apply"));
    }
    let flag = call.args.get(1);
    let replace = if is(flag, "REPLACE") {
        true
    } else if is(flag, "NX") {
        false
    } else {
        return Err(CmdError::err(format!(
            "SHARD.APPLY takes NX or REPLACE first, not '{}'",
            crate::host::args::printable(flag)
        )));
    };
    let expiries = (2..n)
        .step_by(3)
        .map(|i| {
            let text = call.args.get(i + 2);
            std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse::<i64>().ok())
                .filter(|&at| at >= 0)
                .ok_or_else(|| {
                    CmdError::err(format!(
                        "the expiry of key '{}' is not a Unix time in ms (0 for none): '{}'",
                        crate::host::args::printable(call.args.get(i)),
                        crate::host::args::printable(text)
                    ))
                })
        })
        .collect::<Result<Vec<i64>, CmdError>>()?;
    let written = write_string_triples(call.ctx, &call.args, 2, &expiries, replace);
    call.reply.int(i64::try_from(written).unwrap_or(i64::MAX));
    Ok(())
}

static STRING: &[Arg] = &[
    arg(c"key", Kind::Str),
    arg(c"value", Kind::Str),
    arg(c"unix-time-milliseconds", Kind::UnixTime),
];

static ARGS: &[Arg] = &[
    one_of(
        c"condition",
        &[
            tok(c"nx", c"NX", Kind::Token),
            tok(c"replace", c"REPLACE", Kind::Token),
        ],
    ),
    block(c"string", STRING, false),
];

/// `SHARD.APPLY`: how Redis registers and documents it.
pub static COMMAND: CommandSpec = command! {
    name: "shard.apply",
    handler: apply,
    flags: "write deny-oom",
    arity: -5,
    summary: "Internal: writes many strings with their absolute expiries in one command, for a resharding copy's destination",
    complexity: "O(N) with N the number of strings",
    args: ARGS,
    acl: "write slow",
};
