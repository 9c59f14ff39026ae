//! The RESP2/RESP3 wire format: encoding a command, and reading one reply of any type from a
//! connection, with limits so that a broken or hostile peer cannot exhaust memory.

use std::fmt;
use std::io::{self, BufRead};

/// One reply, of any RESP2 or RESP3 type.
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    Simple(Vec<u8>),
    /// An error line, its code included (`ERR ...`, `NOPERM ...`).
    Error(Vec<u8>),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    /// RESP2's null array (`*-1`), which some commands reply instead of a null bulk string.
    NullArray,
    Array(Vec<Resp>),
    Map(Vec<(Resp, Resp)>),
    Set(Vec<Resp>),
    Double(f64),
    Bool(bool),
    /// A verbatim string: its 3-character format and its text.
    Verbatim([u8; 3], Vec<u8>),
    BigNumber(Vec<u8>),
}

impl Resp {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Resp::Int(n) => Some(*n),
            _ => None,
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }

    /// An error reply's text, its code included.
    pub fn error_text(&self) -> Option<&[u8]> {
        match self {
            Resp::Error(e) => Some(e),
            _ => None,
        }
    }
}

/// Why a reply could not be read.
#[derive(Debug)]
pub enum RespError {
    Io(io::Error),
    Protocol(String),
}

impl fmt::Display for RespError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RespError::Io(e) => write!(f, "{e}"),
            RespError::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

impl From<io::Error> for RespError {
    fn from(e: io::Error) -> Self {
        RespError::Io(e)
    }
}

/// Largest bulk string accepted (Redis's own proto-max-bulk-len default).
pub(super) const MAX_BULK: usize = 512 * 1024 * 1024;
/// Longest status, error or length line accepted.
pub(super) const MAX_LINE: usize = 64 * 1024 * 1024;
/// Largest aggregate accepted.
pub(super) const MAX_ELEMENTS: usize = 1 << 24;
/// Deepest nesting accepted.
pub(super) const MAX_DEPTH: usize = 64;

/// A command as RESP: an array of bulk strings.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let size: usize = args.iter().map(|a| a.as_ref().len() + 16).sum();
    let mut out = Vec::with_capacity(size + 16);
    encode_command_into(&mut out, args);
    out
}

/// Appends the RESP encoding of the command `args` to `out`; how many bytes it took.
pub fn encode_command_into<A: AsRef<[u8]>>(out: &mut Vec<u8>, args: &[A]) -> usize {
    let start = out.len();
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(args.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        let a = a.as_ref();
        out.push(b'$');
        out.extend_from_slice(itoa::Buffer::new().format(a.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out.len() - start
}

/// Reads one whole reply. Attributes (`|`) are read and dropped; a push (`>`) is returned as an
/// array.
pub fn read_reply<R: BufRead>(r: &mut R) -> Result<Resp, RespError> {
    read_at(r, 0)
}

fn read_at<R: BufRead>(r: &mut R, depth: usize) -> Result<Resp, RespError> {
    if depth > MAX_DEPTH {
        return Err(RespError::Protocol("reply nested too deep".into()));
    }
    let line = read_line(r)?;
    let (kind, body) = line
        .split_first()
        .ok_or_else(|| RespError::Protocol("empty line".into()))?;
    Ok(match kind {
        b'+' => Resp::Simple(body.to_vec()),
        b'-' => Resp::Error(body.to_vec()),
        b':' => Resp::Int(parse_int(body)?),
        b'$' => match parse_len(body, MAX_BULK)? {
            None => Resp::Null,
            Some(n) => Resp::Bulk(read_exact_crlf(r, n)?),
        },
        b'*' | b'~' | b'>' => match parse_len(body, MAX_ELEMENTS)? {
            None => Resp::NullArray,
            Some(n) => {
                let items = read_many(r, n, depth)?;
                if *kind == b'~' {
                    Resp::Set(items)
                } else {
                    Resp::Array(items)
                }
            }
        },
        b'%' | b'|' => {
            let n = parse_len(body, MAX_ELEMENTS)?.unwrap_or(0);
            let mut pairs = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                let k = read_at(r, depth + 1)?;
                let v = read_at(r, depth + 1)?;
                pairs.push((k, v));
            }
            if *kind == b'|' {
                // An attribute annotates the reply that follows it.
                return read_at(r, depth + 1);
            }
            Resp::Map(pairs)
        }
        b'_' => Resp::Null,
        b'#' => match body {
            b"t" => Resp::Bool(true),
            b"f" => Resp::Bool(false),
            _ => return Err(RespError::Protocol("bad boolean".into())),
        },
        b',' => Resp::Double(parse_double(body)?),
        b'(' => Resp::BigNumber(body.to_vec()),
        b'=' | b'!' => {
            let n = parse_len(body, MAX_BULK)?.unwrap_or(0);
            let data = read_exact_crlf(r, n)?;
            if *kind == b'!' {
                Resp::Error(data)
            } else {
                let (format, text) = match data.get(3) {
                    Some(b':') => (data[..3].to_vec(), data[4..].to_vec()),
                    _ => (b"txt".to_vec(), data),
                };
                let mut f = [0u8; 3];
                f.copy_from_slice(&format[..3]);
                Resp::Verbatim(f, text)
            }
        }
        other => {
            return Err(RespError::Protocol(format!(
                "unknown reply type byte 0x{other:02x}"
            )));
        }
    })
}

fn read_many<R: BufRead>(r: &mut R, n: usize, depth: usize) -> Result<Vec<Resp>, RespError> {
    let mut items = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        items.push(read_at(r, depth + 1)?);
    }
    Ok(items)
}

fn read_line<R: BufRead>(r: &mut R) -> Result<Vec<u8>, RespError> {
    let mut line = Vec::new();
    let n = io::Read::take(&mut *r, MAX_LINE as u64).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(RespError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        )));
    }
    if !line.ends_with(b"\r\n") {
        return Err(RespError::Protocol("line without CRLF".into()));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn read_exact_crlf<R: BufRead>(r: &mut R, n: usize) -> Result<Vec<u8>, RespError> {
    let mut data = vec![0u8; n];
    r.read_exact(&mut data)?;
    let mut crlf = [0u8; 2];
    r.read_exact(&mut crlf)?;
    if &crlf != b"\r\n" {
        return Err(RespError::Protocol("bulk string without CRLF".into()));
    }
    Ok(data)
}

fn parse_int(body: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| RespError::Protocol("bad integer".into()))
}

/// A length, or `None` for -1 (a null of RESP2).
fn parse_len(body: &[u8], max: usize) -> Result<Option<usize>, RespError> {
    let n = parse_int(body)?;
    if n == -1 {
        return Ok(None);
    }
    usize::try_from(n)
        .ok()
        .filter(|n| *n <= max)
        .map(Some)
        .ok_or_else(|| RespError::Protocol(format!("length {n} out of range")))
}

fn parse_double(body: &[u8]) -> Result<f64, RespError> {
    match body {
        b"inf" => Ok(f64::INFINITY),
        b"-inf" => Ok(f64::NEG_INFINITY),
        b"nan" => Ok(f64::NAN),
        _ => std::str::from_utf8(body)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| RespError::Protocol("bad double".into())),
    }
}

/// Writing a reply read from another node to the module's caller, as it was.
pub trait ReplyResp {
    fn resp(&self, r: &Resp);
}

impl ReplyResp for crate::host::reply::Reply {
    fn resp(&self, r: &Resp) {
        match r {
            Resp::Simple(s) => self.simple(s),
            Resp::Error(e) => self.error(&String::from_utf8_lossy(e)),
            Resp::Int(n) => self.int(*n),
            Resp::Bulk(b) => self.bulk(b),
            Resp::Null => self.null(),
            Resp::NullArray => self.null_array(),
            Resp::Array(items) => {
                self.array(items.len());
                items.iter().for_each(|i| self.resp(i));
            }
            Resp::Set(items) => {
                self.set(items.len());
                items.iter().for_each(|i| self.resp(i));
            }
            Resp::Map(pairs) => {
                self.map(pairs.len());
                for (k, v) in pairs {
                    self.resp(k);
                    self.resp(v);
                }
            }
            Resp::Double(d) => self.double(*d),
            Resp::Bool(b) => self.boolean(*b),
            Resp::BigNumber(n) => self.big_number(n),
            Resp::Verbatim(format, text) => self.verbatim(*format, text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Resp, RespError> {
        read_reply(&mut &bytes[..])
    }

    #[test]
    fn encodes_commands() {
        assert_eq!(
            encode_command(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn reads_resp2() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Resp::Simple(b"OK".to_vec()));
        assert_eq!(
            parse(b"-ERR x\r\n").unwrap(),
            Resp::Error(b"ERR x".to_vec())
        );
        assert_eq!(parse(b":-5\r\n").unwrap(), Resp::Int(-5));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Resp::Null);
        assert_eq!(
            parse(b"$3\r\na\r\n\r\n").unwrap(),
            Resp::Bulk(b"a\r\n".to_vec())
        );
        assert_eq!(parse(b"*-1\r\n").unwrap(), Resp::NullArray);
        assert_eq!(
            parse(b"*2\r\n:1\r\n*1\r\n$0\r\n\r\n").unwrap(),
            Resp::Array(vec![Resp::Int(1), Resp::Array(vec![Resp::Bulk(vec![])])])
        );
    }

    #[test]
    fn reads_resp3() {
        assert_eq!(
            parse(b"%1\r\n+a\r\n,1.5\r\n").unwrap(),
            Resp::Map(vec![(Resp::Simple(b"a".to_vec()), Resp::Double(1.5))])
        );
        assert_eq!(
            parse(b"~1\r\n#t\r\n").unwrap(),
            Resp::Set(vec![Resp::Bool(true)])
        );
        assert_eq!(parse(b"_\r\n").unwrap(), Resp::Null);
        assert_eq!(
            parse(b"(123\r\n").unwrap(),
            Resp::BigNumber(b"123".to_vec())
        );
        assert_eq!(
            parse(b"=7\r\ntxt:abc\r\n").unwrap(),
            Resp::Verbatim(*b"txt", b"abc".to_vec())
        );
        assert_eq!(
            parse(b"!3\r\nERR\r\n").unwrap(),
            Resp::Error(b"ERR".to_vec())
        );
        assert_eq!(parse(b"|1\r\n+k\r\n+v\r\n:3\r\n").unwrap(), Resp::Int(3));
        assert!(matches!(parse(b",inf\r\n").unwrap(), Resp::Double(d) if d.is_infinite()));
    }

    #[test]
    fn rejects_broken_input() {
        for bad in [
            &b""[..],
            b"+OK",
            b"?x\r\n",
            b"$5\r\nab\r\n",
            b"$-2\r\n",
            b":x\r\n",
            b"*99999999999\r\n",
            b"$3\r\nabcde",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = b"*1\r\n".repeat(100);
        assert!(parse(&deep).is_err());
    }
}
