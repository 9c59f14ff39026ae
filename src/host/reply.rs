//! Writing replies with Redis's own reply functions: no intermediate values, no allocation.

use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_long};

use redis_module::raw;

/// The reply channel of one call.
#[derive(Clone, Copy)]
pub struct Reply {
    ctx: *mut raw::RedisModuleCtx,
}

impl Reply {
    pub fn new(ctx: *mut raw::RedisModuleCtx) -> Reply {
        Reply { ctx }
    }

    #[inline]
    pub fn bulk(&self, bytes: &[u8]) {
        raw::reply_with_string_buffer(self.ctx, bytes.as_ptr().cast::<c_char>(), bytes.len());
    }

    #[inline]
    pub fn int(&self, n: i64) {
        raw::reply_with_long_long(self.ctx, n);
    }

    pub fn ok(&self) {
        raw::reply_with_simple_string(self.ctx, c"OK".as_ptr());
    }

    pub fn null(&self) {
        raw::reply_with_null(self.ctx);
    }

    /// Starts an array of `len` elements; the caller writes them next.
    #[inline]
    pub fn array(&self, len: usize) {
        raw::reply_with_array(self.ctx, c_long::try_from(len).unwrap_or(c_long::MAX));
    }

    /// Starts a map of `len` pairs (a flat array under RESP2); the caller writes key, value...
    pub fn map(&self, len: usize) {
        raw::reply_with_map(self.ctx, c_long::try_from(len).unwrap_or(c_long::MAX));
    }

    /// A map field whose value is a bulk string.
    pub fn field_bulk(&self, name: &str, value: &[u8]) {
        self.bulk(name.as_bytes());
        self.bulk(value);
    }

    /// A map field whose value is an integer.
    pub fn field_int(&self, name: &str, value: i64) {
        self.bulk(name.as_bytes());
        self.int(value);
    }

    /// A map field whose value is an integer or nil.
    pub fn field_opt_int(&self, name: &str, value: Option<i64>) {
        self.bulk(name.as_bytes());
        match value {
            Some(v) => self.int(v),
            None => self.null(),
        }
    }

    /// A map field whose value is a bulk string or nil.
    pub fn field_opt(&self, name: &str, value: Option<&[u8]>) {
        self.bulk(name.as_bytes());
        match value {
            Some(v) => self.bulk(v),
            None => self.null(),
        }
    }

    /// A simple string reply (`+text`); a text that holds a NUL byte goes as a bulk string.
    pub fn simple(&self, s: &[u8]) {
        match CString::new(s.to_vec()) {
            Ok(c) => {
                raw::reply_with_simple_string(self.ctx, c.as_ptr());
            }
            Err(_) => self.bulk(s),
        }
    }

    /// A null array (RESP2's `*-1`).
    pub fn null_array(&self) {
        // SAFETY: the reply context of this call.
        unsafe {
            if let Some(f) = raw::RedisModule_ReplyWithNullArray {
                f(self.ctx);
            }
        }
    }

    /// A set of `len` elements (an array under RESP2), the elements to follow.
    pub fn set(&self, len: usize) {
        raw::reply_with_set(self.ctx, c_long::try_from(len).unwrap_or(c_long::MAX));
    }

    pub fn double(&self, d: f64) {
        raw::reply_with_double(self.ctx, d);
    }

    pub fn boolean(&self, b: bool) {
        raw::reply_with_bool(self.ctx, c_int::from(b));
    }

    pub fn big_number(&self, n: &[u8]) {
        raw::reply_with_big_number(self.ctx, n.as_ptr().cast::<c_char>(), n.len());
    }

    /// A verbatim string of a three-letter `format` (`txt`, `mkd`).
    pub fn verbatim(&self, format: [u8; 3], text: &[u8]) {
        let format = [format[0], format[1], format[2], 0];
        raw::reply_with_verbatim_string(
            self.ctx,
            text.as_ptr().cast::<c_char>(),
            text.len(),
            format.as_ptr().cast::<c_char>(),
        );
    }

    /// An error reply; the message starts with its code. Line breaks become spaces.
    pub fn error(&self, msg: &str) {
        let clean: Vec<u8> = msg
            .bytes()
            .map(|b| {
                if b == b'\r' || b == b'\n' || b == 0 {
                    b' '
                } else {
                    b
                }
            })
            .collect();
        let Ok(c) = CString::new(clean) else {
            return;
        };
        // SAFETY: ctx is the live context of this call and c a NUL-terminated string.
        unsafe {
            if let Some(f) = raw::RedisModule_ReplyWithError {
                f(self.ctx, c.as_ptr());
            }
        }
    }
}
