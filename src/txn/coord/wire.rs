//! The words of the owner protocol the coordinator sends (`SHARD.TXN WATCH`, `UNWATCH`,
//! `APPLY`, `PREPARE`, `COMMIT`, `ABORT`) and the records it keeps of its own decisions
//! (`SHARD.TXN DECIDE`, `FORGET`), pure: the arguments built, and the replies read back
//! (`docs/transactions.md`, the table of `SHARD.TXN`). A command list is `ncmds` then, for
//! each command, `argc` and its arguments.

use crate::net::resp::Resp;

/// One command: its name first.
pub type Command = Vec<Vec<u8>>;

fn txn(sub: &str, txid: &str) -> Vec<Vec<u8>> {
    vec![
        b"SHARD.TXN".to_vec(),
        sub.as_bytes().to_vec(),
        txid.as_bytes().to_vec(),
    ]
}

fn number(n: usize) -> Vec<u8> {
    n.to_string().into_bytes()
}

/// Appends `ncmds (argc arg...)...`.
pub fn push_commands(out: &mut Vec<Vec<u8>>, commands: &[Command]) {
    out.push(number(commands.len()));
    for c in commands {
        out.push(number(c.len()));
        out.extend(c.iter().cloned());
    }
}

/// Appends `nwatched key...`.
fn push_keys(out: &mut Vec<Vec<u8>>, keys: &[Vec<u8>]) {
    out.push(number(keys.len()));
    out.extend(keys.iter().cloned());
}

/// `SHARD.TXN WATCH txid ttl-ms key [key ...]`.
pub fn watch(txid: &str, ttl_ms: u64, keys: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = txn("WATCH", txid);
    out.push(ttl_ms.to_string().into_bytes());
    out.extend(keys.iter().cloned());
    out
}

/// `SHARD.TXN READ txid ttl-ms key [key ...]`: `WATCH`, and each key's `DUMP` and
/// `PEXPIRETIME` in the same command.
pub fn read(txid: &str, ttl_ms: u64, keys: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = txn("READ", txid);
    out.push(ttl_ms.to_string().into_bytes());
    out.extend(keys.iter().cloned());
    out
}

/// `SHARD.TXN UNWATCH txid`.
pub fn unwatch(txid: &str) -> Vec<Vec<u8>> {
    txn("UNWATCH", txid)
}

/// `SHARD.TXN APPLY txid nwatched key... ncmds (argc arg...)...`.
pub fn apply(txid: &str, watched: &[Vec<u8>], commands: &[Command]) -> Vec<Vec<u8>> {
    let mut out = txn("APPLY", txid);
    push_keys(&mut out, watched);
    push_commands(&mut out, commands);
    out
}

/// `SHARD.TXN PREPARE txid lock-ms nwatched key... ncmds (argc arg...)... [FROM host:port]`:
/// `from` is this coordinator's address, which the owner keeps with the part to ask about it
/// when no ring there names this node any more.
pub fn prepare(
    txid: &str,
    lock_ms: u64,
    watched: &[Vec<u8>],
    commands: &[Command],
    from: Option<&str>,
) -> Vec<Vec<u8>> {
    let mut out = txn("PREPARE", txid);
    out.push(lock_ms.to_string().into_bytes());
    push_keys(&mut out, watched);
    push_commands(&mut out, commands);
    if let Some(at) = from {
        out.push(b"FROM".to_vec());
        out.push(at.as_bytes().to_vec());
    }
    out
}

/// `SHARD.TXN COMMIT txid ncmds (argc arg...)...`: the part given, so that an owner that lost
/// its prepared record in a failover applies it still.
pub fn commit(txid: &str, commands: &[Command]) -> Vec<Vec<u8>> {
    let mut out = txn("COMMIT", txid);
    push_commands(&mut out, commands);
    out
}

/// Whether an `APPLY`'s error reply is the owner's `NOREPLICAS the transaction is applied
/// ...`: its block applied there, at no replica of it (`txn::owner::acked::single`); not
/// Redis's own `NOREPLICAS` (refused by `min-replicas-to-write`, not applied).
pub fn unconfirmed(line: &[u8]) -> bool {
    line.starts_with(crate::txn::owner::acked::UNCONFIRMED.as_bytes())
}

/// Whether a `COMMIT`'s error reply is the owner's `APPLIED ...`: its part applied there, not
/// yet at a replica (`txn::owner::acked::commit_reply`).
pub fn applied(line: &[u8]) -> bool {
    line.starts_with(b"APPLIED ")
}

/// `SHARD.TXN ABORT txid`.
pub fn abort(txid: &str) -> Vec<Vec<u8>> {
    txn("ABORT", txid)
}

/// `SHARD.TXN FORGET txid`: the coordinator's decision is carried out everywhere.
pub fn forget(txid: &str) -> Vec<Vec<u8>> {
    txn("FORGET", txid)
}

/// One owner's part of a decision: the owner's node name and its commands.
pub type DecidedPart = (String, Vec<Command>);

/// A decision to commit: the database the commands run in, every owner's part, and each
/// owner's address when it was decided (in the parts' order; empty in a record of a build
/// before them). The commit is sent again to an owner at its address in the rings; an owner no
/// ring names any more (a shrink took it out before its confirmation came) is found at the
/// address recorded here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub db: u32,
    pub parts: Vec<DecidedPart>,
    pub addresses: Vec<String>,
}

/// `SHARD.TXN DECIDE txid COMMIT db nparts (owner ncmds (argc arg...)...)... [AT address...]`
/// (one address per part).
pub fn decide_commit(txid: &str, decision: &Decision) -> Vec<Vec<u8>> {
    let mut out = txn("DECIDE", txid);
    out.push(b"COMMIT".to_vec());
    out.push(decision.db.to_string().into_bytes());
    out.push(number(decision.parts.len()));
    for (owner, commands) in &decision.parts {
        out.push(owner.as_bytes().to_vec());
        push_commands(&mut out, commands);
    }
    if decision.addresses.len() == decision.parts.len() && !decision.addresses.is_empty() {
        out.push(b"AT".to_vec());
        out.extend(decision.addresses.iter().map(|a| a.as_bytes().to_vec()));
    }
    out
}

/// `SHARD.TXN DECIDE txid ABORT`.
pub fn decide_abort(txid: &str) -> Vec<Vec<u8>> {
    let mut out = txn("DECIDE", txid);
    out.push(b"ABORT".to_vec());
    out
}

/// Reads `count` then that many items with `item`, from `args` at `*at`.
fn counted<T>(
    args: &[&[u8]],
    at: &mut usize,
    what: &str,
    mut item: impl FnMut(&[&[u8]], &mut usize) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let n = count(args, at, what)?;
    let mut out = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        out.push(item(args, at)?);
    }
    Ok(out)
}

fn count(args: &[&[u8]], at: &mut usize, what: &str) -> Result<usize, String> {
    let raw = args
        .get(*at)
        .ok_or_else(|| format!("the {what} count is missing"))?;
    *at += 1;
    let n: usize = std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            format!(
                "the {what} count must be a number, got '{}'",
                String::from_utf8_lossy(raw)
            )
        })?;
    // Each counted item takes at least one argument.
    if n > args.len().saturating_sub(*at) {
        return Err(format!(
            "the {what} count {n} is more than the arguments given"
        ));
    }
    Ok(n)
}

/// Reads `ncmds (argc arg...)...` from `args` at `*at`.
pub fn read_commands(args: &[&[u8]], at: &mut usize) -> Result<Vec<Command>, String> {
    counted(args, at, "command", |args, at| {
        let argc = count(args, at, "argument")?;
        if argc == 0 {
            return Err("a command without a name".into());
        }
        let command: Command = args[*at..*at + argc].iter().map(|a| a.to_vec()).collect();
        *at += argc;
        Ok(command)
    })
}

/// Reads `db nparts (owner ncmds (argc arg...)...)... [AT address...]`, the whole of `args`
/// from `at`.
pub fn read_decision(args: &[&[u8]], at: usize) -> Result<Decision, String> {
    let db = args
        .get(at)
        .and_then(|a| std::str::from_utf8(a).ok())
        .and_then(|a| a.parse().ok())
        .ok_or("a decision's database must be a number")?;
    let mut at = at + 1;
    let parts = parts_at(args, &mut at)?;
    let mut addresses = Vec::new();
    if args.get(at).is_some_and(|a| a.eq_ignore_ascii_case(b"AT")) {
        let rest = &args[at + 1..];
        if rest.len() != parts.len() {
            return Err(format!(
                "a decision of {} parts gives {} addresses",
                parts.len(),
                rest.len()
            ));
        }
        addresses = rest
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        at = args.len();
    }
    if at != args.len() {
        return Err(format!("{} arguments after the parts", args.len() - at));
    }
    Ok(Decision {
        db,
        parts,
        addresses,
    })
}

/// Reads `nparts (owner ncmds (argc arg...)...)...`, the whole of `args` from `at`.
pub fn read_parts(args: &[&[u8]], mut at: usize) -> Result<Vec<DecidedPart>, String> {
    let parts = parts_at(args, &mut at)?;
    if at != args.len() {
        return Err(format!("{} arguments after the parts", args.len() - at));
    }
    Ok(parts)
}

/// Reads `nparts (owner ncmds (argc arg...)...)...` from `args` at `*at`.
fn parts_at(args: &[&[u8]], at: &mut usize) -> Result<Vec<DecidedPart>, String> {
    counted(args, at, "part", |args, at| {
        let owner = args
            .get(*at)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .ok_or("a part's owner is missing")?;
        *at += 1;
        Ok((owner, read_commands(args, at)?))
    })
}

/// What an owner answered a `PREPARE` (or an `APPLY`'s refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    Prepared,
    /// A watched key was written: the transaction fails (nil).
    Watched,
    /// A key is locked by another transaction: retry.
    Locked,
    /// Anything else: the error line the client gets.
    Failed(String),
}

/// Reads the reply to a `PREPARE`.
pub fn prepared(reply: &Resp) -> Prepared {
    match reply {
        Resp::Simple(s) | Resp::Bulk(s) if s.eq_ignore_ascii_case(b"PREPARED") => {
            Prepared::Prepared
        }
        Resp::Error(e) => refusal(e),
        other => Prepared::Failed(format!("ERR PREPARE replied {other:?}")),
    }
}

/// An owner's error line, by its code.
pub fn refusal(line: &[u8]) -> Prepared {
    let code = line.split(|b| *b == b' ').next().unwrap_or_default();
    if code.eq_ignore_ascii_case(b"WATCHED") {
        Prepared::Watched
    } else if code.eq_ignore_ascii_case(b"LOCKED") {
        Prepared::Locked
    } else {
        Prepared::Failed(String::from_utf8_lossy(line).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn requests() {
        let cmds = vec![s(&["SET", "a", "1"]), s(&["INCR", "b"])];
        assert_eq!(
            prepare("n1/1f", 500, &s(&["w"]), &cmds, None),
            s(&[
                "SHARD.TXN",
                "PREPARE",
                "n1/1f",
                "500",
                "1",
                "w",
                "2",
                "3",
                "SET",
                "a",
                "1",
                "2",
                "INCR",
                "b"
            ])
        );
        assert_eq!(
            apply("t", &[], &cmds[1..]),
            s(&["SHARD.TXN", "APPLY", "t", "0", "1", "2", "INCR", "b"])
        );
        assert_eq!(
            watch("t", 100, &s(&["a", "b"])),
            s(&["SHARD.TXN", "WATCH", "t", "100", "a", "b"])
        );
        assert_eq!(commit("t", &[]), s(&["SHARD.TXN", "COMMIT", "t", "0"]));
    }

    #[test]
    fn decisions_read_back() {
        let parts: Vec<DecidedPart> = vec![
            ("n1".into(), vec![s(&["SET", "a", "1"])]),
            ("n2".into(), vec![s(&["DEL", "b"]), s(&["INCR", "c"])]),
        ];
        let addresses = vec!["127.0.0.1:1".to_string(), "[::1]:2".to_string()];
        for addresses in [Vec::new(), addresses] {
            let decision = Decision {
                db: 3,
                parts: parts.clone(),
                addresses,
            };
            let args = decide_commit("t", &decision);
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            assert_eq!(read_decision(&refs, 4), Ok(decision));
            // Cut short (an address short of the parts' count too), or too long: an error,
            // never a panic.
            let whole = refs.len()
                - if args.iter().any(|a| a == b"AT") {
                    3
                } else {
                    0
                };
            for end in (4..refs.len()).filter(|e| *e != whole) {
                assert!(read_decision(&refs[..end], 4).is_err(), "{end}");
            }
            let mut longer = refs.clone();
            longer.push(b"x");
            assert!(read_decision(&longer, 4).is_err());
        }
        let huge: Vec<&[u8]> = vec![b"99999999999", b"n1"];
        assert!(read_parts(&huge, 0).is_err());
        let zero: Vec<&[u8]> = vec![b"1", b"n1", b"1", b"0"];
        assert!(read_parts(&zero, 0).is_err());
    }

    #[test]
    fn replies() {
        assert_eq!(
            prepared(&Resp::Simple(b"PREPARED".to_vec())),
            Prepared::Prepared
        );
        assert_eq!(
            prepared(&Resp::Error(b"WATCHED key 'a' was written".to_vec())),
            Prepared::Watched
        );
        assert_eq!(
            prepared(&Resp::Error(b"LOCKED n2/ab".to_vec())),
            Prepared::Locked
        );
        assert_eq!(
            prepared(&Resp::Error(b"MOVED key 'a'".to_vec())),
            Prepared::Failed("MOVED key 'a'".into())
        );
        assert!(matches!(prepared(&Resp::Int(1)), Prepared::Failed(_)));
    }
}
