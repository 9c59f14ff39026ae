//! The base62 codec: `decode` never panics and rejects what is not base62; what decodes
//! re-encodes (unpadded) to the same text without its leading zeros; `encode_fixed` into any
//! width reports overflow exactly and decodes back; fixed-width text sorts like the numbers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shard::keys::base62::{self, ALPHABET, KEY_WIDTH, MAX_WIDTH};

fn check_decode(text: &[u8]) {
    match base62::decode(text) {
        Ok(n) => {
            assert!(!text.is_empty() && text.iter().all(|c| ALPHABET.contains(c)));
            let mut buf = [0u8; MAX_WIDTH];
            let len = base62::encode_unpadded(n, &mut buf);
            let stripped = match text.iter().position(|&c| c != b'0') {
                Some(p) => &text[p..],
                None => &b"0"[..],
            };
            assert_eq!(&buf[..len], stripped, "unpadded form of {n}");
            let mut fixed = [0u8; KEY_WIDTH];
            assert!(base62::encode_fixed(n, &mut fixed), "{n} must fit 11 chars");
            assert_eq!(base62::decode(&fixed), Ok(n));
        }
        Err(base62::Base62Error::Empty) => assert!(text.is_empty()),
        Err(base62::Base62Error::BadChar(c)) => {
            assert!(!ALPHABET.contains(&c) && text.contains(&c));
        }
        // 62^10 < 2^64: it takes at least 11 digits to overflow.
        Err(base62::Base62Error::Overflow) => assert!(text.len() >= 11),
    }
}

fn word(bytes: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    let n = bytes.len().min(8);
    a[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(a)
}

fuzz_target!(|data: &[u8]| {
    check_decode(data);
    if data.len() < 17 {
        return;
    }
    let (a, b, width) = (
        word(&data[..8]),
        word(&data[8..16]),
        usize::from(data[16] % 24),
    );
    // Any width, including 0 and more than 11.
    let mut buf = [0u8; 24];
    let fits = base62::encode_fixed(a, &mut buf[..width]);
    let need = {
        let mut t = [0u8; MAX_WIDTH];
        if a == 0 {
            0
        } else {
            base62::encode_unpadded(a, &mut t)
        }
    };
    assert_eq!(fits, width >= need, "encode_fixed({a}, width {width})");
    if fits && width > 0 {
        assert_eq!(base62::decode(&buf[..width]), Ok(a));
    }
    // Text order of the 11-character form equals numeric order.
    let (mut ta, mut tb) = ([0u8; KEY_WIDTH], [0u8; KEY_WIDTH]);
    assert!(base62::encode_fixed(a, &mut ta) && base62::encode_fixed(b, &mut tb));
    assert_eq!(ta.cmp(&tb), a.cmp(&b));
    check_decode(&data[17..]);
});
