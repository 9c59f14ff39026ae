//! One pass of a copy, run by a forked child (`host::fork`), the way `BGSAVE` and Valkey's slot
//! migration work: the child walks its snapshot of the keyspace (`host::keyspace`), picks each
//! key this node no longer owns, and hands them in batches to `copy_serialize`, which ships
//! them as `RESTORE key ttl payload ABSTTL` to their owner (`ship`), while the main thread
//! serves clients untouched. The child reports its counts through the page it shares with the
//! parent (`copy_page`).
//!
//! Why a fork and not time-bounded steps on the main thread, measured (bench/findings.md,
//! "Where a copy's time goes"): serializing a small key through `DUMP` costs the thread that does
//! it about 2 µs, so steps that must leave the server 70% of its time cap a copy near 100 000
//! keys/s and tax every client; the child serializes at its own core's pace and the
//! destination's `RESTORE` rate becomes the limit. What the fork costs the server is the fork
//! itself (page tables: about 1 ms per 100 MB of dataset here, 5-16 ms of the main thread at 1-3
//! M keys) and copy-on-write of the pages written while the child runs. Where that stall matters
//! more than the main thread's share, `copy_steps` runs a pass without a fork
//! (`shard.copy-fork`, by default whenever the key index is ready).
//!
//! Keys written here after the fork are not in the snapshot: `dirty` records them (keyspace
//! events) and the next pass copies just those, until a pass has nothing to copy.
//!
//! Every database that has keys is walked in turn; its keys go to the same database number at
//! their destination.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis_module::Context;

use crate::host::fork::{self, Exit, Forked, Pid};
use crate::host::keyspace::{self, KeyInfo, ScanCursor};
use crate::reshard::copy_page::{self, Shared};
use crate::reshard::copy_serialize::Copier;
use crate::reshard::dirty::DbKey;
use crate::reshard::moved::ListWriter;
use crate::reshard::pieces::Limits;
use crate::reshard::ship::{Shipper, Target, Window};
use crate::ring::placement::Placement;

/// Where a pass finds its keys.
pub enum Source {
    /// Every key of the snapshot.
    Scan,
    /// The keys the key index names in the buckets that the ring does not give wholly to this
    /// node (the parent checked the index is ready for the ring).
    Index,
    /// These keys only (written after the previous pass's fork), sorted by database.
    Keys(Vec<DbKey>),
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
    /// Where a walk writes the names it finds going elsewhere, for the cleanup (`moved`).
    pub list: Option<std::path::PathBuf>,
    /// The ring the keys leave: only the keys it gives to this node travel
    /// (`CopyOptions::leaving`).
    pub leaving: Option<Arc<Placement>>,
    /// Each node of the ring as a destination, with its address at the fork (`targets`).
    pub targets: Vec<Target>,
    /// The destinations this pass ships to, by node index (`None`: all): a pass that sends
    /// again what a failover lost walks for those only (`failover`).
    pub only: Option<Vec<bool>>,
}

/// The nodes of `ring` as a copy's destinations: the address each has now (Sentinel's, for a
/// `sentinel` node: the child keeps it for its whole pass), and whether it is followed through
/// a failover.
pub fn targets(ring: &Placement) -> Vec<Target> {
    ring.spec
        .nodes
        .iter()
        .enumerate()
        .map(|(index, n)| Target {
            name: n.name.clone(),
            address: crate::topology::nodes::endpoint_of(n, "").address,
            index,
            followed: n.via_sentinel() && index < copy_page::MAX_FOLLOWED,
        })
        .collect()
}

/// `SHARD.DEBUG COPY-CHILD-END ms`: a copy's child waits `ms` after its pass before it exits,
/// and the job leaves reaping it to the server's cron (the tests make the server reap the
/// child, and a refused fork happen while it runs, deterministically). 0: off.
static END_HOLD_MS: AtomicU64 = AtomicU64::new(0);

/// Sets `END_HOLD_MS` (0: off).
pub fn hold_end(ms: u64) {
    END_HOLD_MS.store(ms, Ordering::Relaxed);
}

/// Whether the job leaves reaping its child to the server (`END_HOLD_MS`).
pub fn end_held() -> bool {
    END_HOLD_MS.load(Ordering::Relaxed) > 0
}

/// Forks a child that runs `pass`; its pid, or why it could not start (another child, such as
/// a `BGSAVE`, is running: Redis runs one at a time). `done` is told on the main thread when
/// the child exits.
pub fn start(ctx: &Context, pass: &Pass, done: fn(Exit)) -> Result<Pid, String> {
    let shared = copy_page::shared().ok_or("cannot map the page shared with the copy's child")?;
    shared.reset();
    shared.max_rate.store(pass.max_rate, Ordering::Relaxed);
    shared
        .paused
        .store(u64::from(pass.paused), Ordering::Relaxed);
    match fork::fork(done)? {
        Forked::Parent(pid) => Ok(pid),
        Forked::Child => {
            let outcome = catch_unwind(AssertUnwindSafe(|| run(ctx, pass, shared)));
            let hold = END_HOLD_MS.load(Ordering::Relaxed);
            if hold > 0 {
                std::thread::sleep(Duration::from_millis(hold));
            }
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
            fork::exit_child(code)
        }
    }
}

/// A key the walk found that goes to another node.
pub struct Found {
    pub name: Vec<u8>,
    /// Index of its owner in the ring.
    pub owner: usize,
    pub info: KeyInfo,
    /// Whether it travels: the ring it leaves (the previous ring) gave it to this node. A key
    /// that ring gave elsewhere is a stray (an earlier cleanup's leftover): listed for the
    /// cleanup, never shipped, so it cannot replace or bring back the owner's key.
    pub travels: bool,
}

/// Keys are serialized and shipped this many at a time.
pub(super) const BATCH: usize = 256;

/// What the walk has seen and found (a child's, or a pass in steps', `copy_steps`).
pub(super) struct Walk<'a> {
    ring: &'a crate::ring::Ring,
    self_index: Option<usize>,
    /// The ring the keys leave (the previous ring: the old one in a resharding, the one being
    /// left in a cancel's copy back) and this node's index in it; a key travels only if that
    /// ring gives it to this node.
    leaving: Option<(&'a crate::ring::Ring, Option<usize>)>,
    /// The destinations shipped to, by node index (`Pass::only`).
    only: Option<&'a [bool]>,
    pub(super) scanned: u64,
    pub(super) found: Vec<Found>,
}

impl<'a> Walk<'a> {
    /// A walk of `pass`'s ring for `pass`'s node (`None` when the ring has none).
    pub(super) fn of(
        ring: &'a Placement,
        self_name: &str,
        leaving: Option<&'a Placement>,
        only: Option<&'a [bool]>,
    ) -> Option<Walk<'a>> {
        let ring = ring.ring.as_ref()?;
        let leaving = leaving
            .and_then(|p| p.ring.as_ref())
            .map(|left| (left, left.spec().node_index(self_name)));
        Some(Walk {
            ring,
            self_index: ring.spec().node_index(self_name),
            leaving,
            only,
            scanned: 0,
            // Empty: a pass in steps makes a walk for every few names and keeps its own list
            // (`copy_steps`); the child reserves its batches' room itself (`run`).
            found: Vec::new(),
        })
    }

    /// Every bucket the ring does not give wholly to this node (all of them when it is no
    /// node): those whose keys a pass from the key index looks at.
    pub(super) fn buckets_to_visit(&self) -> Vec<bool> {
        self.ring.buckets_not_wholly_of(self.self_index)
    }

    /// The owner of `name` when it is another node, and whether the key travels there.
    fn moving(&self, name: &[u8]) -> Option<(usize, bool)> {
        let owner = self.ring.owner(name);
        if Some(owner) == self.self_index
            || self
                .only
                .is_some_and(|only| !only.get(owner).copied().unwrap_or(false))
        {
            return None;
        }
        let travels = match self.leaving {
            Some((left, me)) => me.is_some() && Some(left.owner(name)) == me,
            None => true,
        };
        Some((owner, travels))
    }
}

/// The child's work.
fn run(ctx: &Context, pass: &Pass, shared: &Shared) {
    let Some(mut walk) = Walk::of(
        &pass.ring,
        &pass.self_name,
        pass.leaving.as_deref(),
        pass.only.as_deref(),
    ) else {
        shared.set_error("the cluster algo has no ring to reshard");
        return;
    };
    walk.found.reserve(BATCH * 2);
    let targets = pass.targets.clone();
    // The TLS configuration in force at the fork (the child's copy of the main thread's).
    let shipper = Shipper::new(
        Window::default(),
        pass.timeout,
        pass.auth.clone(),
        crate::net::tls::current(),
    );
    let mut copier = Copier::new(shared, shipper, targets, pass.replace, pass.big);
    match &pass.source {
        Source::Scan => {
            let mut list = pass.list.clone().and_then(ListWriter::create);
            for db in 0.. {
                if !keyspace::select_db(ctx, db) {
                    break;
                }
                if keyspace::db_size(ctx) == 0 {
                    continue;
                }
                copier.shipper.select(db);
                if !scan_db(ctx, db, &mut walk, &mut copier, shared, list.as_mut()) {
                    shared.set_error("RedisModule_Scan is missing");
                    return;
                }
            }
            // (A list that could not be written whole is removed: the cleanup walks.)
            if let Some(list) = list {
                list.finish();
            }
        }
        Source::Index => {
            let mut list = pass.list.clone().and_then(ListWriter::create);
            by_index(ctx, &mut walk, &mut copier, shared, list.as_mut());
            if let Some(list) = list {
                list.finish();
            }
        }
        Source::Keys(keys) => {
            let mut db = 0;
            keyspace::select_db(ctx, 0);
            for chunk in keys.chunks(BATCH) {
                for (key_db, name) in chunk {
                    if *key_db != db {
                        copier.ship(ctx, &mut walk.found);
                        db = *key_db;
                        keyspace::select_db(ctx, db);
                        copier.shipper.select(db);
                    }
                    walk.scanned += 1;
                    if let Some(found) = look_up(ctx, &walk, name) {
                        walk.found.push(found);
                    }
                }
                copier.ship(ctx, &mut walk.found);
                shared.publish(
                    walk.scanned,
                    &copier.shipper.tally,
                    copier.shipper.in_flight(),
                );
            }
        }
    }
    copier.shipper.finish();
    shared.publish(walk.scanned, &copier.shipper.tally, 0);
    if !copier.shipper.tally.last_error.is_empty() {
        shared.set_error(&copier.shipper.tally.last_error);
    }
}

/// Copies the keys of the selected database (`db`) that go elsewhere, and adds their names to
/// the cleanup's list; false without the scan API.
fn scan_db(
    ctx: &Context,
    db: i32,
    walk: &mut Walk,
    copier: &mut Copier,
    shared: &Shared,
    mut list: Option<&mut ListWriter>,
) -> bool {
    let Some(cursor) = ScanCursor::new() else {
        return false;
    };
    loop {
        let more = cursor.scan(ctx, &mut |name, key| {
            walk.scanned += 1;
            let Some((owner, travels)) = walk.moving(name) else {
                return;
            };
            if let Some(info) = key.info() {
                walk.found.push(Found {
                    name: name.to_vec(),
                    owner,
                    info,
                    travels,
                });
            }
        });
        if walk.found.len() >= BATCH || !more {
            ship_found(ctx, db, walk, copier, shared, list.as_deref_mut());
        }
        if !more {
            break;
        }
    }
    true
}

/// Copies the keys of the buckets the ring does not give wholly to this node, as the key index
/// names them, and adds their names to the cleanup's list.
fn by_index(
    ctx: &Context,
    walk: &mut Walk,
    copier: &mut Copier,
    shared: &Shared,
    mut list: Option<&mut ListWriter>,
) {
    let visit = walk.buckets_to_visit();
    crate::index::in_child(|index| {
        for db in index.databases() {
            if !keyspace::select_db(ctx, db) {
                continue;
            }
            copier.shipper.select(db);
            for (bucket, _) in index.buckets(db) {
                if !visit[usize::from(bucket)] {
                    continue;
                }
                for name in index.names(db, bucket) {
                    walk.scanned += 1;
                    if let Some(found) = look_up(ctx, walk, name) {
                        walk.found.push(found);
                    }
                    // (Within the bucket: one bucket may hold a hash tag's million keys.)
                    if walk.found.len() >= BATCH {
                        ship_found(ctx, db, walk, copier, shared, list.as_deref_mut());
                    }
                }
            }
            ship_found(ctx, db, walk, copier, shared, list.as_deref_mut());
        }
    });
}

/// Ships what the walk found in database `db` (adding the names to the cleanup's list, when
/// the pass writes one) and publishes the counts.
fn ship_found(
    ctx: &Context,
    db: i32,
    walk: &mut Walk,
    copier: &mut Copier,
    shared: &Shared,
    list: Option<&mut ListWriter>,
) {
    if let Some(list) = list {
        for f in &walk.found {
            list.add(db, &f.name);
        }
    }
    copier.ship(ctx, &mut walk.found);
    shared.publish(
        walk.scanned,
        &copier.shipper.tally,
        copier.shipper.in_flight(),
    );
}

/// A key the scan did not hand over (a pass over written keys), if it goes elsewhere and is
/// still there.
pub(super) fn look_up(ctx: &Context, walk: &Walk, name: &[u8]) -> Option<Found> {
    let (owner, travels) = walk.moving(name)?;
    let info = keyspace::look_up(ctx, name)?;
    Some(Found {
        name: name.to_vec(),
        owner,
        info,
        travels,
    })
}
