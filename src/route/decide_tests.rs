//! SHARD.CALL's decision against a table of cases: each names the keys' owners (`self` is this
//! node; `b<a` a key moving from `a` to `b` in an open resharding) and the decision, written
//! out as text (the errors as the client reads them).

use super::*;
use crate::route::split::splittable;

fn ep(name: &str) -> Endpoint {
    Endpoint {
        name: name.into(),
        host: "h".into(),
        port: 1,
        address: format!("h:{name}"),
        is_self: name == "self",
    }
}

fn placed(spec: &str) -> Placed {
    match spec.split_once('<') {
        Some((current, previous)) => Placed {
            current: ep(current),
            previous: Some(ep(previous)),
        },
        None => Placed {
            current: ep(spec),
            previous: None,
        },
    }
}

/// One case: the command, its kind, its keys, and the settings that differ from the usual
/// (primary reads, no dictionary, a client that may wait, no resharding being cancelled, no
/// `WAIT`).
struct Case {
    command: &'static str,
    kind: CommandKind,
    keys: &'static [&'static str],
    returning: bool,
    fence: bool,
    settled: bool,
    read_from: ReadFrom,
    translated: bool,
    can_wait: bool,
    replicated: bool,
}

const fn case(command: &'static str, kind: CommandKind, keys: &'static [&'static str]) -> Case {
    Case {
        command,
        kind,
        keys,
        returning: false,
        fence: false,
        settled: false,
        read_from: ReadFrom::Primary,
        translated: false,
        can_wait: true,
        replicated: false,
    }
}

impl Case {
    const fn returning(mut self) -> Case {
        self.returning = true;
        self
    }
    const fn fence(mut self) -> Case {
        self.returning = true;
        self.fence = true;
        self
    }
    const fn settled(mut self) -> Case {
        self.settled = true;
        self
    }
    const fn read_from(mut self, mode: ReadFrom) -> Case {
        self.read_from = mode;
        self
    }
    const fn translated(mut self) -> Case {
        self.translated = true;
        self
    }
    const fn in_multi(mut self) -> Case {
        self.can_wait = false;
        self
    }
    const fn replicated(mut self) -> Case {
        self.replicated = true;
        self
    }

    fn decide(&self) -> String {
        let facts = Facts {
            name: self.command,
            kind: self.kind,
            splittable: splittable(self.command.as_bytes()),
            keys: self.keys.iter().map(|k| placed(k)).collect(),
            returning: self.returning,
            fence: self.fence,
            settled: self.settled,
            read_from: self.read_from,
            translated: self.translated,
            can_wait: self.can_wait,
            released: false,
            replicated: self.replicated,
        };
        show(decide(facts))
    }
}

fn at(current: &Endpoint, previous: &Option<Endpoint>) -> String {
    match previous {
        Some(p) => format!("{}<{}", current.name, p.name),
        None => current.name.clone(),
    }
}

fn show(decision: Result<Route, CmdError>) -> String {
    match decision {
        Err(e) => e.message().to_string(),
        Ok(Route::Here) => "here".into(),
        Ok(Route::Gather) => "gather".into(),
        Ok(Route::HereTranslated) => "here, translated".into(),
        Ok(Route::Forward(to)) => format!("forward to {}", to.name),
        Ok(Route::Replica { primary, mode }) => format!("replica of {} {mode:?}", primary.name),
        Ok(Route::Plan {
            current,
            previous,
            translated,
        }) => format!(
            "plan at {}{}",
            at(&current, &previous),
            if translated { ", translated" } else { "" }
        ),
        Ok(Route::Split(s)) => {
            let targets: Vec<String> = s
                .targets
                .iter()
                .map(|t| at(&t.current, &t.previous) + if t.here { " (here)" } else { "" })
                .collect();
            format!(
                "split to [{}] keys {:?}{}",
                targets.join(", "),
                s.target_of_key,
                s.replica.map_or(String::new(), |m| format!(" {m:?}"))
            )
        }
    }
}

use CommandKind::{Delete, Read, Write};
use ReadFrom::{Replica, ReplicaPreferred};

const SCATTERED_MULTI: &str = "ERR the keys of 'rename' live on different nodes (a, b): a command over keys of several owners is gathered as a transaction, which cannot run inside MULTI or a script; give the keys one hash tag to keep them together";
const SCATTERED_WAIT: &str = "ERR the keys of 'rename' live on different nodes (a, b): a command over keys of several owners is gathered as a transaction, which SHARD.CALL WAIT does not wait for; give the keys one hash tag to keep them together";
const MOVING: &str = "ERR the keys of 'rename' are moving between nodes in a resharding: SHARD.CALL runs commands with several keys then only if they split by key (MGET, MSET, DEL, UNLINK, EXISTS, TOUCH)";
const RETURNING: &str =
    "TRYAGAIN a cancelled resharding is bringing this key's keys back to their owner: retry in a moment";
const FENCE: &str = "TRYAGAIN a resharding is starting (its fence): a write of a key about to move waits until every node has the new ring; retry in a moment";

#[test]
fn the_table() {
    let cases: Vec<(&str, Case, &str)> = vec![
        // One owner, no resharding.
        ("a key of this node", case("get", Read, &["self"]), "here"),
        (
            "a key of another node",
            case("get", Read, &["b"]),
            "forward to b",
        ),
        (
            "several keys of one other node",
            case("rename", Write, &["b", "b"]),
            "forward to b",
        ),
        (
            "several keys of this node",
            case("rename", Write, &["self", "self"]),
            "here",
        ),
        (
            "local in MULTI",
            case("set", Write, &["self"]).in_multi(),
            "here",
        ),
        (
            "elsewhere in MULTI",
            case("get", Read, &["b"]).in_multi(),
            "ERR SHARD.CALL cannot wait for node b (h:b) inside MULTI or a script",
        ),
        // Replica reads.
        (
            "a read under replica-preferred, even of a local key",
            case("get", Read, &["self"]).read_from(ReplicaPreferred),
            "replica of self ReplicaPreferred",
        ),
        (
            "a read under replica",
            case("get", Read, &["b"]).read_from(Replica),
            "replica of b Replica",
        ),
        (
            "a write ignores read-from",
            case("set", Write, &["self"]).read_from(Replica),
            "here",
        ),
        (
            "a replica read in MULTI",
            case("get", Read, &["self"]).read_from(Replica).in_multi(),
            "ERR SHARD.CALL cannot wait for node self (h:self) inside MULTI or a script",
        ),
        (
            "a moving key is read from the primaries",
            case("get", Read, &["b<a"]).read_from(Replica),
            "plan at b<a",
        ),
        // A resharding moves the key.
        (
            "a read of a moving key",
            case("get", Read, &["b<a"]),
            "plan at b<a",
        ),
        (
            "a write of a moving key",
            case("incr", Write, &["self<a"]),
            "plan at self<a",
        ),
        (
            "a delete of a moving key",
            case("del", Delete, &["b<a"]),
            "plan at b<a",
        ),
        (
            "a moving key in MULTI",
            case("get", Read, &["self<a"]).in_multi(),
            "ERR SHARD.CALL cannot wait for node self (h:self) inside MULTI or a script",
        ),
        // A cancelled resharding brings keys back.
        (
            "a write while returning",
            case("set", Write, &["b<a"]).returning(),
            RETURNING,
        ),
        (
            "a delete while returning",
            case("del", Delete, &["b<a"]).returning(),
            RETURNING,
        ),
        (
            "a write during a fleet operation's fence names the fence",
            case("set", Write, &["b<a"]).fence(),
            FENCE,
        ),
        (
            "a delete during the fence names it too",
            case("del", Delete, &["b<a"]).fence(),
            FENCE,
        ),
        (
            "a read while returning prefers the previous owner",
            case("get", Read, &["b<a"]).returning(),
            "plan at a<b",
        ),
        (
            "a write of a key that does not move while returning",
            case("set", Write, &["b"]).returning(),
            "forward to b",
        ),
        // The copies are done (settled): reads at the new owner only, as if nothing moved;
        // writes and deletes keep the previous owner, to remove the key there too.
        (
            "a settled read of a moving key",
            case("get", Read, &["b<a"]).settled(),
            "forward to b",
        ),
        (
            "a settled read of a key moving here",
            case("get", Read, &["self<a"]).settled(),
            "here",
        ),
        (
            "a settled read goes to replicas again",
            case("get", Read, &["b<a"]).settled().read_from(Replica),
            "replica of b Replica",
        ),
        (
            "settled reads of keys moving together",
            case("sunion", Read, &["b<a", "b<a"]).settled(),
            "forward to b",
        ),
        (
            "a settled MGET splits by owner",
            case("mget", Read, &["b<a", "b", "self<a"]).settled(),
            "split to [b, self (here)] keys [0, 0, 1]",
        ),
        (
            "a settled write",
            case("incr", Write, &["b<a"]).settled(),
            "plan at b<a",
        ),
        (
            "a settled delete",
            case("del", Delete, &["self<a"]).settled(),
            "plan at self<a",
        ),
        // Split commands.
        (
            "MGET over two owners, this node's part here",
            case("mget", Read, &["b", "self", "b"]),
            "split to [b, self (here)] keys [0, 1, 0]",
        ),
        (
            "MSET's local part goes over a connection",
            case("mset", Write, &["b", "self"]),
            "split to [b, self] keys [0, 1]",
        ),
        (
            "MGET at replicas",
            case("mget", Read, &["b", "self"]).read_from(ReplicaPreferred),
            "split to [b, self] keys [0, 1] ReplicaPreferred",
        ),
        (
            "moving keys split one per key",
            case("mget", Read, &["b<a", "b", "b"]),
            "split to [b<a, b, b] keys [0, 1, 2]",
        ),
        (
            "moving keys of this node split one per key",
            case("del", Delete, &["self<a", "self"]),
            "split to [self<a, self (here)] keys [0, 1]",
        ),
        (
            "MGET of one moving key is a plan",
            case("mget", Read, &["b<a"]),
            "plan at b<a",
        ),
        (
            "DEL of keys of one other node",
            case("del", Delete, &["b", "b"]),
            "forward to b",
        ),
        (
            "a split in MULTI",
            case("mget", Read, &["b", "self"]).in_multi(),
            "ERR SHARD.CALL cannot wait for node b (h:b) inside MULTI or a script",
        ),
        // Gathered (txn::coord::gather).
        (
            "keys on two nodes",
            case("rename", Write, &["b", "a"]),
            "gather",
        ),
        (
            "keys on this node and another",
            case("rename", Write, &["self", "a"]),
            "gather",
        ),
        // Refused.
        (
            "keys on two nodes in MULTI",
            case("rename", Write, &["b", "a"]).in_multi(),
            SCATTERED_MULTI,
        ),
        (
            "keys on two nodes under WAIT",
            case("rename", Write, &["b", "a"]).replicated(),
            SCATTERED_WAIT,
        ),
        (
            "keys on two nodes, one moving",
            case("rename", Write, &["b<c", "a"]),
            MOVING,
        ),
        (
            "keys moving together",
            case("rename", Write, &["b<a", "b"]),
            MOVING,
        ),
        // The field dictionary.
        (
            "a translated command of this node",
            case("hget", Read, &["self"]).translated(),
            "here, translated",
        ),
        (
            "a translated command elsewhere ignores read-from",
            case("hget", Read, &["b"]).translated().read_from(Replica),
            "plan at b, translated",
        ),
        (
            "a translated command of a moving key",
            case("hset", Write, &["self<a"]).translated(),
            "plan at self<a, translated",
        ),
        (
            "a translated command elsewhere in MULTI",
            case("hget", Read, &["b"]).translated().in_multi(),
            "ERR SHARD.CALL cannot wait for node b (h:b) inside MULTI or a script",
        ),
        (
            "a translated write while returning",
            case("hset", Write, &["b<a"]).translated().returning(),
            RETURNING,
        ),
        (
            "no key",
            case("get", Read, &[]),
            "ERR internal error: a routed call without a key",
        ),
        // SHARD.CALL WAIT: a write and its WAIT at the owner, over a connection.
        (
            "a waited write of this node goes over a connection to itself",
            case("set", Write, &["self"]).replicated(),
            "plan at self",
        ),
        (
            "a waited write of another node",
            case("set", Write, &["b"]).replicated(),
            "plan at b",
        ),
        (
            "a waited command with several keys of one node runs whole",
            case("mset", Write, &["b", "b"]).replicated(),
            "plan at b",
        ),
        (
            "a waited split: this node's part over a connection too",
            case("del", Delete, &["b", "self", "b"]).replicated(),
            "split to [b, self] keys [0, 1, 0]",
        ),
        (
            "a waited write of a moving key",
            case("incr", Write, &["self<a"]).replicated(),
            "plan at self<a",
        ),
        (
            "a waited translated write of this node",
            case("hset", Write, &["self"]).translated().replicated(),
            "plan at self, translated",
        ),
        (
            "a waited write in MULTI, even of this node",
            case("set", Write, &["self"]).replicated().in_multi(),
            "ERR SHARD.CALL cannot wait for node self (h:self) inside MULTI or a script",
        ),
        (
            "a waited write while returning",
            case("set", Write, &["b<a"]).replicated().returning(),
            RETURNING,
        ),
    ];
    let mut wrong = Vec::new();
    for (what, case, expected) in &cases {
        let got = case.decide();
        if got != *expected {
            wrong.push(format!("{what}:\n  expected {expected}\n  got      {got}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn blocking_commands_are_refused() {
    let args = |words: &[&'static str]| -> Vec<&'static [u8]> {
        words.iter().map(|w| w.as_bytes()).collect()
    };
    let refused = |blocking, words: &[&'static str]| {
        refuse_blocking(blocking, words[1], args(words).as_slice(), 1)
            .err()
            .map(|e| e.message().to_string())
    };
    assert_eq!(
        refused(true, &["SHARD.CALL", "blpop", "k", "0"]).as_deref(),
        Some("ERR 'blpop' can block: SHARD.CALL routes a blocking command on its own (not with WAIT, nor inside MULTI or SHARD.MULTI)")
    );
    assert_eq!(
        refused(true, &["SHARD.CALL", "XREAD", "STREAMS", "s", "0"]),
        None
    );
    assert!(refused(
        true,
        &["SHARD.CALL", "xreadgroup", "GROUP", "g", "c", "block", "1"]
    )
    .is_some());
    assert_eq!(refused(false, &["SHARD.CALL", "get", "k"]), None);
    // Behind SHARD.CALL WAIT's prefix.
    let words = [
        "SHARD.CALL",
        "WAIT",
        "1",
        "0",
        "XREAD",
        "BLOCK",
        "0",
        "STREAMS",
        "s",
        "$",
    ];
    assert!(refuse_blocking(true, "xread", args(&words).as_slice(), 4).is_err());
    let words = ["SHARD.CALL", "WAIT", "1", "0", "XREAD", "STREAMS", "s", "0"];
    assert!(refuse_blocking(true, "xread", args(&words).as_slice(), 4).is_ok());
}
