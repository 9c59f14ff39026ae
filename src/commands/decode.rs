//! `SHARD.DECODE key [LAYOUT name] [EPOCH ms]`: take a key apart.

use crate::command;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::{is, printable, ArgList, Cursor};
use crate::host::register::{arg, opt, Arg, CommandSpec, Kind};
use crate::keys::settings::parse_epoch;
use crate::keys::{codec, shardjs, time, LayoutKind};
use crate::state;

/// Reads the `LAYOUT name` and `EPOCH ms` options shared by DECODE and ENCODE.
#[derive(Default)]
pub struct LayoutOptions {
    pub kind: Option<LayoutKind>,
    pub epoch: Option<i64>,
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
        } else if is(arg, "LAYOUT") || is(arg, "EPOCH") {
            Err(CmdError::given_twice(arg))
        } else {
            Ok(false)
        }
    }
}

/// Reads `key [LAYOUT name] [EPOCH ms]`.
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
    let fields = codec::parse(&layout, keys.encoding, key).map_err(|e| {
        CmdError::err(format!(
            "'{}' is not a {} key: {e}",
            printable(key),
            layout.name()
        ))
    })?;
    let time_ms = layout.time_ms(fields.tick);
    let iso = time::iso8601_ms(time_ms).ok_or_else(|| {
        CmdError::err(format!(
            "time {time_ms} of '{}' is out of range",
            printable(key)
        ))
    })?;
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

static ARGS: &[Arg] = &[
    arg(c"key", Kind::Str),
    opt(c"layout", c"LAYOUT", Kind::Str),
    opt(c"epoch", c"EPOCH", Kind::UnixTime),
];

/// `SHARD.DECODE`: how Redis registers and documents it.
pub static COMMAND: CommandSpec = command! {
    name: "shard.decode",
    handler: decode,
    flags: "readonly fast",
    arity: -2,
    summary: "Takes a key apart: time, node, sequence, type",
    complexity: "O(1)",
    args: ARGS,
    acl: "read fast",
};
