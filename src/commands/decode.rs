//! `SHARD.DECODE key [LAYOUT name] [EPOCH ms] [FORMAT f]`: take a key apart. A key of the
//! tsid, uuidv7 or ulid layout (generated here or by any other program, in any of its forms)
//! gives its time, node, counter, random bits and canonical text (`reply_id`).

use crate::command;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::{is, printable, ArgList, Cursor};
use crate::host::register::{arg, opt, Arg, CommandSpec, Kind};
use crate::keys::settings::parse_epoch;
use crate::keys::{codec, shardjs, time, Format, Layout, LayoutKind, WideParts};
use crate::state;

/// Reads the `LAYOUT name`, `EPOCH ms` and `FORMAT f` options shared by DECODE and ENCODE.
#[derive(Default)]
pub struct LayoutOptions {
    pub kind: Option<LayoutKind>,
    pub epoch: Option<i64>,
    /// The form of the key read (DECODE) or written (ENCODE); checked against the layout later.
    pub format: Option<Format>,
}

impl LayoutOptions {
    /// Takes `arg` (and its value) if it is one of these options; `Ok(false)` otherwise.
    pub fn take<A: ArgList + ?Sized>(
        &mut self,
        arg: &[u8],
        cursor: &mut Cursor<'_, A>,
    ) -> Result<bool, CmdError> {
        if is(arg, "LAYOUT") && self.kind.is_none() {
            let name = cursor.value_of("LAYOUT")?;
            self.kind = Some(LayoutKind::parse(name).map_err(CmdError::err)?);
            Ok(true)
        } else if is(arg, "EPOCH") && self.epoch.is_none() {
            let value = cursor.value_of("EPOCH")?;
            let text = String::from_utf8_lossy(value);
            self.epoch = parse_epoch(&text).map_err(|e| CmdError::err(format!("EPOCH {e}")))?;
            if self.epoch.is_none() {
                return Err(CmdError::err(
                    "EPOCH must be unix milliseconds, got an empty value",
                ));
            }
            Ok(true)
        } else if is(arg, "FORMAT") && self.format.is_none() {
            let name = cursor.value_of("FORMAT")?;
            self.format =
                Some(Format::parse(name).ok_or_else(|| CmdError::err(Format::unknown(name)))?);
            Ok(true)
        } else if is(arg, "LAYOUT") || is(arg, "EPOCH") || is(arg, "FORMAT") {
            Err(CmdError::given_twice(arg))
        } else {
            Ok(false)
        }
    }
}

/// Reads `key [LAYOUT name] [EPOCH ms] [FORMAT f]`.
pub fn parse<A: ArgList + ?Sized>(args: &A) -> Result<(&[u8], LayoutOptions), CmdError> {
    if args.count() < 2 {
        return Err(CmdError::wrong_arity("shard.decode"));
    }
    let key = args.arg(1);
    let mut options = LayoutOptions::default();
    let mut cursor = args.cursor(2);
    while let Some(arg) = cursor.next_arg() {
        if !options.take(arg, &mut cursor)? {
            return Err(CmdError::unknown_option("shard.decode", arg));
        }
    }
    Ok((key, options))
}

pub fn decode(call: &Call) -> CmdResult {
    let (key, options) = parse(&call.args)?;

    let st = state::lock();
    let keys = &st.keys;
    let layout = keys
        .layout_for(options.kind.unwrap_or(keys.layout.kind), options.epoch)
        .map_err(CmdError::err)?;
    let format = options
        .format
        .map(|f| f.check(&layout))
        .transpose()
        .map_err(CmdError::err)?;
    let not_a_key = |e: codec::KeyError| {
        CmdError::err(format!(
            "'{}' is not a {} key: {e}",
            printable(key),
            layout.name()
        ))
    };
    let fields = codec::parse_as(&layout, keys.encoding, format, key).map_err(not_a_key)?;
    let time_ms = layout.time_ms(fields.tick);
    let iso = time::iso8601_ms(time_ms).ok_or_else(|| {
        CmdError::err(format!(
            "time {time_ms} of '{}' is out of range",
            printable(key)
        ))
    })?;
    if let Some(w) = layout.wide_form() {
        let value = w.read(key, format).map_err(not_a_key)?;
        let text = codec::format_wide(&w, value, Format::Text);
        let parts = w.parts(value);
        let random = hex(parts.random, w.random_bits());
        reply_id(
            call,
            &layout,
            time_ms,
            &iso,
            &parts,
            Some(&random),
            text.as_bytes(),
            None,
        );
        return Ok(());
    }
    if layout.kind == LayoutKind::Tsid {
        let text = codec::format_as(&layout, Format::Text, &fields);
        let decimal = codec::format_as(&layout, Format::Decimal, &fields);
        let parts = WideParts {
            ms: u64::try_from(time_ms).unwrap_or(0),
            node: fields.node,
            counter: Some(fields.seq),
            random: 0,
        };
        reply_id(
            call,
            &layout,
            time_ms,
            &iso,
            &parts,
            None,
            text.as_bytes(),
            Some(decimal.as_bytes()),
        );
        return Ok(());
    }
    let type_name = keys.types.name_of(fields.key_type);

    // Shardjs keys: the decimal form (toDecimalString) and a fixed key's suffix.
    let (decimal, suffix) = if layout.is_text() {
        let (_, suffix) = shardjs::split_suffix(key);
        (
            Some(shardjs::decimal(fields.tick, fields.seq, fields.key_type)),
            suffix,
        )
    } else {
        (None, None)
    };

    let reply = &call.reply;
    reply.map(9);
    reply.field_bulk("layout", layout.name().as_bytes());
    reply.field_int("time_ms", time_ms);
    reply.field_bulk("time", iso.as_bytes());
    reply.field_int("node", to_i64(layout.node_of(&fields)));
    reply.field_int("seq", to_i64(fields.seq));
    reply.field_int("type", to_i64(fields.key_type));
    reply.field_opt("type_name", type_name.map(str::as_bytes));
    reply.field_opt("decimal", decimal.as_deref().map(str::as_bytes));
    reply.field_opt("suffix", suffix);
    Ok(())
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `value`'s low `bits` bits in lowercase hex, one digit per 4 bits (rounded up).
fn hex(value: u128, bits: u32) -> String {
    let width = bits.div_ceil(4) as usize;
    format!("{value:0width$x}")
}

/// The reply for a tsid, uuidv7 or ulid ID: its layout, time, node, counter (`seq`, nil for
/// ulid), random bits in hex (nil for tsid), canonical text and decimal number (tsid only).
#[allow(clippy::too_many_arguments)]
fn reply_id(
    call: &Call,
    layout: &Layout,
    time_ms: i64,
    iso: &str,
    parts: &WideParts,
    random: Option<&str>,
    text: &[u8],
    decimal: Option<&[u8]>,
) {
    let reply = &call.reply;
    reply.map(8);
    reply.field_bulk("layout", layout.name().as_bytes());
    reply.field_int("time_ms", time_ms);
    reply.field_bulk("time", iso.as_bytes());
    reply.field_int("node", to_i64(parts.node));
    reply.field_opt_int("seq", parts.counter.map(to_i64));
    reply.field_opt("random", random.map(str::as_bytes));
    reply.field_bulk("text", text);
    reply.field_opt("decimal", decimal);
}

static ARGS: &[Arg] = &[
    arg(c"key", Kind::Str),
    opt(c"layout", c"LAYOUT", Kind::Str),
    opt(c"epoch", c"EPOCH", Kind::UnixTime),
    opt(c"format", c"FORMAT", Kind::Str),
];

/// `SHARD.DECODE`: how Redis registers and documents it.
pub static COMMAND: CommandSpec = command! {
    name: "shard.decode",
    handler: decode,
    flags: "readonly fast",
    arity: -2,
    summary: "Takes a key apart: time, node, sequence, type; a TSID, UUIDv7 or ULID's random bits and text",
    complexity: "O(1)",
    args: ARGS,
    acl: "read fast",
};
