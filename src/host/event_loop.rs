//! The server's event loop for the module's own sockets and hand-overs: a socket watched for
//! being readable or writable (the connection pool, `net::pool`; a cleanup child's pipe,
//! `watch_readable`), and a function run once on
//! the main thread, handed over from another thread (a resolver, the topology watcher). No
//! allocation per event: a socket's owner is a number it chose, handed back as is.

use std::ffi::c_void;
use std::io;
use std::os::fd::RawFd;
use std::os::raw::c_int;

use redis_module::raw;

/// What a socket is ready for, or what to watch it for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    pub readable: bool,
    pub writable: bool,
}

impl Ready {
    pub const READABLE: Ready = Ready {
        readable: true,
        writable: false,
    };
    pub const WRITABLE: Ready = Ready {
        readable: false,
        writable: true,
    };
    pub const BOTH: Ready = Ready {
        readable: true,
        writable: true,
    };

    fn mask(self) -> c_int {
        let mut mask = 0;
        if self.readable {
            mask |= raw::REDISMODULE_EVENTLOOP_READABLE as c_int;
        }
        if self.writable {
            mask |= raw::REDISMODULE_EVENTLOOP_WRITABLE as c_int;
        }
        mask
    }

    fn of(mask: c_int) -> Ready {
        Ready {
            readable: mask & raw::REDISMODULE_EVENTLOOP_READABLE as c_int != 0,
            writable: mask & raw::REDISMODULE_EVENTLOOP_WRITABLE as c_int != 0,
        }
    }
}

/// Who handles the events of the sockets it watches: called on the main thread with the
/// number it gave [`watch`].
pub trait SocketEvents {
    fn ready(id: usize, ready: Ready);
}

/// Watches `fd` for `what`; `H::ready(id, ...)` is called when it is. Main thread only.
pub fn watch<H: SocketEvents>(fd: RawFd, what: Ready, id: usize) -> io::Result<()> {
    extern "C" fn on_event<H: SocketEvents>(_fd: c_int, data: *mut c_void, mask: c_int) {
        // A panic must not reach the server: the handler's own guard has already dealt with it.
        let _step = crate::host::latency::step(c"shard-socket-event");
        let _ = std::panic::catch_unwind(|| H::ready(data as usize, Ready::of(mask)));
    }
    // SAFETY: the API table is filled at load and read-only after; the callback reads only
    // the number carried in `data`, never dereferenced.
    let ok = unsafe {
        let add = raw::RedisModule_EventLoopAdd.ok_or(io::ErrorKind::Unsupported)?;
        add(fd, what.mask(), Some(on_event::<H>), id as *mut c_void)
    };
    if ok == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Stops watching `fd` for `what` (before it is closed, so that a reused fd is safe).
pub fn unwatch(fd: RawFd, what: Ready) {
    // SAFETY: the API table is filled at load and read-only after; removing events of a
    // socket the module watches.
    unsafe {
        if let Some(del) = raw::RedisModule_EventLoopDel {
            del(fd, what.mask());
        }
    }
}

/// Runs `f(data)` once on the main thread, at its next turn of the event loop; callable from
/// any thread. False (and `data` dropped) when the server lacks the API.
pub fn on_main_thread<T: Send + 'static>(f: fn(T), data: T) -> bool {
    extern "C" fn run<T>(data: *mut c_void) {
        // SAFETY: made by Box::into_raw below, handed over exactly once.
        let (f, data) = *unsafe { Box::from_raw(data.cast::<(fn(T), T)>()) };
        let _step = crate::host::latency::step(c"shard-main-thread-call");
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(data)));
    }
    // SAFETY: the API table is filled at load and read-only after.
    let Some(add) = (unsafe { raw::RedisModule_EventLoopAddOneShot }) else {
        return false;
    };
    let boxed = Box::into_raw(Box::new((f, data)));
    // SAFETY: the one-shot runs `run::<T>` once on the main thread, which takes the box back.
    if unsafe { add(Some(run::<T>), boxed.cast()) } != raw::REDISMODULE_OK as c_int {
        // SAFETY: refused: the box was not handed over.
        drop(unsafe { Box::from_raw(boxed) });
        return false;
    }
    true
}

thread_local! {
    /// What `watch_readable` calls.
    static READABLE: std::cell::Cell<fn()> = const { std::cell::Cell::new(nothing) };
}

fn nothing() {}

/// The single fd of `watch_readable`.
struct Readable;

impl SocketEvents for Readable {
    fn ready(_id: usize, _ready: Ready) {
        (READABLE.with(std::cell::Cell::get))();
    }
}

/// Asks the event loop to call `ready` on the main thread once `fd` (the read end of a pipe
/// from a child) has something to read, or its end; false if it cannot. The fd stays watched
/// until `stop_watching`, which must come before it closes. One fd at a time.
pub fn watch_readable(fd: RawFd, ready: fn()) -> bool {
    READABLE.with(|r| r.set(ready));
    watch::<Readable>(fd, Ready::READABLE, 0).is_ok()
}

/// Takes `fd` out of the event loop (watched by `watch_readable`).
pub fn stop_watching(fd: RawFd) {
    unwatch(fd, Ready::READABLE);
}
