//! The server edge: the one place that calls the raw module API (`redis_module::raw`).
//!
//! Everything else in the crate reaches Redis through the safe functions here: the detached
//! context, server and keyspace events, timers, the event loop, blocked clients, fork and the
//! child's keyspace walk, command keys and ACL checks, running a command as its caller,
//! replication, the RDB auxiliary field, replies and INFO fields. Each file owns one family;
//! every `unsafe` block says what makes it sound. Nothing here knows a ring, a command of the
//! module, or a setting.

pub mod acl;
pub mod args;
pub mod argv;
pub mod aux;
pub mod blocked;
pub mod caller;
pub mod command;
pub mod command_keys;
pub mod context;
pub mod error;
pub mod event_loop;
pub mod events;
pub mod filter;
pub mod fork;
pub mod info;
pub mod keyspace;
pub mod keyspace_events;
pub mod latency;
pub mod names;
pub mod published;
pub mod register;
pub mod replicate;
pub mod reply;
pub mod scratch;
pub mod strings;
pub mod time;
pub mod timers;
pub mod walk;
pub mod writes;
