//! `RingError`: the one error type of the ring module, a lowercase message without any
//! "ERR " prefix that says exactly what was wrong; the glue adds the Redis error prefix.

use std::fmt;

/// Why a ring spec, a ring file or a ring build was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingError {
    msg: String,
}

impl RingError {
    /// An error with this message (lowercase, no "ERR " prefix).
    pub fn new(msg: impl Into<String>) -> RingError {
        RingError { msg: msg.into() }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.msg
    }

    /// The same error with `prefix` put before the message (e.g. a file and line).
    pub fn prefixed(self, prefix: &str) -> RingError {
        RingError {
            msg: format!("{}{}", prefix, self.msg),
        }
    }
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for RingError {}

/// Shows user-given bytes inside an error message: lossy UTF-8, control characters escaped,
/// cut after 64 characters so one huge argument cannot make a huge reply.
pub(crate) fn show(bytes: &[u8]) -> String {
    const MAX: usize = 64;
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len().min(MAX * 4) + 3);
    for (n, c) in text.chars().enumerate() {
        if n >= MAX {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            for e in c.escape_default() {
                out.push(e);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_escapes_and_cuts() {
        assert_eq!(show(b"a\nb"), "a\\nb");
        assert_eq!(show(b"\xff"), "\u{fffd}");
        let long = vec![b'x'; 100];
        assert_eq!(show(&long), format!("{}...", "x".repeat(64)));
    }

    #[test]
    fn display_and_prefix() {
        let e = RingError::new("duplicate node name 'a'").prefixed("ring file f line 2: ");
        assert_eq!(e.to_string(), "ring file f line 2: duplicate node name 'a'");
    }
}
