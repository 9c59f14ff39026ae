//! The RESP2/RESP3 reply reader (`route::read_reply`) that SHARD.CALL and the resharding jobs
//! use on other servers' replies, and the resumable frame scanner of the pipelined connections
//! (`route::frame`), on arbitrary bytes. Checks: no panic, no runaway allocation (libFuzzer's
//! malloc limit); the scanner, fed the bytes in two pieces, finds a whole reply exactly where
//! the reader ends one (it checks only framing: a frame the reader refuses closes the
//! connection); a command encoded by `encode_command` reads back as an array of the same
//! bulk strings.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shard::net::frame::FrameScanner;
use shard::net::resp::{encode_command, read_reply, Resp};
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
    // The scanner, resumed after a cut anywhere, agrees with the reader.
    let cut = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let mut scanner = FrameScanner::default();
    let scanned = match scanner.scan(&data[..cut]) {
        Ok(Some(n)) => Ok(Some(n)),
        Ok(None) => scanner.scan(data),
        Err(e) => Err(e),
    };
    let mut rest = data;
    let read = read_reply(&mut rest).map(|_| data.len() - rest.len());
    if let (Ok(Some(n)), Ok(m)) = (&scanned, &read) {
        assert_eq!(n, m, "the scanner and the reader end the reply at different places");
    }
    let args = split_args(data);
    let wire = encode_command(&args);
    let back = read_reply(&mut &wire[..]).expect("an encoded command must read back");
    let expected = Resp::Array(args.iter().map(|a| Resp::Bulk(a.to_vec())).collect());
    assert_eq!(back, expected);
});
