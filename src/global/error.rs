//! What an operation of the global layer can fail with; `ffi` maps it to a `cudaError_t` in one
//! place (`ffi::status`).

use crate::backend::cuda::runtime::CudaError;
use crate::pool::{self, DeviceId};
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
    /// A device ordinal the process does not have (`cudaErrorInvalidDevice`, as the runtime).
    NoSuchDevice,
    /// The device's pool was left inconsistent by an earlier internal failure.
    PoolBroken(DeviceId, String),
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
            ShimError::NoSuchDevice => write!(f, "no such device in this process"),
            ShimError::PoolBroken(device, why) => write!(
                f,
                "the pool of device {} is inconsistent after an internal error ({why}); \
                 its allocations fail from now on",
                device.0
            ),
        }
    }
}

impl std::error::Error for ShimError {}
