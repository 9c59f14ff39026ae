//! `shard-cli check`: whether the fleet is well. Every node answers and holds the same rings
//! (digests) and term; keys sampled on each node (SCAN) are at their owner (SHARD.WHEREIS;
//! `strays`); with the cluster protocol on, every node answers the same map (`cluster`);
//! replicas are linked, online and close behind, Sentinel's too (`replicas`); no fleet
//! operation is stuck. Each problem is printed with the command that mends it; the exit status
//! is 0 only when there is none.

use std::collections::BTreeMap;

use serde_json::json;

use crate::conn::{get, int, pairs, split_addr, text, ConnOpts, Node};
use crate::fleet::{ring_of, Fleet, RingNode};

/// One check's finding: `mend` is empty when all is well; `action` is what `fix` runs.
#[derive(Default)]
pub struct Finding {
    pub check: &'static str,
    pub ok: bool,
    pub detail: String,
    pub mend: String,
    pub action: Action,
}

/// What mends a finding, for `shard-cli fix`.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Action {
    /// Nothing `fix` can do (a node down, a replica behind): the mend is for a person.
    #[default]
    None,
    /// A fleet operation runs: `fix` changes nothing meanwhile.
    Running,
    /// A command to run on a node (its name, its address, the command as bytes: a key's name
    /// need not be UTF-8), on a connection marked `SHARD.CLUSTER INTERNAL` when `internal` (the
    /// node's own keyspace, not redirected by the cluster protocol).
    Run {
        node: String,
        addr: String,
        args: Vec<Vec<u8>>,
        internal: bool,
    },
}

pub fn run_on(node: &RingNode, args: &[&str]) -> Action {
    Action::Run {
        node: node.name.clone(),
        addr: node.reach().to_string(),
        args: args.iter().map(|a| a.as_bytes().to_vec()).collect(),
        internal: false,
    }
}

/// `redis-cli` pointed at an address, with `--tls` when the tool speaks TLS.
pub fn redis_cli(opts: &ConnOpts, addr: &str) -> String {
    let (host, port) = split_addr(addr).unwrap_or((addr.to_string(), 0));
    let tls = if opts.tls { " --tls" } else { "" };
    format!("redis-cli -h {host} -p {port}{tls}")
}

pub struct Seen {
    pub node: RingNode,
    pub con: Node,
    pub(crate) digest: String,
    pub(crate) previous: String,
    pub(crate) term: i64,
}

/// Every check's findings, in the order they are printed.
pub fn findings(opts: &ConnOpts, sample: usize) -> Result<Vec<Finding>, String> {
    let fleet = Fleet::discover(opts)?;
    let mut out = Vec::new();
    let mut seen = Vec::new();
    let mut down = Vec::new();
    for n in &fleet.nodes {
        let got = fleet.connect(opts, n).and_then(|mut con| {
            let ring = ring_of(&mut con)?;
            let state = pairs(&con.call(&["SHARD.RING", "STATE"])?);
            Ok((con, ring, int(&get(&state, "term"))))
        });
        match got {
            Ok((con, ring, term)) => seen.push(Seen {
                node: n.clone(),
                con,
                digest: ring.as_ref().map_or("none".into(), |r| r.digest.clone()),
                previous: ring
                    .and_then(|r| r.previous.map(|p| p.digest))
                    .unwrap_or_default(),
                term,
            }),
            Err(e) => down.push(e),
        }
    }
    let names = |v: &[&Seen]| {
        v.iter()
            .map(|s| s.node.name.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    out.push(Finding {
        check: "nodes",
        ok: down.is_empty(),
        detail: if down.is_empty() {
            format!(
                "{} nodes answer: {}",
                seen.len(),
                names(&seen.iter().collect::<Vec<_>>())
            )
        } else {
            down.join("; ")
        },
        mend: if down.is_empty() {
            String::new()
        } else {
            "start the node, or remove it from the ring with `shard-cli del-node NAME`".into()
        },
        ..Default::default()
    });

    // Rings: the digest most nodes hold is the fleet's; the others are named.
    let mut by_ring: BTreeMap<(String, String), Vec<&Seen>> = BTreeMap::new();
    for s in &seen {
        by_ring
            .entry((s.digest.clone(), s.previous.clone()))
            .or_default()
            .push(s);
    }
    let major = by_ring
        .iter()
        .max_by_key(|(_, v)| v.len())
        .map(|(k, v)| (k.clone(), v[0]));
    // Keys are judged by a node that holds the fleet's rings, not by each node's own.
    let judge_name = major.as_ref().map(|(_, g)| g.node.name.clone());
    if let Some(((digest, previous), good)) = major {
        let odd: Vec<&Seen> = seen
            .iter()
            .filter(|s| s.digest != digest || s.previous != previous)
            .collect();
        let mut detail = format!("every node holds ring {digest}");
        if !previous.is_empty() {
            detail += &format!(" over {previous} (a resharding is open)");
        }
        if odd.is_empty() {
            out.push(Finding {
                check: "rings",
                ok: true,
                detail,
                mend: String::new(),
                ..Default::default()
            });
        }
        for s in odd {
            out.push(Finding {
                check: "rings",
                ok: false,
                detail: format!(
                    "{} holds ring {}{}, the fleet {}{}",
                    s.node.name,
                    s.digest,
                    if s.previous.is_empty() {
                        String::new()
                    } else {
                        format!(" over {}", s.previous)
                    },
                    digest,
                    if previous.is_empty() {
                        String::new()
                    } else {
                        format!(" over {previous}")
                    }
                ),
                mend: format!(
                    "{} SHARD.RING PUSH   # sends {}'s rings to every node",
                    redis_cli(opts, good.node.reach()),
                    good.node.name
                ),
                action: run_on(&good.node, &["SHARD.RING", "PUSH"]),
            });
        }
        let top = seen.iter().map(|s| s.term).max().unwrap_or(0);
        let behind: Vec<&Seen> = seen.iter().filter(|s| s.term != top).collect();
        out.push(Finding {
            check: "term",
            ok: behind.is_empty(),
            detail: if behind.is_empty() { format!("every node follows term {top}") } else {
                format!("{} follow an older term than {top} ({})", names(&behind),
                    behind.iter().map(|s| s.term.to_string()).collect::<Vec<_>>().join(" "))
            },
            mend: if behind.is_empty() { String::new() } else {
                "a node follows the newer term at the next fleet step; if an operation is unfinished, `shard-cli status` resumes it".into()
            },
            ..Default::default()
        });
    }

    // Sampled keys at their owner (not while a resharding is open: keys are on their way).
    let open = seen.iter().any(|s| !s.previous.is_empty());
    let (sampled, strays) =
        match judge_name.and_then(|j| seen.iter().position(|s| s.node.name == j)) {
            Some(judge) if !open => crate::strays::sample(&mut seen, judge, sample)?,
            _ => (0, Vec::new()),
        };
    if open {
        out.push(Finding {
            check: "keys",
            ok: true,
            detail: "not sampled: a resharding is open".into(),
            mend: String::new(),
            ..Default::default()
        });
    } else if strays.is_empty() {
        out.push(Finding {
            check: "keys",
            ok: true,
            detail: format!("{sampled} keys sampled, each at its owner"),
            mend: String::new(),
            ..Default::default()
        });
    }
    for stray in strays {
        out.push(crate::strays::finding(opts, &fleet, &mut seen, stray));
    }

    crate::cluster::cluster_map(opts, &mut seen, &mut out);

    crate::replicas::check(opts, &mut seen, &mut out)?;

    // Fleet operations not stuck.
    let mut ops = Vec::new();
    for s in &mut seen {
        let st = pairs(&s.con.call(&["SHARD.RESHARD", "STATUS"])?);
        let fleet_st = pairs(&get(&st, "fleet"));
        if !fleet_st.is_empty() {
            let phase = text(&get(&fleet_st, "phase"));
            let running = text(&get(&fleet_st, "running")) == "yes";
            if phase != "done" && phase != "cancelled" {
                ops.push((
                    s.node.clone(),
                    phase,
                    running,
                    text(&get(&fleet_st, "error")),
                ));
            }
        }
    }
    if ops.is_empty() && open {
        out.push(Finding {
            check: "operations",
            ok: false,
            detail: "a resharding is open but no node coordinates it".into(),
            mend: format!(
                "{} SHARD.RESHARD RESUME   # adopts the operation whose rings the fleet holds",
                redis_cli(opts, fleet.nodes[0].reach())
            ),
            action: run_on(&fleet.nodes[0], &["SHARD.RESHARD", "RESUME"]),
        });
    } else if ops.is_empty() {
        out.push(Finding {
            check: "operations",
            ok: true,
            detail: "no fleet operation open".into(),
            mend: String::new(),
            ..Default::default()
        });
    }
    for (n, phase, running, error) in ops {
        out.push(Finding {
            check: "operations",
            ok: false,
            detail: format!(
                "{} coordinates an operation in phase {phase}, {}{}",
                n.name,
                if running { "running" } else { "stopped" },
                if error.is_empty() {
                    String::new()
                } else {
                    format!(": {error}")
                }
            ),
            mend: if running {
                "shard-cli status   # follows it to its end".into()
            } else {
                format!(
                    "{} SHARD.RESHARD RESUME   # or `shard-cli status --resume`",
                    redis_cli(opts, n.reach())
                )
            },
            action: if running {
                Action::Running
            } else {
                run_on(&n, &["SHARD.RESHARD", "RESUME"])
            },
        });
    }

    Ok(out)
}

/// Keys away from their owner printed one by one at most; the rest are counted (`--json` and
/// `fix` have them all).
const KEYS_SHOWN: usize = 10;

/// Prints findings as `check` does: `[OK]` or `[ERR]`, the detail, the mend.
pub fn print(out: &[Finding]) {
    let strays = out.iter().filter(|f| f.check == "keys" && !f.ok).count();
    let mut shown = 0;
    for f in out {
        if f.check == "keys" && !f.ok {
            shown += 1;
            if shown > KEYS_SHOWN {
                if shown == strays {
                    println!(
                        "[ERR] keys: and {} more keys away from their owner (`check --json` lists them; `fix` mends them)",
                        strays - KEYS_SHOWN
                    );
                }
                continue;
            }
        }
        println!(
            "[{}] {}: {}",
            if f.ok { "OK" } else { "ERR" },
            f.check,
            f.detail
        );
        if !f.mend.is_empty() {
            println!("      mend: {}", f.mend);
        }
    }
}

/// `shard-cli check [--json] [--sample N]`.
pub fn run(opts: &ConnOpts, json_out: bool, sample: usize) -> Result<i32, String> {
    let out = findings(opts, sample)?;
    let well = out.iter().all(|f| f.ok);
    if json_out {
        let checks: Vec<_> = out
            .iter()
            .map(|f| json!({"check": f.check, "ok": f.ok, "detail": f.detail, "mend": f.mend}))
            .collect();
        println!("{:#}", json!({"ok": well, "checks": checks}));
    } else {
        print(&out);
        let bad = out.iter().filter(|f| !f.ok).count();
        if well {
            println!("All is well.");
        } else {
            println!("{bad} problem{} found.", if bad == 1 { "" } else { "s" });
        }
    }
    Ok(if well { 0 } else { 1 })
}
