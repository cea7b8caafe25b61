//! Calls handed straight to the real runtime, unchanged. Without a runtime in the process they
//! answer `cudaErrorInitializationError` (3), as documented in `backend::cuda::runtime`.

use super::init::mode;
use crate::backend::cuda::runtime::{CudaError, Runtime, codes, runtime};
use std::ffi::c_void;

fn real() -> Option<&'static Runtime> {
    // Decide the mode first, so that the log is set up before the lookup may report.
    let _ = mode();
    runtime()
}

/// The real `cudaMalloc(dev_ptr, size)`.
///
/// # Safety
/// The arguments are the program's, passed on as they came: the runtime checks them.
pub unsafe fn malloc(dev_ptr: *mut *mut c_void, size: usize) -> CudaError {
    match real() {
        // SAFETY: the caller's arguments go to the real cudaMalloc, which validates them.
        Some(rt) => unsafe { (rt.malloc)(dev_ptr, size) },
        None => codes::INITIALIZATION_ERROR,
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
        None => codes::INITIALIZATION_ERROR,
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
        None => codes::INITIALIZATION_ERROR,
    }
}

/// The real `cudaDeviceReset()`.
pub fn device_reset() -> CudaError {
    match real() {
        // SAFETY: no arguments.
        Some(rt) => unsafe { (rt.device_reset)() },
        None => codes::INITIALIZATION_ERROR,
    }
}

/// The real `cudaDeviceSynchronize()`.
pub fn device_synchronize() -> CudaError {
    match real() {
        // SAFETY: no arguments.
        Some(rt) => unsafe { (rt.device_synchronize)() },
        None => codes::INITIALIZATION_ERROR,
    }
}

/// The real `cudaGetLastError()` (success without a runtime: no runtime call has failed).
pub fn get_last_error() -> CudaError {
    match real() {
        // SAFETY: no arguments; it reads and resets the calling thread's last error.
        Some(rt) => unsafe { (rt.get_last_error)() },
        None => codes::SUCCESS,
    }
}

/// The real `cudaPeekAtLastError()` (success without a runtime).
pub fn peek_at_last_error() -> CudaError {
    match real() {
        // SAFETY: no arguments; it only reads the calling thread's last error.
        Some(rt) => unsafe { (rt.peek_at_last_error)() },
        None => codes::SUCCESS,
    }
}
