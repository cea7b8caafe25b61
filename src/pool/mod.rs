//! The pure policy core: PyTorch's caching-allocator policy over an abstract `Backend`.
//!
//! No unsafe code, no statics, no CUDA types. Everything here takes `&mut self`; the global
//! module wraps it in a lock.
#![forbid(unsafe_code)]

mod allocator;
pub mod block;
mod block_table;
mod capture_held;
mod counters;
pub mod error;
pub mod event;
mod expandable;
pub mod expandable_seed;
pub mod format;
mod free_index;
pub mod layout;
pub mod oom;
mod pending_fit;
mod release;
mod replayed_frees;
pub mod rounding;
pub(crate) mod segment_map;
pub mod settings;
mod slot_marks;
pub mod stats;
pub mod types;
mod validate;

#[cfg(test)]
mod boundary_tests;
#[cfg(test)]
mod capture_oom_tests;
#[cfg(test)]
mod capture_tests;
#[cfg(test)]
mod expandable_boundary_tests;
#[cfg(test)]
mod expandable_tests;
#[cfg(test)]
mod fraction_tests;
#[cfg(test)]
mod ladder_tests;
#[cfg(test)]
mod stats_tests;
#[cfg(test)]
mod tests;

pub use allocator::DeviceAllocator;
pub use block::BlockState;
pub use error::{BadPointer, Error};
pub use event::{EventSink, FreeWaits, PoolEvent};
pub use expandable::{page_size, pool_with_page, range_size};
pub use expandable_seed::{MappedRunSeed, RangeSeed};
pub use format::format_size;
pub use layout::{BlockSeed, BlockView, SegmentSeed, SegmentSpan, SegmentView};
pub use oom::{MemoryLeft, OomHint, OomReport};
pub use settings::{
    Settings, allowed_maximum, check_fraction, collects_garbage, max_split_size_from_bytes,
};
pub use stats::{Counts, DeviceStats, Stat, StatArray};
pub use types::{DeviceId, DevicePtr, PoolKind, StreamId};
