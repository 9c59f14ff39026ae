//! Frees, in steps on the main thread, what the key index and a copy's records of written keys
//! held once they are dropped (an index rebuilt for a new ring, a build's deleted names, a
//! record of a million keys): a queue of `FreeInSteps` (`keyindex::free`) that a timer works
//! through for at most `STEP_BUDGET` a turn. Main thread only.
//!
//! Before, a thread of its own freed them; its frees gave the names back to the main thread's
//! allocator arena under the arena's locks while the main thread allocated and freed there
//! itself, and the main thread slept on those locks (bench/findings.md, "No stall"). Here no
//! other thread touches the main thread's memory; a million names take a few tens of steps.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use redis_module::Context;

use crate::keyindex::free::FreeInSteps;

/// The main thread's time for one step.
const STEP_BUDGET: Duration = Duration::from_millis(1);
/// Parts freed between two looks at the clock.
const PARTS: usize = 64;
/// Between two steps: the event loop serves its clients.
const STEP_INTERVAL: Duration = Duration::from_millis(1);

thread_local! {
    static PENDING: RefCell<VecDeque<Box<dyn FreeInSteps>>> = RefCell::new(VecDeque::new());
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

/// Frees `item` in steps from the next turn of the event loop (before the module is loaded,
/// in the unit tests: at once).
pub fn free_later(item: impl FreeInSteps + 'static) {
    PENDING.with(|p| p.borrow_mut().push_back(Box::new(item)));
    arm(Duration::ZERO);
}

/// Items waiting to be freed.
fn pending() -> usize {
    PENDING.with(|p| p.borrow().len())
}

fn arm(delay: Duration) {
    if ARMED.replace(true) {
        return;
    }
    if !crate::host::context::after(delay, |_ctx: &Context, ()| step(), ()) {
        // No server to arm a timer on.
        ARMED.set(false);
        PENDING.with(|p| p.borrow_mut().clear());
    }
}

fn step() {
    ARMED.set(false);
    let _step = crate::host::latency::step_with_cpu(c"shard-free-step", c"shard-free-step-cpu");
    let started = Instant::now();
    loop {
        let freed = PENDING.with(|p| p.borrow_mut().front_mut().map(|i| i.free_some(PARTS)));
        match freed {
            None => return,
            Some(true) => drop(PENDING.with(|p| p.borrow_mut().pop_front())),
            Some(false) => {}
        }
        if started.elapsed() >= STEP_BUDGET {
            break;
        }
    }
    if pending() > 0 {
        arm(STEP_INTERVAL);
    }
}
