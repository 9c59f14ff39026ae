//! The cluster protocol on a fleet of plain servers, and the live slot map of a real cluster.

pub mod filter;
pub mod live_slots;
pub mod protocol;
pub mod replies;
