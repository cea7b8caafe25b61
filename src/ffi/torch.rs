//! Entry points for PyTorch's `torch.cuda.memory.CUDAPluggableAllocator`:
//!
//! ```python
//! alloc = torch.cuda.memory.CUDAPluggableAllocator(
//!     "libcachealloc.so", "cachealloc_torch_malloc", "cachealloc_torch_free")
//! torch.cuda.memory.change_current_allocator(alloc)
//! ```
//!
//! PyTorch passes the device and stream explicitly; blocks belong to their allocation stream and
//! a free is immediate (PyTorch orders reuse on the stream itself). Failures cannot be returned
//! as codes here: malloc answers NULL (an OOM report is logged), free logs the problem.

use super::status::{boundary, to_code};
use crate::global::api;
use crate::pool::{DeviceId, StreamId};
use std::ffi::{c_int, c_void};

/// PyTorch's `MallocFuncType`: `void* (size_t size, int device, cudaStream_t stream)`.
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_torch_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    boundary(
        "cachealloc_torch_malloc",
        std::ptr::null_mut(),
        || match api::malloc(size, DeviceId(device), StreamId(stream as u64)) {
            Ok(addr) => addr as *mut c_void,
            Err(e) => {
                to_code("cachealloc_torch_malloc", e);
                std::ptr::null_mut()
            }
        },
    )
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
