//! A blocking command waiting at its owner when a ring change gives one of its keys to another
//! node (a resharding begun, a ring set): what it waits for will be pushed at the new owner,
//! so it would wait for ever (or to its timeout) for nothing. Redis Cluster answers such a
//! blocked client with a redirect; here the owner is asked to end the wait
//! (`CLIENT UNBLOCK id ERROR` for the connection the command waits on, sent on the control
//! connection), and the client gets `TRYAGAIN`, saying the key moved: sent again, the command
//! is refused while the key moves and waits at the new owner once it has.
//!
//! Why `CLIENT UNBLOCK` rather than closing the connection (what a client that disconnects
//! gets, `net::lanes::cancel`): the owner unblocks or serves the command atomically. If it
//! popped an element for it first, that reply is on its way and is delivered as the
//! client's reply (the unblock then finds nothing to do); closing the connection could drop an
//! element popped for it. The connection's id at the owner is asked (`CLIENT ID`) just before
//! the command on the same connection.
//!
//! Checked before the event loop sleeps, only while some blocking command waits and only after
//! the rings changed (`state::rings_generation`).

use std::cell::RefCell;
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::net::endpoint::Endpoint;
use crate::net::pool::{Link, Waiter};

/// One blocking command waiting at its owner.
struct Waiting {
    at: Endpoint,
    link: Link,
    /// The owner's name when it was sent, and its keys.
    owner: String,
    keys: Vec<Vec<u8>>,
    name: String,
    /// The id of the connection it waits on, at the owner (`CLIENT ID`), once known.
    lane_client: Option<i64>,
    /// Why its wait was ended (the client's `TRYAGAIN`), once the owner was asked to.
    moved: Option<String>,
}

#[derive(Default)]
struct Registry {
    waiting: FxHashMap<Waiter, Waiting>,
    /// The rings' generation last checked.
    checked: u64,
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

/// What a blocking command sent to its owner waits on: the owner's name when it was sent,
/// the command's keys and its name (for the refusal).
pub struct Watched {
    pub owner: String,
    pub keys: Vec<Vec<u8>>,
    pub name: String,
}

/// A blocking command sent to `at` waits for the reply to `waiter`. Its owner was found by the
/// rings the state holds now (the caller held the state while it routed it).
pub fn waits(waiter: Waiter, at: &Endpoint, link: &Link, watched: Watched) {
    REGISTRY.with(|r| {
        let mut r = r.borrow_mut();
        if r.waiting.is_empty() {
            r.checked = crate::state::rings_generation();
        }
        r.waiting.insert(
            waiter,
            Waiting {
                at: at.clone(),
                link: link.clone(),
                owner: watched.owner,
                keys: watched.keys,
                name: watched.name,
                lane_client: None,
                moved: None,
            },
        );
    });
}

/// The id, at the owner, of the connection `waiter`'s command waits on. If the command's key
/// moved meanwhile, the owner is asked to end the wait now.
pub fn lane_client(waiter: Waiter, id: i64) {
    let unblock = REGISTRY.with(|r| {
        let mut r = r.borrow_mut();
        let w = r.waiting.get_mut(&waiter)?;
        w.lane_client = Some(id);
        w.moved.is_some().then(|| (w.at.clone(), w.link.clone()))
    });
    if let Some((at, link)) = unblock {
        send_unblock(&at, &link, id);
    }
}

/// `waiter`'s command is done (its reply or its failure came): the refusal to give instead of
/// the owner's `UNBLOCKED` error, when its wait was ended because its key moved.
pub fn done(waiter: Waiter) -> Option<String> {
    REGISTRY.with(|r| r.borrow_mut().waiting.remove(&waiter)?.moved)
}

/// Before the event loop sleeps: after a change of the rings, ends the wait of every blocking
/// command one of whose keys another node owns now, or a resharding is moving.
pub fn check() {
    let generation = crate::state::rings_generation();
    let stale = REGISTRY.with(|r| {
        let r = r.borrow();
        !r.waiting.is_empty() && r.checked != generation
    });
    if !stale {
        return;
    }
    let moved: Vec<(Waiter, String)> = {
        let st = crate::state::lock();
        let ring = st.rings.current.as_ref().and_then(|p| p.ring.as_ref());
        let previous = st.rings.previous.as_ref().and_then(|p| p.ring.as_ref());
        REGISTRY.with(|r| {
            let mut r = r.borrow_mut();
            r.checked = crate::state::rings_generation();
            r.waiting
                .iter()
                .filter(|(_, w)| w.moved.is_none())
                .filter_map(|(&waiter, w)| {
                    let ring = ring?;
                    w.keys.iter().find_map(|key| {
                        let now = &ring.owner_spec(key).name;
                        let moving = previous.is_some_and(|p| p.owner_spec(key).name != *now);
                        (now != &w.owner || moving).then(|| {
                            let now = if moving {
                                format!("a resharding is moving it to {now}")
                            } else {
                                format!("{now} owns it now")
                            };
                            (
                                waiter,
                                format!(
                                    "TRYAGAIN a ring change moved a key of '{}' away from {} while it waited there ({now}): send it again",
                                    w.name, w.owner
                                ),
                            )
                        })
                    })
                })
                .collect()
        })
    };
    for (waiter, why) in moved {
        let unblock = REGISTRY.with(|r| {
            let mut r = r.borrow_mut();
            let w = r.waiting.get_mut(&waiter)?;
            w.moved = Some(why);
            Some((w.at.clone(), w.link.clone(), w.lane_client?))
        });
        if let Some((at, link, id)) = unblock {
            send_unblock(&at, &link, id);
        }
    }
}

/// Asks the owner to end the wait of its client `id` with an error, on the control connection
/// (its reply is of no use: a wait already served finds nothing to end, and the reply the
/// owner sent is delivered as usual).
fn send_unblock(at: &Endpoint, link: &Link, id: i64) {
    let args = [
        b"CLIENT".to_vec(),
        b"UNBLOCK".to_vec(),
        id.to_string().into_bytes(),
        b"ERROR".to_vec(),
    ];
    crate::route::forward::send_ignored(at, link, &args, Duration::ZERO);
}
