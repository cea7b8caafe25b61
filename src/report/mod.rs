//! Rendering of allocator statistics and reports for people and tools: PyTorch's
//! `memory_summary` text table, `memory_stats`-style JSON, and the size formatters they share.
//!
//! Everything here reads `crate::pool` data and returns strings; nothing here changes state.

pub mod format;
pub mod json;
pub mod summary;

pub use format::format_size;
pub use json::{stats_json, stats_json_string};
pub use summary::memory_summary;
