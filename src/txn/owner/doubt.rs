//! A prepared part in doubt (past its lock's deadline, its `COMMIT` or `ABORT` not come): the
//! owner asks the coordinator named in the txid `SHARD.TXN STATUS txid` over the module's
//! control connection to it (`net::lanes::CONTROL`, from the event loop, never blocking the
//! main thread: not the shared connection, where a routed command may wait for a lock), again at each tick
//! (100 ms) while no answer is in flight, and commits or aborts the part by the answer, on a
//! timer of its own (`run::commit_alone`, `run::abort_alone`). A coordinator no ring here
//! names (a shrink removed it, or it coordinated from outside the ring, its `PREPARE` giving
//! no address) is asked where Sentinel says its primary is, Sentinel asked for it by name
//! while the part waits (`topology::watcher::keep_watching`), else at the address its
//! `PREPARE` gave (`FROM`); a replica there now (it failed over since) gives, in its `ROLE`,
//! the primary it follows, which is asked in turn.
//! `pending`, an error, or a coordinator that cannot be reached (down with all its replicas,
//! or named by no ring here, unknown to Sentinel and given no address) leaves the part locked
//! and counted in `INFO shard` (`txn_in_doubt`): deciding alone could undo a commit. Only a
//! primary asks. What each part's question came to is logged, once per `LOG_EVERY_MS`.

use std::cell::{Cell, RefCell};
use std::time::Duration;

use redis_module::Context;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::net::endpoint::Endpoint;
use crate::net::pool::{link_timeout, Link};
use crate::net::resp::Resp;
use crate::route::forward::{self, CallReply};
use crate::state;
use crate::txn::owner::{read, run};
use crate::txn::Decision;

thread_local! {
    /// The txids asked about, whose answer has not come.
    static ASKING: RefCell<FxHashSet<String>> = RefCell::new(FxHashSet::default());
    /// When what each part in doubt was answered was last logged (monotonic ms).
    static LOGGED: RefCell<FxHashMap<String, u64>> = RefCell::new(FxHashMap::default());
    /// When Sentinel was last asked for a coordinator of no known address (monotonic ms).
    static WOKEN: Cell<u64> = const { Cell::new(0) };
}

/// How often a part in doubt logs what its question came to.
const LOG_EVERY_MS: u64 = 10_000;
/// How often Sentinel is asked at once for a coordinator no ring here names and whose
/// address is not known yet (its regular refresh asks too).
const WAKE_EVERY_MS: u64 = 1000;

/// Logs what the question about the part `txid` in doubt came to, at most once per
/// `LOG_EVERY_MS` for each part unless `settled` (a commit or an abort: logged once, as it
/// ends the doubt).
fn note(txid: &str, settled: bool, what: impl FnOnce() -> String) {
    let now = crate::clock::monotonic_ms();
    let due = LOGGED.with(|l| {
        let mut l = l.borrow_mut();
        match l.get(txid) {
            Some(at) if !settled && now.saturating_sub(*at) < LOG_EVERY_MS => false,
            _ => {
                l.insert(txid.to_string(), now);
                true
            }
        }
    });
    if due {
        redis_module::logging::log_notice(format!(
            "shard: transaction {txid}: its part here is in doubt (its lock is over, no COMMIT \
             or ABORT came): {}",
            what()
        ));
    }
}

/// Asks about every part in doubt at `now` that is not being asked about.
pub fn ask(_ctx: &Context, now: u64) {
    // Writes paused (a failover under way): the part waits; acting on an answer replicates.
    if crate::topology::nodes::is_replica() || crate::host::context::writes_paused() {
        return;
    }
    let doubtful = read(|t| t.in_doubt(now));
    LOGGED.with(|l| {
        let mut l = l.borrow_mut();
        if !l.is_empty() {
            let now_doubtful: FxHashSet<&String> = doubtful.iter().collect();
            l.retain(|t, _| now_doubtful.contains(t));
        }
    });
    for txid in doubtful {
        if ASKING.with(|a| a.borrow().contains(&txid)) {
            continue;
        }
        let Some((coordinator, _)) = txid.split_once('/') else {
            continue;
        };
        let (self_name, link) = {
            let st = state::lock();
            let link = Link {
                timeout: link_timeout(st.config.call_timeout_ms),
                auth: st.config.auth(),
                resp3: false,
                db: 0,
            };
            (st.config.ring.self_name.clone(), link)
        };
        if coordinator == self_name {
            // This node coordinated it: its own side answers.
            decided(txid.clone(), crate::txn::status(&txid));
            continue;
        }
        let recorded = read(|t| t.prepared(&txid).and_then(|p| p.coordinator_at.clone()));
        let Some(at) = endpoint_of(coordinator, &self_name, recorded.as_deref()) else {
            note(&txid, false, || {
                format!(
                    "no address is known for its coordinator {coordinator} (no ring here names \
                     it, Sentinel gave none yet, its PREPARE gave none): not asked"
                )
            });
            continue;
        };
        ASKING.with(|a| a.borrow_mut().insert(txid.clone()));
        forward::spawn(link, move |steps| async move {
            let args = [
                b"SHARD.TXN".to_vec(),
                b"STATUS".to_vec(),
                txid.clone().into_bytes(),
            ];
            // On the control connection: the shared one may hold a routed command waiting at
            // the coordinator for a lock, and the question would wait behind it.
            let mut answer = steps.send_control(&at, &args).await;
            let mut asked = at.address.clone();
            // A replica there now (a `sentinel` coordinator that failed over, then left the
            // ring: no ring nor Sentinel's table here names it, so its `PREPARE`'s address is
            // asked): the primary it follows is asked, which answers for the same name or
            // refuses (`WRONGNODE`).
            if matches!(&answer, Ok(Resp::Error(e)) if e.starts_with(b"READONLY")) {
                if let Ok(role) = steps.send_control(&at, &[b"ROLE".to_vec()]).await {
                    if let Some(primary) = followed_primary(&role, &at.name) {
                        asked = format!("{} (the primary {asked} follows)", primary.address);
                        answer = steps.send_control(&primary, &args).await;
                    }
                }
            }
            ASKING.with(|a| a.borrow_mut().remove(&txid));
            let decision = match &answer {
                Ok(Resp::Simple(t) | Resp::Bulk(t)) => Decision::parse(t),
                _ => None,
            };
            let settled = matches!(decision, Some(Decision::Commit | Decision::Abort));
            note(&txid, settled, || {
                let said = match &answer {
                    Ok(Resp::Simple(t) | Resp::Bulk(t) | Resp::Error(t)) => {
                        String::from_utf8_lossy(t).into_owned()
                    }
                    Ok(other) => format!("{other:?}"),
                    Err(e) => format!("no answer ({})", e.message),
                };
                format!("its coordinator {} asked at {asked}: {said}", at.name)
            });
            if let Some(decision) = decision {
                decided(txid, decision);
            }
            CallReply::Reply(Resp::Null)
        });
    }
}

/// Where to ask the coordinator called `name`: its node in the rings this node holds (at
/// Sentinel's address for a `sentinel` node); else, once no ring here names it (a shrink
/// removed it, or it coordinated from outside the ring), the address Sentinel last gave for
/// that name (Sentinel asked for it, when sentinels are set), else `recorded`, the address
/// its `PREPARE` gave (`FROM`). Whoever answers there answers only for its own name
/// (`SHARD.TXN STATUS` refuses a txid of another node), so an address that is someone else's
/// now leaves the part in doubt, never decided by a stranger.
fn endpoint_of(name: &str, self_name: &str, recorded: Option<&str>) -> Option<Endpoint> {
    let st = state::lock();
    let sentinels = !st.config.sentinels.trim().is_empty();
    let node = st.rings.node(name).cloned();
    drop(st);
    if let Some(n) = node {
        return Some(crate::topology::nodes::endpoint_of(&n, self_name));
    }
    let known = crate::topology::nodes::address_of(name);
    if sentinels {
        // Sentinel is asked for it by name while its parts wait here: a server that never
        // watched it (restarted since a shrink, or it was never in this server's rings) knows
        // no address for it, and its PREPARE gave none when no ring there named it.
        crate::topology::watcher::keep_watching(name);
        let now = crate::clock::monotonic_ms();
        if known.is_none() && now.saturating_sub(WOKEN.with(Cell::get)) >= WAKE_EVERY_MS {
            WOKEN.with(|w| w.set(now));
            crate::topology::watcher::wake();
        }
    }
    let address = known.or(recorded.map(str::to_string))?;
    Endpoint::remote(name, &address)
}

/// The primary a replica's `ROLE` reply names (`slave host port ...`), as the node `name`.
fn followed_primary(role: &Resp, name: &str) -> Option<Endpoint> {
    let Resp::Array(items) = role else {
        return None;
    };
    let text = |r: &Resp| match r {
        Resp::Bulk(b) | Resp::Simple(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Resp::Int(n) => Some(n.to_string()),
        _ => None,
    };
    let (role, host, port) = (
        text(items.first()?)?,
        text(items.get(1)?)?,
        text(items.get(2)?)?,
    );
    if role != "slave" {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    Endpoint::remote(name, &crate::topology::sentinel::join_address(&host, port))
}

/// Acts on an answer, on a timer (a context of its own: its writes are one replicated block).
fn decided(txid: String, decision: Decision) {
    // (Writes paused since the question: the part stays in doubt and is asked about again.)
    let act: fn(&Context, String) = match decision {
        Decision::Commit => |ctx, txid| {
            if !crate::host::context::writes_paused() {
                run::commit_alone(ctx, &txid)
            }
        },
        Decision::Abort => |ctx, txid| {
            if !crate::host::context::writes_paused() {
                run::abort_alone(ctx, &txid)
            }
        },
        Decision::Pending => return,
    };
    crate::host::context::after(Duration::ZERO, act, txid);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replicas_role_names_its_primary() {
        let bulk = |s: &str| Resp::Bulk(s.as_bytes().to_vec());
        let role = Resp::Array(vec![
            bulk("slave"),
            bulk("127.0.0.1"),
            Resp::Int(7001),
            bulk("connected"),
            Resp::Int(10),
        ]);
        let at = followed_primary(&role, "n0").map(|e| (e.name, e.address));
        assert_eq!(at, Some(("n0".into(), "127.0.0.1:7001".into())));
        let v6 = Resp::Array(vec![bulk("slave"), bulk("::1"), Resp::Int(7001)]);
        assert_eq!(
            followed_primary(&v6, "n0").map(|e| e.address),
            Some("[::1]:7001".into())
        );
        let master = Resp::Array(vec![bulk("master"), Resp::Int(3), Resp::Array(vec![])]);
        assert!(followed_primary(&master, "n0").is_none());
        assert!(followed_primary(&Resp::Error(b"NOPERM".to_vec()), "n0").is_none());
        assert!(followed_primary(&Resp::Array(vec![bulk("slave"), bulk("h")]), "n0").is_none());
    }
}
