//! `check`'s replicas part. Each replica a primary has linked (`INFO replication`'s `slaveN`)
//! must be `online`, its last ack at most 10 s old and its offset at most 1 MiB behind its
//! primary's. For a node the ring names `sentinel`, the replicas Sentinel knows (`SENTINEL
//! REPLICAS name`, asked of the first of the node's `shard.sentinels` that answers, with its
//! `shard.sentinel-user`/`-password`) must be up by Sentinel's flags (no `s_down`, `o_down`,
//! `disconnected`), with their link to the primary up (`master-link-status ok`), and linked
//! to the primary: a replica stopped or killed is listed by Sentinel still, and named. No
//! command mends a replica down: the mend is for a person (start it again, or, when it is gone
//! for good, `SENTINEL RESET name` on every sentinel so that they forget it), and the exit
//! status is 1.

use crate::check::{redis_cli, Finding, Seen};
use crate::conn::{get, items, pairs, text, ConnOpts, Node};
use crate::info::{replicas, Replica};

/// A replica whose last ack is older than this (seconds) is out of sync.
pub const MAX_LAG_S: i64 = 10;
/// A replica whose acknowledged offset is this far behind its primary's (bytes) is out of sync.
pub const MAX_BEHIND: i64 = 1 << 20;

/// A replica Sentinel lists for a master.
struct Listed {
    address: String,
    flags: String,
    link: String,
}

/// The sentinels a `sentinel` node is resolved through, reached as the module reaches them.
struct Sentinels {
    con: Option<Node>,
    addresses: Vec<String>,
    error: String,
}

impl Sentinels {
    /// The sentinels of `node`'s `shard.sentinels`, the first that answers connected; when
    /// none can be, `error` says why.
    fn of(opts: &ConnOpts, node: &mut Node) -> Sentinels {
        let config = match node.call(&["CONFIG", "GET", "shard.sentinel*"]) {
            Ok(v) => pairs(&v),
            Err(e) => {
                return Sentinels {
                    con: None,
                    addresses: Vec::new(),
                    error: e,
                }
            }
        };
        let value = |k: &str| Some(text(&get(&config, k))).filter(|v| !v.is_empty());
        let addresses: Vec<String> = value("shard.sentinels")
            .unwrap_or_default()
            .split([' ', ','])
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect();
        let as_sentinel = ConnOpts {
            user: value("shard.sentinel-user"),
            password: value("shard.sentinel-password"),
            ..opts.clone()
        };
        let mut errors = Vec::new();
        for a in &addresses {
            match as_sentinel.connect(&format!("sentinel {a}"), a) {
                Ok(con) => {
                    return Sentinels {
                        con: Some(con),
                        addresses,
                        error: String::new(),
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        let error = if addresses.is_empty() {
            format!("{} has no shard.sentinels", node.label)
        } else {
            errors.join("; ")
        };
        Sentinels {
            con: None,
            addresses,
            error,
        }
    }

    fn replicas(&mut self, name: &str) -> Result<Vec<Listed>, String> {
        let Some(con) = self.con.as_mut() else {
            return Ok(Vec::new());
        };
        let reply = con.call(&["SENTINEL", "REPLICAS", name])?;
        Ok(items(&reply)
            .iter()
            .map(|r| {
                let m = pairs(r);
                let f = |k: &str| text(&get(&m, k));
                Listed {
                    address: format!("{}:{}", f("ip"), f("port")),
                    flags: f("flags"),
                    link: f("master-link-status"),
                }
            })
            .collect())
    }
}

/// What is wrong with a linked replica, if anything.
fn behind(r: &Replica) -> Option<String> {
    if r.state != "online" {
        return Some(format!("{} (not online)", r.state));
    }
    if r.lag_s > MAX_LAG_S || r.lag_bytes > MAX_BEHIND {
        return Some(format!(
            "{} B behind, its last ack {} s ago (out of sync beyond {} s or {} B)",
            r.lag_bytes, r.lag_s, MAX_LAG_S, MAX_BEHIND
        ));
    }
    None
}

/// What is wrong with a replica Sentinel lists, if anything.
fn down(l: &Listed, linked: &[Replica]) -> Option<String> {
    let mut why = Vec::new();
    if l.flags
        .split(',')
        .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"))
    {
        why.push(format!("down by Sentinel's flags ({})", l.flags));
    }
    if l.link == "err" {
        why.push("its link to the primary is down (master-link-status err)".to_string());
    }
    if !linked.iter().any(|r| r.address == l.address) {
        why.push("not linked to the primary".to_string());
    }
    (!why.is_empty()).then(|| why.join(", "))
}

/// The replicas' findings, pushed to `out`.
pub fn check(opts: &ConnOpts, seen: &mut [Seen], out: &mut Vec<Finding>) -> Result<(), String> {
    let mut sentinels: Option<Sentinels> = None;
    let (mut count, mut bad) = (0, 0);
    for s in seen.iter_mut() {
        let linked = replicas(&s.con.info("replication")?);
        count += linked.len();
        for r in &linked {
            if let Some(why) = behind(r) {
                bad += 1;
                out.push(Finding {
                    check: "replicas",
                    ok: false,
                    detail: format!("{}'s replica {} is {why}", s.node.name, r.address),
                    mend: format!(
                        "see the replica: is it running (not paused), what its log and `{} INFO replication` say; it catches up once it answers",
                        redis_cli(opts, &r.address)
                    ),
                    ..Default::default()
                });
            }
        }
        if s.node.address != "sentinel" {
            continue;
        }
        if sentinels.is_none() {
            sentinels = Some(Sentinels::of(opts, &mut s.con));
        }
        let Some(st) = sentinels.as_mut() else {
            continue;
        };
        if st.con.is_none() {
            // Said once for the fleet.
            if !st.error.is_empty() {
                bad += 1;
                out.push(Finding {
                    check: "replicas",
                    ok: false,
                    detail: format!(
                        "no sentinel answers, the replicas Sentinel knows are not checked: {}",
                        st.error
                    ),
                    mend: "start the sentinels (shard.sentinels lists them)".into(),
                    ..Default::default()
                });
                st.error.clear();
            }
            continue;
        }
        let listed = match st.replicas(&s.node.name) {
            Ok(listed) => listed,
            Err(e) => {
                bad += 1;
                out.push(Finding {
                    check: "replicas",
                    ok: false,
                    detail: format!("{}'s replicas not checked: {e}", s.node.name),
                    mend: format!(
                        "the sentinels must monitor a master named {} (`sentinel monitor {} HOST PORT QUORUM`), and let the tool ask them (shard.sentinel-user, shard.sentinel-password)",
                        s.node.name, s.node.name
                    ),
                    ..Default::default()
                });
                continue;
            }
        };
        for l in &listed {
            let Some(why) = down(l, &linked) else {
                continue;
            };
            bad += 1;
            let reset: Vec<String> = st.addresses.iter().map(|a| redis_cli(opts, a)).collect();
            out.push(Finding {
                check: "replicas",
                ok: false,
                detail: format!(
                    "{}'s replica {}, which Sentinel lists, is {why} ({} of {} listed linked)",
                    s.node.name,
                    l.address,
                    listed.iter().filter(|x| linked.iter().any(|r| r.address == x.address)).count(),
                    listed.len()
                ),
                mend: format!(
                    "start the replica at {} again (it resyncs from its primary); if it is gone for good, on every sentinel: {}",
                    l.address,
                    reset
                        .iter()
                        .map(|c| format!("{c} SENTINEL RESET {}", s.node.name))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                ..Default::default()
            });
        }
    }
    if bad == 0 {
        out.push(Finding {
            check: "replicas",
            ok: true,
            detail: format!("{count} replicas, all online and in sync"),
            mend: String::new(),
            ..Default::default()
        });
    }
    Ok(())
}
