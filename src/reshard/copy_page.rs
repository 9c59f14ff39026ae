//! The page a copy's child and the main thread share (an anonymous shared mapping, made before
//! the first fork so that every child inherits it): the child's counts go up (keys scanned,
//! copied, skipped, failed, bytes sent, by database, and its last error), the job's controls
//! come down (its rate, paused). The keys lost with a destination followed through Sentinel go up
//! by node (the job sends them again once the failover is followed). Atomics only: the child publishes after each batch, the main
//! thread reads for `STATUS` whenever it looks; the error text is read once the child exited.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::reshard::ship::Tally;

const ERROR_BYTES: usize = 400;

/// Databases whose counts `STATUS` shows one by one (the totals count every database).
pub const MAX_DBS: usize = 64;

/// Ring nodes, by index, whose lost keys the page counts: a destination of a higher index is
/// not followed through a failover by a copy (its keys fail as a plain node's do).
pub const MAX_FOLLOWED: usize = 256;

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
    /// Set by the parent, read by the child: keys per second (0: no limit), paused (1).
    pub max_rate: AtomicU64,
    pub paused: AtomicU64,
    /// Keys copied, by database number.
    pub copied_by_db: [AtomicU64; MAX_DBS],
    /// Keys lost with their destination (followed through Sentinel), by node index.
    pub lost_by_node: [AtomicU64; MAX_FOLLOWED],
    error_len: AtomicU64,
    error: UnsafeCell<[u8; ERROR_BYTES]>,
}

// SAFETY: the error bytes are written by the child (or by the shipping thread of a pass in
// steps, `ship_thread`) only before it sets `error_len` and exits, and read by the parent only
// after the child exited (the thread was joined).
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
    pub(super) fn reset(&self) {
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
        for c in self.copied_by_db.iter().chain(&self.lost_by_node) {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Keys lost with their destination, by node index, as the child last published them.
    pub fn lost_by_node(&self) -> Vec<u64> {
        self.lost_by_node
            .iter()
            .map(|c| c.load(Ordering::Acquire))
            .collect()
    }

    /// Keys copied by database, as the child last published them.
    pub fn copied_by_db(&self) -> Vec<u64> {
        self.copied_by_db
            .iter()
            .map(|c| c.load(Ordering::Acquire))
            .collect()
    }

    /// (scanned, copied, skipped, failed, bytes sent), as the child last published them.
    pub fn counts(&self) -> [u64; 5] {
        [
            self.scanned.load(Ordering::Acquire),
            self.copied.load(Ordering::Acquire),
            self.skipped.load(Ordering::Acquire),
            self.failed.load(Ordering::Acquire),
            self.bytes_sent.load(Ordering::Acquire),
        ]
    }

    pub(super) fn publish(&self, scanned: u64, tally: &Tally, in_flight: usize) {
        self.scanned.store(scanned, Ordering::Relaxed);
        self.publish_tally(tally, in_flight);
    }

    /// Publishes what the replies came to (a pass in steps: its shipping thread's part; the
    /// main thread publishes the keys it scanned).
    pub(super) fn publish_tally(&self, tally: &Tally, in_flight: usize) {
        self.copied.store(tally.copied, Ordering::Relaxed);
        self.skipped.store(tally.skipped, Ordering::Relaxed);
        self.failed.store(tally.failed, Ordering::Relaxed);
        self.bytes_sent.store(tally.bytes_sent, Ordering::Relaxed);
        self.in_flight.store(in_flight as u64, Ordering::Relaxed);
        for (c, n) in self.copied_by_db.iter().zip(&tally.copied_by_db) {
            c.store(*n, Ordering::Relaxed);
        }
        for (c, n) in self.lost_by_node.iter().zip(&tally.lost_by_node) {
            c.store(*n, Ordering::Relaxed);
        }
    }

    pub(super) fn set_error(&self, text: &str) {
        let bytes = &text.as_bytes()[..text.len().min(ERROR_BYTES)];
        // SAFETY: only the child (or a pass in steps' shipping thread) writes, before it
        // exits (see the Sync impl).
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
