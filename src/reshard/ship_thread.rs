//! The network side of a copy pass run in steps on the main thread (`copy_steps`): a thread of
//! its own owns the pass's `Shipper` (its connections, its window, its waits in `poll(2)`), and
//! the main thread hands it each command already serialized and encoded (`Outbox`, a `Sink` of
//! `copy_serialize`), never waiting on the network. What the replies come to is published in the
//! page the copy's child would use (`copy_page`), so that the job follows a pass in steps as it
//! follows a child. The thread calls no server API (it only writes sockets and atomics).
//!
//! Bounded: the main thread stops serializing while more than `MAX_QUEUED_BYTES` wait in the
//! queue (the thread, its window full, waits for the destination), so memory stays bounded
//! however slow a destination is.
//!
//! The queue (`ship_queue`) takes no lock and leaves every buffer to be allocated and freed by
//! the main thread: a thread under `SCHED_IDLE` that held a lock the main thread wants (the
//! allocator's, on each free of a buffer the main thread allocated) kept the main thread
//! waiting until it ran again. The thread sleeps in `park_timeout` while the queue is empty;
//! the main thread wakes it with each message.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use redis_module::Context;

use crate::net::resp::encode_command_into;
use crate::reshard::copy_child::Found;
use crate::reshard::copy_page::Shared;
use crate::reshard::copy_serialize::Sink;
use crate::reshard::dirty::DbKey;
use crate::reshard::pace::Pace;
use crate::reshard::ship::{Expect, Shipper, Target};
use crate::reshard::ship_queue::{self, Msg, Reader, Writer};

/// The main thread serializes no more while this many bytes wait for the thread.
pub const MAX_QUEUED_BYTES: usize = 8 << 20;

/// How long the thread waits for a message before it reads the replies that came.
const IDLE_WAIT: Duration = Duration::from_millis(1);

/// What the main thread and the shipping thread share.
struct Link {
    /// Keys whose reply was counted (copied, skipped, failed or lost).
    answered: AtomicU64,
    /// Set when the pass is given up (STOP, a failed job): the thread stops at once.
    abort: AtomicBool,
    /// Held while the thread publishes: once the main thread has set `abort` under it, the
    /// thread never writes the page again (a later pass's counts are that pass's).
    publishing: Mutex<()>,
}

/// The main thread's end: a `Sink` that queues commands for the thread.
pub struct Outbox {
    tx: Writer,
    /// Whether the `End` is queued (nothing more is).
    ended: bool,
    link: Arc<Link>,
    thread: Option<JoinHandle<()>>,
    /// Keys queued so far (their replies `answered` or still to come).
    queued_keys: u64,
    db: i32,
    /// Big keys met (which travel in pieces, waiting for answers mid-key: left to a forked
    /// pass), with their databases.
    pub big: Vec<DbKey>,
}

impl Outbox {
    /// Starts the thread that ships to `targets` with `shipper`, publishing into `shared`.
    pub fn start(
        shipper: Shipper,
        targets: Vec<Target>,
        shared: &'static Shared,
    ) -> Result<Outbox, String> {
        let (tx, rx) = ship_queue::queue();
        let link = Arc::new(Link {
            answered: AtomicU64::new(0),
            abort: AtomicBool::new(false),
            publishing: Mutex::new(()),
        });
        let theirs = Arc::clone(&link);
        let thread = std::thread::Builder::new()
            .name("shard-copy-ship".into())
            .spawn(move || run(rx, shipper, targets, shared, &theirs))
            .map_err(|e| format!("cannot start the copy's shipping thread: {e}"))?;
        Ok(Outbox {
            tx,
            ended: false,
            link,
            thread: Some(thread),
            queued_keys: 0,
            db: 0,
            big: Vec::new(),
        })
    }

    /// Whether the thread is behind: the main thread serializes no more for now.
    pub fn full(&mut self) -> bool {
        !self.ended && self.tx.full(MAX_QUEUED_BYTES)
    }

    /// Keys queued and not answered yet (the queue's and the connections').
    pub fn in_flight(&self) -> u64 {
        self.queued_keys
            .saturating_sub(self.link.answered.load(Ordering::Acquire))
    }

    /// The job is paused: the thread closes its connections once what is in flight is answered.
    pub fn close(&mut self) {
        self.queue(Msg::Close);
    }

    /// Every command is queued: the thread waits for the replies and exits.
    pub fn end(&mut self) {
        if !self.ended {
            self.tx.put(Msg::End);
            self.wake();
            self.ended = true;
        }
    }

    /// Whether the thread has exited (after `end`), joined if so.
    pub fn ended(&mut self) -> bool {
        // What waited for room in the queue, the `End` among it.
        if self.ended && !self.tx.flush() {
            self.wake();
        }
        if self.thread.as_ref().is_some_and(JoinHandle::is_finished) {
            if let Some(thread) = self.thread.take() {
                // (A panic in the thread leaves `finished` unset: the pass counts as broken.)
                let _ = thread.join();
            }
        }
        self.thread.is_none()
    }

    fn queue(&mut self, msg: Msg) {
        if self.ended {
            return;
        }
        if let Msg::Send(_, _, expect) = &msg {
            self.queued_keys += expect.keys();
        }
        // (A thread gone, by a panic: the pass ends broken when it is looked at.)
        self.tx.put(msg);
        self.wake();
    }

    /// Wakes the thread if it sleeps (no system call when it does not).
    fn wake(&self) {
        if let Some(thread) = self.thread.as_ref() {
            thread.thread().unpark();
        }
    }
}

impl Drop for Outbox {
    /// A pass given up: the thread stops without waiting for replies, and writes nothing more.
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _held = self.link.publishing.lock();
            self.link.abort.store(true, Ordering::Release);
        }
        self.wake();
    }
}

impl Sink for Outbox {
    fn send_as(&mut self, target: &Target, args: &[&[u8]], expect: Expect) {
        if self.ended {
            return;
        }
        let mut bytes = self.tx.buffer();
        encode_command_into(&mut bytes, args);
        self.queue(Msg::Send(target.index, bytes, expect));
    }

    fn select(&mut self, db: i32) {
        self.db = db;
        self.queue(Msg::Select(db));
    }

    fn wait_turn_for(&mut self, _shared: &Shared, _pace: &mut Pace, _keys: u64) {}

    fn in_pieces(&mut self, _ctx: &Context, _target: &Target, f: &Found, _replace: bool) {
        self.big.push((self.db, f.name.clone()));
    }
}

/// Puts the calling thread under Linux's `SCHED_IDLE` policy, as a copy's child is
/// (`host::fork`): it runs on a CPU nothing else wants, so that it never delays the main thread
/// (on a 2-core machine a shipping thread at the server's priority took the CPU from it). Falls
/// back to nice 19 where the policy is refused.
fn lower_priority() {
    // SAFETY: changes the calling thread's own scheduling (on Linux the policy and the nice
    // value of pid 0 are the calling thread's); `param` is a valid sched_param.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        }
    }
}

/// The thread: ships what comes, reads the replies between messages, publishes the counts.
fn run(
    mut rx: Reader,
    mut shipper: Shipper,
    targets: Vec<Target>,
    shared: &'static Shared,
    link: &Link,
) {
    lower_priority();
    let publish = |shipper: &Shipper, done: bool| {
        let Ok(_held) = link.publishing.lock() else {
            return false;
        };
        if link.abort.load(Ordering::Acquire) {
            return false;
        }
        let t = &shipper.tally;
        link.answered.store(
            t.copied + t.skipped + t.failed + t.lost(),
            Ordering::Release,
        );
        shared.publish_tally(t, shipper.in_flight());
        if done {
            if !t.last_error.is_empty() {
                shared.set_error(&t.last_error);
            }
            shared.finished.store(1, Ordering::Release);
        }
        true
    };
    loop {
        if link.abort.load(Ordering::Acquire) {
            return;
        }
        match rx.take() {
            Some(Msg::Select(db)) => shipper.select(db),
            Some(Msg::Close) => {
                shipper.finish();
                shipper.close();
            }
            Some(Msg::Send(index, bytes, expect)) => {
                if let Some(target) = targets.get(index) {
                    shipper.send_encoded(target, &bytes, expect);
                }
                rx.give_back(bytes);
            }
            Some(Msg::End) => {
                shipper.finish();
                publish(&shipper, true);
                return;
            }
            // (Dropped without its end: the pass was given up.)
            None if rx.abandoned() => return,
            None => {
                shipper.pump_all();
                std::thread::park_timeout(IDLE_WAIT);
            }
        }
        if !publish(&shipper, false) {
            return;
        }
    }
}
