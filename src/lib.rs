//! cachealloc: a caching CUDA device-memory allocator with the policy of PyTorch's CUDA caching
//! allocator, usable as an `LD_PRELOAD` shim, through a C API, or offline as a trace replayer.

pub mod backend;
pub mod config;
pub mod ffi;
pub mod global;
pub mod pool;
pub mod report;
pub mod trace;
