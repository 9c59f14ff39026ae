//! Reading a filtered command's arguments straight from the server's own structures, on the
//! server whose layout is known (Redis 7.x): the command filter runs on every command a client
//! sends, and the API's two calls per argument (`CommandFilterArgGet`, then `StringPtrLen`)
//! were about a third of what the module costs a plain `GET` or `SET` (bench/findings.md,
//! "Plain GET/SET while transactions run"). Everywhere else, and for any argument that is not
//! a plain string object, `host::filter` reads through the API.
//!
//! The layout relied on (Redis 7.0 to 7.4):
//! - the filter context starts with the command's argument array (`RedisModuleString **argv`),
//!   then the array's allocated length and the argument count (two `int`s);
//! - an argument is a `robj`: its first byte holds its type (low 4 bits, 0: a string) and its
//!   encoding (high 4 bits: 0 raw, 8 embedded; any other goes to the API), and at offset 8 the
//!   pointer to its bytes, an sds string;
//! - an sds string's header ends with a flags byte right before its bytes, whose low 3 bits
//!   give the header's type, and with it where the length is.
//!
//! Turned on at load only on Redis (its `INFO server` has no `server_name`, which Valkey's has)
//! 7.x, after reading strings the server made both ways and finding the same bytes; the first
//! filtered command checks the context's layout the same way (its argument array and count
//! against `CommandFilterArgGet` and `CommandFilterArgsCount`). Any difference leaves the API in use.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU8, Ordering};

use redis_module::raw;

const OFF: u8 = 0;
/// The strings read alike at load; the filter context not checked yet.
const UNCHECKED: u8 = 1;
const ON: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(OFF);

/// Turns direct reads on if this server is Redis 7.x and reads strings it made as the API does.
///
/// # Safety
/// `ctx` must be the context Redis passed to the module's `OnLoad`.
pub unsafe fn enable(ctx: *mut raw::RedisModuleCtx) {
    // SAFETY: as the caller promises.
    if unsafe { known_layout(ctx) && strings_read_alike() } {
        MODE.store(UNCHECKED, Ordering::Relaxed);
    }
}

/// Whether arguments are read directly (for tests and `SHARD.DEBUG`-like checks).
pub fn direct() -> bool {
    MODE.load(Ordering::Relaxed) == ON
}

/// Redis (no `server_name` in `INFO server`) of major version 7.
unsafe fn known_layout(ctx: *mut raw::RedisModuleCtx) -> bool {
    // SAFETY: the API table is filled at load; `ctx` is OnLoad's.
    unsafe {
        let (Some(get), Some(field), Some(free)) = (
            raw::RedisModule_GetServerInfo,
            raw::RedisModule_ServerInfoGetFieldC,
            raw::RedisModule_FreeServerInfo,
        ) else {
            return false;
        };
        let info = get(ctx, c"server".as_ptr());
        if info.is_null() {
            return false;
        }
        let named = !field(info, c"server_name".as_ptr()).is_null();
        let version = field(info, c"redis_version".as_ptr());
        let seven = !version.is_null() && CStr::from_ptr(version).to_bytes().starts_with(b"7.");
        free(ctx, info);
        !named && seven
    }
}

/// Strings of every sds header size, embedded and raw, made by the server: read directly, the
/// same bytes as `StringPtrLen` gives.
unsafe fn strings_read_alike() -> bool {
    // SAFETY: the API table is filled at load; the strings are made and freed here.
    unsafe {
        let (Some(create), Some(ptr_len), Some(free)) = (
            raw::RedisModule_CreateString,
            raw::RedisModule_StringPtrLen,
            raw::RedisModule_FreeString,
        ) else {
            return false;
        };
        let buf = vec![b'x'; 70_000];
        [
            0usize, 1, 5, 31, 32, 44, 45, 100, 255, 256, 300, 65_535, 65_536, 70_000,
        ]
        .iter()
        .all(|&n| {
            let s = create(std::ptr::null_mut(), buf.as_ptr().cast(), n);
            if s.is_null() {
                return false;
            }
            let mut len = 0usize;
            let p = ptr_len(s, &mut len);
            // Every way of reading: `bytes` (which `bytes_quick` is the first part of) and the
            // length alone (`quick_len`, an embedded string's header found after its object).
            let same = bytes(s).is_some_and(|(q, l)| q == p.cast::<u8>() && l == len)
                && quick_len(s).is_none_or(|l| l == len);
            free(std::ptr::null_mut(), s);
            same
        })
    }
}

/// Whether arguments are read directly (the filter context's layout checked too).
#[inline(always)]
pub fn on() -> bool {
    MODE.load(Ordering::Relaxed) == ON
}

/// The filtered command's argument count and array read from the filter context, where `on`.
///
/// # Safety
/// `fctx` must be the live context of the filter callback running now, and `on()` true.
#[inline(always)]
pub unsafe fn read(
    fctx: *mut raw::RedisModuleCommandFilterCtx,
) -> (usize, *const *mut raw::RedisModuleString) {
    // SAFETY: the context's layout was checked: the argument array, its allocated length,
    // then the argument count.
    unsafe {
        let array = *fctx.cast::<*const *mut raw::RedisModuleString>();
        let argc = *fctx.cast::<u8>().add(12).cast::<c_int>();
        (usize::try_from(argc).unwrap_or(0), array)
    }
}

/// The filtered command's argument count and array read from the filter context `fctx`, or
/// `None` while arguments are read through the API. The first call with arguments checks the
/// context's layout against `CommandFilterArgsCount` and `CommandFilterArgGet`.
///
/// # Safety
/// `fctx` must be the live context of the filter callback running now.
#[inline(always)]
pub unsafe fn command(
    fctx: *mut raw::RedisModuleCommandFilterCtx,
) -> Option<(usize, *const *mut raw::RedisModuleString)> {
    if on() {
        // SAFETY: as the caller promises; `on`.
        Some(unsafe { read(fctx) })
    } else {
        // SAFETY: as the caller promises.
        unsafe { command_unchecked(fctx) }
    }
}

#[cold]
#[inline(never)]
unsafe fn command_unchecked(
    fctx: *mut raw::RedisModuleCommandFilterCtx,
) -> Option<(usize, *const *mut raw::RedisModuleString)> {
    match MODE.load(Ordering::Relaxed) {
        UNCHECKED => unsafe { check_context(fctx) },
        _ => None,
    }
}

/// The argument array of the live filter context `fctx` (after a rewrite, which may move it).
///
/// # Safety
/// As for `command`.
pub unsafe fn array(
    fctx: *mut raw::RedisModuleCommandFilterCtx,
) -> *const *mut raw::RedisModuleString {
    // SAFETY: as the caller promises.
    unsafe { command(fctx) }.map_or(std::ptr::null(), |(_, array)| array)
}

#[cold]
#[inline(never)]
unsafe fn check_context(
    fctx: *mut raw::RedisModuleCommandFilterCtx,
) -> Option<(usize, *const *mut raw::RedisModuleString)> {
    // SAFETY: a live filter context; positions below argc.
    unsafe {
        let (Some(count), Some(get)) = (
            raw::RedisModule_CommandFilterArgsCount,
            raw::RedisModule_CommandFilterArgGet,
        ) else {
            MODE.store(OFF, Ordering::Relaxed);
            return None;
        };
        let argc = count(fctx);
        if argc <= 0 {
            return None;
        }
        let array = *fctx.cast::<*const *mut raw::RedisModuleString>();
        let allocated = *fctx.cast::<u8>().add(8).cast::<c_int>();
        let counted = *fctx.cast::<u8>().add(12).cast::<c_int>();
        let last = argc - 1;
        let same = counted == argc
            && allocated >= argc
            && !array.is_null()
            && *array == get(fctx, 0)
            && *array.add(last as usize) == get(fctx, last);
        MODE.store(if same { ON } else { OFF }, Ordering::Relaxed);
        same.then_some((argc as usize, array))
    }
}

/// The bytes of a string argument read directly: `None` when it is not a raw or embedded
/// string object (the caller asks the API).
///
/// # Safety
/// `s` must be a live string object of a server whose layout `enable` checked.
#[inline(always)]
pub unsafe fn bytes(s: *mut raw::RedisModuleString) -> Option<(*const u8, usize)> {
    // SAFETY: as the caller promises.
    unsafe {
        match bytes_quick(s) {
            Some(read) => Some(read),
            None => bytes_other(s),
        }
    }
}

/// The bytes of a string argument whose sds header is 8 bits (every embedded string's: an
/// argument of up to 44 bytes), read without a call; `None` for any other.
///
/// # Safety
/// As for `bytes`.
#[inline(always)]
pub unsafe fn bytes_quick(s: *mut raw::RedisModuleString) -> Option<(*const u8, usize)> {
    // SAFETY: as the caller promises: the layout described at the top of this file.
    unsafe {
        // Type 0 (a string), encoding 0 (raw) or 8 (embedded).
        if *s.cast::<u8>() & 0x7f != 0 {
            return None;
        }
        let p = *s.cast::<u8>().add(8).cast::<*const u8>();
        (!p.is_null() && *p.sub(1) & 7 == 1).then(|| (p, usize::from(*p.sub(3))))
    }
}

/// `bytes` of a string whose sds header is not 8 bits (a long argument).
#[cold]
#[inline(never)]
unsafe fn bytes_other(s: *mut raw::RedisModuleString) -> Option<(*const u8, usize)> {
    // SAFETY: as for `bytes`.
    unsafe {
        if *s.cast::<u8>() & 0x7f != 0 {
            return None;
        }
        let p = *s.cast::<u8>().add(8).cast::<*const u8>();
        if p.is_null() {
            return None;
        }
        let flags = *p.sub(1);
        let len = match flags & 7 {
            0 => usize::from(flags >> 3),
            1 => usize::from(*p.sub(3)),
            2 => usize::from(p.sub(5).cast::<u16>().read_unaligned()),
            3 => p.sub(9).cast::<u32>().read_unaligned() as usize,
            4 => usize::try_from(p.sub(17).cast::<u64>().read_unaligned()).ok()?,
            _ => return None,
        };
        Some((p, len))
    }
}

/// The length of a string argument when it is read without a call: an embedded string's (its
/// 8-bit sds header right after the object), or a raw one's with an 8-bit header; `None` for
/// anything else (the caller then takes the slower way).
///
/// # Safety
/// As for `bytes`.
#[inline(always)]
pub unsafe fn quick_len(s: *mut raw::RedisModuleString) -> Option<usize> {
    // SAFETY: as the caller promises: the layout described at the top of this file (an embedded
    // string's header follows its 16-byte object, as `strings_read_alike` checked).
    unsafe {
        match *s.cast::<u8>() {
            0x80 => Some(usize::from(*s.cast::<u8>().add(16))),
            0 => {
                let p = *s.cast::<u8>().add(8).cast::<*const u8>();
                (!p.is_null() && *p.sub(1) & 7 == 1).then(|| usize::from(*p.sub(3)))
            }
            _ => None,
        }
    }
}
