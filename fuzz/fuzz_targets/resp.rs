//! The RESP2/RESP3 reply reader (`route::read_reply`) that SHARD.CALL and the resharding jobs
//! use on other servers' replies, on arbitrary bytes. Checks: no panic, no runaway allocation
//! (libFuzzer's malloc limit); a command encoded by `encode_command` reads back as an array of
//! the same bulk strings.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shard::route::{encode_command, read_reply, Resp};
use shard_fuzz::split_args;

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    for _ in 0..32 {
        let before = r.len();
        match read_reply(&mut r) {
            Ok(reply) => {
                let _ = (reply.as_int(), reply.is_error());
                assert!(r.len() < before, "a reply consumed nothing");
            }
            Err(_) => break,
        }
    }
    let args = split_args(data);
    let wire = encode_command(&args);
    let back = read_reply(&mut &wire[..]).expect("an encoded command must read back");
    let expected = Resp::Array(args.iter().map(|a| Resp::Bulk(a.to_vec())).collect());
    assert_eq!(back, expected);
});
