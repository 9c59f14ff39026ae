//! The argument parsing of every command, on argument lists made by splitting the input on
//! 0x00: SHARD.GENKEY, SHARD.DECODE, SHARD.ENCODE, SHARD.RING SET/BEGIN (`parse_spec`),
//! SHARD.RESHARD COPY/CLEANUP, SHARD.CALL's command kind, and the shared helpers (`int_in`,
//! `printable`); then, on what parses, the pure work the handlers do next (under three
//! configurations). Checks: no panic; error replies start with an error code; what ENCODE
//! writes, DECODE reads back to the same fields; options stay in their documented ranges.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use shard::host::args::{int_in, printable, ArgList};
use shard::commands::{decode, encode, genkey, reshard, ring};
use shard::host::error::CmdError;
use shard::keys::{codec, time, KeyConfig, KeyFields, KeySettings};
use shard::route::steps::CommandKind;
use shard_fuzz::{build_bounded, check_locate, split_args};

fn settings() -> &'static [KeySettings] {
    static S: OnceLock<Vec<KeySettings>> = OnceLock::new();
    S.get_or_init(|| {
        let base = KeyConfig::default();
        let configs = [
            base.clone(),
            KeyConfig {
                layout: "shardjs".into(),
                node_count: 4,
                node_id: 3,
                encoding: "base62".into(),
                types: "user:2 group:3 zz:3843".into(),
                ..base.clone()
            },
            KeyConfig {
                layout: "custom".into(),
                custom_layout: "time:30 type:8 seq:10 node:5 unit:10".into(),
                epoch: "1600000000000".into(),
                encoding: "base62".into(),
                types: "user:2 comment:255".into(),
                ..base
            },
        ];
        configs
            .iter()
            .map(|c| KeySettings::resolve(c).expect("fuzz configuration"))
            .collect()
    })
}

fn check_error(e: &CmdError) {
    let m = e.message();
    let code = m.split(' ').next().unwrap_or("");
    assert!(
        !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()),
        "error reply without a code: {m:?}"
    );
}

fn ok_or_check<T>(r: Result<T, CmdError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            check_error(&e);
            None
        }
    }
}

fn genkey(args: &[&[u8]]) {
    let Some(o) = ok_or_check(genkey::parse(args)) else {
        return;
    };
    if let Some(c) = o.count {
        assert!((1..=genkey::MAX_COUNT as u64).contains(&c));
    }
    for s in settings() {
        if let Some(t) = o.key_type {
            let _ = s.type_number(&s.layout, t);
        }
    }
}

fn decode(args: &[&[u8]]) {
    let Some((key, o)) = ok_or_check(decode::parse(args)) else {
        return;
    };
    for s in settings() {
        let Ok(layout) = s.layout_for(o.kind.unwrap_or(s.layout.kind), o.epoch) else {
            continue;
        };
        let Ok(fields) = codec::parse(&layout, s.encoding, key) else {
            continue;
        };
        let ms = layout.time_ms(fields.tick);
        let _ = time::iso8601_ms(ms);
        let _ = (s.types.name_of(fields.key_type), layout.node_of(&fields));
    }
}

fn encode(args: &[&[u8]]) {
    let Some(o) = ok_or_check(encode::parse(args)) else {
        return;
    };
    assert!(o.time_ms >= 0 && o.node.unwrap_or(0) >= 0 && o.seq.unwrap_or(0) >= 0);
    for s in settings() {
        let Ok(layout) = s.layout_for(o.layout.kind.unwrap_or(s.layout.kind), o.layout.epoch)
        else {
            continue;
        };
        let Ok(tick) = layout.tick_of(o.time_ms) else {
            continue;
        };
        let key_type = match o.key_type {
            Some(t) => match s.type_number(&layout, t) {
                Ok(n) => n,
                Err(_) => continue,
            },
            None => layout.default_type(),
        };
        let mut fields = KeyFields {
            tick,
            node: 0,
            key_type,
            seq: o.seq.map_or(0, i64::unsigned_abs),
        };
        fields.node = match o.node {
            Some(n) => n.unsigned_abs(),
            None => layout.node_of(&fields),
        };
        if layout.validate(&fields).is_err() {
            continue;
        }
        let text = codec::format(&layout, s.encoding, &fields);
        let back = codec::parse(&layout, s.encoding, text.as_bytes())
            .unwrap_or_else(|e| panic!("ENCODE wrote {text:?}, DECODE says {e}"));
        assert_eq!(back, fields, "ENCODE/DECODE round trip of {text:?}");
    }
}

fn ring(args: &[&[u8]]) {
    for command in ["shard.ring|set", "shard.ring|begin"] {
        let Some(spec) = ok_or_check(ring::parse_spec(args, command)) else {
            continue;
        };
        if let Some(Ok(r)) = build_bounded(&spec) {
            for key in args.iter().take(4) {
                check_locate(&r, key);
            }
        }
    }
}

fn reshard(args: &[&[u8]]) {
    if let Some(c) = ok_or_check(reshard::parse_copy(args)) {
        assert!((1..=10_000).contains(&c.batch) && (1..=600_000).contains(&c.timeout_ms));
    }
    if let Some((b, _left)) = ok_or_check(reshard::parse_cleanup(args)) {
        assert!((1..=10_000).contains(&b));
    }
}

fuzz_target!(|data: &[u8]| {
    let args = split_args(data);
    let args: &[&[u8]] = &args;
    genkey(args);
    decode(args);
    encode(args);
    ring(args);
    reshard(args);
    let _ = CommandKind::of(args.arg(1), data.len().is_multiple_of(2));
    for (i, a) in args.iter().enumerate().take(8) {
        let (min, max) = match i % 4 {
            0 => (1, genkey::MAX_COUNT),
            1 => (0, i64::MAX),
            2 => (i64::MIN, i64::MAX),
            _ => (-5, 5),
        };
        match int_in(a, "N", min, max) {
            Ok(n) => assert!((min..=max).contains(&n)),
            Err(e) => check_error(&e),
        }
        let p = printable(a);
        assert!(!p.chars().any(char::is_control));
    }
});
