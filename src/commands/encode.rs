//! `SHARD.ENCODE [LAYOUT name] [EPOCH ms] TIME unix-ms [NODE n] [SEQ s] [TYPE t]`: put a key
//! together from its fields, the inverse of DECODE.

use super::args::{int_in, is, printable, ArgList};
use super::decode::LayoutOptions;
use super::{Call, CmdError, CmdResult};
use crate::keys::{codec, KeyFields};
use crate::state;

/// The fields and options of one ENCODE call.
#[derive(Default)]
pub struct EncodeOptions<'a> {
    pub layout: LayoutOptions,
    pub time_ms: i64,
    pub node: Option<i64>,
    pub seq: Option<i64>,
    pub key_type: Option<&'a [u8]>,
}

/// Reads `[LAYOUT name] [EPOCH ms] TIME unix-ms [NODE n] [SEQ s] [TYPE t]`.
pub fn parse<A: ArgList + ?Sized>(args: &A) -> Result<EncodeOptions<'_>, CmdError> {
    let mut options = LayoutOptions::default();
    let (mut time, mut node, mut seq, mut type_arg) = (None, None, None, None);
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
        } else {
            return Err(CmdError::unknown_option("shard.encode", arg));
        };
        if slot.is_some() {
            return Err(CmdError::given_twice(arg));
        }
        *slot = Some(cursor.value_of(&printable(arg).to_ascii_uppercase())?);
    }
    let time = time.ok_or_else(|| CmdError::err("TIME unix-ms is required"))?;
    Ok(EncodeOptions {
        layout: options,
        time_ms: int_in(time, "TIME", 0, i64::MAX)?,
        node: node.map(|n| int_in(n, "NODE", 0, i64::MAX)).transpose()?,
        seq: seq.map(|s| int_in(s, "SEQ", 0, i64::MAX)).transpose()?,
        key_type: type_arg,
    })
}

pub fn encode(call: &Call) -> CmdResult {
    let EncodeOptions {
        layout: options,
        time_ms,
        node,
        seq,
        key_type: type_arg,
    } = parse(&call.args)?;

    let st = state::lock();
    let keys = &st.keys;
    let layout = keys
        .layout_for(options.kind.unwrap_or(keys.layout.kind), options.epoch)
        .map_err(CmdError::err)?;
    let tick = layout.tick_of(time_ms).map_err(CmdError::err)?;
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
    call.reply
        .bulk(codec::format(&layout, keys.encoding, &fields).as_bytes());
    Ok(())
}
