//! What an operation of the global layer can fail with; `ffi` maps it to a `cudaError_t` in one
//! place (`ffi::status`).

use crate::backend::cuda::runtime::CudaError;
use crate::pool::{self, DeviceId, SegmentSpan, format_size};
use std::fmt;

#[derive(Debug)]
pub enum ShimError {
    /// The pool refused or failed (out of memory, bad pointer, a device error inside the pool).
    Pool(pool::Error),
    /// A real runtime call failed with this code; passed to the program unchanged.
    Runtime { code: CudaError, call: &'static str },
    /// The configuration is invalid (reported once at the first call).
    ConfigInvalid,
    /// No CUDA runtime could be found in the process (reported once).
    NoRuntime,
    /// An argument the C API does not accept.
    InvalidArgument(&'static str),
    /// A device ordinal the process does not have (`cudaErrorInvalidDevice`, as the runtime),
    /// with the number of devices it has where the runtime was asked.
    NoSuchDevice { device: i32, count: Option<i32> },
    /// The device's pool was left inconsistent by an earlier internal failure.
    PoolBroken(DeviceId, String),
    /// `cudaIpcGetMemHandle` of an address whose handle would not open at it: inside a segment
    /// shared with other allocations, or in an expandable segment.
    NotExportable { addr: u64, segment: SegmentSpan },
}

impl From<pool::Error> for ShimError {
    fn from(e: pool::Error) -> Self {
        ShimError::Pool(e)
    }
}

impl fmt::Display for ShimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShimError::Pool(e) => write!(f, "{e}"),
            ShimError::Runtime { code, call } => write!(f, "{call} failed with CUDA error {code}"),
            ShimError::ConfigInvalid => write!(f, "the cachealloc configuration is invalid"),
            ShimError::NoRuntime => write!(f, "no CUDA runtime found in this process"),
            ShimError::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
            ShimError::NoSuchDevice { device, count } => {
                write!(f, "no device {device} in this process")?;
                match count {
                    Some(0) => write!(f, " (it has none)"),
                    Some(1) => write!(f, " (it has 1: device 0)"),
                    Some(n) => write!(f, " (it has {n}: devices 0 to {})", n - 1),
                    None => Ok(()),
                }
            }
            ShimError::PoolBroken(device, why) => write!(
                f,
                "the pool of device {} is inconsistent after an internal error ({why}); \
                 its allocations fail from now on",
                device.0
            ),
            ShimError::NotExportable { addr, segment } if segment.expandable => write!(
                f,
                "{addr:#x} is memory of an expandable segment (mapped with the driver's virtual \
                 memory calls), which an IPC handle cannot name; memory shared with another \
                 process needs expandable_segments off"
            ),
            ShimError::NotExportable { addr, segment } => write!(
                f,
                "{addr:#x} lies {} into a {} segment that cachealloc shares between \
                 allocations; an IPC handle names the whole segment and opens at its start \
                 ({:#x}) in the other process, not at {addr:#x}, so no handle is made. A \
                 program that sends the offset itself can export the segment's start (what \
                 cuMemGetAddressRange gives); or run the exporting process with \
                 CACHEALLOC_DISABLE=1",
                format_size(addr - segment.start),
                format_size(segment.size),
                segment.start
            ),
        }
    }
}

impl std::error::Error for ShimError {}
