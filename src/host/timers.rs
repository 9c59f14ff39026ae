//! The module's timers, kept by the monotonic clock as well as by the server's.
//!
//! A timer is the server's module timer (`RedisModule_CreateTimer`), which Redis 7.0 and Valkey
//! key by the wall clock (`ustime() + period`): when the server's wall clock steps back by `s`
//! seconds, a timer armed before the step fires `s` seconds late (the server's event loop wakes
//! for it by its monotonic clock, finds it not due by the wall clock, and waits again). So every
//! timer armed here is also recorded with its deadline on the monotonic clock and the wall-clock
//! time at which the server will fire it; `rescue_overdue`, called at every turn of the event
//! loop (which wakes at least every `1000 / hz` ms for the server's cron), runs a timer whose
//! monotonic deadline has passed while the server's wall clock has not reached its expiry yet,
//! with the turn's context. The server's own timer then finds nothing to run. In every other case
//! (the wall clock steady or stepped forward, the main thread late) the server's timer runs it,
//! as before.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use redis_module::Context;

/// How late by the monotonic clock a timer must be before a turn runs it: the server fires a
/// due timer within a turn or two, so a rescue never races a timer that is merely due.
const SLACK_MS: u64 = 100;

type Due = Box<dyn FnOnce(&Context)>;

struct Armed {
    /// When the server fires it: its wall clock (ms) at arming plus the delay.
    wall_expiry_ms: i64,
    run: Due,
}

thread_local! {
    /// The armed timers not yet run, by (monotonic deadline in ms, arming number).
    static ARMED: RefCell<BTreeMap<(u64, u64), Armed>> = const { RefCell::new(BTreeMap::new()) };
    static NEXT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Runs `callback(data)` on the main thread after `delay`, on a timer of the server's event
/// loop armed on `ctx` (its database is the timer's), or at a turn of the event loop once
/// `delay` has passed by the monotonic clock while the server's wall clock stepped back.
pub fn after_on<T: 'static>(ctx: &Context, delay: Duration, callback: fn(&Context, T), data: T) {
    let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    let deadline = crate::clock::monotonic_ms().saturating_add(delay_ms);
    let wall_expiry_ms = crate::clock::now_ms()
        .unwrap_or(0)
        .saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
    let number = NEXT.with(|n| {
        let v = n.get();
        n.set(v.wrapping_add(1));
        v
    });
    let key = (deadline, number);
    let run: Due = Box::new(move |ctx: &Context| callback(ctx, data));
    ARMED.with(|a| {
        a.borrow_mut().insert(
            key,
            Armed {
                wall_expiry_ms,
                run,
            },
        )
    });
    ctx.create_timer(delay, fire, key);
}

/// The server's timer of `key`: runs it unless a turn did already.
fn fire(ctx: &Context, key: (u64, u64)) {
    let armed = ARMED.with(|a| a.borrow_mut().remove(&key));
    if let Some(armed) = armed {
        run(ctx, armed.run);
    }
}

fn run(ctx: &Context, due: Due) {
    let _step = crate::host::latency::step_with_cpu(c"shard-timer", c"shard-timer-cpu");
    // redis-module's timer entry point does not catch panics: the guard is here.
    let _ = catch_unwind(AssertUnwindSafe(|| due(ctx)));
}

/// Runs, with the turn's context, the timers overdue by the monotonic clock that the server
/// will not fire yet because its wall clock stepped back. Main thread only.
pub fn rescue_overdue(ctx: &Context) {
    let now = crate::clock::monotonic_ms();
    // Most turns nothing is due: one look at the earliest deadline, no wall clock read.
    let any_due = ARMED.with(|a| {
        a.borrow()
            .keys()
            .next()
            .is_some_and(|k| k.0.saturating_add(SLACK_MS) <= now)
    });
    if !any_due {
        return;
    }
    let Some(wall) = crate::clock::now_ms() else {
        return;
    };
    // The timers overdue now (those the callbacks arm are not: their deadlines are later).
    let overdue: Vec<(u64, u64)> = ARMED.with(|a| {
        a.borrow()
            .iter()
            .take_while(|(k, _)| k.0.saturating_add(SLACK_MS) <= now)
            .filter(|(_, armed)| wall < armed.wall_expiry_ms)
            .map(|(k, _)| *k)
            .collect()
    });
    for key in overdue {
        let armed = ARMED.with(|a| a.borrow_mut().remove(&key));
        if let Some(armed) = armed {
            run(ctx, armed.run);
        }
    }
}
