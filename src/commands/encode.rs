//! `SHARD.ENCODE [LAYOUT name] [EPOCH ms] TIME unix-ms|OFFSET ms [NODE n] [SEQ s] [TYPE t]
//! [SUFFIX s] [RANDOM hex] [FORMAT f]`: put a key together from its fields, the inverse of
//! DECODE. In the shardjs layout `OFFSET` (Shardjs's `ts`, milliseconds from the epoch) or
//! `SUFFIX` make Shardjs's fixed key (`fixedKey`): every field padded to two characters, then
//! `-suffix`. In the uuidv7 and ulid layouts `RANDOM` gives the random bits (0 when left out,
//! so `SHARD.ENCODE LAYOUT uuidv7 TIME t` is the smallest ID of millisecond t: a bound for a
//! range query); `SEQ` is uuidv7's counter (ulid has none apart from its randomness).

use crate::command;
use crate::commands::decode::LayoutOptions;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::{int_in, is, printable, ArgList};
use crate::host::register::{one_of, opt, tok, Arg, CommandSpec, Kind};
use crate::keys::{codec, shardjs, Format, KeyFields, WideParts};
use crate::state;

/// The fields and options of one ENCODE call.
#[derive(Default)]
pub struct EncodeOptions<'a> {
    pub layout: LayoutOptions,
    /// Unix ms (`TIME`), or milliseconds from the epoch (`OFFSET`).
    pub time_ms: i64,
    pub offset: bool,
    pub suffix: Option<&'a [u8]>,
    pub node: Option<i64>,
    pub seq: Option<i64>,
    pub key_type: Option<&'a [u8]>,
    pub random: Option<u128>,
}

/// A `RANDOM` value: 1 to 32 hex digits.
fn random_arg(arg: &[u8]) -> Result<u128, CmdError> {
    let bad = || {
        CmdError::err(format!(
            "RANDOM must be 1 to 32 hex digits, got '{}'",
            printable(arg)
        ))
    };
    if arg.is_empty() || arg.len() > 32 {
        return Err(bad());
    }
    arg.iter().try_fold(0u128, |acc, &c| {
        let d = char::from(c).to_digit(16).ok_or_else(bad)?;
        Ok((acc << 4) | u128::from(d))
    })
}

/// Reads `[LAYOUT name] [EPOCH ms] TIME unix-ms [NODE n] [SEQ s] [TYPE t]`.
pub fn parse<A: ArgList + ?Sized>(args: &A) -> Result<EncodeOptions<'_>, CmdError> {
    let mut options = LayoutOptions::default();
    let (mut time, mut node, mut seq, mut type_arg) = (None, None, None, None);
    let (mut offset, mut suffix, mut random) = (None, None, None);
    let mut cursor = args.cursor(1);
    while let Some(arg) = cursor.next_arg() {
        if options.take(arg, &mut cursor)? {
            continue;
        }
        let slot = if is(arg, "TIME") {
            &mut time
        } else if is(arg, "NODE") {
            &mut node
        } else if is(arg, "SEQ") {
            &mut seq
        } else if is(arg, "TYPE") {
            &mut type_arg
        } else if is(arg, "OFFSET") {
            &mut offset
        } else if is(arg, "SUFFIX") {
            &mut suffix
        } else if is(arg, "RANDOM") {
            &mut random
        } else {
            return Err(CmdError::unknown_option("shard.encode", arg));
        };
        if slot.is_some() {
            return Err(CmdError::given_twice(arg));
        }
        *slot = Some(cursor.value_of(&printable(arg).to_ascii_uppercase())?);
    }
    let (time_ms, is_offset) = match (time, offset) {
        (Some(t), None) => (int_in(t, "TIME", 0, i64::MAX)?, false),
        (None, Some(o)) => (int_in(o, "OFFSET", 0, i64::MAX)?, true),
        (Some(_), Some(_)) => return Err(CmdError::err("give TIME or OFFSET, not both")),
        (None, None) => return Err(CmdError::err("TIME unix-ms (or OFFSET ms) is required")),
    };
    Ok(EncodeOptions {
        layout: options,
        time_ms,
        offset: is_offset,
        suffix,
        node: node.map(|n| int_in(n, "NODE", 0, i64::MAX)).transpose()?,
        seq: seq.map(|s| int_in(s, "SEQ", 0, i64::MAX)).transpose()?,
        key_type: type_arg,
        random: random.map(random_arg).transpose()?,
    })
}

pub fn encode(call: &Call) -> CmdResult {
    let EncodeOptions {
        layout: options,
        time_ms,
        offset,
        suffix,
        node,
        seq,
        key_type: type_arg,
        random,
    } = parse(&call.args)?;

    let st = state::lock();
    let keys = &st.keys;
    let layout = keys
        .layout_for(options.kind.unwrap_or(keys.layout.kind), options.epoch)
        .map_err(CmdError::err)?;
    let format = match options.format {
        Some(f) => f.check(&layout).map_err(CmdError::err)?,
        None => Format::default_for(&layout, keys.encoding),
    };
    let fixed = offset || suffix.is_some();
    if fixed && !layout.is_text() {
        return Err(CmdError::err(
            "OFFSET and SUFFIX make Shardjs's fixed keys: the shardjs layout only",
        ));
    }
    let unix_ms = if offset {
        layout
            .epoch_ms
            .checked_add(time_ms)
            .ok_or_else(|| CmdError::err("OFFSET is out of range"))?
    } else {
        time_ms
    };
    let tick = layout.tick_of(unix_ms).map_err(CmdError::err)?;
    if let Some(w) = layout.wide_form() {
        if type_arg.is_some() {
            return Err(CmdError::err(format!(
                "layout {} has no type field; TYPE needs a layout with one",
                layout.name()
            )));
        }
        if seq.is_some() && w.kind == crate::keys::wide::WideKind::Ulid {
            return Err(CmdError::err(
                "a ulid has no counter apart from its randomness: give RANDOM (hex) instead of SEQ",
            ));
        }
        let parts = WideParts {
            ms: tick,
            node: node.map_or(0, i64::unsigned_abs),
            counter: seq.map(i64::unsigned_abs),
            random: random.unwrap_or(0),
        };
        let value = w.build(&parts).map_err(CmdError::err)?;
        call.reply
            .bulk(codec::format_wide(&w, value, format).as_bytes());
        return Ok(());
    }
    if random.is_some() {
        return Err(CmdError::err(
            "RANDOM gives the random bits of the uuidv7 and ulid layouts only",
        ));
    }
    let mut fields = KeyFields {
        tick,
        node: 0,
        key_type: match type_arg {
            Some(t) => keys.type_number(&layout, t).map_err(CmdError::err)?,
            None => layout.default_type(),
        },
        seq: seq.map_or(0, i64::unsigned_abs),
    };
    fields.node = match node {
        Some(n) => n.unsigned_abs(),
        None => layout.node_of(&fields),
    };
    layout.validate(&fields).map_err(CmdError::err)?;
    if fixed {
        let key = shardjs::fixed_key(fields.tick, fields.seq, fields.key_type, suffix);
        call.reply.bulk(&key);
        return Ok(());
    }
    call.reply
        .bulk(codec::format_as(&layout, format, &fields).as_bytes());
    Ok(())
}

static ARGS: &[Arg] = &[
    opt(c"layout", c"LAYOUT", Kind::Str),
    opt(c"epoch", c"EPOCH", Kind::UnixTime),
    one_of(
        c"when",
        &[
            tok(c"time", c"TIME", Kind::UnixTime),
            tok(c"offset", c"OFFSET", Kind::Int),
        ],
    ),
    opt(c"node", c"NODE", Kind::Int),
    opt(c"seq", c"SEQ", Kind::Int),
    opt(c"type", c"TYPE", Kind::Str),
    opt(c"suffix", c"SUFFIX", Kind::Str),
    opt(c"random", c"RANDOM", Kind::Str),
    opt(c"format", c"FORMAT", Kind::Str),
];

/// `SHARD.ENCODE`: how Redis registers and documents it.
pub static COMMAND: CommandSpec = command! {
    name: "shard.encode",
    handler: encode,
    flags: "readonly fast",
    arity: -1,
    summary: "Puts a key together from its fields",
    complexity: "O(1)",
    args: ARGS,
    acl: "read fast",
};
