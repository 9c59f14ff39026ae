//! One pass of a copy, run by a forked child (`RedisModule_Fork`), the way `BGSAVE` and
//! Valkey's slot migration work: the child walks its snapshot of the keyspace, serializes each
//! key this node no longer owns (`DUMP`, its absolute expiry) and ships it as
//! `RESTORE key ttl payload ABSTTL` to its owner (`ship`), while the main thread serves clients
//! untouched. The child reports its counts through a page shared with the parent.
//!
//! Why a fork and not time-bounded steps on the main thread, measured (bench/findings.md,
//! "Where a copy's time goes"): serializing a small key through `DUMP` costs the thread that does
//! it about 2 µs, so steps that must leave the server 70% of its time cap a copy near 100 000
//! keys/s and tax every client; the child serializes at its own core's pace and the
//! destination's `RESTORE` rate becomes the limit. What the fork costs the server is the fork
//! itself (page tables: about 1 ms per 100 MB of dataset here) and copy-on-write of the pages
//! written while the child runs.
//!
//! Keys written here after the fork are not in the snapshot: `dirty` records them (keyspace
//! events) and the next pass copies just those, until a pass has nothing to copy.

use std::cell::UnsafeCell;
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_module::{raw, CallOptionsBuilder, CallReply, CallResult, Context, KeysCursor};

use super::copy_target;
use super::ship::{Shipper, Tally, Target, Window};
use crate::placement::Placement;

/// Where a pass finds its keys.
pub enum Source {
    /// Every key of the snapshot.
    Scan,
    /// These keys only (written after the previous pass's fork).
    Keys(Vec<Vec<u8>>),
}

/// What a pass needs to know.
pub struct Pass {
    pub ring: Arc<Placement>,
    pub self_name: String,
    pub source: Source,
    pub replace: bool,
    pub timeout: Duration,
    pub auth: Option<(String, String)>,
}

const ERROR_BYTES: usize = 400;

/// The child's counts, in a page both processes map.
#[repr(C)]
pub struct Shared {
    pub scanned: AtomicU64,
    pub copied: AtomicU64,
    pub skipped: AtomicU64,
    pub failed: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub in_flight: AtomicU64,
    /// Set by the child when it ended normally.
    pub finished: AtomicU64,
    error_len: AtomicU64,
    error: UnsafeCell<[u8; ERROR_BYTES]>,
}

// SAFETY: the error bytes are written by the child only before it sets `error_len` and exits,
// and read by the parent only after the child exited.
unsafe impl Sync for Shared {}

static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());

/// The shared page, mapped on first use (before any fork, so the child inherits it).
pub fn shared() -> Option<&'static Shared> {
    let mut p = SHARED.load(Ordering::Acquire);
    if p.is_null() {
        // SAFETY: a fresh anonymous shared mapping of the struct's size, zeroed by the kernel
        // (all-zero is a valid `Shared`); it is never unmapped.
        let mapped = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<Shared>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return None;
        }
        p = mapped.cast();
        SHARED.store(p, Ordering::Release);
    }
    // SAFETY: mapped above and never unmapped.
    Some(unsafe { &*p })
}

impl Shared {
    fn reset(&self) {
        for c in [
            &self.scanned,
            &self.copied,
            &self.skipped,
            &self.failed,
            &self.bytes_sent,
            &self.in_flight,
            &self.finished,
            &self.error_len,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    fn publish(&self, scanned: u64, tally: &Tally, in_flight: usize) {
        self.scanned.store(scanned, Ordering::Relaxed);
        self.copied.store(tally.copied, Ordering::Relaxed);
        self.skipped.store(tally.skipped, Ordering::Relaxed);
        self.failed.store(tally.failed, Ordering::Relaxed);
        self.bytes_sent.store(tally.bytes_sent, Ordering::Relaxed);
        self.in_flight
            .store(in_flight as u64, Ordering::Relaxed);
    }

    fn set_error(&self, text: &str) {
        let bytes = &text.as_bytes()[..text.len().min(ERROR_BYTES)];
        // SAFETY: only the child writes, before it exits (see the Sync impl).
        unsafe { (&mut *self.error.get())[..bytes.len()].copy_from_slice(bytes) };
        self.error_len.store(bytes.len() as u64, Ordering::Release);
    }

    /// The last error the child reported (read once it has exited).
    pub fn error(&self) -> String {
        let len = usize::try_from(self.error_len.load(Ordering::Acquire))
            .unwrap_or(0)
            .min(ERROR_BYTES);
        // SAFETY: the child has exited (see the Sync impl).
        String::from_utf8_lossy(unsafe { &(&*self.error.get())[..len] }).into_owned()
    }
}

/// Called on the main thread when the child has exited.
pub type Done = unsafe extern "C" fn(exitcode: c_int, bysignal: c_int, user_data: *mut c_void);

/// Forks a child that runs `pass`; its pid, or why it could not start (another child, such as
/// a `BGSAVE`, is running: Redis runs one at a time).
pub fn start(ctx: &Context, pass: &Pass, done: Done) -> Result<c_int, String> {
    let shared = shared().ok_or("cannot map the page shared with the copy's child")?;
    shared.reset();
    // SAFETY: the API table is filled at load.
    let fork = unsafe { raw::RedisModule_Fork }.ok_or("RedisModule_Fork is missing")?;
    // SAFETY: Redis forks; in the child this returns 0 and the child runs the pass, then exits.
    let pid = unsafe { fork(Some(done), std::ptr::null_mut()) };
    if pid < 0 {
        return Err("another child process (BGSAVE, AOF rewrite) is running".into());
    }
    if pid == 0 {
        let outcome = catch_unwind(AssertUnwindSafe(|| run(ctx, pass, shared)));
        let code = match outcome {
            Ok(()) => {
                shared.finished.store(1, Ordering::Release);
                0
            }
            Err(_) => {
                shared.set_error("internal error in the copy's child; see the Redis log");
                1
            }
        };
        // SAFETY: in the child; this does not return.
        unsafe {
            if let Some(exit) = raw::RedisModule_ExitFromChild {
                exit(code);
            }
            libc::_exit(code);
        }
    }
    Ok(pid)
}

/// Kills the running child, if any (`SHARD.RESHARD STOP`).
pub fn kill(pid: c_int) {
    // SAFETY: the API table is filled at load; Redis checks the pid is its module child.
    unsafe {
        if let Some(kill) = raw::RedisModule_KillForkChild {
            kill(pid);
        }
    }
}

/// The child's work.
fn run(ctx: &Context, pass: &Pass, shared: &Shared) {
    let Some(ring) = pass.ring.ring.as_ref() else {
        shared.set_error("the cluster algo has no ring to reshard");
        return;
    };
    let mut shipper = Shipper::new(Window::default(), pass.timeout, pass.auth.clone());
    let options = CallOptionsBuilder::new().build();
    let mut scanned = 0u64;
    let mut handle = |key: &[u8], shipper: &mut Shipper| {
        scanned += 1;
        let Some(owner) = copy_target(ring, &pass.self_name, key) else {
            return;
        };
        let expiry: CallResult = ctx.call_ext("PEXPIRETIME", &options, &[key]);
        let expires_at = match expiry {
            Ok(CallReply::I64(ms)) if ms.to_i64() >= 0 => ms.to_i64(),
            Ok(CallReply::I64(ms)) if ms.to_i64() == -1 => 0,
            _ => return, // gone (-2) since the scan found it
        };
        let dump: CallResult = ctx.call_ext("DUMP", &options, &[key]);
        let Ok(CallReply::String(payload)) = dump else {
            return;
        };
        let target = Target {
            name: owner.name.clone(),
            address: owner.address.clone(),
        };
        let ttl = itoa::Buffer::new().format(expires_at).as_bytes().to_vec();
        let mut args: Vec<&[u8]> = vec![b"RESTORE", key, &ttl, payload.as_bytes(), b"ABSTTL"];
        if pass.replace {
            args.push(b"REPLACE");
        }
        shipper.send(&target, &args);
        if scanned % 256 == 0 {
            shared.publish(scanned, &shipper.tally, shipper.in_flight());
        }
    };
    match &pass.source {
        Source::Scan => scan_all(ctx, &mut |key| handle(key, &mut shipper)),
        Source::Keys(keys) => {
            for key in keys {
                handle(key, &mut shipper);
            }
        }
    }
    shipper.finish();
    shared.publish(scanned, &shipper.tally, 0);
    if !shipper.tally.last_error.is_empty() {
        shared.set_error(&shipper.tally.last_error);
    }
}

/// Walks every key of database 0, handing each name to `each` outside the scan callback.
fn scan_all(ctx: &Context, each: &mut dyn FnMut(&[u8])) {
    let cursor = KeysCursor::new();
    let names = std::cell::RefCell::new(Vec::<Vec<u8>>::with_capacity(1024));
    loop {
        let more = cursor.scan(
            ctx,
            &|_: &Context, name: &redis_module::RedisString, _: Option<&redis_module::key::RedisKey>| {
                names.borrow_mut().push(name.as_slice().to_vec());
            },
        );
        for name in names.borrow_mut().drain(..) {
            each(&name);
        }
        if !more {
            return;
        }
    }
}
