//! The thread that watches the fleet's topology: Sentinel's masters and their failovers, and
//! the replicas reads may go to. It hands what it learns to the main thread
//! (`crate::topology::nodes::apply`), never touching the server itself.
//!
//! - A subscription to `+switch-master` on one sentinel at a time (the first of
//!   `shard.sentinels` that answers), opened again on another one when it is lost.
//! - Every `shard.topology-refresh-ms`, and at once when the main thread needs an address it
//!   does not have (`wake`): `SENTINEL get-master-addr-by-name` for every ring node whose
//!   address is `sentinel`, asking the sentinels in turn (one that is down or does not know the
//!   name is skipped); under `shard.read-from replica|replica-preferred`, `SENTINEL replicas`
//!   for those nodes and `ROLE` for the others.
//!
//! Why a thread with blocking sockets and not the event loop of `route::conn`: a subscription
//! is a stream of pushes, not replies matched to requests, and these few queries per second
//! are nobody's hot path; waiting on them here never holds the server. Its connections speak
//! RESP2 with `route::resp` (no client crate needed for `AUTH`, `SUBSCRIBE` and four queries).

use std::collections::HashMap;
use std::ffi::c_void;
use std::io::{self, BufReader, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use redis_module::raw;

use crate::net::resp::{encode_command, read_reply, Resp};
use crate::net::tls::Tls;
use crate::net::transport::{self, Transport};
use crate::state::{self, ModuleState};
use crate::topology::nodes::{ReadFrom, Update};
use crate::topology::sentinel;

/// What to watch, read from the module's state at every turn.
#[derive(Debug, Clone, PartialEq)]
struct Watch {
    sentinels: Vec<String>,
    sentinel_auth: Option<(String, String)>,
    node_auth: Option<(String, String)>,
    timeout: Duration,
    refresh: Duration,
    /// Ring nodes whose address is `sentinel`.
    masters: Vec<String>,
    /// The other ring nodes, (name, address): asked for `ROLE` when reads may go to replicas.
    plain: Vec<(String, String)>,
    replicas: bool,
    /// TLS toward the sentinels and the nodes, as in force on the main thread.
    tls: SameTls,
}

/// The TLS configuration, equal when it is the same one (a rotated certificate is a change).
#[derive(Debug, Clone)]
struct SameTls(Option<Arc<Tls>>);

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
            replicas: ReadFrom::parse(&c.read_from).is_some_and(|m| m != ReadFrom::Primary),
            tls: SameTls(crate::net::tls::current()),
        }
    }

    fn idle(&self) -> bool {
        self.masters.is_empty() && !self.replicas
    }
}

thread_local! {
    static MORE_RINGS: std::cell::Cell<fn() -> Vec<crate::ring::RingSpec>> =
        const { std::cell::Cell::new(Vec::new) };
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
enum Order {
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
        .spawn(move || run(rx))
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

/// Asks for a look now (a node's address is needed and not known); the next `tick` also
/// sends what to watch, should the node be new.
pub fn wake() {
    SENT.with(|s| s.borrow_mut().0 = None);
    send(Order::Wake);
}

/// A blocking RESP2 connection with timeouts.
struct Client {
    address: String,
    /// The connection; requests are written through `get_mut`.
    reader: BufReader<Transport>,
}

impl Client {
    /// Connects (in TLS when `tls` is given, verified before the credentials are sent) and
    /// authenticates.
    fn open(
        address: &str,
        timeout: Duration,
        auth: Option<&(String, String)>,
        tls: &SameTls,
    ) -> Result<Client, String> {
        let stream = transport::dial(address, timeout, tls.0.as_ref()).map_err(|e| {
            let text = format!("{address}: {e}");
            if crate::net::tls::failure(&e).is_some() {
                crate::net::tls::count_failure(&text);
            }
            text
        })?;
        let mut client = Client {
            address: address.to_string(),
            reader: BufReader::new(stream),
        };
        if let Some((user, password)) = auth {
            let args: Vec<&[u8]> = if user.is_empty() {
                vec![b"AUTH", password.as_bytes()]
            } else {
                vec![b"AUTH", user.as_bytes(), password.as_bytes()]
            };
            if let Resp::Error(e) = client.call(&args)? {
                return Err(format!("{address}: {}", String::from_utf8_lossy(&e)));
            }
        }
        Ok(client)
    }

    fn call(&mut self, args: &[&[u8]]) -> Result<Resp, String> {
        let stream = self.reader.get_mut();
        stream
            .write_all(&encode_command(args))
            .and_then(|()| stream.flush())
            .map_err(|e| format!("{}: {e}", self.address))?;
        self.read()
    }

    fn read(&mut self) -> Result<Resp, String> {
        read_reply(&mut self.reader).map_err(|e| format!("{}: {e}", self.address))
    }
}

/// The thread's connections and schedule.
struct Watcher {
    /// The `+switch-master` subscription.
    subscription: Option<Client>,
    next_subscribe: Instant,
    /// The sentinel queries go to (kept open), and which one it is.
    query: Option<(usize, Client)>,
    /// Connections to primaries for `ROLE`, by address.
    roles: HashMap<String, Client>,
    next_look: Instant,
}

fn run(orders: Receiver<Order>) {
    let mut w = Watcher {
        subscription: None,
        next_subscribe: Instant::now(),
        query: None,
        roles: HashMap::new(),
        next_look: Instant::now(),
    };
    let mut watch: Option<Watch> = None;
    loop {
        let mut updates = Vec::new();
        // Wait for a message, an order or the next look, at most 100 ms.
        let mut woken = false;
        let mut received = Vec::new();
        if let Some(sub) = w.subscription.as_mut() {
            match listen(sub) {
                Ok(Some((name, address))) => {
                    if watch.as_ref().is_some_and(|wt| wt.masters.contains(&name)) {
                        updates.push(Update::Master {
                            name,
                            address: Ok(address),
                        });
                        woken = true;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    w.subscription = None;
                    updates.push(Update::Subscription(Some(e)));
                }
            }
        } else {
            match orders.recv_timeout(Duration::from_millis(100)) {
                Ok(order) => received.push(order),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        received.extend(orders.try_iter());
        for order in received {
            match order {
                Order::Wake => woken = true,
                Order::Watch(next) => {
                    let before = watch.take();
                    if before.as_ref().is_none_or(|b| {
                        b.sentinels != next.sentinels || b.sentinel_auth != next.sentinel_auth
                    }) {
                        w.subscription = None;
                        w.query = None;
                        w.next_subscribe = Instant::now();
                    }
                    // TLS turned on or off: no connection of the other kind stays.
                    if before
                        .as_ref()
                        .is_some_and(|b| b.tls.0.is_some() != next.tls.0.is_some())
                    {
                        w.subscription = None;
                        w.query = None;
                        w.roles.clear();
                        w.next_subscribe = Instant::now();
                    }
                    if next.idle() {
                        w.subscription = None;
                        w.query = None;
                        w.roles.clear();
                    }
                    w.next_look = Instant::now();
                    watch = Some(*next);
                }
            }
        }
        let Some(watch) = watch.as_ref() else {
            continue;
        };
        if !watch.masters.is_empty()
            && w.subscription.is_none()
            && Instant::now() >= w.next_subscribe
        {
            match subscribe(watch) {
                Ok(client) => {
                    w.subscription = Some(client);
                    updates.push(Update::Subscription(None));
                }
                Err(e) => {
                    w.next_subscribe = Instant::now() + Duration::from_secs(1);
                    updates.push(Update::Subscription(Some(e)));
                }
            }
        }
        if !watch.idle() && (woken || Instant::now() >= w.next_look) {
            look(&mut w, watch, &mut updates);
            w.next_look = Instant::now() + watch.refresh;
        }
        if !updates.is_empty() {
            hand_over(updates);
        }
    }
}

/// Opens the subscription on the first sentinel that takes it.
fn subscribe(watch: &Watch) -> Result<Client, String> {
    if watch.sentinels.is_empty() {
        return Err("no sentinel configured: set shard.sentinels".into());
    }
    let mut errors = Vec::new();
    for address in &watch.sentinels {
        let subscribed = Client::open(
            address,
            watch.timeout,
            watch.sentinel_auth.as_ref(),
            &watch.tls,
        )
        .and_then(|mut c| match c.call(&[b"SUBSCRIBE", b"+switch-master"])? {
            Resp::Array(_) => Ok(c),
            Resp::Error(e) => Err(format!("{address}: {}", String::from_utf8_lossy(&e))),
            _ => Err(format!("{address}: an unexpected reply to SUBSCRIBE")),
        });
        match subscribed {
            Ok(c) => {
                let _ = c
                    .reader
                    .get_ref()
                    .tcp()
                    .set_read_timeout(Some(Duration::from_millis(100)));
                return Ok(c);
            }
            Err(e) => errors.push(e),
        }
    }
    Err(format!(
        "no sentinel takes the subscription: {}",
        errors.join("; ")
    ))
}

/// Waits up to 100 ms for a `+switch-master` message.
fn listen(sub: &mut Client) -> Result<Option<(String, String)>, String> {
    match read_reply(&mut sub.reader) {
        Ok(Resp::Array(items)) => Ok(match items.as_slice() {
            [Resp::Bulk(kind), Resp::Bulk(_channel), Resp::Bulk(payload)] if kind == b"message" => {
                sentinel::switch_master(payload)
            }
            _ => None,
        }),
        Ok(_) => Ok(None),
        Err(crate::net::resp::RespError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) && sub.reader.buffer().is_empty() =>
        {
            Ok(None)
        }
        Err(e) => Err(format!("the subscription to {} was lost: {e}", sub.address)),
    }
}

/// One look at every watched node.
fn look(w: &mut Watcher, watch: &Watch, updates: &mut Vec<Update>) {
    for name in &watch.masters {
        let address = ask_sentinels(
            w,
            watch,
            &[b"SENTINEL", b"get-master-addr-by-name", name.as_bytes()],
            |reply| {
                sentinel::master_address(reply)?
                    .ok_or_else(|| format!("does not monitor a master '{name}'"))
            },
        )
        .map_err(|e| format!("no sentinel gives the address of master '{name}': {e}"));
        updates.push(Update::Master {
            name: name.clone(),
            address,
        });
        if watch.replicas {
            let replicas = ask_sentinels(
                w,
                watch,
                &[b"SENTINEL", b"replicas", name.as_bytes()],
                sentinel::sentinel_replicas,
            )
            .map_err(|e| format!("no sentinel lists the replicas of '{name}': {e}"));
            updates.push(Update::Replicas {
                name: name.clone(),
                replicas,
            });
        }
    }
    if !watch.replicas {
        return;
    }
    w.roles
        .retain(|a, _| watch.plain.iter().any(|(_, p)| p == a));
    for (name, address) in &watch.plain {
        let replicas = role_of(w, watch, address).map_err(|e| format!("ROLE of {name}: {e}"));
        updates.push(Update::Replicas {
            name: name.clone(),
            replicas,
        });
    }
}

/// Sends a query to the sentinels in turn, the one that answered last first, until one's
/// reply is accepted; a sentinel that is down, refuses or does not know the name is skipped.
fn ask_sentinels<T>(
    w: &mut Watcher,
    watch: &Watch,
    args: &[&[u8]],
    accept: impl Fn(&Resp) -> Result<T, String>,
) -> Result<T, String> {
    if watch.sentinels.is_empty() {
        return Err("no sentinel configured (shard.sentinels)".into());
    }
    let n = watch.sentinels.len();
    let start = w.query.as_ref().map_or(0, |(i, _)| *i % n);
    let mut errors = Vec::new();
    for k in 0..n {
        let i = (start + k) % n;
        let address = &watch.sentinels[i];
        let client = match w.query.take() {
            Some((j, c)) if j == i => Ok(c),
            _ => Client::open(
                address,
                watch.timeout,
                watch.sentinel_auth.as_ref(),
                &watch.tls,
            ),
        };
        match client.and_then(|mut c| c.call(args).map(|r| (c, r))) {
            Ok((c, reply)) => {
                w.query = Some((i, c));
                match accept(&reply) {
                    Ok(t) => return Ok(t),
                    Err(e) => errors.push(format!("{address}: {e}")),
                }
            }
            Err(e) => errors.push(e),
        }
    }
    Err(errors.join("; "))
}

/// A primary's replicas from its `ROLE`.
fn role_of(w: &mut Watcher, watch: &Watch, address: &str) -> Result<Vec<String>, String> {
    let client = match w.roles.remove(address) {
        Some(c) => Ok(c),
        None => Client::open(address, watch.timeout, watch.node_auth.as_ref(), &watch.tls),
    };
    let (client, reply) = client.and_then(|mut c| c.call(&[b"ROLE"]).map(|r| (c, r)))?;
    w.roles.insert(address.to_string(), client);
    sentinel::role_replicas(&reply)
}

/// Carries updates to the main thread.
fn hand_over(updates: Vec<Update>) {
    extern "C" fn on_main_thread(data: *mut c_void) {
        // SAFETY: made by Box::into_raw below, handed over exactly once.
        let updates = unsafe { Box::from_raw(data.cast::<Vec<Update>>()) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::net::pool::topology_changed(crate::topology::nodes::apply(*updates));
        }));
    }
    let data = Box::into_raw(Box::new(updates));
    // SAFETY: the one-shot runs `on_main_thread` once on the main thread, which takes the box
    // back.
    unsafe {
        match raw::RedisModule_EventLoopAddOneShot {
            Some(add) => {
                add(Some(on_main_thread), data.cast());
            }
            None => drop(Box::from_raw(data)),
        }
    }
}
