//! `SHARD.GENKEY [TYPE name|number] [COUNT n] [FORMAT f]`: issue time-sorted unique keys, in
//! the layout's default form or the one `FORMAT` names (`keys::format`).

use crate::clock;
use crate::command;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::{int_in, is, ArgList};
use crate::host::register::{opt, Arg, CommandSpec, Kind};
use crate::keys::{Format, KeyFormatter, Request};
use crate::state;

/// The most keys one call may ask for.
pub const MAX_COUNT: i64 = 100_000;

/// The options of one GENKEY call.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GenkeyOptions<'a> {
    pub key_type: Option<&'a [u8]>,
    pub count: Option<u64>,
    pub format: Option<Format>,
}

/// Reads `[TYPE name|number] [COUNT n] [FORMAT f]`.
pub fn parse<A: ArgList + ?Sized>(args: &A) -> Result<GenkeyOptions<'_>, CmdError> {
    let mut options = GenkeyOptions::default();
    let mut cursor = args.cursor(1);
    while let Some(arg) = cursor.next_arg() {
        if is(arg, "TYPE") && options.key_type.is_none() {
            options.key_type = Some(cursor.value_of("TYPE")?);
        } else if is(arg, "COUNT") && options.count.is_none() {
            let n = int_in(cursor.value_of("COUNT")?, "COUNT", 1, MAX_COUNT)?;
            options.count = Some(n.unsigned_abs());
        } else if is(arg, "FORMAT") && options.format.is_none() {
            let name = cursor.value_of("FORMAT")?;
            options.format =
                Some(Format::parse(name).ok_or_else(|| CmdError::err(Format::unknown(name)))?);
        } else if is(arg, "TYPE") || is(arg, "COUNT") || is(arg, "FORMAT") {
            return Err(CmdError::given_twice(arg));
        } else {
            return Err(CmdError::unknown_option("shard.genkey", arg));
        }
    }
    Ok(options)
}

pub fn genkey(call: &Call) -> CmdResult {
    let GenkeyOptions {
        key_type: type_arg,
        count,
        format,
    } = parse(&call.args)?;
    let now_ms = clock::now_ms()
        .ok_or_else(|| CmdError::err("the wall clock cannot be read, or reads before 1970"))?;
    let mut st = state::lock();
    let st = &mut *st;
    let keys = &st.keys;
    let key_type = match type_arg {
        Some(t) => keys.type_number(&keys.layout, t).map_err(CmdError::err)?,
        None => keys.layout.default_type(),
    };
    let format = match format {
        Some(f) => f.check(&keys.layout).map_err(CmdError::err)?,
        None => Format::default_for(&keys.layout, keys.encoding),
    };
    // The random source is made ready before any key is reserved: a failure issues nothing.
    let mut draw = match keys.layout.wide_form() {
        Some(_) => Some(st.entropy.ready().map_err(CmdError::err)?),
        None => None,
    };
    let request = Request {
        now_ms,
        count: count.unwrap_or(1),
        node: keys.node_id,
        key_type,
        max_drift_ms: keys.max_drift_ms,
    };
    let batch = st
        .generator
        .reserve(&keys.layout, &keys.shape, &request)
        .map_err(CmdError::err)?;
    // Replicas and the AOF need the mark once per tick, not once per call.
    let moved = st
        .generator
        .high_water_ms(&keys.layout)
        .filter(|m| Some(*m) != st.propagated_high_water);
    if let Some(mark) = moved {
        propagate_high_water(call, mark);
        st.propagated_high_water = Some(mark);
    }

    if count.is_some() {
        call.reply.array(batch.len());
    }
    let mut formatter = KeyFormatter::new();
    match draw.as_mut() {
        Some(draw) => {
            for fields in batch {
                call.reply
                    .bulk(formatter.issue(&keys.layout, format, &fields, draw));
            }
        }
        None => {
            for fields in batch {
                call.reply
                    .bulk(formatter.format_in(&keys.layout, format, &fields));
            }
        }
    }
    Ok(())
}

/// Propagates a new high-water mark to replicas and the AOF as `SHARD.ADVANCE ms`.
pub fn propagate_high_water(call: &Call, high_water_ms: i64) {
    crate::host::replicate::replicate_with_int(call.ctx, c"shard.advance", high_water_ms);
}

static ARGS: &[Arg] = &[
    opt(c"type", c"TYPE", Kind::Str),
    opt(c"count", c"COUNT", Kind::Int),
    opt(c"format", c"FORMAT", Kind::Str),
];

/// `SHARD.GENKEY`: how Redis registers and documents it.
pub static COMMAND: CommandSpec = command! {
    name: "shard.genkey",
    handler: genkey,
    flags: "write deny-oom fast",
    arity: -1,
    summary: "Issues time-sorted unique keys, drawn atomically in the server",
    complexity: "O(N) with N the COUNT, O(1) without",
    args: ARGS,
    acl: "write fast",
};
