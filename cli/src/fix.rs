//! `shard-cli fix`: runs the mends `check` prints, each one shown as it is applied, then checks
//! again. It changes nothing while a fleet operation runs (its rings and keys are on their way),
//! and is idempotent: on a well fleet it does nothing. The mends go in two rounds: first the
//! fleet's own state (rings sent with `SHARD.RING PUSH`, the cluster protocol turned on, a
//! stopped operation resumed and followed), then, checked again on the mended rings, the keys
//! sampled away from their owner (`MIGRATE` to an owner that does not hold the key, on a
//! connection marked `SHARD.CLUSTER INTERNAL` where the cluster protocol is on, a
//! `SHARD.RESHARD CLEANUP` followed to its end on a node whose strays the owner holds too).
//! What no command mends (a node down, a replica behind, an older term) is left for a person,
//! with the mend `check` prints, and the exit status is 1.

use crate::check::{findings, print, Action, Finding};
use crate::conn::{items, pairs, shell_word, text, ConnOpts};
use crate::fleet::RingNode;

/// The command as printed, each argument as a shell reads it back (a key's name `$'\xff'`);
/// passwords given to MIGRATE shown as `***`.
fn shown(args: &[Vec<u8>]) -> String {
    let before = |i: usize, n: usize| i.checked_sub(n).and_then(|j| args.get(j));
    args.iter()
        .enumerate()
        .map(|(i, a)| {
            let password = before(i, 1).is_some_and(|b| b == b"AUTH")
                || before(i, 2).is_some_and(|b| b == b"AUTH2");
            if password {
                "***".to_string()
            } else {
                shell_word(a)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs one mend on its node (on a connection marked `SHARD.CLUSTER INTERNAL` first when
/// `internal`); Ok(true) when it worked.
fn apply(
    opts: &ConnOpts,
    node: &str,
    addr: &str,
    args: &[Vec<u8>],
    internal: bool,
) -> Result<bool, String> {
    let mut con = opts.connect(node, addr)?;
    if internal {
        con.call(&["SHARD.CLUSTER", "INTERNAL"])?;
    }
    let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let reply = con.call_bytes(&argv)?;
    let ring_node = RingNode {
        name: node.to_string(),
        address: addr.to_string(),
        resolved: addr.to_string(),
        weight: 1,
    };
    let name: Vec<String> = argv
        .iter()
        .take(2)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let name: Vec<&str> = name.iter().map(String::as_str).collect();
    match name.as_slice() {
        ["SHARD.RESHARD", "CLEANUP"] => {
            let job = crate::jobs::Job {
                node: ring_node,
                con,
                kind: "cleanup".to_string(),
                paused: false,
                percent: 0,
            };
            Ok(crate::jobs::follow(vec![job])? == 0)
        }
        ["SHARD.RESHARD", "RESUME"] => Ok(crate::follow::follow(opts, con, &ring_node, None)? == 0),
        ["SHARD.RING", "PUSH"] => {
            // Per node: OK, or the error naming it.
            let mut ok = true;
            let per = pairs(&reply);
            let per = if per.is_empty() {
                items(&reply).iter().map(|v| (text(v), v.clone())).collect()
            } else {
                per
            };
            for (name, v) in per {
                let v = text(&v);
                ok &= v == "OK";
                println!("    {name}: {v}");
            }
            Ok(ok)
        }
        _ => {
            println!("    {}", text(&reply));
            Ok(true)
        }
    }
}

/// The mends of `found` this round: not the keys' in the first round; each command once.
fn mends(found: &[Finding], keys: bool) -> Vec<&Finding> {
    let mut out: Vec<&Finding> = Vec::new();
    for f in found
        .iter()
        .filter(|f| !f.ok && (f.check == "keys") == keys)
    {
        if matches!(f.action, Action::Run { .. }) && !out.iter().any(|o| o.action == f.action) {
            out.push(f);
        }
    }
    out
}

/// `shard-cli fix [--sample N]`.
pub fn run(opts: &ConnOpts, sample: usize) -> Result<i32, String> {
    let (mut applied, mut failed) = (0, 0);
    for keys in [false, true] {
        let found = findings(opts, sample)?;
        if let Some(f) = found.iter().find(|f| f.action == Action::Running) {
            println!("A fleet operation runs: {}.", f.detail);
            println!(
                "fix changes nothing while it runs: `shard-cli status` follows it to its end."
            );
            return Ok(1);
        }
        for f in mends(&found, keys) {
            let Action::Run {
                node,
                addr,
                args,
                internal,
            } = &f.action
            else {
                continue;
            };
            println!("Mending {}: {}", f.check, f.detail);
            println!("  on {node} ({addr}): {}", shown(args));
            applied += 1;
            match apply(opts, node, addr, args, *internal) {
                Ok(true) => {}
                Ok(false) => failed += 1,
                Err(e) => {
                    println!("    failed: {e}");
                    failed += 1;
                }
            }
        }
    }
    let after = findings(opts, sample)?;
    let left = after.iter().filter(|f| !f.ok).count();
    if applied == 0 && left == 0 {
        println!("Nothing to mend: all is well.");
        return Ok(0);
    }
    if applied > 0 {
        println!(
            "{applied} mend{} applied{}; the fleet checked again:",
            if applied == 1 { "" } else { "s" },
            if failed > 0 {
                format!(", {failed} failed")
            } else {
                String::new()
            }
        );
    }
    print(&after);
    if left == 0 {
        println!("All is well.");
        Ok(0)
    } else {
        println!(
            "{left} problem{} left that fix does not mend: see each one's mend above.",
            if left == 1 { "" } else { "s" }
        );
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_printed() {
        let s = |v: &[&str]| shown(&v.iter().map(|a| a.as_bytes().to_vec()).collect::<Vec<_>>());
        assert_eq!(
            s(&["MIGRATE", "h", "1", "k", "0", "5000", "AUTH", "pw"]),
            "MIGRATE h 1 k 0 5000 AUTH ***"
        );
        assert_eq!(
            s(&["MIGRATE", "h", "1", "a b", "0", "5000", "AUTH2", "ops", "pw"]),
            "MIGRATE h 1 'a b' 0 5000 AUTH2 ops ***"
        );
        assert_eq!(s(&["SHARD.RING", "PUSH"]), "SHARD.RING PUSH");
        assert_eq!(
            shown(&[b"MIGRATE".to_vec(), b"k\xff".to_vec()]),
            "MIGRATE $'k\\xff'"
        );
    }
}
