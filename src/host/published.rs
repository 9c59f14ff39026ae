//! A value read on every command and replaced rarely (the command table the filter reads),
//! published through one atomic pointer: a read is one load, with no lock and no thread-local
//! (which a shared library reaches through a `__tls_get_addr` call on every access).
//!
//! Each version published is kept for the life of the process: a reader on any thread may
//! hold a reference to the one it loaded while a newer one is published. So publish only what
//! changes a bounded number of times (the command table: once at load, then at most once per
//! command the server adds later).

use std::sync::atomic::{AtomicPtr, Ordering};

/// A value published whole, read without a lock.
pub struct Published<T: 'static> {
    current: AtomicPtr<T>,
}

impl<T: Sync + 'static> Published<T> {
    /// Nothing published yet.
    pub const fn new() -> Self {
        Published {
            current: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The version last published (`None`: none yet).
    #[inline(always)]
    pub fn get(&self) -> Option<&'static T> {
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: a non-null pointer here comes from `Box::leak` in `publish`: never freed,
        // never written after it was published (the `Release` store made its contents visible
        // to this `Acquire` load), and only shared references to it are ever made.
        unsafe { p.cast_const().as_ref() }
    }

    /// Publishes `value` in place of the last version (which stays alive: see the module).
    pub fn publish(&self, value: T) {
        let leaked: &'static T = Box::leak(Box::new(value));
        self.current
            .store(std::ptr::from_ref(leaked).cast_mut(), Ordering::Release);
    }
}

impl<T: Sync + 'static> Default for Published<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_version_published_is_read() {
        static P: Published<Vec<u32>> = Published::new();
        assert!(P.get().is_none());
        P.publish(vec![1]);
        let first = P.get().expect("published");
        P.publish(vec![1, 2]);
        assert_eq!(first, &vec![1], "an older version stays readable");
        assert_eq!(P.get(), Some(&vec![1, 2]));
    }
}
