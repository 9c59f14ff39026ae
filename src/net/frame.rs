//! Where whole replies end in a stream of bytes read from a pipelined connection.
//!
//! Replies arrive in pieces of whatever size the socket gives. [`FrameScanner`] remembers how far
//! it got (the position and, for aggregates, how many elements each open level still needs), so
//! a reply of a million elements arriving in a thousand reads is scanned once in all, not once
//! per read. Once a whole reply is there, [`crate::net::resp::read_reply`] parses it from the slice.
//! No crate scans RESP3 resumably with Redis's own limits, hence this small one.

use crate::net::resp::{RespError, MAX_BULK, MAX_DEPTH, MAX_ELEMENTS, MAX_LINE};

/// A resumable scan of one reply at the start of a buffer.
#[derive(Debug, Default)]
pub struct FrameScanner {
    /// Bytes already scanned (whole elements only).
    pos: usize,
    /// Per open aggregate, the elements it still needs.
    open: Vec<usize>,
}

impl FrameScanner {
    /// Continues the scan over `buf` (the same bytes as before, maybe with more at the end).
    /// `Ok(Some(n))`: the first `n` bytes are one whole reply; call [`Self::reset`] once they
    /// are consumed. `Ok(None)`: more bytes are needed.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, RespError> {
        loop {
            let rest = &buf[self.pos.min(buf.len())..];
            let Some(nl) = memchr::memchr(b'\n', rest) else {
                if rest.len() > MAX_LINE {
                    return Err(RespError::Protocol("line too long".into()));
                }
                return Ok(None);
            };
            if nl == 0 || rest[nl - 1] != b'\r' {
                return Err(RespError::Protocol("line without CRLF".into()));
            }
            let header = nl + 1;
            let Some((&kind, body)) = rest[..nl - 1].split_first() else {
                return Err(RespError::Protocol("empty line".into()));
            };
            match kind {
                b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => {
                    self.pos += header;
                    if self.element_done() {
                        return Ok(Some(self.pos));
                    }
                }
                b'$' | b'=' | b'!' => {
                    let total = match length(body, MAX_BULK)? {
                        None => header,
                        Some(n) => header + n + 2,
                    };
                    if rest.len() < total {
                        return Ok(None);
                    }
                    self.pos += total;
                    if self.element_done() {
                        return Ok(Some(self.pos));
                    }
                }
                b'*' | b'~' | b'>' | b'%' | b'|' => {
                    let n = length(body, MAX_ELEMENTS)?.unwrap_or(0);
                    let needed = match kind {
                        b'%' => n * 2,
                        // An attribute's pairs, then the reply it annotates.
                        b'|' => n * 2 + 1,
                        _ => n,
                    };
                    self.pos += header;
                    if needed == 0 {
                        if self.element_done() {
                            return Ok(Some(self.pos));
                        }
                    } else {
                        if self.open.len() >= MAX_DEPTH {
                            return Err(RespError::Protocol("reply nested too deep".into()));
                        }
                        self.open.push(needed);
                    }
                }
                other => {
                    return Err(RespError::Protocol(format!(
                        "unknown reply type byte 0x{other:02x}"
                    )))
                }
            }
        }
    }

    /// Starts over, for the reply after the one just consumed.
    pub fn reset(&mut self) {
        self.pos = 0;
        self.open.clear();
    }

    /// One element completed at `pos`: closes the aggregates it completes. True when the
    /// whole reply is complete.
    fn element_done(&mut self) -> bool {
        while let Some(left) = self.open.last_mut() {
            *left -= 1;
            if *left > 0 {
                return false;
            }
            self.open.pop();
        }
        true
    }
}

/// A length field; `None` for -1 (RESP2's nulls).
fn length(body: &[u8], max: usize) -> Result<Option<usize>, RespError> {
    if body == b"-1" {
        return Ok(None);
    }
    let n: usize = std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| RespError::Protocol("bad length".into()))?;
    if n > max {
        return Err(RespError::Protocol(format!("length {n} out of range")));
    }
    Ok(Some(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::resp::{read_reply, Resp};

    /// Feeds `bytes` one byte at a time; returns where the first reply ends.
    fn end_fed_bytewise(bytes: &[u8]) -> Option<usize> {
        let mut s = FrameScanner::default();
        for i in 0..=bytes.len() {
            if let Some(n) = s.scan(&bytes[..i]).expect("scan") {
                return Some(n);
            }
        }
        None
    }

    #[test]
    fn finds_the_end_of_every_reply_type_fed_a_byte_at_a_time() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"-ERR no\r\n",
            b":42\r\n",
            b"$5\r\nhello\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*2\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n",
            b"%2\r\n+a\r\n:1\r\n+b\r\n*1\r\n_\r\n",
            b"~2\r\n#t\r\n,3.5\r\n",
            b"|1\r\n+ttl\r\n:3\r\n$2\r\nhi\r\n",
            b"*2\r\n|1\r\n+a\r\n:1\r\n:7\r\n:8\r\n",
            b"=7\r\ntxt:abc\r\n",
            b"!3\r\nERR\r\n",
            b"(123456789012345678901234567890\r\n",
            b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n",
            // Binary data with CRLF inside a bulk string.
            b"$4\r\n\r\n\r\n\r\n",
        ];
        for reply in replies {
            let mut stream = reply.to_vec();
            stream.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(
                end_fed_bytewise(&stream),
                Some(reply.len()),
                "{:?}",
                String::from_utf8_lossy(reply)
            );
            // The frame parses whole with the ordinary reader.
            read_reply(&mut &reply[..]).expect("parses");
        }
    }

    #[test]
    fn consecutive_replies_after_reset() {
        let stream = b":1\r\n*2\r\n:2\r\n:3\r\n$1\r\nx\r\n";
        let mut s = FrameScanner::default();
        let mut at = 0;
        let mut got = Vec::new();
        while at < stream.len() {
            let n = s.scan(&stream[at..]).expect("scan").expect("whole");
            got.push(read_reply(&mut &stream[at..at + n]).expect("parse"));
            at += n;
            s.reset();
        }
        assert_eq!(
            got,
            [
                Resp::Int(1),
                Resp::Array(vec![Resp::Int(2), Resp::Int(3)]),
                Resp::Bulk(b"x".to_vec())
            ]
        );
    }

    #[test]
    fn a_big_array_in_pieces_is_scanned_once() {
        let mut stream = b"*100000\r\n".to_vec();
        for i in 0..100_000 {
            stream.extend_from_slice(format!(":{i}\r\n").as_bytes());
        }
        let mut s = FrameScanner::default();
        let mut fed = 0;
        let mut end = None;
        while end.is_none() {
            fed = (fed + 4096).min(stream.len());
            end = s.scan(&stream[..fed]).expect("scan");
        }
        assert_eq!(end, Some(stream.len()));
        // The scan resumed: it never went back before what it had passed.
        assert!(s.pos == stream.len());
    }

    #[test]
    fn refuses_garbage() {
        let mut s = FrameScanner::default();
        assert!(s.scan(b"?x\r\n").is_err());
        let mut s = FrameScanner::default();
        assert!(s.scan(b"$abc\r\n").is_err());
        let mut s = FrameScanner::default();
        assert!(s.scan(b"+OK\n").is_err());
        let mut s = FrameScanner::default();
        assert!(s.scan(b"\r\n").is_err());
        let mut s = FrameScanner::default();
        assert!(s.scan(b"$99999999999\r\n").is_err());
        let mut deep = Vec::new();
        for _ in 0..100 {
            deep.extend_from_slice(b"*1\r\n");
        }
        let mut s = FrameScanner::default();
        assert!(s.scan(&deep).is_err());
    }
}
