//! A fleet operation's plan (`SHARD.RESHARD START`), pure: the old and the new ring, the phase
//! the fleet is in, each node's part and progress, and what each phase asks of which node (the
//! rings it installs, the job each node runs). Its byte form, which the coordinator keeps in
//! its RDB and replicates (`SHARD.RESHARD PLAN`) so that a restart or a failover resumes it,
//! is `plan_bytes.rs`; what the nodes' answers say of it (START's and RESUME's checks, a job's
//! verdict) is `checks`.
//!
//! The phases, each made of idempotent steps so that one repeated after a crash is harmless:
//! - forward: `fence` (every node gets the old ring as current and the new one as previous,
//!   *returning*: routed writes of the keys that will move are refused for a moment, until no
//!   call routed by the old ring alone is still in flight anywhere, so that no write can reach an
//!   old owner once a new owner may have copied the key), `begin` (every node gets the new ring
//!   as current and the old one as previous),
//!   `copy` (COPY on every node of the old ring), `settle` (every node gets the new ring over
//!   the old one, *settled*: the copies are done, so a moving key is read and written at its new
//!   owner only and a delete reaches both owners; then, until no call routed by the rings before
//!   is in flight anywhere, nothing: from there on no node reads an old owner's copy or copies
//!   it back, so a node that commits may delete at the new owner alone), `commit` (every node:
//!   the new ring alone), `cleanup` (CLEANUP on the new ring's nodes, `CLEANUP LEFT` on the
//!   nodes that left), `done`;
//! - cancel, before `commit`: `cancel-stop` (the copies stop), `cancel-return` (every node gets
//!   the old ring as current and the new one as previous, *returning*: routed writes of moving
//!   keys are refused while the new owners copy their versions back with REPLACE),
//!   `cancel-revert` (every node: the old ring alone), `cancel-cleanup` (CLEANUP on the old
//!   ring's nodes, `CLEANUP LEFT` on the nodes that were joining), `cancelled`.

use std::fmt;

use crate::ring::RingSpec;

#[path = "plan_bytes.rs"]
mod bytes;

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
    Settle,
}

/// The phases by their byte code (`plan_bytes.rs`): a new phase is added at the end, so that
/// the codes of the others stay, and a build that does not know it refuses the plan ("unknown
/// phase") rather than read it as another.
const PHASES: [Phase; 12] = [
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
    Phase::Settle,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Fence => "fence",
            Phase::Begin => "begin",
            Phase::Copy => "copy",
            Phase::Settle => "settle",
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

    /// The phase of this name (`name`), if any.
    pub fn named(name: &str) -> Option<Phase> {
        PHASES.iter().copied().find(|p| p.name() == name)
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
        matches!(self, Phase::Fence | Phase::Settle | Phase::CancelReturn)
    }

    /// The phase after this one.
    pub fn next(self) -> Phase {
        match self {
            Phase::Fence => Phase::Begin,
            Phase::Begin => Phase::Copy,
            Phase::Copy => Phase::Settle,
            Phase::Settle => Phase::Commit,
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
    /// The fence: returning rings whose refusals name the fence.
    pub fence: bool,
    /// The copies are done (`settle`): see `RingState::settled`.
    pub settled: bool,
}

impl Install<'_> {
    /// `SHARD.RING INSTALL current [previous] [RETURNING|FENCE|SETTLED]`.
    pub fn command(&self) -> Vec<Vec<u8>> {
        let mut args = vec![
            b"SHARD.RING".to_vec(),
            b"INSTALL".to_vec(),
            self.current.canonical().into_bytes(),
        ];
        if let Some(previous) = self.previous {
            args.push(previous.canonical().into_bytes());
        }
        if self.fence {
            args.push(b"FENCE".to_vec());
        } else if self.returning {
            args.push(b"RETURNING".to_vec());
        } else if self.settled {
            args.push(b"SETTLED".to_vec());
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
    /// The term this plan was last driven under (`lease`): every step carries it; 0 before the
    /// first drive.
    pub term: u64,
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
            term: 0,
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
            Phase::Begin | Phase::Settle => (&self.new, Some(&self.old), false),
            Phase::Commit => (&self.new, None, false),
            Phase::CancelReturn => (&self.old, Some(&self.new), true),
            Phase::CancelRevert => (&self.old, None, false),
            _ => return None,
        };
        Some(Install {
            current,
            previous,
            returning,
            fence: self.phase == Phase::Fence,
            settled: self.phase == Phase::Settle,
        })
    }

    /// The rings every node must hold before the operation ends (the rings of the phase
    /// that installed them last: `commit`, `cancel-revert`), once the current phase's jobs
    /// are done: installed again everywhere, and waited for at each node's replica, so that a
    /// node whose primary failed over does not end on other rings (and a cleanup's deletes
    /// have reached the replica, since they went before it on the replication stream).
    pub fn final_install(&self) -> Option<Install<'_>> {
        let current = match self.phase {
            Phase::Cleanup => &self.new,
            Phase::CancelCleanup => &self.old,
            _ => return None,
        };
        Some(Install {
            current,
            previous: None,
            returning: false,
            fence: false,
            settled: false,
        })
    }

    /// The rings the current phase's jobs run on, if its jobs depend on them: a copy's, its
    /// direction and the keys it sends (`copy`: the new ring over the old one; `cancel-return`:
    /// the old one over the new one, returning), a cleanup's, the keys it deletes (the ring the
    /// operation ends on, alone). A job counts only when it ran on them (`checks::job_verdict`).
    pub fn job_rings(&self) -> Option<Install<'_>> {
        match self.phase {
            Phase::Copy => Some(Install {
                current: &self.new,
                previous: Some(&self.old),
                returning: false,
                fence: false,
                settled: false,
            }),
            Phase::CancelReturn => self.install(),
            Phase::Cleanup | Phase::CancelCleanup => self.final_install(),
            _ => None,
        }
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
            "the resharding is in phase {}: it can no longer be cancelled (the copies are done and the fleet commits to the new ring); START the reverse resharding instead",
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
