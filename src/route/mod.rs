//! SHARD.CALL's routing: which node runs a command, and getting it there.
//!
//! - `command_table`: what routing knows of a command (arity, read-only, blocking, key
//!   positions), learnt from the server's `COMMAND INFO`, and the command a call carries with
//!   its key positions (from the table or the server's key specs).
//! - `decide`: the pure decision of a call (here, one other node, a replica, a split, the plan
//!   of a moving key, or a refusal), tested against a table of cases in `decide_tests`.
//! - `call`: SHARD.CALL carried out: the facts gathered, the ACL checked, the decision made and
//!   executed.
//! - `steps`: the pure plan of a single key while a resharding is open (fallbacks, copies,
//!   deletes at both owners), driven through the `Step` trait; `split`: multi-key commands cut
//!   by owner and their replies merged; `fields`: Shardjs's field-name dictionary.
//! - `blocking`: a blocking command waits at its owner on a connection of its own, closed if
//!   the client disconnects; `blocking_moves`: its wait ended (`TRYAGAIN`) when a ring change
//!   moves its key away.
//! - `forward`: calls in flight (the blocked client, the future over its steps, the network
//!   steps `NetSteps`); `stats`: the counters of INFO; `copy`: copy-before-write's requests;
//!   `replica`: reads at replicas.
//! - `filter`: the command filter's part that turns a call whose keys are all here into the
//!   plain command; `plain`: its part under `shard.route-plain yes`, which hands a plain
//!   client's command for other nodes (or for the whole fleet) to `SHARD.PLAIN`;
//!   `local_view`: the filter's copy of the ring and of which node is this one, for the usual
//!   command of keys all here, made again when the rings change.
//! - `keyless`: the keyless commands the fleet answers and how their replies merge (pure,
//!   `SHARD.HOTKEYS`'s merge too, tested in `keyless_hot_tests`); `keyless_call`: their
//!   fan-out; `scan_cursor`: the fleet's `SCAN` cursor (pure); `hot_sample`: one node's
//!   hottest keys by their LFU counters, sampled in steps of 1 ms.
//! - `outside`: a node outside its rings refuses the writes routed to it (the filter's part
//!   and the refusal; the handler is `commands::outside`).
//! - `wait`: `SHARD.CALL WAIT numreplicas timeout-ms ...`: its prefix, and the call's reply
//!   (the command's, or `NOREPLICAS`) from how many replicas acknowledged each write.
//!
//! May import: `host`, `net`, `state`, `topology` and the pure rooms (`ring`, `keys`, `clock`);
//! never `cluster`, `reshard` or `commands`, which sit above it. No raw module API here: that
//! is `host`'s.

pub mod blocking;
pub mod blocking_moves;
pub mod call;
pub mod command_table;
pub mod copy;
pub mod decide;
pub mod fields;
pub mod filter;
pub mod forward;
pub mod gate;
pub mod hot_sample;
pub mod keyless;
pub mod keyless_call;
#[cfg(test)]
mod keyless_hot_tests;
pub mod local_view;
pub mod name_table;
pub mod outside;
pub mod plain;
pub mod replica;
pub mod scan_cursor;
pub mod split;
pub mod stats;
pub mod steps;
pub mod wait;

pub use crate::net::endpoint::{Endpoint, StepError, StepErrorKind};
pub use crate::net::resp::{encode_command, read_reply, Resp, RespError};
pub use steps::{execute, CommandKind, Plan, Routed, Step};
