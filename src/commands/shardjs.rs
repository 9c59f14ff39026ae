//! Shardjs's calls as commands: `SHARD.SPECIALKEY name` (its special keys), `SHARD.RETYPE key
//! type` (`changeKeyType`), `SHARD.MINIFY field ...` and `SHARD.MAXIFY field ...` (the field
//! dictionary, for clients that talk to a key's owner directly).

use crate::command;
use crate::commands::{Call, CmdError, CmdResult};
use crate::host::args::printable;
use crate::host::register::{arg, many, Arg, CommandSpec, Kind};
use crate::keys::{codec, shardjs};
use crate::route::fields;
use crate::state;

/// `SHARD.SPECIALKEY name`: the fixed key of a special key of the configuration.
pub fn special_key(call: &Call) -> CmdResult {
    if call.args.len() != 2 {
        return Err(CmdError::wrong_arity("shard.specialkey"));
    }
    let name = call.args.get(1);
    let st = state::lock();
    let keys = shardjs::parse_special_keys(&st.config.special_keys).map_err(CmdError::err)?;
    let Some(k) = keys.iter().find(|k| k.name.as_bytes() == name) else {
        let known: Vec<&str> = keys.iter().map(|k| k.name.as_str()).collect();
        return Err(CmdError::err(format!(
            "no special key '{}'; the special-keys configuration names {}",
            printable(name),
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    };
    let key_type = state::special_key_type(&st.keys, &k.key_type).map_err(CmdError::err)?;
    call.reply.bulk(&shardjs::fixed_key(
        k.offset,
        0,
        key_type,
        Some(k.name.as_bytes()),
    ));
    Ok(())
}

/// `SHARD.RETYPE key type`: the same key with another type (a name of `types`, or a number).
pub fn retype(call: &Call) -> CmdResult {
    if call.args.len() != 3 {
        return Err(CmdError::wrong_arity("shard.retype"));
    }
    let (key, type_arg) = (call.args.get(1), call.args.get(2));
    let st = state::lock();
    let keys = &st.keys;
    let layout = &keys.layout;
    if layout.max_type().is_none_or(|max| max == 0) {
        return Err(CmdError::err(format!(
            "the {} layout has no type field: a key's type cannot change",
            layout.name()
        )));
    }
    let mut fields = codec::parse(layout, keys.encoding, key).map_err(|e| {
        CmdError::err(format!(
            "'{}' is not a {} key: {e}",
            printable(key),
            layout.name()
        ))
    })?;
    let key_type = keys.type_number(layout, type_arg).map_err(CmdError::err)?;
    if layout.is_text() {
        let out = shardjs::retype(key, key_type)
            .ok_or_else(|| CmdError::err("the type does not fit a shardjs key"))?;
        call.reply.bulk(&out);
        return Ok(());
    }
    fields.key_type = key_type;
    layout.validate(&fields).map_err(CmdError::err)?;
    call.reply
        .bulk(codec::format(layout, keys.encoding, &fields).as_bytes());
    Ok(())
}

/// `SHARD.MINIFY field ...`: the stored names of the fields.
pub fn minify(call: &Call) -> CmdResult {
    translate(call, "shard.minify", fields::FieldDict::minify)
}

/// `SHARD.MAXIFY field ...`: the names clients see for stored fields.
pub fn maxify(call: &Call) -> CmdResult {
    translate(call, "shard.maxify", fields::FieldDict::maxify)
}

fn translate(
    call: &Call,
    command: &str,
    how: for<'a> fn(&'a fields::FieldDict, &'a [u8]) -> &'a [u8],
) -> CmdResult {
    if call.args.len() < 2 {
        return Err(CmdError::wrong_arity(command));
    }
    let dict = fields::current().unwrap_or_default();
    call.reply.array(call.args.len() - 1);
    for i in 1..call.args.len() {
        call.reply.bulk(how(dict.as_ref(), call.args.get(i)));
    }
    Ok(())
}

static NAME_ARGS: &[Arg] = &[arg(c"name", Kind::Str)];

static RETYPE_ARGS: &[Arg] = &[arg(c"key", Kind::Str), arg(c"type", Kind::Str)];

static FIELDS_ARGS: &[Arg] = &[many(c"field", Kind::Str, false)];

/// `SHARD.SPECIALKEY`: how Redis registers and documents it.
pub static SPECIALKEY: CommandSpec = command! {
    name: "shard.specialkey",
    handler: special_key,
    flags: "readonly fast",
    arity: 2,
    summary: "The fixed key of a special key of the special-keys configuration (Shardjs)",
    complexity: "O(N) with N the special keys",
    args: NAME_ARGS,
    acl: "read fast",
};

/// `SHARD.RETYPE`: how Redis registers and documents it.
pub static RETYPE: CommandSpec = command! {
    name: "shard.retype",
    handler: retype,
    flags: "readonly fast",
    arity: 3,
    summary: "The same key with another type (Shardjs's changeKeyType)",
    complexity: "O(1)",
    args: RETYPE_ARGS,
    acl: "read fast",
};

/// `SHARD.MINIFY`: how Redis registers and documents it.
pub static MINIFY: CommandSpec = command! {
    name: "shard.minify",
    handler: minify,
    flags: "readonly fast",
    arity: -2,
    summary: "The stored (short) names of hash fields, from the fields dictionary",
    complexity: "O(N) with N the fields",
    args: FIELDS_ARGS,
    acl: "read fast",
};

/// `SHARD.MAXIFY`: how Redis registers and documents it.
pub static MAXIFY: CommandSpec = command! {
    name: "shard.maxify",
    handler: maxify,
    flags: "readonly fast",
    arity: -2,
    summary: "The names clients see for stored hash fields, from the fields dictionary",
    complexity: "O(N) with N the fields",
    args: FIELDS_ARGS,
    acl: "read fast",
};
