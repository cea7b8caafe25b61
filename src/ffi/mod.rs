//! The `extern "C"` surface: the interposed CUDA runtime functions, the `cachealloc_*` C API and
//! the PyTorch pluggable-allocator entry points. Each export converts its arguments, runs one
//! call into `global` inside a panic boundary, and maps the result to a code in one place
//! (`status`). No policy lives here.

pub mod c_api;
mod capture;
mod cxx_exception;
mod free_async;
pub mod interpose;
pub mod repeats;
pub mod stats;
pub mod status;
pub mod torch;

pub use stats::{CACHEALLOC_STATS_VERSION, CacheallocStats};
