//! "Now" for a command that needs the wall clock on every call (`SHARD.GENKEY`), at the least
//! cost the server allows.
//!
//! Why it matters: on a virtual machine a clock read is not cheap. Here `clock_gettime` took 8 %
//! of a server running pipelined `SHARD.GENKEY`s (and the server's own `gettimeofday` before
//! each command another 8 %), where GENKEY is otherwise as cheap as `INCR`.
//!
//! - Redis 7.2 and later, and Valkey, read the clock once before each command they run from a
//!   client and give modules that reading (`RedisModule_CachedMicroseconds`): it is taken. Within a
//!   script or a transaction they do not read it again for each command, so those commands see
//!   the time at which the script or `EXEC` began, as they do for key expiry.
//! - Redis 7.0 gives modules no cached reading. There a reading is kept for at most `REUSES`
//!   more calls within one turn of the event loop (the turn ends when the server goes to wait for
//!   clients: `turn_over`, from `events::on_event_loop`): a burst of pipelined calls reads the
//!   clock once in `REUSES + 1`, and a reading is never older than the commands run since it in
//!   the same turn (a few microseconds for a burst of GENKEYs). The generator keeps its IDs
//!   strictly increasing whatever the reading, as it does through a clock step.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw;

/// Calls that may reuse one reading within a turn of the event loop (Redis 7.0).
const REUSES: u32 = 15;

/// Turns of the event loop so far (main thread).
static TURN: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last reading on Redis 7.0: the turn it was taken in, unix ms, the calls that reused it.
    static KEPT: Cell<(u64, i64, u32)> = const { Cell::new((u64::MAX, 0, 0)) };
}

/// A turn of the event loop is over (the server is about to wait, or has woken).
pub fn turn_over() {
    TURN.fetch_add(1, Ordering::Relaxed);
}

/// The wall clock in unix milliseconds as the server read it when the running command (or the
/// script or transaction running it) began; `None` on a server without the call (Redis 7.0).
#[inline]
fn command_start_ms() -> Option<i64> {
    // SAFETY: an optional API pointer, checked for null before the call; the call takes no
    // argument and only reads the server's cached time (main thread, inside a command).
    let us = unsafe { raw::RedisModule_CachedMicroseconds.map(|f| f()) }?;
    (us > 0).then_some(us / 1000)
}

/// Now in unix ms for a command on the main thread: the server's own reading of this command,
/// or on Redis 7.0 `read()`'s, reused as the module comment says; `None` if neither gives one.
#[inline]
pub fn now_ms(read: impl FnOnce() -> Option<i64>) -> Option<i64> {
    if let Some(ms) = command_start_ms() {
        return Some(ms);
    }
    let turn = TURN.load(Ordering::Relaxed);
    KEPT.with(|kept| {
        let (at, ms, reused) = kept.get();
        if at == turn && reused < REUSES {
            kept.set((at, ms, reused + 1));
            return Some(ms);
        }
        let ms = read()?;
        kept.set((turn, ms, 0));
        Some(ms)
    })
}
