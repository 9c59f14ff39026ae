//! The topology watcher as the main thread sees it: what to watch (Sentinel's masters, the
//! nodes whose replicas reads may go to or the cluster protocol's maps list, read from the module's state at most every 100 ms and
//! sent when it changes), the orders it sends the watcher's thread (`watch_loop`), and what it
//! hands back, applied on the main thread (`crate::topology::nodes::apply`). The thread never
//! touches the server or the module's state itself.
//!
//! Why a thread with blocking sockets and not the event loop's pool: a subscription is a
//! stream of pushes, not replies matched to requests, and these few queries per second are
//! nobody's hot path; waiting on them there never holds the server.

use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::host::event_loop;
use crate::net::tls::Tls;
use crate::state::{self, ModuleState};
use crate::topology::nodes::{ReadFrom, Update};
use crate::topology::{sentinel, watch_loop};

/// What to watch, read from the module's state at every turn.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Watch {
    pub(super) sentinels: Vec<String>,
    pub(super) sentinel_auth: Option<(String, String)>,
    pub(super) node_auth: Option<(String, String)>,
    pub(super) timeout: Duration,
    pub(super) refresh: Duration,
    /// Ring nodes whose address is `sentinel`.
    pub(super) masters: Vec<String>,
    /// The other ring nodes, (name, address): asked for `ROLE` when reads may go to replicas
    /// or the cluster protocol is on.
    pub(super) plain: Vec<(String, String)>,
    pub(super) replicas: bool,
    /// TLS toward the sentinels and the nodes, as in force on the main thread.
    pub(super) tls: SameTls,
}

/// The TLS configuration, equal when it is the same one (a rotated certificate is a change).
#[derive(Debug, Clone)]
pub(super) struct SameTls(pub(super) Option<Arc<Tls>>);

impl PartialEq for SameTls {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Watch {
    fn of(st: &ModuleState) -> Watch {
        let c = &st.config;
        let mut masters: Vec<String> = Vec::new();
        let mut plain: Vec<(String, String)> = Vec::new();
        let more = (more_rings())();
        let now = Instant::now();
        ASKED.with(|a| {
            let mut a = a.borrow_mut();
            a.retain(|(_, at)| now.duration_since(*at) < ASKED_FOR);
            masters.extend(a.iter().map(|(name, _)| name.clone()));
        });
        let specs = [st.rings.current.as_ref(), st.rings.previous.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| &p.spec)
            .chain(more.iter());
        for spec in specs {
            for n in &spec.nodes {
                if n.via_sentinel() {
                    if !masters.contains(&n.name) {
                        masters.push(n.name.clone());
                    }
                } else if !plain.iter().any(|(name, _)| *name == n.name) {
                    plain.push((n.name.clone(), n.address.clone()));
                }
            }
        }
        Watch {
            sentinels: sentinel::parse_sentinels(&c.sentinels).unwrap_or_default(),
            sentinel_auth: (!c.sentinel_password.is_empty())
                .then(|| (c.sentinel_user.clone(), c.sentinel_password.clone())),
            node_auth: c.auth(),
            timeout: Duration::from_millis(u64::try_from(c.call_timeout_ms.max(1)).unwrap_or(1000)),
            refresh: Duration::from_millis(
                u64::try_from(c.topology_refresh_ms.max(100)).unwrap_or(1000),
            ),
            masters,
            plain,
            // Reads may go to replicas, or the cluster protocol's maps list them, or a fleet
            // operation waits for its copies at the replicas Sentinel could promote
            // (`reshard::fleet::landed`).
            replicas: ReadFrom::parse(&c.read_from).is_some_and(|m| m != ReadFrom::Primary)
                || c.cluster_protocol == "yes"
                || !more.is_empty(),
            tls: SameTls(crate::net::tls::current()),
        }
    }

    pub(super) fn idle(&self) -> bool {
        self.masters.is_empty() && !self.replicas
    }
}

/// How long a Sentinel node asked for by name (`wake_for`) stays watched after the last ask.
const ASKED_FOR: Duration = Duration::from_secs(60);

thread_local! {
    /// Sentinel nodes of no ring this server holds whose address was needed (a fleet
    /// operation's survey of a joining node, before any ring names it), and when.
    static ASKED: std::cell::RefCell<Vec<(String, Instant)>> =
        const { std::cell::RefCell::new(Vec::new()) };
    static MORE_RINGS: std::cell::Cell<fn() -> Vec<crate::ring::RingSpec>> =
        const { std::cell::Cell::new(Vec::new) };
    static NAMED_ME: std::cell::Cell<fn()> = const { std::cell::Cell::new(|| {}) };
}

/// Registers what runs when Sentinel fails this server's own node over to this server (from
/// `reshard`: its rings checked, as on a promotion), once at load. A server Sentinel names that
/// was a primary already (an old primary restarted from its AOF, or one that left its primary,
/// which Sentinel had not turned into a replica yet) changes no role: nothing else checks it.
pub fn set_on_named(hook: fn()) {
    NAMED_ME.with(|m| m.set(hook));
}

/// Registers where the watcher finds rings to watch beyond the node's own (a fleet operation's
/// old and new rings, from `reshard`), once at load.
pub fn set_more_rings(rings: fn() -> Vec<crate::ring::RingSpec>) {
    MORE_RINGS.with(|m| m.set(rings));
}

fn more_rings() -> fn() -> Vec<crate::ring::RingSpec> {
    MORE_RINGS.with(|m| m.get())
}

/// What the main thread tells the watcher.
pub(super) enum Order {
    /// What to watch now (sent when it changes).
    Watch(Box<Watch>),
    /// Look now: a node's address is needed and not known.
    Wake,
}

static ORDERS: OnceLock<Mutex<Sender<Order>>> = OnceLock::new();

thread_local! {
    /// The main thread's last look at the state, and what it sent.
    static SENT: std::cell::RefCell<(Option<Instant>, Option<Watch>)> =
        const { std::cell::RefCell::new((None, None)) };
}

/// Starts the watcher (once, at load).
pub fn start() -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    if ORDERS.set(Mutex::new(tx)).is_err() {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("shard-topology".into())
        .spawn(move || watch_loop::run(rx))
        .map(|_| ())
        .map_err(|e| format!("cannot start the topology watcher: {e}"))
}

fn send(order: Order) {
    if let Some(tx) = ORDERS.get() {
        let _ = tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(order);
    }
}

/// On the main thread before it sleeps: at most every 100 ms, tells the watcher what to watch
/// when that changed. The watcher never takes the module's state lock itself: a fork (a
/// snapshot, a copy) while another thread held it would leave the child's copy locked.
pub fn tick() {
    let now = Instant::now();
    let due = SENT.with(|s| {
        s.borrow()
            .0
            .is_none_or(|at| now.duration_since(at) >= Duration::from_millis(100))
    });
    if !due {
        return;
    }
    let watch = Watch::of(&state::lock());
    SENT.with(|s| {
        let mut s = s.borrow_mut();
        s.0 = Some(now);
        if s.1.as_ref() != Some(&watch) {
            s.1 = Some(watch.clone());
            send(Order::Watch(Box::new(watch)));
        }
    });
}

/// Asks for the address of Sentinel node `name` now: watched from the next `tick` even when
/// no ring names it yet (a fleet operation asks the nodes of its new ring before it installs
/// it), for a minute after the last ask.
pub fn wake_for(name: &str) {
    keep_watching(name);
    wake();
}

/// Keeps Sentinel node `name` watched as `wake_for` does, for a minute from now, without a
/// look now (its address is known: the watcher's refreshes and Sentinel's pushes keep it
/// current).
pub fn keep_watching(name: &str) {
    let now = Instant::now();
    ASKED.with(|a| {
        let mut a = a.borrow_mut();
        if let Some(entry) = a.iter_mut().find(|(n, _)| n == name) {
            entry.1 = now;
        } else if a.len() < 1024 {
            // Bounded: a client naming endless nodes cannot grow it without end.
            a.push((name.to_owned(), now));
        }
    });
}

/// Asks for a look now (a node's address is needed and not known); the next `tick` also
/// sends what to watch, should the node be new.
pub fn wake() {
    SENT.with(|s| s.borrow_mut().0 = None);
    send(Order::Wake);
}

/// Carries updates to the main thread.
pub(super) fn hand_over(updates: Vec<Update>) {
    fn on_main_thread(updates: Vec<Update>) {
        let is_me = crate::topology::me::is_own_address;
        let applied = crate::topology::nodes::apply(updates, is_me);
        let me = crate::state::lock().config.ring.self_name.clone();
        let named_me = applied
            .moved
            .iter()
            .any(|(name, _, new)| *name == me && is_me(new));
        crate::net::pool::topology_changed(applied);
        if named_me && !crate::topology::nodes::is_replica() {
            NAMED_ME.with(|m| m.get())();
        }
    }
    event_loop::on_main_thread(on_main_thread, updates);
}
