//! `SHARD.GENKEY [TYPE name|number] [COUNT n] [FORMAT f] [LAYOUT name]`: issue time-sorted
//! unique keys of the configured layout (or of the one `LAYOUT` names, from a generator of its
//! own that shares the high-water mark: `keys::generators`), in the layout's default form or
//! the one `FORMAT` names (`keys::format`).

use crate::clock;
use crate::command;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::{int_in, is, ArgList};
use crate::host::register::{opt, Arg, CommandSpec, Kind};
use crate::keys::{Format, KeyFormatter, LayoutKind, Request, Shape};
use crate::state;

/// The most keys one call may ask for.
pub const MAX_COUNT: i64 = 100_000;

/// The options of one GENKEY call.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GenkeyOptions<'a> {
    pub key_type: Option<&'a [u8]>,
    pub count: Option<u64>,
    pub format: Option<Format>,
    pub layout: Option<LayoutKind>,
}

/// Reads `[TYPE name|number] [COUNT n] [FORMAT f] [LAYOUT name]`.
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
        } else if is(arg, "LAYOUT") && options.layout.is_none() {
            let name = cursor.value_of("LAYOUT")?;
            options.layout = Some(LayoutKind::parse(name).map_err(CmdError::err)?);
        } else if is(arg, "TYPE") || is(arg, "COUNT") || is(arg, "FORMAT") || is(arg, "LAYOUT") {
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
        layout: layout_kind,
    } = parse(&call.args)?;
    // The server's own reading of the clock for this command, or one of ours reused for a few
    // calls (a clock read costs a pipelined GENKEY 8 % on a virtual machine: host::time).
    let now_ms = crate::host::time::now_ms(clock::now_ms)
        .ok_or_else(|| CmdError::err("the wall clock cannot be read, or reads before 1970"))?;
    let mut st = state::lock();
    let st = &mut *st;
    let keys = &st.keys;
    // LAYOUT of another kind than the configured one: that layout (with its own epoch), the
    // configured node id, and a generator of its own (`keys::generators`).
    let other = match layout_kind.filter(|k| *k != keys.layout.kind) {
        Some(kind) => {
            let l = keys.layout_for(kind, None).map_err(CmdError::err)?;
            if keys.node_id > l.max_node() {
                return Err(CmdError::err(format!(
                    "node-id {} does not fit layout {} (0 to {})",
                    keys.node_id,
                    l.name(),
                    l.max_node()
                )));
            }
            let shape = Shape::of(&l, keys.node_id);
            Some((l, shape))
        }
        None => None,
    };
    let (layout, shape) = match &other {
        Some((l, shape)) => (l, shape),
        None => (&keys.layout, &keys.shape),
    };
    let key_type = match type_arg {
        Some(t) => keys.type_number(layout, t).map_err(CmdError::err)?,
        None => layout.default_type(),
    };
    let format = match format {
        Some(f) => f.check(layout).map_err(CmdError::err)?,
        None => Format::default_for(layout, keys.encoding),
    };
    // The random source is made ready before any key is reserved: a failure issues nothing.
    let mut draw = match layout.wide_form() {
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
        .reserve(&keys.layout, layout, shape, &request)
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
                    .bulk(formatter.issue(layout, format, &fields, draw));
            }
        }
        None => {
            for fields in batch {
                call.reply
                    .bulk(formatter.format_in(layout, format, &fields));
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
    opt(c"layout", c"LAYOUT", Kind::Str),
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
