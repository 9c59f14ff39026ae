//! Time-sorted unique keys: layouts, base62, the text of a key, type names, the generator's
//! clock and sequence, and the configuration that ties them together; the IDs of other
//! specifications (TSID, UUIDv7, ULID), their Crockford base32 and hex forms, and the random
//! bits they draw. Pure Rust: nothing here touches Redis (`entropy` reads the OS's random
//! source to seed its generator).

pub mod base62;
pub mod codec;
pub mod crockford;
pub mod entropy;
pub mod format;
pub mod generator;
pub mod generators;
#[cfg(test)]
mod ids_tests;
pub mod layout;
pub mod settings;
pub mod shardjs;
pub mod time;
pub mod tsid;
pub mod types;
pub mod ulid;
pub mod uuidv7;
pub mod wide;

pub use codec::{Encoding, KeyFormatter, KeyText};
pub use entropy::{Draw, Entropy};
pub use format::Format;
pub use generator::{Batch, GenError, GenStats, Generator, Request, Shape};
pub use generators::Generators;
pub use layout::{KeyFields, Layout, LayoutKind};
pub use settings::{KeyConfig, KeySettings};
pub use types::TypeNames;
pub use wide::{WideForm, WideParts};
