//! The wall clock, in unix milliseconds (CLOCK_REALTIME, as Redis's own `mstime`); and a
//! monotonic clock for durations (`monotonic_ms`: a fleet operation's lease).
//!
//! It reads `clock_gettime` directly: GENKEY asks on every call, and `SystemTime`'s checked
//! `duration_since` and `u128` milliseconds cost more than the read itself.
//!
//! The function is the one the server's executable sees (looked up once, from the main
//! program's handle, `dlopen(NULL)`), not the module's own link to libc: Valkey loads modules
//! with `RTLD_DEEPBIND`, under which a module's calls (and even `dlsym(RTLD_DEFAULT)` from it)
//! bypass an `LD_PRELOAD` time interposer (a test's clock shim, libfaketime) that the server
//! itself obeys. So the module's clock is always the server's clock. Without an interposer the
//! symbol is libc's `clock_gettime`, and the call costs what a PLT call does.

use std::sync::OnceLock;

type ClockGettime = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int;

/// `clock_gettime` as the process resolves it (an interposer first), else libc's.
fn clock_gettime() -> ClockGettime {
    static RESOLVED: OnceLock<ClockGettime> = OnceLock::new();
    *RESOLVED.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name; a non-null result for this name is a
        // function with clock_gettime's signature (whoever defines it must honour it).
        unsafe {
            let main_program = libc::dlopen(std::ptr::null(), libc::RTLD_NOW);
            let sym = if main_program.is_null() {
                std::ptr::null_mut()
            } else {
                // The main program stays loaded: its handle is never closed.
                libc::dlsym(main_program, c"clock_gettime".as_ptr())
            };
            if sym.is_null() {
                libc::clock_gettime as ClockGettime
            } else {
                std::mem::transmute::<*mut libc::c_void, ClockGettime>(sym)
            }
        }
    })
}

/// Now, in unix ms; `None` if the clock cannot be read or reads before 1970.
#[inline]
// time_t and c_long are i64 here but narrower on some targets.
#[allow(clippy::useless_conversion)]
pub fn now_ms() -> Option<i64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    if unsafe { clock_gettime()(libc::CLOCK_REALTIME, &mut ts) } != 0 {
        return None;
    }
    let secs = i64::from(ts.tv_sec);
    if secs < 0 {
        return None;
    }
    // tv_nsec is in 0..1e9, so this cannot overflow for any time a u64 key can hold.
    secs.checked_mul(1000)?
        .checked_add(i64::from(ts.tv_nsec) / 1_000_000)
}

/// Milliseconds of a monotonic clock since this process first asked (a lease's time: never
/// stepped by a change of the wall clock).
pub fn monotonic_ms() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    #[test]
    fn agrees_with_system_time() {
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let now = super::now_ms().unwrap();
        let after = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!(
            before <= now && now <= after,
            "{before} <= {now} <= {after}"
        );
    }
}
