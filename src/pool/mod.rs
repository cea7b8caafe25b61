//! The pure policy core: PyTorch's caching-allocator policy over an abstract `Backend`.
//!
//! No unsafe code, no statics, no CUDA types. Everything here takes `&mut self`; the global
//! module wraps it in a lock.
#![forbid(unsafe_code)]

pub mod format;
pub mod oom;
pub mod rounding;
pub mod settings;
pub mod stats;
pub mod types;

pub use format::format_size;
pub use oom::{OomHint, OomReport};
pub use settings::Settings;
pub use stats::{DeviceStats, Stat, StatArray};
pub use types::{DeviceId, DevicePtr, PoolKind, StreamId};
