//! The wall clock, in unix milliseconds (CLOCK_REALTIME, as Redis's own `mstime`).
//!
//! It reads `clock_gettime` directly: GENKEY asks on every call, and `SystemTime`'s checked
//! `duration_since` and `u128` milliseconds cost more than the read itself.

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
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) } != 0 {
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
