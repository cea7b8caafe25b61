//! Entry points for PyTorch's `torch.cuda.memory.CUDAPluggableAllocator`:
//!
//! ```python
//! alloc = torch.cuda.memory.CUDAPluggableAllocator(
//!     "libcachealloc.so", "cachealloc_torch_malloc", "cachealloc_torch_free")
//! torch.cuda.memory.change_current_allocator(alloc)
//! ```
//!
//! PyTorch passes the device and stream explicitly; blocks belong to their allocation stream and
//! a free is immediate (PyTorch orders reuse on the stream itself), unless the tensor was
//! recorded on another stream (`Tensor.record_stream`, through `cachealloc_torch_record_stream`
//! set with `set_record_stream_fn`). `cachealloc_torch_empty_cache` is the hook for
//! `set_reset_fn`, which `torch.cuda.empty_cache()` calls. Failures cannot be returned as codes
//! here: malloc answers NULL (an OOM report is logged), the others log the problem.

use super::cxx_exception;
use super::status::{boundary, to_code};
use crate::global::api;
use crate::pool::{DeviceId, StreamId};
use std::ffi::{c_int, c_void};

/// PyTorch's `MallocFuncType`: `void* (size_t size, int device, cudaStream_t stream)`. A failure
/// (out of memory, after its report is logged; a configuration error; a device error) is thrown
/// as a C++ `std::runtime_error` carrying the same text, which PyTorch raises as a Python
/// `RuntimeError`: it does not check the pointer, and a NULL one would become a tensor at address
/// 0. Without a C++ runtime in the process, a failure answers NULL.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn cachealloc_torch_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let served = boundary(
        "cachealloc_torch_malloc",
        Err("cachealloc_torch_malloc: internal error in cachealloc (logged)".to_string()),
        || match api::malloc(size, DeviceId(device), StreamId(stream as u64)) {
            Ok(addr) => Ok(addr),
            Err(e) => {
                let message = e.to_string();
                to_code("cachealloc_torch_malloc", e);
                Err(message)
            }
        },
    );
    match served {
        Ok(addr) => addr as *mut c_void,
        Err(message) => {
            // SAFETY: PyTorch's allocator calls this function from C++ that handles the
            // exception as its own allocator's; this frame owns nothing once `message` is
            // handed over (it is dropped before the throw).
            unsafe { cxx_exception::throw_runtime_error(message) };
            std::ptr::null_mut()
        }
    }
}

/// PyTorch's `FreeFuncType`: `void (void* ptr, size_t size, int device, cudaStream_t stream)`.
/// The pointer alone identifies the block; `size`, `device` and `stream` are not needed.
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = (size, device, stream);
    boundary("cachealloc_torch_free", (), || {
        if let Err(e) = api::free(ptr as u64) {
            to_code("cachealloc_torch_free", e);
        }
    })
}

/// The hook for `set_record_stream_fn`, `void (void* ptr, cudaStream_t stream)`, which
/// `Tensor.record_stream(stream)` calls: the tensor's block is not reused before that stream's
/// work issued before its free is done (see `cachealloc_record_stream`).
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_torch_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    boundary("cachealloc_torch_record_stream", (), || {
        if let Err(e) = api::record_stream(ptr as u64, StreamId(stream as u64)) {
            to_code("cachealloc_torch_record_stream", e);
        }
    })
}

/// The hook for `set_reset_fn`, `void (void)`, which `torch.cuda.empty_cache()` calls: every
/// device's fully free cached segments go back to the driver (after pending frees complete).
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_torch_empty_cache() {
    boundary("cachealloc_torch_empty_cache", (), || {
        if let Err(e) = api::empty_cache_all() {
            to_code("cachealloc_torch_empty_cache", e);
        }
    })
}
