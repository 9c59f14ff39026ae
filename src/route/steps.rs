//! Which node runs a routed command, as Tarantool's shard module did: the current owner; while
//! a resharding is open, reads fall back to the previous owner when the key is not at the
//! current one, a write first copies the key from the previous owner, and a delete runs at both.
//! Under `SHARD.CALL WAIT` each write of the plan (the command at the current owner, a delete at
//! the previous one) is waited for at its node (`Step::run_acked`), and the counts come back
//! with the reply (`route::wait` decides the call's reply from them).
//! Once the resharding is settled (its copies are done: COMMIT's first step), the previous
//! owner is never read or copied from; a delete, or a write that removes the key, still
//! removes it there too, for the nodes that have not settled yet.

use std::future::Future;

use crate::net::endpoint::{Endpoint, StepError};
use crate::net::resp::Resp;
use crate::route::wait::{Acked, Wait};

/// How a command is routed during a resharding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandKind {
    /// Read-only by its flags: current owner, then previous.
    Read,
    /// Any other command: copy from the previous owner if needed, then current owner.
    Write,
    /// DEL and UNLINK: at both owners.
    Delete,
}

impl CommandKind {
    /// The kind of a command from its name and whether its flags say `readonly`.
    pub fn of(name: &[u8], readonly: bool) -> CommandKind {
        if name.eq_ignore_ascii_case(b"del") || name.eq_ignore_ascii_case(b"unlink") {
            CommandKind::Delete
        } else if readonly {
            CommandKind::Read
        } else {
            CommandKind::Write
        }
    }
}

/// A routed call: the command, its key, where it goes.
#[derive(Debug, Clone)]
pub struct Plan {
    pub args: Vec<Vec<u8>>,
    pub key: Vec<u8>,
    pub kind: CommandKind,
    pub current: Endpoint,
    /// The previous owner, when a resharding is open and it differs from the current one.
    pub previous: Option<Endpoint>,
    /// The replicas each write must reach (`SHARD.CALL WAIT`).
    pub wait: Option<Wait>,
    /// The resharding is settled (`RingState::settled`): the key is at the current owner if
    /// anywhere; the previous owner only loses it when the call removes it.
    pub settled: bool,
}

/// What runs the steps: the glue sends them over its connections; tests use a fake. Steps are
/// futures, so that the glue can send a step, go on serving, and resume the plan when the
/// reply arrives; several plans (the parts of a split command) run at once.
pub trait Step {
    /// Runs a command at `at` and returns its reply (an error reply is a reply, not an Err).
    fn run(
        &self,
        at: &Endpoint,
        args: Vec<Vec<u8>>,
    ) -> impl Future<Output = Result<Resp, StepError>>;
    /// Runs a write at `at` and then, on the same connection, `WAIT` for `wait`: its reply,
    /// and how many of `at`'s replicas acknowledged it (`None` when the reply is an error:
    /// nothing was written to wait for).
    fn run_acked(
        &self,
        at: &Endpoint,
        args: Vec<Vec<u8>>,
        wait: Wait,
    ) -> impl Future<Output = Result<(Resp, Option<i64>), StepError>>;
    /// Copies `key` from `from` to `to`, leaving it at `from` and not replacing it at `to`.
    fn copy(
        &self,
        from: &Endpoint,
        to: &Endpoint,
        key: &[u8],
    ) -> impl Future<Output = Result<(), StepError>>;

    fn exists(&self, at: &Endpoint, key: &[u8]) -> impl Future<Output = Result<bool, StepError>> {
        let request = vec![b"EXISTS".to_vec(), key.to_vec()];
        async move {
            match self.run(at, request).await? {
                Resp::Int(n) => Ok(n > 0),
                other => Err(StepError::new(at, format!("EXISTS replied {other:?}"))),
            }
        }
    }
}

/// The reply and what it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    pub reply: Resp,
    /// The previous owner answered a read.
    pub fallback: bool,
    /// The key was copied from the previous owner before a write.
    pub copied: bool,
    /// The replicas that acknowledged each write waited for (`SHARD.CALL WAIT`).
    pub acks: Vec<Acked>,
}

/// A write of the plan at `at`: waited for when the plan waits. Its reply, and its count.
async fn write<S: Step>(
    steps: &S,
    at: &Endpoint,
    args: Vec<Vec<u8>>,
    wait: Option<Wait>,
) -> Result<(Resp, Option<Acked>), StepError> {
    let Some(wait) = wait else {
        return Ok((steps.run(at, args).await?, None));
    };
    let (reply, replicas) = steps.run_acked(at, args, wait).await?;
    let acked = replicas.map(|replicas| Acked {
        node: at.name.clone(),
        address: at.address.clone(),
        replicas,
    });
    Ok((reply, acked))
}

/// Runs a plan.
pub async fn execute<S: Step>(plan: &Plan, steps: &S) -> Result<Routed, StepError> {
    let mut routed = Routed {
        reply: Resp::Null,
        fallback: false,
        copied: false,
        acks: Vec::new(),
    };
    // A read writes nothing to wait for.
    let wait = plan.wait.filter(|_| plan.kind != CommandKind::Read);
    let Some(previous) = &plan.previous else {
        let (reply, acked) = write(steps, &plan.current, plan.args.clone(), wait).await?;
        routed.reply = reply;
        routed.acks.extend(acked);
        return Ok(routed);
    };
    match plan.kind {
        CommandKind::Read => {
            if plan.settled || steps.exists(&plan.current, &plan.key).await? {
                routed.reply = steps.run(&plan.current, plan.args.clone()).await?;
            } else {
                routed.fallback = true;
                routed.reply = steps.run(previous, plan.args.clone()).await?;
            }
        }
        CommandKind::Write => {
            let at_previous = !plan.settled
                && !steps.exists(&plan.current, &plan.key).await?
                && steps.exists(previous, &plan.key).await?;
            if at_previous {
                steps.copy(previous, &plan.current, &plan.key).await?;
                routed.copied = true;
            }
            let (reply, acked) = write(steps, &plan.current, plan.args.clone(), wait).await?;
            routed.reply = reply;
            routed.acks.extend(acked);
            // A write that removed the key (GETDEL, EXPIRE 0, popping the last element) must
            // not leave the previous owner's copy for reads to fall back to.
            if !routed.reply.is_error() && !steps.exists(&plan.current, &plan.key).await? {
                let delete = vec![b"DEL".to_vec(), plan.key.clone()];
                let (_, acked) = write(steps, previous, delete, wait).await?;
                routed.acks.extend(acked);
            }
        }
        CommandKind::Delete => {
            // Both at once: neither depends on the other.
            let (here, there) = futures_util::future::join(
                write(steps, &plan.current, plan.args.clone(), wait),
                write(steps, previous, plan.args.clone(), wait),
            )
            .await;
            let ((here, acked_here), (there, acked_there)) = (here?, there?);
            routed
                .acks
                .extend(acked_here.into_iter().chain(acked_there));
            routed.reply = match (here.as_int(), there.as_int()) {
                // One key: deleted if it was deleted at either owner.
                (Some(a), Some(b)) => Resp::Int(a.max(b)),
                _ if here.is_error() => here,
                _ => there,
            };
        }
    }
    Ok(routed)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::future::{ready, Future};
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// Runs a future whose steps are all ready at once (the fake fleet answers in place).
    fn block_on<F: Future>(f: F) -> F::Output {
        let mut f = pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(out) => out,
            Poll::Pending => panic!("a fake step never waits"),
        }
    }

    fn execute(plan: &Plan, fleet: &mut Fleet) -> Result<Routed, StepError> {
        let shared = Shared(RefCell::new(std::mem::take(fleet)));
        let out = block_on(crate::route::execute(plan, &shared));
        *fleet = shared.0.into_inner();
        out
    }

    struct Shared(RefCell<Fleet>);

    impl Step for Shared {
        fn run(
            &self,
            at: &Endpoint,
            args: Vec<Vec<u8>>,
        ) -> impl Future<Output = Result<Resp, StepError>> {
            ready(self.0.borrow_mut().run(at, &args))
        }

        fn run_acked(
            &self,
            at: &Endpoint,
            args: Vec<Vec<u8>>,
            wait: Wait,
        ) -> impl Future<Output = Result<(Resp, Option<i64>), StepError>> {
            let mut fleet = self.0.borrow_mut();
            let out = fleet.run(at, &args).map(|reply| {
                fleet
                    .log
                    .push(format!("{} WAIT {}", at.name, wait.replicas));
                let acked = fleet.replicas.get(&at.name).copied().unwrap_or(0);
                let acked = (!reply.is_error()).then_some(acked);
                (reply, acked)
            });
            ready(out)
        }

        fn copy(
            &self,
            from: &Endpoint,
            to: &Endpoint,
            key: &[u8],
        ) -> impl Future<Output = Result<(), StepError>> {
            ready(self.0.borrow_mut().copy(from, to, key))
        }
    }

    /// Two in-memory nodes holding string keys.
    #[derive(Default)]
    struct Fleet {
        data: HashMap<String, HashMap<Vec<u8>, Vec<u8>>>,
        log: Vec<String>,
        down: Option<String>,
        /// Each node's replicas that acknowledge a write.
        replicas: HashMap<String, i64>,
    }

    impl Fleet {
        fn run(&mut self, at: &Endpoint, args: &[Vec<u8>]) -> Result<Resp, StepError> {
            if self.down.as_deref() == Some(&at.name) {
                return Err(StepError::new(at, "connection refused"));
            }
            let cmd = String::from_utf8_lossy(&args[0]).to_uppercase();
            self.log.push(format!("{} {}", at.name, cmd));
            let node = self.data.entry(at.name.clone()).or_default();
            Ok(match cmd.as_str() {
                "EXISTS" => Resp::Int(i64::from(node.contains_key(&args[1]))),
                "GET" => node.get(&args[1]).cloned().map_or(Resp::Null, Resp::Bulk),
                "SET" => {
                    node.insert(args[1].clone(), args[2].clone());
                    Resp::Simple(b"OK".to_vec())
                }
                "INCR" => {
                    let v = node
                        .get(&args[1])
                        .map_or(0, |v| String::from_utf8_lossy(v).parse::<i64>().unwrap())
                        + 1;
                    node.insert(args[1].clone(), v.to_string().into_bytes());
                    Resp::Int(v)
                }
                "DEL" => Resp::Int(i64::from(node.remove(&args[1]).is_some())),
                "GETDEL" => node.remove(&args[1]).map_or(Resp::Null, Resp::Bulk),
                _ => Resp::Error(b"ERR unknown".to_vec()),
            })
        }

        fn copy(&mut self, from: &Endpoint, to: &Endpoint, key: &[u8]) -> Result<(), StepError> {
            self.log.push(format!("copy {} {}", from.name, to.name));
            let value = self.data[&from.name][key].clone();
            self.data
                .entry(to.name.clone())
                .or_default()
                .entry(key.to_vec())
                .or_insert(value);
            Ok(())
        }
    }

    fn ep(name: &str) -> Endpoint {
        Endpoint {
            name: name.into(),
            host: "h".into(),
            port: 1,
            address: format!("h:{name}"),
            is_self: false,
        }
    }

    fn plan(kind: CommandKind, args: &[&str], previous: bool) -> Plan {
        Plan {
            args: args.iter().map(|a| a.as_bytes().to_vec()).collect(),
            key: args[1].as_bytes().to_vec(),
            kind,
            current: ep("new"),
            previous: previous.then(|| ep("old")),
            wait: None,
            settled: false,
        }
    }

    fn waiting(mut plan: Plan) -> Plan {
        plan.wait = Some(Wait {
            replicas: 1,
            timeout_ms: 10,
        });
        plan
    }

    fn acks(routed: &Routed) -> Vec<(String, i64)> {
        routed
            .acks
            .iter()
            .map(|a| (a.node.clone(), a.replicas))
            .collect()
    }

    #[test]
    fn a_waiting_write_is_waited_for_where_it_runs() {
        let mut f = fleet_with_old_key();
        f.replicas.insert("new".into(), 1);
        let waited = waiting(plan(CommandKind::Write, &["SET", "k", "v"], false));
        let r = execute(&waited, &mut f).unwrap();
        assert_eq!(r.reply, Resp::Simple(b"OK".to_vec()));
        assert_eq!(acks(&r), [("new".to_string(), 1)]);
        assert_eq!(f.log, ["new SET", "new WAIT 1"]);
        // An error reply: nothing to wait for.
        let waited = waiting(plan(CommandKind::Write, &["BOGUS", "k"], false));
        let r = execute(&waited, &mut f).unwrap();
        assert!(r.reply.is_error() && r.acks.is_empty());
        // A read waits for nothing.
        f.log.clear();
        let waited = waiting(plan(CommandKind::Read, &["GET", "k"], true));
        let r = execute(&waited, &mut f).unwrap();
        assert!(r.acks.is_empty());
        assert_eq!(f.log, ["new EXISTS", "new GET"]);
    }

    #[test]
    fn a_waiting_plan_waits_for_each_of_its_writes() {
        let mut f = fleet_with_old_key();
        f.replicas.insert("new".into(), 1);
        let waited = waiting(plan(CommandKind::Write, &["GETDEL", "k"], true));
        let r = execute(&waited, &mut f).unwrap();
        assert_eq!(r.reply, Resp::Bulk(b"41".to_vec()));
        assert_eq!(
            acks(&r),
            [("new".to_string(), 1), ("old".to_string(), 0)],
            "the write, then the delete of the previous owner's copy"
        );
        let mut f = fleet_with_old_key();
        let waited = waiting(plan(CommandKind::Delete, &["DEL", "k"], true));
        let r = execute(&waited, &mut f).unwrap();
        assert_eq!(r.reply, Resp::Int(1));
        assert_eq!(acks(&r), [("new".to_string(), 0), ("old".to_string(), 0)]);
    }

    fn fleet_with_old_key() -> Fleet {
        let mut f = Fleet::default();
        f.data
            .entry("old".into())
            .or_default()
            .insert(b"k".to_vec(), b"41".to_vec());
        f
    }

    #[test]
    fn without_resharding_runs_at_the_owner_only() {
        let mut f = fleet_with_old_key();
        let r = execute(&plan(CommandKind::Read, &["GET", "k"], false), &mut f).unwrap();
        assert_eq!((r.reply, r.fallback), (Resp::Null, false));
        assert_eq!(f.log, ["new GET"]);
    }

    #[test]
    fn read_falls_back_to_the_previous_owner() {
        let mut f = fleet_with_old_key();
        let r = execute(&plan(CommandKind::Read, &["GET", "k"], true), &mut f).unwrap();
        assert_eq!((r.reply, r.fallback), (Resp::Bulk(b"41".to_vec()), true));
        f.data
            .get_mut("new")
            .unwrap()
            .insert(b"k".to_vec(), b"new".to_vec());
        let r = execute(&plan(CommandKind::Read, &["GET", "k"], true), &mut f).unwrap();
        assert_eq!((r.reply, r.fallback), (Resp::Bulk(b"new".to_vec()), false));
    }

    #[test]
    fn write_copies_first_then_continues_from_the_old_value() {
        let mut f = fleet_with_old_key();
        let r = execute(&plan(CommandKind::Write, &["INCR", "k"], true), &mut f).unwrap();
        assert_eq!((r.reply, r.copied), (Resp::Int(42), true));
        let r = execute(&plan(CommandKind::Write, &["INCR", "k"], true), &mut f).unwrap();
        assert_eq!((r.reply, r.copied), (Resp::Int(43), false));
        assert_eq!(
            f.data["old"][&b"k"[..]],
            b"41",
            "the previous owner keeps its copy until cleanup"
        );
    }

    #[test]
    fn a_write_that_removes_the_key_removes_the_previous_copy() {
        let mut f = fleet_with_old_key();
        let r = execute(&plan(CommandKind::Write, &["GETDEL", "k"], true), &mut f).unwrap();
        assert_eq!(r.reply, Resp::Bulk(b"41".to_vec()));
        assert!(f.data["old"].is_empty() && f.data["new"].is_empty());
        let r = execute(&plan(CommandKind::Read, &["GET", "k"], true), &mut f).unwrap();
        assert_eq!(r.reply, Resp::Null);
    }

    #[test]
    fn delete_runs_at_both() {
        let mut f = fleet_with_old_key();
        let r = execute(&plan(CommandKind::Delete, &["DEL", "k"], true), &mut f).unwrap();
        assert_eq!(r.reply, Resp::Int(1));
        assert!(f.data["old"].is_empty());
        let r = execute(&plan(CommandKind::Delete, &["DEL", "k"], true), &mut f).unwrap();
        assert_eq!(r.reply, Resp::Int(0));
    }

    #[test]
    fn settled_never_reads_or_copies_from_the_previous_owner_but_deletes_there() {
        // The previous owner's copy is one a node that committed deleted at the new owner.
        let settled = |kind, args: &[&str]| Plan {
            settled: true,
            ..plan(kind, args, true)
        };
        let mut f = fleet_with_old_key();
        let r = execute(&settled(CommandKind::Read, &["GET", "k"]), &mut f).unwrap();
        assert_eq!((r.reply, r.fallback), (Resp::Null, false));
        let r = execute(&settled(CommandKind::Write, &["INCR", "k"]), &mut f).unwrap();
        assert_eq!((r.reply, r.copied), (Resp::Int(1), false));
        assert_eq!(f.data["old"][&b"k"[..]], b"41", "left to the cleanup");
        // A write that removes the key, and a delete, still reach the previous owner.
        let r = execute(&settled(CommandKind::Write, &["GETDEL", "k"]), &mut f).unwrap();
        assert_eq!(r.reply, Resp::Bulk(b"1".to_vec()));
        assert!(f.data["old"].is_empty() && f.data["new"].is_empty());
        let mut f = fleet_with_old_key();
        let r = execute(&settled(CommandKind::Delete, &["DEL", "k"]), &mut f).unwrap();
        assert_eq!(r.reply, Resp::Int(1));
        assert!(f.data["old"].is_empty());
    }

    #[test]
    fn a_down_node_is_named_in_the_error() {
        let mut f = fleet_with_old_key();
        f.down = Some("new".into());
        let err = execute(&plan(CommandKind::Read, &["GET", "k"], false), &mut f).unwrap_err();
        assert_eq!(err.to_string(), "node new (h:new): connection refused");
    }

    #[test]
    fn kinds() {
        assert_eq!(CommandKind::of(b"UNLINK", false), CommandKind::Delete);
        assert_eq!(CommandKind::of(b"get", true), CommandKind::Read);
        assert_eq!(CommandKind::of(b"set", false), CommandKind::Write);
    }
}
