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
//! `set_reset_fn`, which `torch.cuda.empty_cache()` calls, and
//! `cachealloc_torch_set_memory_fraction` the one for `set_memory_fraction_fn`, which
//! `torch.cuda.set_per_process_memory_fraction` calls. `cachealloc_torch_base_alloc`, the hook
//! for `set_base_alloc_fn`, gives the segment that PyTorch 2.1 to 2.4 export with an IPC handle
//! when they share a tensor with another process.
//!
//! A failed allocation reaches PyTorch in the form its calling path checks: installed with
//! `change_current_allocator`, PyTorch uses the pointer unchecked, so `cachealloc_torch_malloc`
//! throws (`cxx_exception`); as the allocator of a `torch.cuda.MemPool`, PyTorch's own caching
//! allocator calls it and checks for NULL (raising its `OutOfMemoryError`, in some versions after
//! freeing what it caches and retrying: pytorch#159674), so `cachealloc_torch_mempool_malloc`
//! answers NULL. The other hooks return no code: they log their failures, a runtime error
//! included, at warn (`log_unreturned`), since PyTorch has no code to read.

use super::cxx_exception;
use super::status::{boundary, log_unreturned, oom_text, to_code};
use crate::backend::cuda::runtime::{self, codes};
use crate::global::{ShimError, api};
use crate::pool::{DeviceId, Error, StreamId};
use std::ffi::{c_int, c_void};

/// An allocation for PyTorch: the address, or the text of the failure (logged already; `None`
/// for an internal error, logged by the panic boundary). The runtime's last error is left clear,
/// as PyTorch's own allocator leaves it after a failed cudaMalloc.
fn allocate(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    call: &'static str,
) -> Result<u64, Option<String>> {
    let served = boundary(call, Err(None), || {
        match api::malloc(size, DeviceId(device), StreamId(stream as u64)) {
            Ok(addr) => Ok(addr),
            Err(e) => {
                let text = failure_text(&e, size, device);
                to_code(call, e);
                Err(Some(text))
            }
        }
    });
    if served.is_err()
        && let Some(rt) = runtime::runtime()
    {
        runtime::clear_last_error(rt);
    }
    served
}

/// What PyTorch's exception says: an out-of-memory report in full, as the log gives it; the
/// pool's own text for its other failures (a device the process does not have is named there,
/// with the devices it has); and for an out-of-memory answer of the runtime itself
/// (`CACHEALLOC_DISABLE=1`), the words OOM handlers look for.
fn failure_text(e: &ShimError, size: usize, device: c_int) -> String {
    match e {
        ShimError::Pool(Error::OutOfMemory(report)) => oom_text(report),
        ShimError::ConfigInvalid => {
            format!("{e} (the error was printed on stderr at the first CUDA call)")
        }
        ShimError::Runtime {
            code: codes::MEMORY_ALLOCATION,
            call,
        } => format!(
            "CUDA out of memory. Tried to allocate {size} bytes on device {device}: {call} \
             answered cudaErrorMemoryAllocation (2)"
        ),
        e => e.to_string(),
    }
}

/// PyTorch's `MallocFuncType`: `void* (size_t size, int device, cudaStream_t stream)`, for
/// `change_current_allocator`. A failure (out of memory, after its report is logged; a
/// configuration error; a device error) is thrown as a C++ `std::runtime_error` carrying the same
/// text, which PyTorch raises as a Python `RuntimeError`: on this path it does not check the
/// pointer, and a NULL one would become a tensor at address 0. Where no libstdc++ is loaded, a
/// failure answers NULL. For PyTorch's allocator only: a caller without a C++ handler around
/// the call (C, ctypes) is terminated by the C++ runtime when a failure is thrown.
#[unsafe(no_mangle)]
pub extern "C-unwind" fn cachealloc_torch_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    match allocate(size, device, stream, "cachealloc_torch_malloc") {
        Ok(addr) => addr as *mut c_void,
        Err(text) => {
            let text = text.unwrap_or_else(|| {
                "cachealloc_torch_malloc: internal error in cachealloc (logged)".to_string()
            });
            // SAFETY: PyTorch's allocator calls this function from C++ that handles the
            // exception as its own allocator's; this frame owns nothing once `text` is handed
            // over (it is dropped before the throw).
            unsafe { cxx_exception::throw_runtime_error(text) };
            std::ptr::null_mut()
        }
    }
}

/// The same allocation for a `torch.cuda.MemPool(alloc.allocator())`, whose caller checks for
/// NULL: a failure answers NULL (the report is logged), and PyTorch raises its own
/// `OutOfMemoryError` (some versions first free the blocks they cache and retry). Never throws.
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_torch_mempool_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    allocate(size, device, stream, "cachealloc_torch_mempool_malloc")
        .map_or(std::ptr::null_mut(), |addr| addr as *mut c_void)
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
            log_unreturned("cachealloc_torch_free", e);
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
            log_unreturned("cachealloc_torch_record_stream", e);
        }
    })
}

/// The hook for `set_base_alloc_fn`, `void* (void* ptr, size_t* size)`, which PyTorch's
/// `getBaseAllocation` calls when PyTorch 2.1 to 2.4 share a CUDA tensor with another process
/// (`torch.multiprocessing`): the start of the cachealloc segment that holds `ptr`, its size in
/// `*size`. PyTorch exports that start with `cudaIpcGetMemHandle` and sends the tensor's offset
/// from it, so the other process opens the tensor's own memory. Without the hook PyTorch exports
/// `ptr` itself with offset 0: a preloaded cachealloc refuses that handle, and the runtime's own
/// opens at the segment's start, another allocation's memory, read without an error. A pointer
/// in no segment of cachealloc's (NULL included) is answered with itself and `*size` left as it
/// was, as PyTorch does without the hook; so is memory of an expandable segment, which no IPC
/// handle can name (logged; PyTorch's `cudaIpcGetMemHandle` then fails, and it raises).
///
/// # Safety
/// `size` is NULL or valid for writing one `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachealloc_torch_base_alloc(
    ptr: *mut c_void,
    size: *mut usize,
) -> *mut c_void {
    let addr = ptr as u64;
    let segment = boundary(
        "cachealloc_torch_base_alloc",
        None,
        || match api::segment_of(addr) {
            Ok(Some(segment)) if segment.expandable => {
                log_unreturned(
                    "cachealloc_torch_base_alloc",
                    ShimError::NotExportable { addr, segment },
                );
                None
            }
            Ok(segment) => segment,
            Err(e) => {
                log_unreturned("cachealloc_torch_base_alloc", e);
                None
            }
        },
    );
    let Some(segment) = segment else {
        return ptr;
    };
    if !size.is_null() {
        // SAFETY: the caller passes NULL or a pointer valid for writing one size_t (PyTorch
        // passes its own local); NULL was excluded above.
        unsafe { *size = segment.size as usize };
    }
    segment.start as *mut c_void
}

/// The hook for `set_memory_fraction_fn`, `void (double fraction, int device)`, which
/// `torch.cuda.set_per_process_memory_fraction(fraction, device)` calls: `device`'s pool may
/// reserve `fraction` of the device's memory from its next request that needs more (as
/// `cachealloc_set_memory_fraction`). PyTorch checks the fraction first; a failure here is
/// logged.
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_torch_set_memory_fraction(fraction: f64, device: c_int) {
    boundary("cachealloc_torch_set_memory_fraction", (), || {
        if let Err(e) = api::set_memory_fraction(DeviceId(device), fraction) {
            log_unreturned("cachealloc_torch_set_memory_fraction", e);
        }
    })
}

/// The hook for `set_reset_fn`, `void (void)`, which `torch.cuda.empty_cache()` calls: every
/// device's fully free cached segments go back to the driver (after pending frees complete);
/// nothing happens during a CUDA graph capture that cachealloc follows, as with PyTorch's own
/// allocator (one begun through the preloaded library; see `cachealloc_empty_cache`).
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_torch_empty_cache() {
    boundary("cachealloc_torch_empty_cache", (), || {
        if let Err(e) = api::empty_cache_all() {
            log_unreturned("cachealloc_torch_empty_cache", e);
        }
    })
}
