//! cachealloc: a caching CUDA device-memory allocator with the policy of PyTorch's CUDA caching
//! allocator, usable as an `LD_PRELOAD` shim, through a C API, or offline as a trace replayer.

/// A `tracing` event that cannot panic (`log_event!(warn, "...")`): see
/// `global::logging::emit`. Every log line of the library goes through it.
macro_rules! log_event {
    ($level:ident, $($arg:tt)+) => {
        $crate::global::logging::emit(|| tracing::$level!($($arg)+))
    };
}

pub mod backend;
pub mod config;
pub mod ffi;
pub mod global;
pub mod pool;
pub mod report;
pub mod trace;
