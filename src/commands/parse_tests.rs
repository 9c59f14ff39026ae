// Compiled only under #[cfg(test)], as declared in mod.rs.
//! Option parsing of every command, on plain byte slices (no server needed).

use crate::commands::{decode, encode, genkey, reshard, ring};
use crate::host::args::ArgList;

fn args(words: &[&str]) -> Vec<&'static [u8]> {
    words
        .iter()
        .map(|w| &*Box::leak(w.as_bytes().to_vec().into_boxed_slice()))
        .collect()
}

fn list<'v>(v: &'v [&'static [u8]]) -> &'v [&'static [u8]] {
    v
}

#[test]
fn genkey_options() {
    let a = args(&["shard.genkey", "count", "5", "TYPE", "user"]);
    let o = genkey::parse(list(&a)).unwrap();
    assert_eq!((o.count, o.key_type), (Some(5), Some(&b"user"[..])));
    for bad in [
        &["g", "COUNT"][..],
        &["g", "COUNT", "0"],
        &["g", "COUNT", "1", "COUNT", "2"],
        &["g", "X"],
    ] {
        assert!(genkey::parse(list(&args(bad))).is_err(), "{bad:?}");
    }
}

#[test]
fn decode_and_encode_options() {
    let a = args(&["shard.decode", "123", "LAYOUT", "sonyflake", "EPOCH", "5"]);
    let (key, o) = decode::parse(list(&a)).unwrap();
    assert_eq!((key, o.epoch), (&b"123"[..], Some(5)));
    assert!(decode::parse(list(&args(&["shard.decode"]))).is_err());
    let words = args(&["e", "TIME", "7", "NODE", "1", "SEQ", "2", "TYPE", "u"]);
    let e = encode::parse(list(&words)).unwrap();
    assert_eq!(
        (e.time_ms, e.node, e.seq, e.key_type),
        (7, Some(1), Some(2), Some(&b"u"[..]))
    );
    assert!(encode::parse(list(&args(&["e", "NODE", "1"]))).is_err());
}

#[test]
fn ring_and_reshard_options() {
    let a = args(&[
        "shard.ring",
        "set",
        "ketama",
        "HASHTAG",
        "cluster",
        "a",
        "h:1",
        "1",
    ]);
    let spec = ring::parse_spec(list(&a), "shard.ring|set").unwrap();
    assert_eq!(spec.nodes.len(), 1);
    assert!(ring::parse_spec(list(&args(&["r", "set", "cluster", "a", "h:1", "1"])), "x").is_err());
    let c = reshard::parse_copy(list(&args(&["r", "copy", "BATCH", "7", "REPLACE"]))).unwrap();
    assert_eq!((c.batch, c.replace), (7, true));
    assert_eq!(
        reshard::parse_cleanup(list(&args(&["r", "cleanup"]))).unwrap(),
        (100, false)
    );
    assert_eq!(
        reshard::parse_cleanup(list(&args(&["r", "cleanup", "LEFT", "BATCH", "5"]))).unwrap(),
        (5, true)
    );
    assert!(reshard::parse_copy(list(&args(&["r", "copy", "TIMEOUT", "0"]))).is_err());
}

#[test]
fn slices_are_arg_lists() {
    let a = args(&["x", "y"]);
    let l: &[&[u8]] = list(&a);
    assert_eq!((l.count(), l.arg(1), l.arg(9)), (2, &b"y"[..], &b""[..]));
}
