//! The interposed CUDA runtime functions. A program linked against `libcudart` calls these when
//! the library is preloaded (unversioned definitions satisfy `cudaMalloc@libcudart.so.12`).
//! Each one: panic boundary, argument check, one call into `global`, one code mapping.

use super::status::{boundary, to_code};
use crate::backend::cuda::runtime::{CudaError, codes};
use crate::global::{Routed, forward, interpose, last_error};
use std::ffi::{c_int, c_uint, c_void};

/// `cudaMalloc`: served from the current device's pool. A NULL out-pointer and size 0 are
/// forwarded (the runtime answers them); out of memory is 2 after the whole retry ladder.
///
/// # Safety
/// `dev_ptr` is NULL or valid for writing one pointer (the runtime's own contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMalloc(dev_ptr: *mut *mut c_void, size: usize) -> CudaError {
    boundary("cudaMalloc", codes::UNKNOWN, || {
        if dev_ptr.is_null() {
            // SAFETY: forwarded unchanged; the runtime rejects the NULL out-pointer itself.
            return unsafe { forward::malloc(dev_ptr, size) };
        }
        match interpose::cuda_malloc(size) {
            Ok(Routed::Pool(ptr)) => {
                // SAFETY: `dev_ptr` is non-null and, by the caller's contract, writable.
                unsafe { dev_ptr.write(ptr.addr() as *mut c_void) };
                codes::SUCCESS
            }
            // SAFETY: the program's own arguments, forwarded unchanged.
            Ok(Routed::Forward) => unsafe { forward::malloc(dev_ptr, size) },
            Err(e) => last_error::record(to_code("cudaMalloc", e)),
        }
    })
}

/// `cudaFree`: a pool pointer goes back to its owner device's pool; NULL and pointers the pools
/// do not own are forwarded untouched; a double free or an interior pointer is 1.
///
/// # Safety
/// None beyond the runtime's: `dev_ptr` is only compared with pool addresses or forwarded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaFree(dev_ptr: *mut c_void) -> CudaError {
    boundary("cudaFree", codes::UNKNOWN, || {
        match interpose::cuda_free(dev_ptr as u64) {
            Ok(Routed::Pool(())) => codes::SUCCESS,
            // SAFETY: the program's own pointer, forwarded unchanged.
            Ok(Routed::Forward) => unsafe { forward::free(dev_ptr) },
            Err(e) => last_error::record(to_code("cudaFree", e)),
        }
    })
}

/// `cudaDeviceSynchronize`: forwarded; on success every block freed on this device before the
/// call is ready for reuse.
#[unsafe(no_mangle)]
pub extern "C" fn cudaDeviceSynchronize() -> CudaError {
    boundary(
        "cudaDeviceSynchronize",
        codes::UNKNOWN,
        interpose::cuda_device_synchronize,
    )
}

/// `cudaDeviceEnablePeerAccess`: forwarded; when peer access is on after it (enabled now, or
/// already: 704, which programs such as PyTorch take as success), the peer's expandable
/// segments are opened to the current device too. The runtime's code is returned whatever
/// that bookkeeping meets.
#[unsafe(no_mangle)]
pub extern "C" fn cudaDeviceEnablePeerAccess(peer_device: c_int, flags: c_uint) -> CudaError {
    let code = boundary("cudaDeviceEnablePeerAccess", codes::UNKNOWN, || {
        forward::device_enable_peer_access(peer_device, flags)
    });
    if code == codes::SUCCESS || code == codes::PEER_ACCESS_ALREADY_ENABLED {
        boundary("cudaDeviceEnablePeerAccess", (), || {
            interpose::grant_peer_access(peer_device)
        });
    }
    code
}

/// `cudaIpcGetMemHandle`: forwarded, except for a pointer that a handle cannot name (inside a
/// segment past its start, or in an expandable segment): another process would open the
/// handle at the segment's start, not at the allocation, so the answer is 1 with a warning that
/// says why.
///
/// # Safety
/// None beyond the runtime's: `dev_ptr` is only compared with pool addresses, and both
/// arguments are forwarded unchanged.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaIpcGetMemHandle(
    handle: *mut c_void,
    dev_ptr: *mut c_void,
) -> CudaError {
    boundary("cudaIpcGetMemHandle", codes::UNKNOWN, || {
        match interpose::cuda_ipc_get_mem_handle(dev_ptr as u64) {
            // SAFETY: the program's own arguments, forwarded unchanged.
            Ok(()) => unsafe { forward::ipc_get_mem_handle(handle, dev_ptr) },
            Err(e) => last_error::record(to_code("cudaIpcGetMemHandle", e)),
        }
    })
}

/// `cudaDeviceReset`: drops the current device's pool (the reset takes its memory), then
/// forwards.
#[unsafe(no_mangle)]
pub extern "C" fn cudaDeviceReset() -> CudaError {
    boundary(
        "cudaDeviceReset",
        codes::UNKNOWN,
        interpose::cuda_device_reset,
    )
}

/// `cudaMemGetInfo`: forwarded; with `count_cached_as_free:True` the current device's cached
/// free bytes are added to `*free` (never beyond `*total`).
///
/// # Safety
/// `free` and `total` are NULL or valid for writing (the runtime's own contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudaMemGetInfo(free: *mut usize, total: *mut usize) -> CudaError {
    boundary("cudaMemGetInfo", codes::UNKNOWN, || {
        // SAFETY: the program's own out-pointers, forwarded unchanged.
        let code = unsafe { forward::mem_get_info(free, total) };
        if code != codes::SUCCESS || free.is_null() || total.is_null() {
            return code;
        }
        let extra = interpose::cached_free_bytes_for_mem_info();
        if extra > 0 {
            // SAFETY: both pointers are non-null and the runtime has just written them.
            unsafe {
                let sum = (*free).saturating_add(extra as usize);
                free.write(sum.min(*total));
            }
        }
        code
    })
}

/// `cudaGetLastError`: the calling thread's last error, the runtime's or one an interposed call
/// answered itself (whichever came last), then cleared.
#[unsafe(no_mangle)]
pub extern "C" fn cudaGetLastError() -> CudaError {
    boundary("cudaGetLastError", codes::UNKNOWN, last_error::take)
}

/// `cudaPeekAtLastError`: the same error as `cudaGetLastError`, not cleared.
#[unsafe(no_mangle)]
pub extern "C" fn cudaPeekAtLastError() -> CudaError {
    boundary("cudaPeekAtLastError", codes::UNKNOWN, last_error::peek)
}
