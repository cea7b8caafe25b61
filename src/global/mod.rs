//! The process-wide state: one pool per device behind its lock, the mode decided at the first
//! call, the re-entrancy guard, the exit-time statistics, and the calls forwarded to the real
//! runtime. `ffi` calls in here; nothing here is `extern "C"`.

pub mod api;
pub mod capture_calls;
pub mod error;
mod exit_stats;
mod exit_wait;
mod file_claim;
mod fork;
pub mod forward;
pub mod free_async;
pub mod init;
pub mod interpose;
pub mod last_error;
pub(crate) mod logging;
pub mod panics;
mod peer_notice;
pub mod pools;
pub(crate) mod raw_stderr;
pub mod reentry;
mod stream_uses;
mod trace_file;
mod unreached;

pub use error::ShimError;
pub use exit_stats::{render_json, render_text};
pub use interpose::Routed;
pub use trace_file::recording_path;
