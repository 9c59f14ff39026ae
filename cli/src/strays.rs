//! `check`'s keys part: keys sampled on each node (`SCAN`) that another node owns
//! (`SHARD.WHEREIS`, asked of a node holding the fleet's rings), each a finding with its mend.
//! Key names are bytes end to end (a name need not be UTF-8), shown as `redis-cli` shows them
//! (`"st\xffray"`). On a node with the cluster protocol on, a client's `MIGRATE` (or `EXISTS`,
//! `DUMP`) of a key another node owns is answered `MOVED`; the module's own connections say
//! `SHARD.CLUSTER INTERNAL` and see the node's own keyspace, and so does the mend's connection.

use crate::check::{redis_cli, run_on, Action, Finding, Seen};
use crate::conn::{bytes, get, int, items, pairs, repr, shell_word, split_addr, text, ConnOpts};
use crate::fleet::Fleet;

/// A key sampled on `seen[node]` that `owner` owns; `held` when the owner holds it too.
pub struct Stray {
    node: usize,
    key: Vec<u8>,
    owner: String,
    held: bool,
}

/// Up to `sample` keys of each node, judged by `seen[judge]`: how many were sampled, and the
/// strays.
pub fn sample(
    seen: &mut [Seen],
    judge: usize,
    sample: usize,
) -> Result<(usize, Vec<Stray>), String> {
    let (mut sampled, mut strays) = (0, Vec::new());
    let count = sample.max(1).to_string();
    for i in 0..seen.len() {
        let reply = seen[i].con.call(&["SCAN", "0", "COUNT", &count])?;
        let keys = items(&items(&reply).get(1).cloned().unwrap_or(redis::Value::Nil));
        for k in keys.iter().take(sample) {
            let key = bytes(k);
            sampled += 1;
            let owner = text(&seen[judge].con.call_bytes(&[b"SHARD.WHEREIS", &key])?);
            if owner != seen[i].node.name {
                // The owner's own key: its EXISTS is not redirected.
                let held = seen
                    .iter_mut()
                    .find(|s| s.node.name == owner)
                    .is_some_and(|s| {
                        s.con
                            .call_bytes(&[b"EXISTS", &key])
                            .is_ok_and(|v| int(&v) == 1)
                    });
                strays.push(Stray {
                    node: i,
                    key,
                    owner,
                    held,
                });
            }
        }
    }
    Ok((sampled, strays))
}

/// The finding of one stray: a key its owner holds too is cleaned up on the node
/// (`SHARD.RESHARD CLEANUP`), any other is moved to its owner (`MIGRATE`, on a connection
/// marked `SHARD.CLUSTER INTERNAL` where the cluster protocol is on).
pub fn finding(opts: &ConnOpts, fleet: &Fleet, seen: &mut [Seen], stray: Stray) -> Finding {
    let Stray {
        node,
        key,
        owner,
        held,
    } = stray;
    let cluster_on = seen[node]
        .con
        .call(&["CONFIG", "GET", "shard.cluster-protocol"])
        .map(|v| text(&get(&pairs(&v), "shard.cluster-protocol")) == "yes")
        .unwrap_or(false);
    let s = &seen[node];
    let detail = format!(
        "key {} is on {}, its owner is {owner}{}",
        repr(&key),
        s.node.name,
        if held {
            " (which holds it too)"
        } else {
            " (which does not hold it)"
        }
    );
    if held {
        return Finding {
            check: "keys",
            ok: false,
            detail,
            mend: format!(
                "{} SHARD.RESHARD CLEANUP   # deletes the keys {} holds that another node owns",
                redis_cli(opts, s.node.reach()),
                s.node.name
            ),
            action: run_on(&s.node, &["SHARD.RESHARD", "CLEANUP"]),
        };
    }
    let to = fleet
        .ring
        .node(&owner)
        .map(|n| n.reach().to_string())
        .unwrap_or_default();
    let (host, port) = split_addr(&to).unwrap_or_default();
    let port = port.to_string();
    let cli = redis_cli(opts, s.node.reach());
    let mend = if cluster_on {
        // redis-cli reads commands from its input a line each, names quoted as it shows them.
        let lines = format!(
            "'SHARD.CLUSTER INTERNAL' {}",
            shell_word(format!("MIGRATE {host} {port} {} 0 5000", repr(&key)).as_bytes())
        );
        format!(
            "printf '%s\\n' {lines} | {cli}   # moves it to {owner}; the cluster protocol redirects a client's MIGRATE, not the node's own connections'"
        )
    } else {
        format!(
            "{cli} MIGRATE {host} {port} {} 0 5000   # moves it to {owner}",
            shell_word(&key)
        )
    };
    let mut args: Vec<Vec<u8>> = vec![
        b"MIGRATE".to_vec(),
        host.into_bytes(),
        port.into_bytes(),
        key,
        b"0".to_vec(),
        b"5000".to_vec(),
    ];
    // The destination asks the fleet's credentials, as the tool was given them.
    match (&opts.user, &opts.password) {
        (Some(u), Some(p)) => args.extend([b"AUTH2".to_vec(), u.clone().into(), p.clone().into()]),
        (None, Some(p)) => args.extend([b"AUTH".to_vec(), p.clone().into()]),
        _ => {}
    }
    Finding {
        check: "keys",
        ok: false,
        detail,
        mend,
        action: Action::Run {
            node: s.node.name.clone(),
            addr: s.node.reach().to_string(),
            args,
            internal: cluster_on,
        },
    }
}
