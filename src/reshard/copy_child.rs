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
//!
//! Every database that has keys is walked in turn; its keys go to the same database number at
//! their destination.

use std::cell::UnsafeCell;
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::{raw, CallOptionsBuilder, CallReply, CallResult, Context, RedisString};

use crate::reshard::pace::Pace;
use crate::reshard::payload;
use crate::reshard::pieces::{self, Kind, Limits};
use crate::reshard::ship::{Shipper, Tally, Target, Window};
use crate::ring::placement::Placement;

/// Where a pass finds its keys.
pub enum Source {
    /// Every key of the snapshot.
    Scan,
    /// These keys only (written after the previous pass's fork), sorted by database.
    Keys(Vec<crate::reshard::dirty::DbKey>),
}

/// What a pass needs to know.
pub struct Pass {
    pub ring: Arc<Placement>,
    pub self_name: String,
    pub source: Source,
    pub replace: bool,
    pub timeout: Duration,
    pub auth: Option<(String, String)>,
    /// Keys per second (0: no limit) and whether the job is paused, when the pass starts.
    pub max_rate: u64,
    pub paused: bool,
    /// Which keys travel in pieces.
    pub big: Limits,
}

const ERROR_BYTES: usize = 400;

/// Databases whose counts `STATUS` shows one by one (the totals count every database).
pub const MAX_DBS: usize = 64;

/// Puts the calling (child) process under Linux's `SCHED_IDLE` policy: it runs only on a CPU
/// nothing else wants, and any woken task of the server (the main thread answering a client)
/// takes the CPU from it at once. (Nice 10 alone left `PING`s waiting for a CPU for tens of ms
/// on a 2-core machine: `bench/findings.md`.) Falls back to nice 19 where the policy is refused.
pub fn lower_priority() {
    // SAFETY: changes this process's own scheduling; `param` is a valid sched_param.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        }
    }
}

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
        for c in &self.copied_by_db {
            c.store(0, Ordering::Relaxed);
        }
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

    fn publish(&self, scanned: u64, tally: &Tally, in_flight: usize) {
        self.scanned.store(scanned, Ordering::Relaxed);
        self.copied.store(tally.copied, Ordering::Relaxed);
        self.skipped.store(tally.skipped, Ordering::Relaxed);
        self.failed.store(tally.failed, Ordering::Relaxed);
        self.bytes_sent.store(tally.bytes_sent, Ordering::Relaxed);
        self.in_flight.store(in_flight as u64, Ordering::Relaxed);
        for (c, n) in self.copied_by_db.iter().zip(&tally.copied_by_db) {
            c.store(*n, Ordering::Relaxed);
        }
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
    shared.max_rate.store(pass.max_rate, Ordering::Relaxed);
    shared
        .paused
        .store(u64::from(pass.paused), Ordering::Relaxed);
    let pid = fork_child(done)?;
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
        exit_child(code);
    }
    Ok(pid)
}

/// Ends a child made by `fork_child`, with `code` (0: its work is done).
pub fn exit_child(code: c_int) -> ! {
    // SAFETY: called in the child only; neither call returns.
    unsafe {
        if let Some(exit) = raw::RedisModule_ExitFromChild {
            exit(code);
        }
        libc::_exit(code)
    }
}

/// Forks through Redis (`RedisModule_Fork`): the child's pid in the parent, 0 in the child
/// (which then runs at the lowest priority), or why no child could start (Redis runs one at a
/// time: a `BGSAVE` or an AOF rewrite may be running).
pub fn fork_child(done: Done) -> Result<c_int, String> {
    // SAFETY: the API table is filled at load.
    let fork = unsafe { raw::RedisModule_Fork }.ok_or("RedisModule_Fork is missing")?;
    // SAFETY: Redis forks; `done` is called on its main thread when the child exits.
    let pid = unsafe { fork(Some(done), std::ptr::null_mut()) };
    if pid < 0 {
        return Err("another child process (BGSAVE, AOF rewrite) is running".into());
    }
    if pid == 0 {
        // The child yields the CPU to the server's clients: a copy may go slower, not them.
        lower_priority();
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

/// If the child has exited, reaps it now (through Redis, which then forgets it and lets the
/// next child fork) and returns its (exit code, killed by a signal); `None` while it runs.
/// Without this a job would learn of the end only when Redis reaps the child in its cron, up
/// to a tenth of a second later (`hz 10`), once per pass.
pub fn reap_if_exited(pid: c_int) -> Option<(c_int, bool)> {
    // SAFETY: `waitid` with WNOWAIT only looks at the child, leaving it to be reaped below;
    // `info` is a valid siginfo_t for it to fill.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        if libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) != 0
            || info.si_pid() != pid
        {
            return None;
        }
        let outcome = (info.si_status(), info.si_code != libc::CLD_EXITED);
        // Redis's kill of its module child: a signal the dead child ignores, then `waitpid`,
        // which returns at once, and the child's slot freed. Its done handler is not called.
        kill(pid);
        Some(outcome)
    }
}

/// A key the scan found that goes to another node.
struct Found {
    name: Vec<u8>,
    /// Index of its owner in the ring.
    owner: usize,
    kind: Kind,
    /// Bytes of a string, elements of a collection.
    len: usize,
    /// Absolute expiry in Unix ms, 0 for none.
    expires_at: i64,
}

/// Keys are serialized and shipped this many at a time.
const BATCH: usize = 256;

/// What the scan callback fills.
struct ScanState<'a> {
    ring: &'a crate::ring::Ring,
    self_index: Option<usize>,
    scanned: u64,
    found: Vec<Found>,
}

/// The child's work.
fn run(ctx: &Context, pass: &Pass, shared: &Shared) {
    let Some(ring) = pass.ring.ring.as_ref() else {
        shared.set_error("the cluster algo has no ring to reshard");
        return;
    };
    let targets: Vec<Target> = ring
        .spec()
        .nodes
        .iter()
        .map(|n| Target {
            name: n.name.clone(),
            // A `sentinel` node's address as the parent knew it at the fork.
            address: crate::topology::nodes::endpoint_of(n, "").address,
        })
        .collect();
    let mut state = ScanState {
        ring,
        self_index: ring.spec().node_index(&pass.self_name),
        scanned: 0,
        found: Vec::with_capacity(BATCH * 2),
    };
    let mut copier = Copier {
        ctx,
        shared,
        pace: Pace::default(),
        // The TLS configuration in force at the fork (the child's copy of the main thread's).
        shipper: Shipper::new(
            Window::default(),
            pass.timeout,
            pass.auth.clone(),
            crate::net::tls::current(),
        ),
        targets,
        replace: pass.replace,
        big: pass.big,
        version: None,
        payload: Vec::new(),
    };
    match &pass.source {
        Source::Scan => {
            for db in 0.. {
                if !select_db(ctx, db) {
                    break;
                }
                // SAFETY: the API table is filled at load.
                if unsafe { raw::RedisModule_DbSize.map_or(0, |f| f(ctx.ctx)) } == 0 {
                    continue;
                }
                copier.shipper.select(db);
                if !scan_db(ctx, &mut state, &mut copier, shared) {
                    shared.set_error("RedisModule_Scan is missing");
                    return;
                }
            }
        }
        Source::Keys(keys) => {
            let mut db = 0;
            select_db(ctx, 0);
            for chunk in keys.chunks(BATCH) {
                for (key_db, name) in chunk {
                    if *key_db != db {
                        copier.ship(&mut state.found);
                        db = *key_db;
                        select_db(ctx, db);
                        copier.shipper.select(db);
                    }
                    state.scanned += 1;
                    if let Some(found) = look_up(ctx, &state, name) {
                        state.found.push(found);
                    }
                }
                copier.ship(&mut state.found);
                shared.publish(
                    state.scanned,
                    &copier.shipper.tally,
                    copier.shipper.in_flight(),
                );
            }
        }
    }
    copier.shipper.finish();
    shared.publish(state.scanned, &copier.shipper.tally, 0);
    if !copier.shipper.tally.last_error.is_empty() {
        shared.set_error(&copier.shipper.tally.last_error);
    }
}

/// Selects database `db` on `ctx` (a job's context, or its child's) for what it reads or
/// writes next; false if there is no such database.
pub fn select_db(ctx: &Context, db: i32) -> bool {
    // SAFETY: the API table is filled at load; a live context of the job.
    let selected = unsafe { raw::RedisModule_SelectDb.map(|f| f(ctx.ctx, db)) };
    selected == Some(raw::REDISMODULE_OK as c_int)
}

/// Copies the keys of the selected database that go elsewhere; false without `RedisModule_Scan`.
fn scan_db(ctx: &Context, state: &mut ScanState, copier: &mut Copier, shared: &Shared) -> bool {
    // SAFETY: the API table is filled at load; the cursor is destroyed below.
    let cursor = unsafe { raw::RedisModule_ScanCursorCreate.map(|f| f()) };
    let (Some(cursor), Some(scan)) = (cursor, unsafe { raw::RedisModule_Scan }) else {
        return false;
    };
    loop {
        // SAFETY: the callback only reads the key it is given and pushes to `state`.
        let more = unsafe {
            scan(
                ctx.ctx,
                cursor,
                Some(on_key),
                std::ptr::addr_of_mut!(*state).cast(),
            )
        } != 0;
        if state.found.len() >= BATCH || !more {
            copier.ship(&mut state.found);
            shared.publish(
                state.scanned,
                &copier.shipper.tally,
                copier.shipper.in_flight(),
            );
        }
        if !more {
            break;
        }
    }
    // SAFETY: created above.
    unsafe {
        if let Some(destroy) = raw::RedisModule_ScanCursorDestroy {
            destroy(cursor);
        }
    }
    true
}

/// The owner of `name` when it is another node.
fn moving(state: &ScanState, name: &[u8]) -> Option<usize> {
    let owner = state.ring.owner(name);
    (Some(owner) != state.self_index).then_some(owner)
}

/// Type and expiry of a key the scan did not hand over (a pass over written keys).
fn look_up(ctx: &Context, state: &ScanState, name: &[u8]) -> Option<Found> {
    let owner = moving(state, name)?;
    let key_name = ctx.create_string(name);
    // SAFETY: the API table is filled at load; the key is closed before returning.
    unsafe {
        let key =
            raw::RedisModule_OpenKey?(ctx.ctx, key_name.inner, raw::REDISMODULE_READ as c_int)
                .cast::<raw::RedisModuleKey>();
        if key.is_null() {
            return None;
        }
        let found = describe(key).map(|(kind, len, expires_at)| Found {
            name: name.to_vec(),
            owner,
            kind,
            len,
            expires_at,
        });
        if let Some(close) = raw::RedisModule_CloseKey {
            close(key);
        }
        found
    }
}

/// An open key's type, length (bytes of a string, elements of a collection) and absolute
/// expiry (0: none); `None` when empty.
///
/// # Safety
/// `key` must be an open key.
unsafe fn describe(key: *mut raw::RedisModuleKey) -> Option<(Kind, usize, i64)> {
    // SAFETY: the caller's key; the API table is filled at load.
    unsafe {
        let kind = raw::RedisModule_KeyType?(key);
        if kind == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
            return None;
        }
        let expires_at = match raw::RedisModule_GetAbsExpire {
            Some(abs) => abs(key),
            None => {
                let rel = raw::RedisModule_GetExpire?(key);
                if rel < 0 {
                    rel
                } else {
                    crate::clock::now_ms()?.saturating_add(rel)
                }
            }
        };
        let kind = match kind as isize {
            raw::REDISMODULE_KEYTYPE_STRING => Kind::String,
            raw::REDISMODULE_KEYTYPE_LIST => Kind::List,
            raw::REDISMODULE_KEYTYPE_HASH => Kind::Hash,
            raw::REDISMODULE_KEYTYPE_SET => Kind::Set,
            raw::REDISMODULE_KEYTYPE_ZSET => Kind::ZSet,
            raw::REDISMODULE_KEYTYPE_STREAM => Kind::Stream,
            _ => Kind::Other,
        };
        let len = raw::RedisModule_ValueLength.map_or(0, |f| f(key));
        Some((kind, len, expires_at.max(0)))
    }
}

extern "C" fn on_key(
    _ctx: *mut raw::RedisModuleCtx,
    keyname: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    privdata: *mut c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `privdata` is the `ScanState` `run` passed, alive for the scan call; Redis
        // passes a live name and key for the duration of the callback.
        unsafe {
            let state = &mut *privdata.cast::<ScanState>();
            state.scanned += 1;
            if key.is_null() {
                return;
            }
            let name = RedisString::string_as_slice(keyname);
            let Some(owner) = moving(state, name) else {
                return;
            };
            if let Some((kind, len, expires_at)) = describe(key) {
                state.found.push(Found {
                    name: name.to_vec(),
                    owner,
                    kind,
                    len,
                    expires_at,
                });
            }
        }
    }));
}

/// Serializes found keys and hands them to the shipper.
struct Copier<'a> {
    ctx: &'a Context,
    shared: &'a Shared,
    pace: Pace,
    shipper: Shipper,
    targets: Vec<Target>,
    replace: bool,
    big: Limits,
    /// The RDB version of this server's `DUMP`, once seen.
    version: Option<u16>,
    payload: Vec<u8>,
}

impl Copier<'_> {
    fn ship(&mut self, found: &mut Vec<Found>) {
        let options = CallOptionsBuilder::new().build();
        // Big keys: in pieces.
        let big = self.big;
        for f in found.iter().filter(|f| big.big_by_length(f.kind, f.len)) {
            self.in_pieces(f);
        }
        found.retain(|f| !big.big_by_length(f.kind, f.len));
        // Strings: their values in one MGET, their payloads built here.
        let strings: Vec<&Found> = found.iter().filter(|f| f.kind == Kind::String).collect();
        if !strings.is_empty() {
            let names: Vec<&[u8]> = strings.iter().map(|f| f.name.as_slice()).collect();
            let reply: CallResult = self.ctx.call_ext("MGET", &options, names.as_slice());
            if let Ok(CallReply::Array(values)) = reply {
                for (f, value) in strings.iter().zip(values.iter()) {
                    // Anything else: gone since the scan saw it.
                    if let Ok(CallReply::String(v)) = value {
                        match self.version {
                            Some(version) => {
                                let mut payload = std::mem::take(&mut self.payload);
                                payload::string_payload(&mut payload, v.as_bytes(), version);
                                self.restore(f, &payload);
                                self.payload = payload;
                            }
                            None => self.dump_and_restore(f),
                        }
                    }
                }
            }
        }
        for f in found.iter().filter(|f| f.kind != Kind::String) {
            self.dump_and_restore(f);
        }
        found.clear();
    }

    /// Ships the server's own `DUMP` of the key (and learns its RDB version), or the key in
    /// pieces when the payload is too big.
    fn dump_and_restore(&mut self, f: &Found) {
        let options = CallOptionsBuilder::new().build();
        let dump: CallResult = self.ctx.call_ext("DUMP", &options, &[f.name.as_slice()]);
        if let Ok(CallReply::String(payload)) = dump {
            if self.version.is_none() {
                self.version = payload::rdb_version(payload.as_bytes());
            }
            if self.big.big_by_payload(f.kind, payload.as_bytes().len()) {
                self.in_pieces(f);
            } else {
                self.restore(f, payload.as_bytes());
            }
        }
    }

    /// Ships a big key in pieces.
    fn in_pieces(&mut self, f: &Found) {
        self.wait_turn();
        let Some(target) = self.targets.get(f.owner) else {
            return;
        };
        pieces::copy(
            self.ctx,
            &mut self.shipper,
            target,
            &f.name,
            f.kind,
            f.expires_at,
            self.replace,
        );
    }

    /// Waits while the job is paused (its connections closed) or ahead of its rate.
    fn wait_turn(&mut self) {
        loop {
            if self.shared.paused.load(Ordering::Relaxed) != 0 {
                self.shipper.finish();
                self.shipper.close();
                self.shared.in_flight.store(0, Ordering::Relaxed);
                self.pace.restart();
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let rate = self.shared.max_rate.load(Ordering::Relaxed);
            let now = Instant::now();
            if self.pace.allowance(rate, now) > 0 {
                self.pace.spend(1);
                return;
            }
            std::thread::sleep(self.pace.wait(now).min(Duration::from_millis(50)));
        }
    }

    fn restore(&mut self, f: &Found, payload: &[u8]) {
        self.wait_turn();
        let Some(target) = self.targets.get(f.owner) else {
            return;
        };
        let mut ttl = itoa::Buffer::new();
        let ttl = ttl.format(f.expires_at).as_bytes();
        let mut args: Vec<&[u8]> = vec![b"RESTORE", &f.name, ttl, payload, b"ABSTTL"];
        if self.replace {
            args.push(b"REPLACE");
        }
        self.shipper.send(target, &args);
    }
}
