//! One coordinator at a time: the coordinator's side of a fleet operation's lease (the nodes'
//! side is `fencing`, the record's rules `ring::lease`).
//!
//! - Before it drives a plan (START, RESUME, START again, CANCEL of a plan not driven), the
//!   coordinator asks every node of the plan for its state (`ask`) and takes a term (`take`):
//!   refused while a node has heard from another coordinator within that one's lease, naming
//!   it and how long the lease still runs there, unless that coordinator is an earlier run of
//!   this very server (its address, the one the fleet reaches this node at, now answers with
//!   this server's run id: the earlier run is gone, so the lease is handed over to this one at
//!   once); else the term is the highest any node or the plan has seen, plus one. The caller
//!   makes it durable in its plan before the first step.
//! - It then claims the term at every node (`claim`: a node follows a newer term at once),
//!   renews it at every node every third of the lease while it drives (`renew_in_background`,
//!   one loop a node, so a silent node delays no other), and stamps every step with it
//!   (`stamped`).
//! - A node that refuses a step or a renewal (`STALETERM`) follows another coordinator's newer
//!   term: the lease is lost (`lose`) and the coordinator sends no other step (`check`, before
//!   each step). A coordinator that no node has confirmed for a whole lease, or whose previous
//!   step was a whole lease ago (it was paused, or starved), first renews at every node before
//!   its next step (`fresh`): a node that moved on refuses it, naming the new term.
//!   `SHARD.RESHARD HANDOVER` stops it at its next step too.
//! - When it stops on purpose (done, cancelled, gave up, handed over) it releases the term at
//!   every node (`end`), so that a RESUME elsewhere need not wait for the lease to run out; a
//!   lost lease is not released (it is another's).

use std::cell::RefCell;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::net::endpoint::{Endpoint, StepError};
use crate::net::resp::Resp;
use crate::reshard::fleet::coordinator::{self, Reach};
use crate::reshard::fleet::fencing::lease_args;
use crate::reshard::fleet::node_state::NodeState;
use crate::ring::lease::{Claim, Holder};
use crate::route::forward::{self, CallReply, NetSteps};

/// The term a coordinator drives under, and whether it took it over from an earlier run of
/// this server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub claim: Claim,
    pub takeover: bool,
}

impl Term {
    /// `TERM term lease-ms name address run-id`, the end of every step.
    fn suffix(&self) -> Vec<Vec<u8>> {
        let mut args = lease_args(&self.claim, None);
        args[0] = b"TERM".to_vec();
        args
    }

    /// `SHARD.RING LEASE ...` with a mode.
    fn lease_command(&self, mode: Option<&str>) -> Vec<Vec<u8>> {
        let mut args = vec![b"SHARD.RING".to_vec()];
        args.extend(lease_args(&self.claim, mode));
        args
    }
}

struct Held {
    term: Term,
    lost: Option<String>,
    handover: bool,
    /// When (ms of the monotonic clock) the latest renewal a node acknowledged was sent.
    confirmed_ms: u64,
    /// When the coordinator last went through `fresh` (before a step).
    guarded_ms: u64,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
    /// How the last drive ended, for STATUS (`released`, `lost: ...`).
    static ENDED: RefCell<String> = const { RefCell::new(String::new()) };
}

const HANDED_OVER: &str =
    "handed over (SHARD.RESHARD HANDOVER): RESUME on a node that holds the plan goes on at once";

/// `args` with the held term's `TERM ...` at the end (unchanged when none is held).
pub fn stamped(mut args: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    HELD.with(|h| {
        if let Some(held) = h.borrow().as_ref() {
            args.extend(held.term.suffix());
        }
    });
    args
}

/// The term this coordinator holds (0: none).
pub fn held_term() -> u64 {
    HELD.with(|h| h.borrow().as_ref().map_or(0, |held| held.term.claim.term))
}

/// Whether the coordinator may send its next step: not once its lease is lost or handed over.
pub fn check() -> Result<(), String> {
    HELD.with(|h| match h.borrow().as_ref() {
        Some(Held {
            lost: Some(why), ..
        }) => Err(format!("lost the lease: {why}")),
        Some(Held { handover: true, .. }) => Err(HANDED_OVER.to_string()),
        _ => Ok(()),
    })
}

/// A node's refusal of a step of this term (it follows a newer one), as text.
pub fn refusal(reply: &Result<Resp, StepError>) -> Option<String> {
    match reply {
        Ok(Resp::Error(e)) if e.starts_with(b"STALETERM") => {
            Some(String::from_utf8_lossy(e).into_owned())
        }
        _ => None,
    }
}

/// A node acknowledged a renewal of term `number` sent at `sent_ms`.
fn confirmed(number: u64, sent_ms: u64) {
    HELD.with(|h| {
        if let Some(held) = h.borrow_mut().as_mut() {
            if held.term.claim.term == number {
                held.confirmed_ms = held.confirmed_ms.max(sent_ms);
            }
        }
    });
}

/// Before a step: when no node has confirmed the held term for a whole lease, or the
/// coordinator's previous step was a whole lease ago (it was paused or starved, and another may
/// have taken over meanwhile), a renewal at every node of the plan first: a node that follows a
/// newer term refuses it and the lease is lost. Then `check`.
pub async fn fresh(steps: &NetSteps, reach: &Reach) -> Result<(), String> {
    let now = crate::clock::monotonic_ms();
    let stale = HELD.with(|h| {
        h.borrow_mut().as_mut().and_then(|held| {
            let lease = held.term.claim.lease_ms;
            let unconfirmed = now.saturating_sub(held.confirmed_ms) > lease;
            let idle = now.saturating_sub(held.guarded_ms) > lease;
            held.guarded_ms = now;
            (held.lost.is_none() && (unconfirmed || idle)).then(|| held.term.clone())
        })
    });
    if let Some(term) = stale {
        let nodes = crate::reshard::current::lock()
            .fleet
            .as_ref()
            .map(|p| coordinator::endpoints(p, &reach.me.name))
            .unwrap_or_default();
        renew_all(steps, &nodes, &term).await;
    }
    check()
}

/// A renewal of `term` at every node of `nodes`: acknowledgements confirm it, a refusal loses
/// it.
async fn renew_all(steps: &NetSteps, nodes: &[Endpoint], term: &Term) {
    let args = term.lease_command(None);
    let sent = crate::clock::monotonic_ms();
    let replies = join_all(nodes.iter().map(|at| steps.send(at, &args))).await;
    for (at, reply) in nodes.iter().zip(&replies) {
        match reply {
            Ok(Resp::Simple(_)) => confirmed(term.claim.term, sent),
            other => {
                if let Some(why) = refusal(other) {
                    lose(&at.name, &why);
                }
            }
        }
    }
}

/// Node `node` refused a step (`why`): the lease is lost; the first reason is kept.
pub fn lose(node: &str, why: &str) {
    HELD.with(|h| {
        if let Some(held) = h.borrow_mut().as_mut() {
            held.lost
                .get_or_insert_with(|| format!("node {node}: {why}"));
        }
    });
}

/// The replies of `nodes` (in order): the lease lost if one refused.
pub fn note_refusals<'a>(
    replies: impl IntoIterator<Item = (&'a str, &'a Result<Resp, StepError>)>,
) -> Result<(), String> {
    for (node, reply) in replies {
        if let Some(why) = refusal(reply) {
            lose(node, &why);
        }
    }
    check()
}

/// `SHARD.RESHARD HANDOVER`: the coordinator stops at its next step and releases its term.
/// False when this node drives nothing.
pub fn request_handover() -> bool {
    HELD.with(|h| match h.borrow_mut().as_mut() {
        Some(held) => {
            held.handover = true;
            true
        }
        None => false,
    })
}

/// STATUS's `lease`: `held` (and whether it was taken over from an earlier run of this
/// server), `taking` (a RESUME asking the nodes), how the last drive ended (`released (term
/// n)`, `lost: <the refusal>`), or `none`.
pub fn status(running: bool) -> String {
    let held = HELD.with(|h| {
        h.borrow().as_ref().map(|held| match &held.lost {
            Some(why) => format!("lost: {why}"),
            None if held.term.takeover => {
                "held (taken over from an earlier run of this server)".to_string()
            }
            None => "held".to_string(),
        })
    });
    match held {
        Some(text) => text,
        None if running => "taking".into(),
        None => ENDED.with(|e| {
            let e = e.borrow();
            if e.is_empty() {
                "none".into()
            } else {
                e.clone()
            }
        }),
    }
}

/// The term of this node's state answer, as its node sees it: held by another run than
/// `my_run`, not handed over, and its lease still running there.
fn held_elsewhere(st: &NodeState, my_run: &str) -> bool {
    st.term > 0 && !st.term_released && st.lease_left_ms > 0 && st.term_run_id != my_run
}

/// Asks every node of the plan for its state; stops at the first answer that shows another
/// coordinator's lease, at another address than this node's, still running: the refusal.
pub async fn ask(
    steps: &NetSteps,
    nodes: &[Endpoint],
    reach: &Reach,
) -> Result<Vec<Result<NodeState, String>>, String> {
    let args = vec![b"SHARD.RING".to_vec(), b"STATE".to_vec()];
    let mut pending: FuturesUnordered<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, at)| {
            let reply = steps.send(at, &args);
            async move { (i, reply.await) }
        })
        .collect();
    let mut answers: Vec<Result<NodeState, String>> =
        vec![Err("no answer".to_string()); nodes.len()];
    while let Some((i, reply)) = pending.next().await {
        let answer = reply
            .map_err(|e| e.message)
            .and_then(|r| NodeState::from_resp(&r));
        if let Ok(st) = &answer {
            if held_elsewhere(st, &reach.run_id) && st.term_address != reach.me.address {
                return Err(held_text(&nodes[i].name, st));
            }
        }
        answers[i] = answer;
    }
    Ok(answers)
}

fn held_text(node: &str, st: &NodeState) -> String {
    format!(
        "LEASEHELD term {} of {} ({}) holds this fleet operation: node {node} heard from it within its lease, which runs there for {} ms more; RESUME again once it has run out, or SHARD.RESHARD HANDOVER on {}",
        st.term, st.term_holder, st.term_address, st.lease_left_ms, st.term_holder
    )
}

/// The term this node may take from the nodes' answers (`answers[i]` for `nodes[i]`) for a
/// plan of term `plan_term`, or why not (pure). A node that does not answer says nothing.
pub fn take(
    plan_term: u64,
    nodes: &[Endpoint],
    answers: &[Result<NodeState, String>],
    reach: &Reach,
) -> Result<Term, String> {
    let my_run = reach.run_id.as_str();
    // The address the fleet reaches this node at answers with this server's run id.
    let here = nodes
        .iter()
        .zip(answers)
        .any(|(at, a)| at.name == reach.me.name && a.as_ref().is_ok_and(|st| st.run_id == my_run));
    let mut takeover = false;
    let mut longest: Option<(&str, &NodeState)> = None;
    for (at, st) in nodes
        .iter()
        .zip(answers)
        .filter_map(|(at, a)| Some((at, a.as_ref().ok()?)))
    {
        if !held_elsewhere(st, my_run) {
            continue;
        }
        if here && !my_run.is_empty() && st.term_address == reach.me.address {
            takeover = true;
        } else if longest.is_none_or(|(_, l)| st.lease_left_ms > l.lease_left_ms) {
            longest = Some((&at.name, st));
        }
    }
    if let Some((node, st)) = longest {
        return Err(held_text(node, st));
    }
    let highest = answers
        .iter()
        .flatten()
        .map(|st| st.term)
        .fold(plan_term, u64::max);
    Ok(Term {
        claim: Claim {
            term: highest + 1,
            lease_ms: u64::try_from(reach.lease.as_millis()).unwrap_or(u64::MAX),
            holder: Holder {
                name: reach.me.name.clone(),
                address: reach.me.address.clone(),
                run_id: my_run.to_string(),
            },
        },
        takeover,
    })
}

/// From now on this node drives under `term`.
pub fn hold(term: &Term) {
    HELD.with(|h| {
        *h.borrow_mut() = Some(Held {
            term: term.clone(),
            lost: None,
            handover: false,
            confirmed_ms: crate::clock::monotonic_ms(),
            guarded_ms: crate::clock::monotonic_ms(),
        })
    });
    ENDED.with(|e| e.borrow_mut().clear());
}

/// Claims the held term at every node: each follows it from now on (a node that does not
/// answer takes it at its first step). Fails when one refuses: it follows a newer term still.
pub async fn claim(steps: &NetSteps, nodes: &[Endpoint], term: &Term) -> Result<(), String> {
    renew_all(steps, nodes, term).await;
    check()
}

/// Renews the held term at every node of the plan every third of the lease, each node on its
/// own, until the term is no longer held or is lost.
pub fn renew_in_background(reach: &Reach, term: &Term, names: Vec<String>) {
    let interval = Duration::from_millis((term.claim.lease_ms / 3).max(1));
    let args = term.lease_command(None);
    let number = term.claim.term;
    let self_name = reach.me.name.clone();
    forward::spawn(reach.link.clone(), move |steps| async move {
        join_all(names.into_iter().map(|name| {
            let (steps, args, self_name) = (steps.clone(), args.clone(), self_name.clone());
            async move {
                loop {
                    steps.sleep(interval).await;
                    let Some(at) = renewing(number, &name, &self_name) else {
                        return;
                    };
                    let sent = crate::clock::monotonic_ms();
                    let reply = steps.send(&at, &args).await;
                    if let Ok(Resp::Simple(_)) = reply {
                        confirmed(number, sent);
                    }
                    if let Some(why) = refusal(&reply) {
                        lose(&name, &why);
                        return;
                    }
                }
            }
        }))
        .await;
        CallReply::Reply(Resp::Null)
    });
}

/// Where to renew term `number` at node `name` now, while it is held and not lost.
fn renewing(number: u64, name: &str, self_name: &str) -> Option<Endpoint> {
    let held = HELD.with(|h| {
        h.borrow()
            .as_ref()
            .is_some_and(|held| held.term.claim.term == number && held.lost.is_none())
    });
    if !held {
        return None;
    }
    let current = crate::reshard::current::lock();
    coordinator::endpoint_of(current.fleet.as_ref()?, name, self_name)
}

/// The drive under the held term ended: the term is released at every node (one try each),
/// unless it was lost. STATUS then says which.
pub async fn end(steps: &NetSteps, nodes: &[Endpoint]) {
    let Some(held) = HELD.with(|h| h.borrow_mut().take()) else {
        return;
    };
    let ended = match held.lost {
        Some(why) => format!("lost: {why}"),
        None => {
            let args = held.term.lease_command(Some("RELEASE"));
            join_all(nodes.iter().map(|at| steps.send(at, &args))).await;
            format!("released (term {})", held.term.claim.term)
        }
    };
    ENDED.with(|e| *e.borrow_mut() = ended);
}
