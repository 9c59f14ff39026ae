//! A child process forked through the server (`RedisModule_Fork`), the way `BGSAVE` works: the
//! child sees a snapshot of the keyspace and works on it while the main thread serves clients.
//! Here: forking (the child then runs at the lowest CPU priority), the child's exit, killing
//! and reaping it from the main thread, the handler told when it ended, and waiting in the
//! event loop for a pipe from it to become readable.
//!
//! The server runs one child at a time (a `BGSAVE`, an AOF rewrite or a module's), so one
//! handler slot is enough. Main thread only, except `exit_child` (the child).

use std::cell::Cell;
use std::os::raw::{c_int, c_void};

use redis_module::raw;

/// A process id.
pub type Pid = c_int;

/// How a child ended: its exit code, and whether a signal killed it.
pub type Exit = (c_int, bool);

/// Which side of a fork this is.
pub enum Forked {
    /// The parent: the child's pid.
    Parent(Pid),
    /// The child (already at the lowest priority).
    Child,
}

fn no_handler(_: Exit) {}

thread_local! {
    /// Told on the main thread when the running child exits.
    static DONE: Cell<fn(Exit)> = const { Cell::new(no_handler) };
}

thread_local! {
    /// Run first in every child (`in_child`).
    static IN_CHILD: Cell<fn()> = const { Cell::new(|| {}) };
}

/// Sets what every child runs first, before its own work (registered at load).
pub fn in_child(first: fn()) {
    IN_CHILD.with(|c| c.set(first));
}

/// Forks through the server. In the parent: the child's pid; `done` is called on the main
/// thread when the child exits (unless it was reaped by `reap_if_exited` or killed by
/// `kill_child` first). In the child: `Forked::Child`, the child running at the lowest
/// priority. An error when no child could start (the server runs one at a time: a `BGSAVE` or
/// an AOF rewrite may be running).
pub fn fork(done: fn(Exit)) -> Result<Forked, String> {
    // SAFETY: the API table is filled at load.
    let fork = unsafe { raw::RedisModule_Fork }.ok_or("RedisModule_Fork is missing")?;
    unsafe extern "C" fn on_done(exitcode: c_int, bysignal: c_int, _: *mut c_void) {
        let _ = std::panic::catch_unwind(|| (DONE.with(Cell::get))((exitcode, bysignal != 0)));
    }
    // SAFETY: the server forks; `on_done` is called on its main thread when the child exits.
    let pid = unsafe { fork(Some(on_done), std::ptr::null_mut()) };
    if pid < 0 {
        // The running child's handler stays: set before the fork, a refused fork (the key
        // index's build while a copy's child runs) took the running child's end for its own,
        // and the copy waited in `copying` for ever once the server reaped its child.
        return Err("another child process (BGSAVE, AOF rewrite) is running".into());
    }
    if pid > 0 {
        // The parent, before its main thread can reap the child and call `on_done`.
        DONE.with(|d| d.set(done));
    }
    if pid == 0 {
        // The child yields the CPU to the server's clients: its work may go slower, not them.
        lower_priority();
        // What the parent follows from keyspace events is the parent's: a child that opens a
        // key (and so may expire it) must not touch it.
        (IN_CHILD.with(Cell::get))();
        return Ok(Forked::Child);
    }
    Ok(Forked::Parent(pid))
}

/// Puts the calling (child) process under Linux's `SCHED_IDLE` policy: it runs only on a CPU
/// nothing else wants, and any woken task of the server (the main thread answering a client)
/// takes the CPU from it at once. (Nice 10 alone left `PING`s waiting for a CPU for tens of ms
/// on a 2-core machine: `bench/findings.md`.) Falls back to nice 19 where the policy is refused.
fn lower_priority() {
    // SAFETY: changes this process's own scheduling; `param` is a valid sched_param.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        }
    }
}

/// Ends a child made by `fork`, with `code` (0: its work is done).
pub fn exit_child(code: c_int) -> ! {
    // SAFETY: called in the child only; neither call returns.
    unsafe {
        if let Some(exit) = raw::RedisModule_ExitFromChild {
            exit(code);
        }
        libc::_exit(code)
    }
}

/// Kills the running child, if any, through the server (which then forgets it, so that the
/// next child may fork). Its done handler is not called.
pub fn kill_child(pid: Pid) {
    // SAFETY: the API table is filled at load; the server checks the pid is its module child.
    unsafe {
        if let Some(kill) = raw::RedisModule_KillForkChild {
            kill(pid);
        }
    }
}

/// If the child has exited, reaps it now (through the server, which then forgets it and lets
/// the next child fork) and returns how it ended; `None` while it runs. Without this the
/// parent would learn of the end only when the server reaps the child in its cron, up to a
/// tenth of a second later (`hz 10`).
pub fn reap_if_exited(pid: Pid) -> Option<Exit> {
    // SAFETY: `waitid` with WNOWAIT only looks at the child, leaving it to be reaped below;
    // `info` is a valid siginfo_t for it to fill; `si_pid`/`si_status` are read only after
    // waitid filled it for an exited child.
    let outcome = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        if libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) != 0
            || info.si_pid() != pid
        {
            return None;
        }
        (info.si_status(), info.si_code != libc::CLD_EXITED)
    };
    // The server's kill of its module child: a signal the dead child ignores, then `waitpid`,
    // which returns at once, and the child's slot freed. Its done handler is not called.
    kill_child(pid);
    Some(outcome)
}
