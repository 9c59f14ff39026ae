//! Fleet operations (`SHARD.RESHARD START|CANCEL|PLAN|RESUME`, `SHARD.RING
//! PUSH|CHECK|STATE`): one node, the coordinator, takes every node of the fleet from the old
//! ring to the new one (or back), phase by phase, over the module's own connections.
//!
//! What each file owns:
//! - `plan`: the plan, pure: phases, each node's role and progress, what each phase asks of
//!   which node; `plan_bytes.rs` (its child module) the plan's byte form, kept in the RDB and
//!   replicated as `SHARD.RESHARD PLAN`.
//! - `node_state`: `SHARD.RING STATE`, this node's answer made, the others' answers read.
//! - `checks`: what the coordinator concludes from the answers (a job's verdict, START's and
//!   RESUME's checks), pure.
//! - `adopt`: the plan whose rings the fleet holds, which RESUME drives when the plan here is
//!   gone or older than the fleet (pure).
//! - `coordinator`: drives the plan in the background on the event loop; `jobs_phase` its
//!   phases' jobs (each node's COPY or CLEANUP sent, looked at, retried).
//! - `landed`: a phase's copies counted done only once each destination's replica has them,
//!   at the primary they went to (else they run again).
//! - `durable`: a step counted done at a node only once that node's replica has it (the step
//!   and `WAIT` on one connection), so a failover cannot lose a step the coordinator counted.
//! - `lease`: one coordinator at a time: the term a coordinator takes before it drives (refused
//!   while another's lease runs), claims, renews, stamps on every step and releases; `fencing`
//!   the nodes' side: a step's `TERM ...` read, accepted or refused (`STALETERM`), and made
//!   durable (the record's rules: `ring::lease`); `unstepped` the same term held against
//!   rings that come without a step (pushed from another node, changed by hand).
//! - `reach`: how this node reaches the fleet (link, the rings' nodes, the coordinator's
//!   `Reach`), and whether there is a plan to resume.
//! - `operation`: START's checks and start, RESUME, CANCEL, HANDOVER, PLAN, as the commands ask
//!   for them.
//! - `push`, `survey`: `SHARD.RING PUSH` and `SHARD.RING CHECK` across the fleet.
//! - `repair`: after a load or a promotion, rings older than the fleet's (a lower term) are
//!   brought up to date by asking a node of the newer term to push its rings.
//! - `status`: STATUS's `fleet` field.
//! - `journal`: the operation's notices in the server log (plans started, resumed, stored,
//!   phases, rings installed).
//! - `tests.rs`: the unit tests of the plan, its checks and byte form.
//!
//! May import what `reshard` may (pure rooms, `host`, `net`, `state`, `topology`, `route`) and
//! the rest of `reshard`; never `cluster` or `commands`.

pub mod adopt;
pub mod checks;
pub mod coordinator;
pub mod durable;
pub mod fencing;
pub mod jobs_phase;
pub mod journal;
pub mod landed;
pub mod lease;
pub mod node_state;
pub mod operation;
pub mod plan;
pub mod push;
pub mod reach;
pub mod repair;
pub mod status;
pub mod survey;
#[cfg(test)]
mod tests;
pub mod unstepped;
