//! `SHARD.CALL WAIT numreplicas timeout-ms command ...`, pure: the prefix read from the
//! arguments, and the call's reply once every write of the call has been waited for (the
//! command's reply when enough replicas acknowledged, else `NOREPLICAS` naming the owners
//! short of acknowledgements and their counts).
//!
//! How a write is waited for: at its owner, as Redis's `WAIT` does it, since only the owner
//! knows its replicas' offsets. The command and then `WAIT numreplicas timeout-ms` go on one
//! connection to the owner (`WAIT` counts the acknowledgements of its own client's last
//! write), a connection of their own (`net::lanes`: `WAIT` blocks its connection, and the
//! shared one carries every other call to that node). When this node is the owner, the pair
//! goes the same way, over a connection to this node's own address: a module cannot run
//! `WAIT` through RedisModule_Call (it is a blocking command; a module context has no
//! replication offset of its own to wait for), and the client, already blocked by
//! `SHARD.CALL`, is unblocked by the same reply path as every routed call
//! (`route::forward`). A read-only command writes nothing to wait for: it runs as it would
//! without `WAIT` and replies at once (as `WAIT` after a read returns at once for a client that
//! wrote nothing). The write stays applied when too few replicas acknowledge it, as with
//! `WAIT`. The command filter never turns such a call into the plain command (`route::filter`
//! rewrites only a carried command with keys, and `WAIT` has none).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::host::args::{int_in, ArgList};
use crate::host::error::CmdError;
use crate::net::resp::Resp;

/// The call's form with `WAIT`, for error messages.
pub const USAGE: &str = "SHARD.CALL WAIT numreplicas timeout-ms command key [arg ...]";

/// What a call waits for: this many replicas of each owner it writes to, for at most this
/// long (0: for ever, as `WAIT 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub replicas: i64,
    pub timeout_ms: i64,
}

impl Wait {
    /// `WAIT numreplicas timeout-ms`, as sent to the owner after the write.
    pub fn command(&self) -> Vec<Vec<u8>> {
        vec![
            b"WAIT".to_vec(),
            self.replicas.to_string().into_bytes(),
            self.timeout_ms.to_string().into_bytes(),
        ]
    }

    /// How long `WAIT` may take beyond the call timeout (`None`: no limit, for timeout 0).
    pub fn extra(&self) -> Option<Duration> {
        (self.timeout_ms > 0).then(|| Duration::from_millis(self.timeout_ms.unsigned_abs()))
    }
}

/// How many replicas of one owner acknowledged a write of the call (`WAIT`'s reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    pub node: String,
    pub address: String,
    pub replicas: i64,
}

/// Where the carried command starts among the call's arguments (its name's index), and what
/// the call waits for: `(1, None)` for `SHARD.CALL command ...`, `(4, Some(..))` for
/// `SHARD.CALL WAIT numreplicas timeout-ms command ...`. `WAIT` itself has no key, so it is
/// never a command SHARD.CALL could route: as the first argument it is this prefix.
pub fn prefix<A: ArgList + ?Sized>(args: &A) -> Result<(usize, Option<Wait>), CmdError> {
    if !args.arg(1).eq_ignore_ascii_case(b"wait") {
        return Ok((1, None));
    }
    if args.count() < 4 {
        return Err(CmdError::err(format!(
            "WAIT needs numreplicas and timeout-ms: {USAGE}"
        )));
    }
    let max = i64::from(i32::MAX);
    let replicas = int_in(args.arg(2), "WAIT numreplicas", 0, max)?;
    let timeout_ms = int_in(args.arg(3), "WAIT timeout-ms", 0, max)?;
    if args.count() < 5 {
        return Err(CmdError::err(format!(
            "WAIT needs a command after numreplicas and timeout-ms: {USAGE}"
        )));
    }
    Ok((
        4,
        Some(Wait {
            replicas,
            timeout_ms,
        }),
    ))
}

/// The call's reply: the command's (merged) reply when it is an error (nothing more to wait
/// for) or when every owner it wrote to had enough replicas acknowledge; else the
/// `NOREPLICAS` error line naming each owner short of them (the lowest count of an owner
/// written more than once).
pub fn verdict(wait: Wait, reply: Resp, acks: &[Acked]) -> Result<Resp, String> {
    if reply.is_error() {
        return Ok(reply);
    }
    let mut short: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for a in acks.iter().filter(|a| a.replicas < wait.replicas) {
        let n = short
            .entry((a.node.as_str(), a.address.as_str()))
            .or_insert(a.replicas);
        *n = (*n).min(a.replicas);
    }
    if short.is_empty() {
        return Ok(reply);
    }
    let counts: Vec<String> = short
        .iter()
        .map(|((node, address), n)| {
            format!(
                "{n} of {} replicas of node {node} ({address})",
                wait.replicas
            )
        })
        .collect();
    Err(format!(
        "NOREPLICAS {} acknowledged the write within {} ms; it stays applied, as after WAIT",
        counts.join(", "),
        wait.timeout_ms
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<(usize, Option<Wait>), String> {
        let args: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        prefix(args.as_slice()).map_err(|e| e.message().to_string())
    }

    #[test]
    fn the_prefix() {
        assert_eq!(parse(&["SHARD.CALL", "SET", "k", "v"]), Ok((1, None)));
        let wait = |replicas, timeout_ms| {
            Some(Wait {
                replicas,
                timeout_ms,
            })
        };
        assert_eq!(
            parse(&["SHARD.CALL", "wait", "1", "0", "SET", "k", "v"]),
            Ok((4, wait(1, 0)))
        );
        assert_eq!(
            parse(&["SHARD.CALL", "WAIT", "0", "2147483647", "GET", "k"]),
            Ok((4, wait(0, 2_147_483_647)))
        );
        let bad = |words: &[&str]| parse(words).unwrap_err();
        assert_eq!(
            bad(&["SHARD.CALL", "WAIT", "1"]),
            format!("ERR WAIT needs numreplicas and timeout-ms: {USAGE}")
        );
        assert_eq!(
            bad(&["SHARD.CALL", "WAIT", "1", "100"]),
            format!("ERR WAIT needs a command after numreplicas and timeout-ms: {USAGE}")
        );
        assert_eq!(
            bad(&["SHARD.CALL", "WAIT", "-1", "100", "SET", "k", "v"]),
            "ERR WAIT numreplicas must be an integer from 0 to 2147483647, got '-1'"
        );
        assert_eq!(
            bad(&["SHARD.CALL", "WAIT", "one", "100", "SET", "k", "v"]),
            "ERR WAIT numreplicas must be an integer from 0 to 2147483647, got 'one'"
        );
        assert_eq!(
            bad(&["SHARD.CALL", "WAIT", "1", "-5", "SET", "k", "v"]),
            "ERR WAIT timeout-ms must be an integer from 0 to 2147483647, got '-5'"
        );
        assert_eq!(
            bad(&["SHARD.CALL", "WAIT", "1", "1.5", "SET", "k", "v"]),
            "ERR WAIT timeout-ms must be an integer from 0 to 2147483647, got '1.5'"
        );
    }

    fn acked(node: &str, replicas: i64) -> Acked {
        Acked {
            node: node.into(),
            address: format!("h:{node}"),
            replicas,
        }
    }

    #[test]
    fn the_verdict() {
        let wait = Wait {
            replicas: 2,
            timeout_ms: 100,
        };
        let ok = Resp::Simple(b"OK".to_vec());
        assert_eq!(
            verdict(wait, ok.clone(), &[acked("a", 2), acked("b", 3)]),
            Ok(ok.clone())
        );
        assert_eq!(
            verdict(wait, ok.clone(), &[acked("a", 2), acked("b", 1)]),
            Err("NOREPLICAS 1 of 2 replicas of node b (h:b) acknowledged the write within 100 ms; it stays applied, as after WAIT".into())
        );
        // Each owner short of them once, with its lowest count.
        assert_eq!(
            verdict(wait, ok.clone(), &[acked("b", 1), acked("a", 0), acked("b", 0), acked("c", 5)]),
            Err("NOREPLICAS 0 of 2 replicas of node a (h:a), 0 of 2 replicas of node b (h:b) acknowledged the write within 100 ms; it stays applied, as after WAIT".into())
        );
        let error = Resp::Error(b"WRONGTYPE x".to_vec());
        assert_eq!(verdict(wait, error.clone(), &[acked("a", 0)]), Ok(error));
        let none = Wait {
            replicas: 0,
            timeout_ms: 0,
        };
        assert_eq!(verdict(none, ok.clone(), &[acked("a", 0)]), Ok(ok));
        assert_eq!(none.extra(), None);
        assert_eq!(wait.extra(), Some(Duration::from_millis(100)));
        assert_eq!(
            wait.command(),
            vec![b"WAIT".to_vec(), b"2".to_vec(), b"100".to_vec()]
        );
    }
}
