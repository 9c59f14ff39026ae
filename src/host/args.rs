//! A command's arguments, read straight from Redis's argv without copying or allocating.

use std::os::raw::c_int;
use std::slice;

use redis_module::raw;

use crate::host::error::CmdError;

/// The arguments of one call; `get(0)` is the command name.
pub struct Args<'a> {
    argv: &'a [*mut raw::RedisModuleString],
}

impl<'a> Args<'a> {
    /// # Safety
    /// `argv` must point to `argc` strings that live for the whole call, as Redis guarantees
    /// for a command callback.
    pub unsafe fn from_raw(argv: *mut *mut raw::RedisModuleString, argc: c_int) -> Args<'a> {
        let len = usize::try_from(argc).unwrap_or(0);
        let argv = if argv.is_null() || len == 0 {
            &[]
        } else {
            slice::from_raw_parts(argv, len)
        };
        Args { argv }
    }

    pub fn len(&self) -> usize {
        self.argv.len()
    }

    pub fn is_empty(&self) -> bool {
        self.argv.is_empty()
    }

    /// The arguments from `n` on (`get(0)` is argument `n`).
    pub fn skip(&self, n: usize) -> Args<'a> {
        Args {
            argv: self.argv.get(n..).unwrap_or_default(),
        }
    }

    /// The raw argument strings, as Redis passed them.
    pub fn raw(&self) -> &'a [*mut raw::RedisModuleString] {
        self.argv
    }

    /// The bytes of argument `i` (empty when out of range).
    pub fn get(&self, i: usize) -> &'a [u8] {
        let Some(&s) = self.argv.get(i) else {
            return &[];
        };
        let mut len = 0;
        let ptr = raw::string_ptr_len(s, &mut len);
        if ptr.is_null() {
            return &[];
        }
        // SAFETY: Redis keeps the string alive for the call; ptr/len describe its bytes.
        unsafe { slice::from_raw_parts(ptr.cast::<u8>(), len) }
    }
}

/// A list of arguments: Redis's argv, or plain byte slices (tests, fuzzing). Option parsing
/// works on this trait, so it can be exercised without a server.
pub trait ArgList {
    fn count(&self) -> usize;
    /// Argument `i`, empty when out of range.
    fn arg(&self, i: usize) -> &[u8];

    /// A cursor over the arguments from `start` on.
    fn cursor(&self, start: usize) -> Cursor<'_, Self> {
        Cursor {
            args: self,
            pos: start,
        }
    }
}

impl ArgList for Args<'_> {
    fn count(&self) -> usize {
        self.len()
    }

    fn arg(&self, i: usize) -> &[u8] {
        self.get(i)
    }
}

impl ArgList for [&[u8]] {
    fn count(&self) -> usize {
        self.len()
    }

    fn arg(&self, i: usize) -> &[u8] {
        self.get(i).copied().unwrap_or_default()
    }
}

/// Walks the arguments of a command left to right.
pub struct Cursor<'s, A: ArgList + ?Sized> {
    args: &'s A,
    pos: usize,
}

impl<'s, A: ArgList + ?Sized> Cursor<'s, A> {
    /// The next argument, if any.
    pub fn next_arg(&mut self) -> Option<&'s [u8]> {
        if self.pos >= self.args.count() {
            return None;
        }
        let arg = self.args.arg(self.pos);
        self.pos += 1;
        Some(arg)
    }

    /// The value that must follow option `name`.
    pub fn value_of(&mut self, name: &str) -> Result<&'s [u8], CmdError> {
        self.next_arg()
            .ok_or_else(|| CmdError::err(format!("{name} needs a value")))
    }
}

/// Is `arg` the option `name`, ignoring case?
#[inline]
pub fn is(arg: &[u8], name: &str) -> bool {
    arg.eq_ignore_ascii_case(name.as_bytes())
}

/// A whole number in `min..=max`; the error names the option and the range.
pub fn int_in(arg: &[u8], name: &str, min: i64, max: i64) -> Result<i64, CmdError> {
    std::str::from_utf8(arg)
        .ok()
        .filter(|s| !s.starts_with('+'))
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            CmdError::err(format!(
                "{name} must be an integer from {min} to {max}, got '{}'",
                printable(arg)
            ))
        })
}

/// A short, printable form of client bytes for error messages.
pub fn printable(arg: &[u8]) -> String {
    const MAX: usize = 64;
    let text = String::from_utf8_lossy(&arg[..arg.len().min(MAX)]);
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if arg.len() > MAX {
        out.push_str("...");
    }
    out
}
