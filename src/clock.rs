//! The wall clock, in unix milliseconds (CLOCK_REALTIME, as Redis's own `mstime`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in unix ms; `None` if the clock reads before 1970.
#[inline]
pub fn now_ms() -> Option<i64> {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}
