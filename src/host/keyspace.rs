//! The keyspace as the module walks it, key by key: choosing a database, its size, scanning it
//! with a cursor (each key's name, and for a copy its type, length and absolute expiry; for
//! `SHARD.HOTKEYS` its LFU counter, read without touching the key),
//! looking one key up, and unlinking keys on the main thread (replicated as one `UNLINK`).
//!
//! A copy's child scans millions of keys: the scan hands each key to a closure by reference
//! (no allocation, no copy of the name), and what it reads of a key is read from the key the
//! scan has open.

use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{raw, CallOptionsBuilder, CallReply, CallResult, Context, RedisString};

/// A key's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    String,
    List,
    Set,
    Hash,
    ZSet,
    Stream,
    /// A module's type.
    Other,
}

/// What a key is: its type, length (bytes of a string, elements of a collection) and absolute
/// expiry in Unix ms (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyInfo {
    pub kind: KeyType,
    pub len: usize,
    pub expires_at: i64,
}

/// Selects database `db` on `ctx` for what it reads or writes next; false if there is no such
/// database.
pub fn select_db(ctx: &Context, db: i32) -> bool {
    // SAFETY: the API table is filled at load; a live context.
    let selected = unsafe { raw::RedisModule_SelectDb.map(|f| f(ctx.ctx, db)) };
    selected == Some(raw::REDISMODULE_OK as c_int)
}

/// The database selected on `ctx`.
pub fn selected_db(ctx: &Context) -> i32 {
    // SAFETY: the API table is filled at load; a live context.
    unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx.ctx)) }
}

/// How many keys the selected database holds.
pub fn db_size(ctx: &Context) -> u64 {
    // SAFETY: the API table is filled at load; a live context.
    unsafe { raw::RedisModule_DbSize.map_or(0, |f| f(ctx.ctx)) }
}

/// A key the scan has open, for the length of one call of the scan's closure.
pub struct ScannedKey(*mut raw::RedisModuleKey);

impl ScannedKey {
    /// What the key is; `None` when it is empty (or the server gave no key).
    #[inline]
    pub fn info(&self) -> Option<KeyInfo> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: the server's open key, live for the scan's callback.
        unsafe { describe(self.0) }
    }

    /// The key's LFU counter as `OBJECT FREQ` gives it (0..=255, decayed by the minutes since
    /// its last access); `None` when the server's `maxmemory-policy` is not an LFU one (the
    /// counter is then not kept) or the key is empty. Reading it changes nothing: the server
    /// computes the decay without storing it (`LFUDecrAndReturn`), and the scan's key was
    /// found without a lookup, so neither its counter nor its access time is touched.
    #[inline]
    pub fn lfu(&self) -> Option<u64> {
        if self.0.is_null() {
            return None;
        }
        let mut freq: std::os::raw::c_longlong = -1;
        // SAFETY: the server's open key, live for the scan's callback; the API table is
        // filled at load.
        let read = unsafe { raw::RedisModule_GetLFU.map(|f| f(self.0, &mut freq)) };
        if read != Some(raw::REDISMODULE_OK as c_int) {
            return None;
        }
        u64::try_from(freq).ok()
    }
}

/// A scan's position in the selected database (`RedisModule_ScanCursor`), destroyed when
/// dropped.
pub struct ScanCursor(*mut raw::RedisModuleScanCursor);

impl ScanCursor {
    /// A cursor at the start; `None` when the server lacks the scan API.
    pub fn new() -> Option<ScanCursor> {
        // SAFETY: the API table is filled at load.
        unsafe {
            raw::RedisModule_Scan?;
            let cursor = raw::RedisModule_ScanCursorCreate?();
            (!cursor.is_null()).then_some(ScanCursor(cursor))
        }
    }

    /// Back to the start (of whichever database is selected next).
    pub fn restart(&self) {
        // SAFETY: a live cursor.
        unsafe {
            if let Some(f) = raw::RedisModule_ScanCursorRestart {
                f(self.0);
            }
        }
    }

    /// Scans on in `ctx`'s selected database, calling `on_key(name, key)` for each key of the
    /// next few; true while there are more. A panic in `on_key` ends that key's call.
    pub fn scan<F: FnMut(&[u8], &ScannedKey)>(&self, ctx: &Context, on_key: &mut F) -> bool {
        extern "C" fn callback<F: FnMut(&[u8], &ScannedKey)>(
            _ctx: *mut raw::RedisModuleCtx,
            keyname: *mut raw::RedisModuleString,
            key: *mut raw::RedisModuleKey,
            privdata: *mut c_void,
        ) {
            let _ = catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: `privdata` is the closure `scan` passed, alive for the scan call;
                // the server passes a live name (and key, or null) for the callback.
                let on_key = unsafe { &mut *privdata.cast::<F>() };
                let name = RedisString::string_as_slice(keyname);
                on_key(name, &ScannedKey(key));
            }));
        }
        // SAFETY: the API table is filled at load (checked by `new`).
        let Some(scan) = (unsafe { raw::RedisModule_Scan }) else {
            return false;
        };
        // SAFETY: a live cursor and context; the callback gets `on_key` for the duration of
        // the call.
        unsafe {
            scan(
                ctx.ctx,
                self.0,
                Some(callback::<F>),
                std::ptr::from_mut(on_key).cast(),
            ) != 0
        }
    }
}

impl Drop for ScanCursor {
    fn drop(&mut self) {
        // SAFETY: created by ScanCursorCreate, destroyed once.
        unsafe {
            if let Some(f) = raw::RedisModule_ScanCursorDestroy {
                f(self.0);
            }
        }
    }
}

/// What key `name` of the selected database is; `None` when it is not there.
pub fn look_up(ctx: &Context, name: &[u8]) -> Option<KeyInfo> {
    let key_name = ctx.create_string(name);
    // SAFETY: the API table is filled at load; the key is closed before returning.
    unsafe {
        let key =
            raw::RedisModule_OpenKey?(ctx.ctx, key_name.inner, raw::REDISMODULE_READ as c_int)
                .cast::<raw::RedisModuleKey>();
        if key.is_null() {
            return None;
        }
        let info = describe(key);
        if let Some(close) = raw::RedisModule_CloseKey {
            close(key);
        }
        info
    }
}

/// An open key's type, length and absolute expiry; `None` when empty.
///
/// # Safety
/// `key` must be an open key.
#[inline]
unsafe fn describe(key: *mut raw::RedisModuleKey) -> Option<KeyInfo> {
    // SAFETY: the caller's key; the API table is filled at load.
    unsafe {
        let kind = raw::RedisModule_KeyType?(key);
        if kind == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
            return None;
        }
        let expires_at = match raw::RedisModule_GetAbsExpire {
            Some(abs) => abs(key),
            None => {
                let rel = raw::RedisModule_GetExpire?(key);
                if rel < 0 {
                    rel
                } else {
                    crate::clock::now_ms()?.saturating_add(rel)
                }
            }
        };
        let kind = match kind as isize {
            raw::REDISMODULE_KEYTYPE_STRING => KeyType::String,
            raw::REDISMODULE_KEYTYPE_LIST => KeyType::List,
            raw::REDISMODULE_KEYTYPE_HASH => KeyType::Hash,
            raw::REDISMODULE_KEYTYPE_SET => KeyType::Set,
            raw::REDISMODULE_KEYTYPE_ZSET => KeyType::ZSet,
            raw::REDISMODULE_KEYTYPE_STREAM => KeyType::Stream,
            _ => KeyType::Other,
        };
        let len = raw::RedisModule_ValueLength.map_or(0, |f| f(key));
        Some(KeyInfo {
            kind,
            len,
            expires_at: expires_at.max(0),
        })
    }
}

/// Unlinks the keys `names` of the selected database that are still there, as one `UNLINK`
/// (replicated as it is); how many were there. Main thread only.
///
/// One `UNLINK` through `RedisModule_Call` finds each key once; opening each key and
/// `RedisModule_UnlinkKey` found it twice (the open, then the delete), and a cleanup's time is
/// those lookups (`dictFind`, bench/findings.md): 1.5 times slower.
pub fn unlink<'a>(ctx: &Context, names: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let names: Vec<&[u8]> = names.into_iter().collect();
    if names.is_empty() {
        return 0;
    }
    // A cleanup's delete is a write of the module's own (a watched key moved away).
    if crate::host::writes::following() {
        let mut told: Vec<&[u8]> = Vec::with_capacity(names.len() + 1);
        told.push(b"UNLINK");
        told.extend(&names);
        crate::host::writes::tell(ctx.ctx, &told);
    }
    let options = CallOptionsBuilder::new().replicate().build();
    match ctx.call_ext::<_, CallResult>("UNLINK", &options, names.as_slice()) {
        Ok(CallReply::I64(n)) => u64::try_from(n.to_i64()).unwrap_or(0),
        _ => 0,
    }
}
