//! The topology watcher's thread: its connections (blocking, `net::blocking_client`) and
//! schedule, handing what it learns to the main thread (`watcher::hand_over`).
//!
//! - A subscription to `+switch-master` on one sentinel at a time (the first of
//!   `shard.sentinels` that answers), opened again on another one when it is lost.
//! - Every `shard.topology-refresh-ms`, and at once when the main thread needs an address it
//!   does not have (`watcher::wake`): `SENTINEL get-master-addr-by-name` for every ring node
//!   whose address is `sentinel`, asking the sentinels in turn (one that is down or does not
//!   know the name is skipped); under `shard.read-from replica|replica-preferred` or
//!   `shard.cluster-protocol yes`, `SENTINEL replicas` for those nodes and `ROLE` for the
//!   others.

use std::collections::HashMap;
use std::io;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::net::blocking_client::Client;
use crate::net::resp::{Resp, RespError};
use crate::topology::nodes::{Promotable, Update};
use crate::topology::sentinel;
use crate::topology::watcher::{hand_over, Order, Watch};

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

pub(super) fn run(orders: Receiver<Order>) {
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
            watch.tls.0.as_ref(),
        )
        .and_then(|mut c| match c.call(&[b"SUBSCRIBE", b"+switch-master"])? {
            Resp::Array(_) => Ok(c),
            Resp::Error(e) => Err(format!("{address}: {}", String::from_utf8_lossy(&e))),
            _ => Err(format!("{address}: an unexpected reply to SUBSCRIBE")),
        });
        match subscribed {
            Ok(c) => {
                let _ = c.set_read_timeout(Duration::from_millis(100));
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
    match sub.read_push() {
        Ok(Resp::Array(items)) => Ok(match items.as_slice() {
            [Resp::Bulk(kind), Resp::Bulk(_channel), Resp::Bulk(payload)] if kind == b"message" => {
                sentinel::switch_master(payload)
            }
            _ => None,
        }),
        Ok(_) => Ok(None),
        Err(RespError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) && !sub.buffered() =>
        {
            Ok(None)
        }
        Err(e) => Err(format!(
            "the subscription to {} was lost: {e}",
            sub.address()
        )),
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
            let listed = ask_sentinels(
                w,
                watch,
                &[b"SENTINEL", b"replicas", name.as_bytes()],
                |reply| {
                    let linked = sentinel::sentinel_replicas(reply)?;
                    let promotable = Promotable {
                        now: sentinel::promotable_replicas(reply),
                        ever: sentinel::replicas_it_may_promote(reply),
                    };
                    Ok((linked, promotable))
                },
            )
            .map_err(|e| format!("no sentinel lists the replicas of '{name}': {e}"));
            let promotable = listed.as_ref().ok().map(|(_, n)| *n);
            updates.push(Update::Replicas {
                name: name.clone(),
                replicas: listed.map(|(linked, _)| linked),
                promotable,
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
            promotable: None,
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
                watch.tls.0.as_ref(),
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
        None => Client::open(
            address,
            watch.timeout,
            watch.node_auth.as_ref(),
            watch.tls.0.as_ref(),
        ),
    };
    let (client, reply) = client.and_then(|mut c| c.call(&[b"ROLE"]).map(|r| (c, r)))?;
    w.roles.insert(address.to_string(), client);
    sentinel::role_replicas(&reply)
}
