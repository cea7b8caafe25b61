//! Calls handed straight to the real runtime, unchanged. Without a runtime in the process they
//! answer `cudaErrorInitializationError` (3), as documented in `backend::cuda::runtime`, and
//! leave it as the program's last error, as a failed runtime call does (`without_runtime`).

use super::capture_calls::StreamForm;
use super::init::mode;
use super::last_error;
use crate::backend::cuda::runtime::{CudaError, Runtime, VoidFn, codes, runtime};
use std::ffi::{c_int, c_uint, c_void};

pub(super) fn real() -> Option<&'static Runtime> {
    // Decide the mode first, so that the log is set up before the lookup may report.
    let _ = mode();
    runtime()
}

/// The answer of a call that has no runtime to go to: 3, kept as the program's last error
/// (enabled or disabled alike: `cudaGetLastError()` then answers 3 once).
pub(super) fn without_runtime() -> CudaError {
    last_error::record(codes::INITIALIZATION_ERROR)
}

/// The real `cudaMalloc(dev_ptr, size)`.
///
/// # Safety
/// The arguments are the program's, passed on as they came: the runtime checks them.
pub unsafe fn malloc(dev_ptr: *mut *mut c_void, size: usize) -> CudaError {
    match real() {
        // SAFETY: the caller's arguments go to the real cudaMalloc, which validates them.
        Some(rt) => unsafe { (rt.malloc)(dev_ptr, size) },
        None => without_runtime(),
    }
}

/// The real `cudaFree(ptr)`.
///
/// # Safety
/// `ptr` is the program's, passed on as it came.
pub unsafe fn free(ptr: *mut c_void) -> CudaError {
    match real() {
        // SAFETY: the caller's pointer goes to the real cudaFree, which validates it.
        Some(rt) => unsafe { (rt.free)(ptr) },
        None => without_runtime(),
    }
}

/// The real `cudaFreeAsync(ptr, stream)`, or its `_ptsz` form; 801 (`cudaErrorNotSupported`,
/// as the program's last error) from a runtime without it.
///
/// # Safety
/// The arguments are the program's, passed on as they came.
pub unsafe fn free_async(ptr: *mut c_void, stream: *mut c_void, form: StreamForm) -> CudaError {
    let Some(rt) = real() else {
        return without_runtime();
    };
    let free_async = match form {
        StreamForm::Legacy => rt.free_async,
        StreamForm::PerThread => rt.free_async_ptsz,
    };
    match free_async {
        // SAFETY: the caller's pointer and stream go to the real function, which checks them.
        Some(free_async) => unsafe { free_async(ptr, stream) },
        None => last_error::record(codes::NOT_SUPPORTED),
    }
}

/// The real `cudaMemGetInfo(free, total)`.
///
/// # Safety
/// The out-pointers are the program's, passed on as they came.
pub unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> CudaError {
    match real() {
        // SAFETY: the caller's out-pointers go to the real cudaMemGetInfo.
        Some(rt) => unsafe { (rt.mem_get_info)(free, total) },
        None => without_runtime(),
    }
}

/// The real `cudaDeviceEnablePeerAccess(peer, flags)`.
pub fn device_enable_peer_access(peer: c_int, flags: c_uint) -> CudaError {
    match real() {
        // SAFETY: plain integers, passed on as they came: the runtime checks them.
        Some(rt) => unsafe { (rt.device_enable_peer_access)(peer, flags) },
        None => without_runtime(),
    }
}

/// The real `cudaIpcGetMemHandle(handle, dev_ptr)`.
///
/// # Safety
/// The arguments are the program's, passed on as they came.
pub unsafe fn ipc_get_mem_handle(handle: *mut c_void, dev_ptr: *mut c_void) -> CudaError {
    match real() {
        // SAFETY: the caller's handle out-pointer and device pointer go to the real runtime,
        // which checks them.
        Some(rt) => unsafe { (rt.ipc_get_mem_handle)(handle, dev_ptr) },
        None => without_runtime(),
    }
}

/// A no-argument function of the real runtime (`function` picks it), or `without`'s answer when
/// the process has no runtime.
fn no_arguments(
    function: impl FnOnce(&Runtime) -> VoidFn,
    without: fn() -> CudaError,
) -> CudaError {
    match real() {
        // SAFETY: the picked function takes no arguments (its C signature is `VoidFn`'s).
        Some(rt) => unsafe { function(rt)() },
        None => without(),
    }
}

/// The real `cudaDeviceReset()`.
pub fn device_reset() -> CudaError {
    no_arguments(|rt| rt.device_reset, without_runtime)
}

/// The real `cudaDeviceSynchronize()`.
pub fn device_synchronize() -> CudaError {
    no_arguments(|rt| rt.device_synchronize, without_runtime)
}

/// The real `cudaGetLastError()`, which also clears it (success without a runtime: no runtime
/// call has failed).
pub fn get_last_error() -> CudaError {
    no_arguments(|rt| rt.get_last_error, || codes::SUCCESS)
}

/// The real `cudaPeekAtLastError()` (success without a runtime).
pub fn peek_at_last_error() -> CudaError {
    no_arguments(|rt| rt.peek_at_last_error, || codes::SUCCESS)
}
