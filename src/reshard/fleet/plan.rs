//! A fleet operation's plan (`SHARD.RESHARD START`), pure: the old and the new ring, the phase
//! the fleet is in, each node's part and progress; what each phase asks of which node; START's
//! checks of the nodes' answers; and the plan's byte form, which the coordinator keeps in its
//! RDB and replicates (`SHARD.RESHARD PLAN`) so that a restart or a failover resumes it.
//!
//! The phases, each made of idempotent steps so that one repeated after a crash is harmless:
//! - forward: `fence` (every node gets the old ring as current and the new one as previous,
//!   *returning*: routed writes of the keys that will move are refused for a moment, until no
//!   call routed by the old ring alone is still in flight anywhere, so that no write can reach an
//!   old owner once a new owner may have copied the key), `begin` (every node gets the new ring
//!   as current and the old one as previous),
//!   `copy` (COPY on every node of the old ring), `commit` (every node: the new ring alone),
//!   `cleanup` (CLEANUP on the new ring's nodes, `CLEANUP LEFT` on the nodes that left), `done`;
//! - cancel, before `commit`: `cancel-stop` (the copies stop), `cancel-return` (every node gets
//!   the old ring as current and the new one as previous, *returning*: routed writes of moving
//!   keys are refused while the new owners copy their versions back with REPLACE),
//!   `cancel-revert` (every node: the old ring alone), `cancel-cleanup` (CLEANUP on the old
//!   ring's nodes, `CLEANUP LEFT` on the nodes that were joining), `cancelled`.

use std::fmt;

use crate::persist::Reader;
use crate::ring::RingSpec;
use crate::route::Resp;

/// How many times a node's step is tried before the coordinator stops and waits for RESUME.
pub const MAX_ATTEMPTS: u32 = 6;

/// Where a fleet operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Fence,
    Begin,
    Copy,
    Commit,
    Cleanup,
    Done,
    CancelStop,
    CancelReturn,
    CancelRevert,
    CancelCleanup,
    Cancelled,
}

const PHASES: [Phase; 11] = [
    Phase::Fence,
    Phase::Begin,
    Phase::Copy,
    Phase::Commit,
    Phase::Cleanup,
    Phase::Done,
    Phase::CancelStop,
    Phase::CancelReturn,
    Phase::CancelRevert,
    Phase::CancelCleanup,
    Phase::Cancelled,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Fence => "fence",
            Phase::Begin => "begin",
            Phase::Copy => "copy",
            Phase::Commit => "commit",
            Phase::Cleanup => "cleanup",
            Phase::Done => "done",
            Phase::CancelStop => "cancel-stop",
            Phase::CancelReturn => "cancel-return",
            Phase::CancelRevert => "cancel-revert",
            Phase::CancelCleanup => "cancel-cleanup",
            Phase::Cancelled => "cancelled",
        }
    }

    fn code(self) -> u8 {
        PHASES.iter().position(|p| *p == self).unwrap_or(0) as u8
    }

    fn from_code(code: u8) -> Option<Phase> {
        PHASES.get(usize::from(code)).copied()
    }

    /// The operation is over (nothing more to drive).
    pub fn finished(self) -> bool {
        matches!(self, Phase::Done | Phase::Cancelled)
    }

    /// CANCEL may still return the fleet to the old ring.
    pub fn cancellable(self) -> bool {
        matches!(self, Phase::Fence | Phase::Begin | Phase::Copy)
    }

    /// After this phase's rings are installed, wait until no node has a routed call in flight
    /// that was routed by the rings before.
    pub fn waits_for_calls(self) -> bool {
        matches!(self, Phase::Fence | Phase::CancelReturn)
    }

    /// The phase after this one.
    pub fn next(self) -> Phase {
        match self {
            Phase::Fence => Phase::Begin,
            Phase::Begin => Phase::Copy,
            Phase::Copy => Phase::Commit,
            Phase::Commit => Phase::Cleanup,
            Phase::Cleanup | Phase::Done => Phase::Done,
            Phase::CancelStop => Phase::CancelReturn,
            Phase::CancelReturn => Phase::CancelRevert,
            Phase::CancelRevert => Phase::CancelCleanup,
            Phase::CancelCleanup | Phase::Cancelled => Phase::Cancelled,
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which rings name a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Only the old ring: the node leaves.
    Old,
    /// Only the new ring: the node joins.
    New,
    Both,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Old => "old",
            Role::New => "new",
            Role::Both => "both",
        }
    }

    fn code(self) -> u8 {
        match self {
            Role::Old => 0,
            Role::New => 1,
            Role::Both => 2,
        }
    }

    fn from_code(code: u8) -> Option<Role> {
        [Role::Old, Role::New, Role::Both]
            .get(usize::from(code))
            .copied()
    }

    pub fn in_old(self) -> bool {
        self != Role::New
    }

    pub fn in_new(self) -> bool {
        self != Role::Old
    }
}

/// One node's part in the operation and what the coordinator last saw of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeProgress {
    pub name: String,
    pub address: String,
    pub role: Role,
    /// The current phase's step has finished at this node.
    pub done: bool,
    /// Tries of the current phase's step.
    pub attempts: u32,
    /// The node's job state as last seen (`copying`, `done`, ...), or `unreachable`.
    pub state: String,
    pub copied: u64,
    pub percent: u64,
    pub last_error: String,
}

/// What a job step asks a node to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// `SHARD.RESHARD COPY` (with REPLACE: a cancel's copy back).
    Copy { replace: bool },
    /// `SHARD.RESHARD CLEANUP`, with LEFT on a node outside the ring kept.
    Cleanup { left: bool },
    /// `SHARD.RESHARD STOP`: the copy stops.
    Stop,
}

impl Work {
    /// The job kind `SHARD.RING STATE` reports while it runs.
    pub fn job_name(self) -> &'static str {
        match self {
            Work::Copy { .. } | Work::Stop => "copy",
            Work::Cleanup { .. } => "cleanup",
        }
    }

    /// The command that starts it.
    pub fn command(self, max_rate: u64) -> Vec<Vec<u8>> {
        let mut args = vec![b"SHARD.RESHARD".to_vec()];
        match self {
            Work::Copy { replace } => {
                args.push(b"COPY".to_vec());
                if replace {
                    args.push(b"REPLACE".to_vec());
                }
                if max_rate > 0 {
                    args.push(b"MAXRATE".to_vec());
                    args.push(max_rate.to_string().into_bytes());
                }
            }
            Work::Cleanup { left } => {
                args.push(b"CLEANUP".to_vec());
                if left {
                    args.push(b"LEFT".to_vec());
                }
            }
            Work::Stop => args.push(b"STOP".to_vec()),
        }
        args
    }
}

/// The rings a phase installs on every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install<'a> {
    pub current: &'a RingSpec,
    pub previous: Option<&'a RingSpec>,
    pub returning: bool,
}

impl Install<'_> {
    /// `SHARD.RING INSTALL current [previous] [RETURNING]`.
    pub fn command(&self) -> Vec<Vec<u8>> {
        let mut args = vec![
            b"SHARD.RING".to_vec(),
            b"INSTALL".to_vec(),
            self.current.canonical().into_bytes(),
        ];
        if let Some(previous) = self.previous {
            args.push(previous.canonical().into_bytes());
        }
        if self.returning {
            args.push(b"RETURNING".to_vec());
        }
        args
    }
}

/// The coordinator's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetPlan {
    pub old: RingSpec,
    pub new: RingSpec,
    pub max_rate: u64,
    pub phase: Phase,
    /// CANCEL was asked for; the coordinator turns to `cancel-stop` at its next step.
    pub cancel: bool,
    /// The last problem the coordinator met ("" when none), shown by STATUS.
    pub error: String,
    /// The old ring's nodes in order, then the new ring's joining nodes.
    pub nodes: Vec<NodeProgress>,
}

impl FleetPlan {
    /// A plan to go from `old` to `new`, at its first phase.
    pub fn new(old: RingSpec, new: RingSpec, max_rate: u64) -> FleetPlan {
        let mut nodes: Vec<NodeProgress> = Vec::new();
        for n in &old.nodes {
            let role = if new.node_index(&n.name).is_some() {
                Role::Both
            } else {
                Role::Old
            };
            nodes.push(progress(&n.name, &n.address, role));
        }
        for n in &new.nodes {
            if old.node_index(&n.name).is_none() {
                nodes.push(progress(&n.name, &n.address, Role::New));
            }
        }
        FleetPlan {
            old,
            new,
            max_rate,
            phase: Phase::Fence,
            cancel: false,
            error: String::new(),
            nodes,
        }
    }

    /// Moves to `phase`: every node's step is to do again.
    pub fn enter(&mut self, phase: Phase) {
        self.phase = phase;
        self.error.clear();
        self.reset_steps();
    }

    /// Every node's step is to do again (a phase that installs rings, then runs jobs).
    pub fn reset_steps(&mut self) {
        for n in &mut self.nodes {
            n.done = false;
            n.attempts = 0;
            n.last_error.clear();
        }
    }

    /// The rings the current phase installs on every node, if it is an installing phase.
    pub fn install(&self) -> Option<Install<'_>> {
        let (current, previous, returning) = match self.phase {
            Phase::Fence => (&self.old, Some(&self.new), true),
            Phase::Begin => (&self.new, Some(&self.old), false),
            Phase::Commit => (&self.new, None, false),
            Phase::CancelReturn => (&self.old, Some(&self.new), true),
            Phase::CancelRevert => (&self.old, None, false),
            _ => return None,
        };
        Some(Install {
            current,
            previous,
            returning,
        })
    }

    /// What node `i` runs in the current phase's job step, if anything.
    pub fn work(&self, i: usize) -> Option<Work> {
        let role = self.nodes.get(i)?.role;
        match self.phase {
            Phase::Copy => role.in_old().then_some(Work::Copy { replace: false }),
            Phase::Cleanup => Some(Work::Cleanup {
                left: !role.in_new(),
            }),
            Phase::CancelStop => role.in_old().then_some(Work::Stop),
            Phase::CancelReturn => role.in_new().then_some(Work::Copy { replace: true }),
            Phase::CancelCleanup => Some(Work::Cleanup {
                left: !role.in_old(),
            }),
            _ => None,
        }
    }

    /// Asks for the cancel; refused once the fleet committed to the new ring.
    pub fn request_cancel(&mut self) -> Result<(), String> {
        if self.phase.cancellable() {
            self.cancel = true;
            return Ok(());
        }
        if matches!(
            self.phase,
            Phase::CancelStop | Phase::CancelReturn | Phase::CancelRevert | Phase::CancelCleanup
        ) {
            return Ok(());
        }
        Err(format!(
            "the resharding is in phase {}: it can no longer be cancelled (the fleet committed to the new ring); START the reverse resharding instead",
            self.phase
        ))
    }

    /// The index of node `name`.
    pub fn node(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }
}

fn progress(name: &str, address: &str, role: Role) -> NodeProgress {
    NodeProgress {
        name: name.to_string(),
        address: address.to_string(),
        role,
        done: false,
        attempts: 0,
        state: String::new(),
        copied: 0,
        percent: 0,
        last_error: String::new(),
    }
}

/// What a node answered to `SHARD.RING STATE`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeState {
    pub self_name: String,
    pub digest: String,
    pub previous_digest: String,
    pub returning: bool,
    pub job: String,
    pub job_state: String,
    pub copied: u64,
    pub failed: u64,
    pub percent: u64,
    pub last_error: String,
    pub paused: bool,
    pub keys: u64,
    pub used_memory: u64,
    /// Routed calls in flight there that were routed by rings older than the current ones.
    pub calls_before: u64,
}

impl NodeState {
    /// Reads the reply (a RESP3 map, or RESP2's flat list of names and values).
    pub fn from_resp(reply: &Resp) -> Result<NodeState, String> {
        let pairs: Vec<(&Resp, &Resp)> = match reply {
            Resp::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
            Resp::Array(items) if items.len() % 2 == 0 => {
                items.chunks(2).map(|c| (&c[0], &c[1])).collect()
            }
            Resp::Error(e) => return Err(String::from_utf8_lossy(e).into_owned()),
            other => return Err(format!("SHARD.RING STATE replied {other:?}")),
        };
        let mut st = NodeState::default();
        for (k, v) in pairs {
            let text = || match v {
                Resp::Bulk(b) | Resp::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                Resp::Int(n) => n.to_string(),
                _ => String::new(),
            };
            let int = || match v {
                Resp::Int(n) => u64::try_from(*n).unwrap_or(0),
                _ => text().parse().unwrap_or(0),
            };
            let key = match k {
                Resp::Bulk(b) | Resp::Simple(b) => b.as_slice(),
                _ => continue,
            };
            match key {
                b"self" => st.self_name = text(),
                b"digest" => st.digest = text(),
                b"previous_digest" => st.previous_digest = text(),
                b"returning" => st.returning = text() == "yes",
                b"job" => st.job = text(),
                b"job_state" => st.job_state = text(),
                b"copied" => st.copied = int(),
                b"failed" => st.failed = int(),
                b"percent" => st.percent = int(),
                b"last_error" => st.last_error = text(),
                b"paused" => st.paused = text() == "yes",
                b"keys" => st.keys = int(),
                b"used_memory" => st.used_memory = int(),
                b"calls_before" => st.calls_before = int(),
                _ => {}
            }
        }
        Ok(st)
    }

    /// Whether a job is running there.
    pub fn job_running(&self) -> bool {
        matches!(self.job_state.as_str(), "copying" | "cleaning")
    }
}

/// Where a node's job step stands, from its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobVerdict {
    Running,
    Done,
    /// Ended without finishing (failed keys, stopped, or never started): try again.
    Retry(String),
}

/// Reads a node's state after its step `work` was started.
pub fn job_verdict(work: Work, st: &NodeState) -> JobVerdict {
    if work == Work::Stop {
        return if st.job_running() {
            JobVerdict::Running
        } else {
            JobVerdict::Done
        };
    }
    if st.job != work.job_name() {
        return JobVerdict::Retry(format!("its job is '{}', not {}", st.job, work.job_name()));
    }
    match st.job_state.as_str() {
        "copying" | "cleaning" => JobVerdict::Running,
        "done" if st.failed == 0 => JobVerdict::Done,
        "done" | "failed" => {
            JobVerdict::Retry(format!("{} keys failed: {}", st.failed, st.last_error))
        }
        other => JobVerdict::Retry(format!("the job ended {other}: {}", st.last_error)),
    }
}

/// START's check of the nodes' answers (`answers[i]` for `plan.nodes[i]`): the problems, each
/// naming its node; none means the fleet may start (or resume) the plan.
pub fn check_start(plan: &FleetPlan, answers: &[Result<NodeState, String>]) -> Vec<String> {
    let old = plan.old.digest();
    let new = plan.new.digest();
    let mut problems = Vec::new();
    for (node, answer) in plan.nodes.iter().zip(answers) {
        let who = format!("node {} ({})", node.name, node.address);
        let st = match answer {
            Ok(st) => st,
            Err(e) => {
                problems.push(format!("{who} does not answer: {e}"));
                continue;
            }
        };
        if st.self_name != node.name {
            problems.push(format!(
                "{who} calls itself '{}' (shard.self): set shard.self to {} there",
                st.self_name, node.name
            ));
            continue;
        }
        // Already begun (a START repeated, or resumed): the new ring over the old one.
        let begun = st.digest == new && st.previous_digest == old;
        let holds_old = st.digest == old && st.previous_digest.is_empty();
        let fresh = st.digest.is_empty() && st.previous_digest.is_empty();
        match node.role {
            Role::New if !begun && !holds_old && !fresh => problems.push(format!(
                "{who} holds another ring (digest {}{}), not the fleet's {old}",
                st.digest,
                previous_text(st)
            )),
            Role::New if !begun && st.keys > 0 => problems.push(format!(
                "{who} holds {} keys: a joining node must be empty (old copies there would shadow the ones the copy skips); empty it first (FLUSHALL there, once sure its data is elsewhere)",
                st.keys
            )),
            Role::Old | Role::Both if !begun && !holds_old => problems.push(format!(
                "{who} holds another ring (digest {}{}), not this node's {old}: SHARD.RING PUSH from the node whose ring is right",
                st.digest,
                previous_text(st)
            )),
            _ => {}
        }
        if !begun && st.job_running() {
            problems.push(format!(
                "{who} is running a {} job: wait for it or SHARD.RESHARD STOP it",
                st.job
            ));
        }
    }
    problems
}

/// The rings a node holds, as the plan sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rings {
    /// No ring at all (a joining node before the fence).
    Empty,
    /// The old ring alone.
    Old,
    /// The old ring over the new one, returning (the fence, or a cancel's return).
    Fenced,
    /// The new ring over the old one.
    Begun,
    /// The new ring alone.
    New,
    Other,
}

fn rings_of(plan: &FleetPlan, st: &NodeState) -> Rings {
    let (old, new) = (plan.old.digest(), plan.new.digest());
    let (d, p) = (st.digest.as_str(), st.previous_digest.as_str());
    match (d, p, st.returning) {
        ("", "", false) => Rings::Empty,
        (d, "", false) if d == old => Rings::Old,
        (d, p, true) if d == old && p == new => Rings::Fenced,
        (d, p, false) if d == new && p == old => Rings::Begun,
        (d, "", false) if d == new => Rings::New,
        _ => Rings::Other,
    }
}

/// RESUME's check: each node that answers must hold rings the plan's phase can be in (those of
/// the phase, or of the one before, since a phase's rings reach the nodes one by one). A plan
/// restored from an older copy (an RDB, or a replica promoted before it got the last phase)
/// whose fleet has moved on is refused, naming the nodes, rather than driven backwards.
pub fn check_resume(plan: &FleetPlan, answers: &[Result<NodeState, String>]) -> Vec<String> {
    use Rings::*;
    let fits: &[Rings] = match plan.phase {
        Phase::Fence => &[Empty, Old, Fenced],
        Phase::Begin => &[Fenced, Begun],
        Phase::Copy => &[Begun],
        Phase::Commit => &[Begun, New],
        Phase::Cleanup => &[New],
        Phase::CancelStop | Phase::CancelReturn => &[Empty, Old, Fenced, Begun],
        Phase::CancelRevert => &[Fenced, Old],
        Phase::CancelCleanup => &[Old],
        Phase::Done | Phase::Cancelled => return Vec::new(),
    };
    plan.nodes
        .iter()
        .zip(answers)
        .filter_map(|(node, answer)| {
            let st = answer.as_ref().ok()?;
            let rings = rings_of(plan, st);
            (!fits.contains(&rings)).then(|| {
                    format!(
                        "node {} ({}) holds ring {}{}{}, which does not fit phase {} of this plan (old {}, new {}): the plan is older than the fleet",
                        node.name,
                        node.address,
                        if st.digest.is_empty() { "none" } else { &st.digest },
                        previous_text(st),
                        if st.returning { " (returning)" } else { "" },
                        plan.phase,
                        plan.old.digest(),
                        plan.new.digest()
                    )
                })
        })
        .collect()
}

fn previous_text(st: &NodeState) -> String {
    if st.previous_digest.is_empty() {
        String::new()
    } else {
        format!(", previous {}", st.previous_digest)
    }
}

// The byte form: `SHFP`, a version, then fields (u64 little-endian numbers, u8 codes, strings
// prefixed with their u64 length, the rings as canonical text).
const MAGIC: &[u8; 4] = b"SHFP";
const VERSION: u8 = 1;

impl FleetPlan {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        put_str(&mut out, &self.old.canonical());
        put_str(&mut out, &self.new.canonical());
        out.extend_from_slice(&self.max_rate.to_le_bytes());
        out.push(self.phase.code());
        out.push(u8::from(self.cancel));
        put_str(&mut out, &self.error);
        out.extend_from_slice(&(self.nodes.len() as u64).to_le_bytes());
        for n in &self.nodes {
            put_str(&mut out, &n.name);
            put_str(&mut out, &n.address);
            out.push(n.role.code());
            out.push(u8::from(n.done));
            out.extend_from_slice(&u64::from(n.attempts).to_le_bytes());
            put_str(&mut out, &n.state);
            out.extend_from_slice(&n.copied.to_le_bytes());
            out.extend_from_slice(&n.percent.to_le_bytes());
            put_str(&mut out, &n.last_error);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<FleetPlan, String> {
        let mut r = Reader::new(bytes);
        if r.take(4, "magic")? != MAGIC {
            return Err("not a fleet plan (bad magic)".into());
        }
        let version = r.byte("version")?;
        if version != VERSION {
            return Err(format!("unknown fleet plan version {version}"));
        }
        let old = r.ring("old ring")?.ok_or("the plan has no old ring")?;
        let new = r.ring("new ring")?.ok_or("the plan has no new ring")?;
        let max_rate = r.u64("max rate")?;
        let phase = Phase::from_code(r.byte("phase")?).ok_or("unknown phase")?;
        let cancel = r.flag("cancel flag")?;
        let error = r.string("error")?;
        let count = r.u64("node count")?;
        if count > 1 << 16 {
            return Err(format!("{count} nodes is too many"));
        }
        let mut nodes = Vec::new();
        for _ in 0..count {
            nodes.push(NodeProgress {
                name: r.string("node name")?,
                address: r.string("node address")?,
                role: Role::from_code(r.byte("role")?).ok_or("unknown role")?,
                done: r.flag("done flag")?,
                attempts: u32::try_from(r.u64("attempts")?).unwrap_or(u32::MAX),
                state: r.string("state")?,
                copied: r.u64("copied")?,
                percent: r.u64("percent")?,
                last_error: r.string("last error")?,
            });
        }
        if r.pos != bytes.len() {
            return Err(format!(
                "{} unexpected bytes after the plan",
                bytes.len() - r.pos
            ));
        }
        Ok(FleetPlan {
            old,
            new,
            max_rate,
            phase,
            cancel,
            error,
            nodes,
        })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(names: &[&str]) -> RingSpec {
        let fields: Vec<String> = names
            .iter()
            .enumerate()
            .flat_map(|(i, n)| [n.to_string(), format!("127.0.0.1:{}", 7000 + i), "1".into()])
            .collect();
        let refs: Vec<&[u8]> = fields.iter().map(|s| s.as_bytes()).collect();
        RingSpec::from_args(b"ketama", None, &refs).unwrap()
    }

    fn grow() -> FleetPlan {
        FleetPlan::new(spec(&["a", "b", "c"]), spec(&["a", "b", "c", "d"]), 0)
    }

    fn shrink() -> FleetPlan {
        FleetPlan::new(spec(&["a", "b", "c", "d"]), spec(&["a", "b", "c"]), 500)
    }

    #[test]
    fn roles_and_work_per_phase() {
        let mut p = grow();
        let roles: Vec<Role> = p.nodes.iter().map(|n| n.role).collect();
        assert_eq!(roles, [Role::Both, Role::Both, Role::Both, Role::New]);
        p.enter(Phase::Copy);
        assert_eq!(p.work(0), Some(Work::Copy { replace: false }));
        assert_eq!(p.work(3), None, "a joining node has nothing to copy");
        p.enter(Phase::Cleanup);
        assert_eq!(p.work(3), Some(Work::Cleanup { left: false }));
        p.enter(Phase::CancelReturn);
        assert_eq!(p.work(3), Some(Work::Copy { replace: true }));
        p.enter(Phase::CancelCleanup);
        assert_eq!(p.work(3), Some(Work::Cleanup { left: true }));
        assert_eq!(p.work(0), Some(Work::Cleanup { left: false }));

        let mut s = shrink();
        assert_eq!(s.nodes[3].role, Role::Old);
        s.enter(Phase::Cleanup);
        assert_eq!(s.work(3), Some(Work::Cleanup { left: true }));
        s.enter(Phase::Copy);
        assert_eq!(s.work(3), Some(Work::Copy { replace: false }));
        assert_eq!(
            s.work(3).unwrap().command(s.max_rate),
            [&b"SHARD.RESHARD"[..], b"COPY", b"MAXRATE", b"500"]
        );
    }

    #[test]
    fn installs_per_phase() {
        let mut p = grow();
        assert_eq!(p.phase, Phase::Fence);
        let i = p.install().unwrap();
        assert_eq!(
            (i.current, i.previous, i.returning),
            (&p.old, Some(&p.new), true)
        );
        assert!(p.phase.waits_for_calls());
        p.enter(p.phase.next());
        let i = p.install().unwrap();
        assert_eq!(
            (i.current, i.previous, i.returning),
            (&p.new, Some(&p.old), false)
        );
        p.enter(Phase::CancelReturn);
        let i = p.install().unwrap();
        assert_eq!(
            (i.current, i.previous, i.returning),
            (&p.old, Some(&p.new), true)
        );
        assert_eq!(i.command().last().unwrap(), b"RETURNING");
        p.enter(Phase::Copy);
        assert!(p.install().is_none());
    }

    #[test]
    fn cancel_only_before_commit() {
        let mut p = grow();
        p.enter(Phase::Copy);
        assert!(p.request_cancel().is_ok() && p.cancel);
        p.enter(Phase::Commit);
        assert!(p
            .request_cancel()
            .unwrap_err()
            .contains("no longer be cancelled"));
        let order: Vec<Phase> = std::iter::successors(Some(Phase::CancelStop), |p| {
            (!p.finished()).then(|| p.next())
        })
        .collect();
        assert_eq!(order.last(), Some(&Phase::Cancelled));
        assert_eq!(order.len(), 5);
    }

    fn state(name: &str, digest: &str, previous: &str, keys: u64) -> Result<NodeState, String> {
        Ok(NodeState {
            self_name: name.into(),
            digest: digest.into(),
            previous_digest: previous.into(),
            keys,
            job_state: "idle".into(),
            ..NodeState::default()
        })
    }

    #[test]
    fn start_checks_name_each_node() {
        let p = grow();
        let (old, new) = (p.old.digest(), p.new.digest());
        let fine = vec![
            state("a", &old, "", 10),
            state("b", &old, "", 10),
            state("c", &old, "", 10),
            state("d", "", "", 0),
        ];
        assert!(check_start(&p, &fine).is_empty());
        let mut bad = fine.clone();
        bad[1] = Err("connection refused".into());
        bad[2] = state("c", "ffff", "", 10);
        bad[3] = state("d", "", "", 12);
        let problems = check_start(&p, &bad);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("node b (127.0.0.1:7001) does not answer"));
        assert!(problems[1].contains("node c") && problems[1].contains("ffff"));
        assert!(problems[2].contains("node d") && problems[2].contains("12 keys"));
        // Resumed: every node already holds the new ring over the old; the joining node's
        // copies do not count against it.
        let begun: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| state(n, &new, &old, 5))
            .collect();
        assert!(check_start(&p, &begun).is_empty());
        let mut wrong_self = fine;
        wrong_self[0] = state("x", &old, "", 1);
        assert!(check_start(&p, &wrong_self)[0].contains("calls itself 'x'"));
    }

    #[test]
    fn resume_refuses_a_plan_older_than_the_fleet() {
        let mut p = grow();
        let (old, new) = (p.old.digest(), p.new.digest());
        p.enter(Phase::Copy);
        let begun: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| state(n, &new, &old, 5))
            .collect();
        assert!(check_resume(&p, &begun).is_empty());
        // The fleet was cancelled meanwhile: every node back on the old ring alone.
        let cancelled: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| state(n, &old, "", 5))
            .collect();
        let problems = check_resume(&p, &cancelled);
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("node a") && problems[0].contains("phase copy"));
        // A node that does not answer is the driver's to retry, not a refusal.
        let mut partly = begun.clone();
        partly[2] = Err("refused".into());
        assert!(check_resume(&p, &partly).is_empty());
        // Commit reaches the nodes one by one: both rings fit.
        p.enter(Phase::Commit);
        let mut mixed = begun;
        mixed[0] = state("a", &new, "", 5);
        assert!(check_resume(&p, &mixed).is_empty());
    }

    #[test]
    fn verdicts() {
        let mut st = NodeState {
            job: "copy".into(),
            job_state: "copying".into(),
            ..NodeState::default()
        };
        let copy = Work::Copy { replace: false };
        assert_eq!(job_verdict(copy, &st), JobVerdict::Running);
        st.job_state = "done".into();
        assert_eq!(job_verdict(copy, &st), JobVerdict::Done);
        st.failed = 3;
        assert!(matches!(job_verdict(copy, &st), JobVerdict::Retry(e) if e.contains("3 keys")));
        st.job_state = "idle".into();
        assert_eq!(job_verdict(Work::Stop, &st), JobVerdict::Done);
        assert!(matches!(
            job_verdict(Work::Cleanup { left: false }, &st),
            JobVerdict::Retry(_)
        ));
    }

    #[test]
    fn state_reads_both_resp_versions() {
        let pairs = vec![
            (Resp::Bulk(b"self".to_vec()), Resp::Bulk(b"a".to_vec())),
            (Resp::Bulk(b"keys".to_vec()), Resp::Int(42)),
            (
                Resp::Bulk(b"returning".to_vec()),
                Resp::Bulk(b"yes".to_vec()),
            ),
        ];
        let flat: Vec<Resp> = pairs
            .iter()
            .flat_map(|(k, v)| [k.clone(), v.clone()])
            .collect();
        for reply in [Resp::Map(pairs), Resp::Array(flat)] {
            let st = NodeState::from_resp(&reply).unwrap();
            assert_eq!(
                (st.self_name.as_str(), st.keys, st.returning),
                ("a", 42, true)
            );
        }
        assert!(
            NodeState::from_resp(&Resp::Error(b"ERR unknown command".to_vec()))
                .unwrap_err()
                .contains("unknown command")
        );
    }

    #[test]
    fn plan_round_trips_and_rejects_truncation() {
        let mut p = shrink();
        p.enter(Phase::Copy);
        p.nodes[1].done = true;
        p.nodes[2].attempts = 3;
        p.nodes[2].last_error = "node c: refused".into();
        p.cancel = true;
        let bytes = p.encode();
        assert_eq!(FleetPlan::decode(&bytes).unwrap(), p);
        for cut in 0..bytes.len() {
            assert!(FleetPlan::decode(&bytes[..cut]).is_err(), "{cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(FleetPlan::decode(&long).is_err());
    }
}
