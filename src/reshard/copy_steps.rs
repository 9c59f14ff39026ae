//! One pass of a copy run on the main thread in time-bounded steps, without a fork: the
//! alternative to `copy_child` for a server that must not be held while the kernel copies its
//! page tables (5-16 ms of the main thread per fork at 1-3 M keys, bench/findings.md "No
//! stall"). Each step takes the next names, looks each key up, serializes those that go
//! elsewhere the way the child does (`copy_serialize::Copier`: strings in one `MGET`, the rest
//! through `DUMP`) and queues the commands for the pass's shipping thread (`ship_thread`),
//! until its budget is spent, the thread is behind, or the job's rate or pause says wait.
//!
//! Where the names come from:
//! - the key index (`Cursor::Index`), ready for the ring: the buckets the ring does not give
//!   wholly to this node, a page of names at a time (a page's index is stable while names come
//!   and go, `KeyIndex::page_count`). A key present through the whole pass is in the index
//!   when its page is taken, so it is seen; one written (or created) meanwhile is recorded by
//!   `dirty` from the pass's start, as after a fork, and the next pass sends it again;
//! - the keys written during the pass before (`Cursor::Keys`);
//! - a scan of the keyspace (`Cursor::Scan`, `shard.copy-fork no` without a ready index):
//!   `RedisModule_Scan` returns every key present throughout (some twice); no list is written
//!   for the cleanup, whose names would repeat.
//!
//! Where it differs from a child, measured in bench/findings.md: the main thread serializes
//! (about 1-2 µs a key), and a big key (`pieces`), which waits for its destination's answers
//! mid-key, is left to a forked pass (`Outbox::big`). A load or `SWAPDB` during the pass, or
//! the index no longer ready, ends it broken, as a child that died.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_module::Context;

use crate::host::keyspace::{self, ScanCursor};
use crate::reshard::copy_child::{self, Found, Pass, Source, Walk, BATCH};
use crate::reshard::copy_page::{self, Shared};
use crate::reshard::copy_serialize::{Copier, Sink};
use crate::reshard::dirty::DbKey;
use crate::reshard::index_cursor::{self, IndexCursor};
use crate::reshard::moved::ListWriter;
use crate::reshard::pace::Pace;
use crate::reshard::ship::{Shipper, Window};
use crate::reshard::ship_thread::Outbox;
use crate::ring::placement::Placement;

/// `shard.copy-fork`: whether a copy pass forks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every pass forks (the copy before issue 44).
    Yes,
    /// Every pass runs in steps (a scan of the keyspace when the key index is not ready); a
    /// big key still goes in a forked pass.
    No,
    /// A pass forks only to walk the whole keyspace without a ready key index (or for a big
    /// key): the walk of the index and the passes over written keys run in steps.
    Auto,
}

static MODE: AtomicU8 = AtomicU8::new(2);

impl Mode {
    /// `yes`, `no` or `auto`.
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "yes" => Some(Mode::Yes),
            "no" => Some(Mode::No),
            "auto" => Some(Mode::Auto),
            _ => None,
        }
    }

    /// Puts the mode in force.
    pub fn set(self) {
        MODE.store(self as u8, Ordering::Relaxed);
    }

    /// The mode in force.
    pub fn now() -> Mode {
        match MODE.load(Ordering::Relaxed) {
            0 => Mode::Yes,
            1 => Mode::No,
            _ => Mode::Auto,
        }
    }

    /// Whether a pass of `source` runs in steps.
    pub fn by_steps(self, source: &Source) -> bool {
        match self {
            Mode::Yes => false,
            Mode::No => true,
            Mode::Auto => !matches!(source, Source::Scan),
        }
    }
}

/// Bumped when the keyspace is replaced under a pass (a load begins, `SWAPDB`): the pass's
/// position no longer means anything.
static REPLACED: AtomicU64 = AtomicU64::new(0);

/// The keyspace was replaced (a load, a `SWAPDB`): a pass in steps under way ends broken.
pub fn keyspace_replaced() {
    REPLACED.fetch_add(1, Ordering::Relaxed);
}

/// Names looked up between two looks at the clock.
const CHUNK: usize = 32;

/// Where the next names come from.
enum Cursor {
    Index(IndexCursor),
    Keys { keys: Vec<DbKey>, at: usize },
    Scan { db: i32, cursor: ScanCursor },
}

/// A pass under way in steps.
pub struct Steps {
    ring: Arc<Placement>,
    self_name: String,
    leaving: Option<Arc<Placement>>,
    only: Option<Vec<bool>>,
    cursor: Option<Cursor>,
    copier: Copier<'static, Outbox>,
    shared: &'static Shared,
    /// Names taken and not looked up yet, of database `db`.
    names: Vec<Vec<u8>>,
    db: i32,
    scanned: u64,
    found: Vec<Found>,
    list: Option<ListWriter>,
    pace: Pace,
    replaced: u64,
    /// The thread was told to close its connections (the job is paused).
    closed: bool,
    /// Why the pass ended before its end.
    pub broken: Option<String>,
}

/// The next names a cursor gives.
enum Next {
    Names(i32, Vec<Vec<u8>>),
    End,
    Broken(&'static str),
}

/// What a step came to.
pub enum Progress {
    /// More to do at once.
    More,
    /// Nothing to do for this long (the thread is behind, the job is paused or at its rate,
    /// or the thread is waiting for the last replies).
    Wait(Duration),
    /// The pass is over (its thread joined).
    Done,
}

/// Starts `pass` in steps: its shipping thread, and the first names to come. On an error
/// the pass's source is left in it (its keys go back to the record of written keys).
pub fn start(ctx: &Context, pass: &mut Pass) -> Result<Steps, String> {
    let shared = copy_page::shared().ok_or("cannot map the page shared with the copy's child")?;
    if pass.ring.ring.is_none() {
        return Err("the cluster algo has no ring to reshard".into());
    }
    // What may fail comes before the source is taken.
    let mut index = None;
    let mut scan = None;
    match &pass.source {
        Source::Index => {
            index = Some(
                IndexCursor::new(&pass.ring, &pass.self_name)
                    .ok_or("the key index is no longer ready")?,
            );
        }
        Source::Scan => scan = Some(ScanCursor::new().ok_or("RedisModule_Scan is missing")?),
        Source::Keys(_) => {}
    }
    shared.reset();
    let shipper = Shipper::new(
        Window::default(),
        pass.timeout,
        pass.auth.clone(),
        crate::net::tls::current(),
    );
    let outbox = Outbox::start(shipper, pass.targets.clone(), shared)?;
    let copier = Copier::new(shared, outbox, pass.targets.clone(), pass.replace, pass.big);
    let cursor = match std::mem::replace(&mut pass.source, Source::Keys(Vec::new())) {
        Source::Index => match index {
            Some(cursor) => Cursor::Index(cursor),
            None => return Err("the key index is no longer ready".into()),
        },
        Source::Keys(keys) => Cursor::Keys { keys, at: 0 },
        Source::Scan => match scan {
            Some(cursor) => Cursor::Scan { db: 0, cursor },
            None => return Err("RedisModule_Scan is missing".into()),
        },
    };
    let list = match cursor {
        Cursor::Index(_) => pass.list.clone().and_then(ListWriter::create),
        _ => None,
    };
    keyspace::select_db(ctx, 0);
    Ok(Steps {
        ring: Arc::clone(&pass.ring),
        self_name: pass.self_name.clone(),
        leaving: pass.leaving.clone(),
        only: pass.only.clone(),
        cursor: Some(cursor),
        copier,
        shared,
        names: Vec::new(),
        db: 0,
        scanned: 0,
        found: Vec::with_capacity(BATCH * 2),
        list,
        pace: Pace::default(),
        replaced: REPLACED.load(Ordering::Relaxed),
        closed: false,
        broken: None,
    })
}

impl Steps {
    /// Runs the pass for at most `budget`; `rate` keys per second (0: no limit) and `paused`
    /// are the job's.
    pub fn step(&mut self, ctx: &Context, budget: Duration, rate: u64, paused: bool) -> Progress {
        let started = Instant::now();
        if self.cursor.is_none() {
            return if self.copier.shipper.ended() {
                Progress::Done
            } else {
                Progress::Wait(Duration::from_millis(2))
            };
        }
        if self.replaced != REPLACED.load(Ordering::Relaxed) {
            self.end(Some(
                "the keyspace was replaced (a load or SWAPDB) during the pass",
            ));
            return Progress::More;
        }
        keyspace::select_db(ctx, self.db);
        loop {
            if self.copier.shipper.full() {
                return Progress::Wait(Duration::from_millis(1));
            }
            if paused {
                if !self.closed {
                    self.copier.shipper.close();
                    self.closed = true;
                }
                self.pace.restart();
                return Progress::Wait(Duration::from_millis(10));
            }
            self.closed = false;
            let now = Instant::now();
            if rate > 0 && self.pace.allowance(rate, now) == 0 {
                return Progress::Wait(
                    self.pace
                        .wait(now)
                        .clamp(Duration::from_millis(1), Duration::from_millis(50)),
                );
            }
            if started.elapsed() >= budget {
                return Progress::More;
            }
            if self.names.is_empty() && !self.next_names(ctx) {
                return Progress::More;
            }
            self.look_up_some(ctx);
        }
    }

    /// Looks up the next few names taken, shipping a batch when one is full (or the names
    /// taken are done).
    fn look_up_some(&mut self, ctx: &Context) {
        let Some(mut walk) = Walk::of(
            &self.ring,
            &self.self_name,
            self.leaving.as_deref(),
            self.only.as_deref(),
        ) else {
            self.end(Some("the cluster algo has no ring to reshard"));
            return;
        };
        std::mem::swap(&mut walk.found, &mut self.found);
        let from = self.names.len().saturating_sub(CHUNK);
        for name in self.names.drain(from..) {
            walk.scanned += 1;
            if let Some(found) = copy_child::look_up(ctx, &walk, &name) {
                walk.found.push(found);
            }
        }
        self.scanned += walk.scanned;
        std::mem::swap(&mut walk.found, &mut self.found);
        if self.found.len() >= BATCH || self.names.is_empty() {
            self.ship(ctx);
        }
        self.shared.scanned.store(self.scanned, Ordering::Relaxed);
    }

    /// Ships what was found (adding the names to the cleanup's list, when the pass writes
    /// one).
    fn ship(&mut self, ctx: &Context) {
        if self.found.is_empty() {
            return;
        }
        if let Some(list) = self.list.as_mut() {
            for f in &self.found {
                list.add(self.db, &f.name);
            }
        }
        self.pace.spend(self.found.len() as u64);
        self.copier.ship(ctx, &mut self.found);
    }

    /// Takes the next names (of one page of the index, a batch of written keys, or a scan's
    /// few); false when the pass ended or broke.
    fn next_names(&mut self, ctx: &Context) -> bool {
        let next = match self.cursor.as_mut() {
            Some(Cursor::Index(cursor)) => match cursor.next_page() {
                index_cursor::Next::Names(db, names) => Next::Names(db, names),
                index_cursor::Next::End => Next::End,
                index_cursor::Next::NotReady => {
                    Next::Broken("the key index stopped being ready during the pass")
                }
            },
            Some(Cursor::Keys { keys, at }) => match keys.get(*at) {
                None => Next::End,
                Some(&(db, _)) => {
                    let mut names = Vec::with_capacity(BATCH);
                    while let Some((key_db, name)) = keys.get_mut(*at) {
                        if *key_db != db || names.len() >= BATCH {
                            break;
                        }
                        names.push(std::mem::take(name));
                        *at += 1;
                    }
                    Next::Names(db, names)
                }
            },
            Some(Cursor::Scan { db, cursor }) => {
                let at = *db;
                if keyspace::select_db(ctx, at) {
                    let mut names = Vec::new();
                    let more = keyspace::db_size(ctx) > 0
                        && cursor.scan(ctx, &mut |name, _| names.push(name.to_vec()));
                    if !more {
                        *db += 1;
                        cursor.restart();
                    }
                    Next::Names(at, names)
                } else {
                    Next::End
                }
            }
            None => return false,
        };
        let (db, names) = match next {
            Next::Names(db, names) => (db, names),
            Next::End => {
                self.ship(ctx);
                self.end(None);
                return false;
            }
            Next::Broken(why) => {
                self.end(Some(why));
                return false;
            }
        };
        if db != self.db {
            // What was found is of the database before.
            self.ship(ctx);
            self.db = db;
            self.copier.shipper.select(db);
        }
        keyspace::select_db(ctx, db);
        // (Looked up from the end: the order within a page does not matter.)
        self.names = names;
        true
    }

    /// The names are all taken (or the pass broke): what was found is shipped, the list
    /// finished, and the thread told to finish.
    fn end(&mut self, broken: Option<&str>) {
        if self.cursor.take().is_none() {
            return;
        }
        if let Some(why) = broken {
            self.broken = Some(why.to_string());
            self.found.clear();
            self.list = None;
        }
        self.names.clear();
        // (A list that could not be written whole is removed: the cleanup walks.)
        if let Some(list) = self.list.take() {
            list.finish();
        }
        self.copier.shipper.end();
    }

    /// Keys queued and not answered yet.
    pub fn in_flight(&self) -> u64 {
        self.copier.shipper.in_flight()
    }

    /// The big keys met, for a forked pass.
    pub fn take_big(&mut self) -> Vec<DbKey> {
        std::mem::take(&mut self.copier.shipper.big)
    }
}
