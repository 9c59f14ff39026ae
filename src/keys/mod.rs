//! Time-sorted unique keys: layouts, base62, the text of a key, type names, the generator's
//! clock and sequence, and the configuration that ties them together. Pure Rust: nothing here
//! touches Redis.

pub mod base62;
pub mod codec;
pub mod generator;
pub mod layout;
pub mod settings;
pub mod shardjs;
pub mod time;
pub mod types;

pub use codec::{Encoding, KeyFormatter, KeyText};
pub use generator::{Batch, GenError, GenStats, Generator, Request, Shape};
pub use layout::{KeyFields, Layout, LayoutKind};
pub use settings::{KeyConfig, KeySettings};
pub use types::TypeNames;
