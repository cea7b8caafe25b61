//! The interposed `cudaFreeAsync` and its per-thread-default-stream form (`_ptsz`, which code
//! built with `--default-stream per-thread` calls): a pool pointer goes back to its pool, ordered
//! on the stream (`global::free_async`); NULL and other memory (the driver's pool's) are
//! forwarded untouched.

use super::status::{boundary, to_code};
use crate::backend::cuda::runtime::{CudaError, codes};
use crate::global::capture_calls::StreamForm;
use crate::global::{Routed, forward, free_async, last_error};
use std::ffi::c_void;

/// One `cudaFreeAsync` of either form, named `call` in the log.
///
/// # Safety
/// The arguments are the program's: `dev_ptr` is only compared with pool addresses or
/// forwarded, `stream` goes to the runtime.
unsafe fn free_async_from(
    call: &'static str,
    dev_ptr: *mut c_void,
    stream: *mut c_void,
    form: StreamForm,
) -> CudaError {
    boundary(call, codes::UNKNOWN, || {
        match free_async::cuda_free_async(dev_ptr as u64, form.stream(stream)) {
            Ok(Routed::Pool(())) => codes::SUCCESS,
            // SAFETY: the program's own arguments, forwarded unchanged.
            Ok(Routed::Forward) => unsafe { forward::free_async(dev_ptr, stream, form) },
            Err(e) => last_error::record(to_code(call, e)),
        }
    })
}

/// `cudaFreeAsync(devPtr, stream)`: a pool pointer is reusable once `stream` reaches the free;
/// on a capturing stream it is refused with 1 and stays allocated.
///
/// # Safety
/// None beyond the runtime's: see `free_async_from`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaFreeAsync(dev_ptr: *mut c_void, stream: *mut c_void) -> CudaError {
    // SAFETY: the program's own arguments, as `free_async_from` takes them.
    unsafe { free_async_from("cudaFreeAsync", dev_ptr, stream, StreamForm::Legacy) }
}

/// `cudaFreeAsync_ptsz(devPtr, stream)`: a null stream is the thread's default stream.
///
/// # Safety
/// None beyond the runtime's: see `free_async_from`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaFreeAsync_ptsz(
    dev_ptr: *mut c_void,
    stream: *mut c_void,
) -> CudaError {
    // SAFETY: the program's own arguments, as `free_async_from` takes them.
    unsafe { free_async_from("cudaFreeAsync_ptsz", dev_ptr, stream, StreamForm::PerThread) }
}
