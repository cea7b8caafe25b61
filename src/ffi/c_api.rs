//! The C API for programs that link `libcachealloc` directly (`include/cachealloc.h`).
//!
//! Devices and streams are explicit, as in PyTorch: a block belongs to the stream it was
//! allocated on and is reused only on that stream, so `cachealloc_free` returns it at once.
//! Functions answer `cudaError_t` codes (0 = success), and report a failure by the code only: the
//! thread's last CUDA error is left as it was. With `CACHEALLOC_DISABLE=1` allocation and
//! free go straight to the real runtime.

use super::stats::CacheallocStats;
use super::status::{boundary, to_code};
use crate::backend::cuda::runtime::codes;
use crate::global::{ShimError, api};
use crate::pool::{DeviceId, StreamId};
use std::ffi::{c_char, c_int, c_void};

/// Allocate `size` bytes on `device` for use on `stream` (a `cudaStream_t`, NULL = the default
/// stream). Size 0 stores NULL and succeeds, once the configuration, the runtime and the device
/// check out as for any size. Out of memory: 2 (`cudaErrorMemoryAllocation`), with the report
/// logged; a device the process does not have: 101 (`cudaErrorInvalidDevice`); `*ptr` is left
/// unchanged on any error. During a CUDA graph capture that cachealloc follows (see
/// `cachealloc_empty_cache`), a request no cached block serves takes new memory with
/// `cudaMalloc` (no synchronization, no memory given back), with the calling thread's capture
/// mode relaxed for the request (`cudaThreadExchangeStreamCaptureMode`; its mode is restored
/// after), as PyTorch's allocator relaxes it for its own `cudaMalloc`: a capture in the global
/// or thread-local mode would otherwise refuse the call and end. Memory that a captured graph
/// uses must stay allocated while the graph may be launched: there is no private pool per
/// graph, and a block freed is handed to the next request of its stream.
///
/// # Safety
/// `ptr` is NULL (answered with 1) or valid for writing one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachealloc_malloc(
    ptr: *mut *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    boundary("cachealloc_malloc", codes::UNKNOWN, || {
        if ptr.is_null() {
            return to_code(
                "cachealloc_malloc",
                ShimError::InvalidArgument("ptr is NULL"),
            );
        }
        match api::malloc(size, DeviceId(device), StreamId(stream as u64)) {
            Ok(addr) => {
                // SAFETY: `ptr` is non-null and writable by the caller's contract.
                unsafe { ptr.write(addr as *mut c_void) };
                codes::SUCCESS
            }
            Err(e) => to_code("cachealloc_malloc", e),
        }
    })
}

/// Return memory from `cachealloc_malloc` to its pool (immediately reusable on its stream,
/// unless it was recorded with `cachealloc_record_stream`).
/// NULL is a no-op; a pointer cachealloc does not own, a double free or an interior pointer is
/// 1 (`cudaErrorInvalidValue`) and changes nothing.
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_free(ptr: *mut c_void) -> c_int {
    boundary("cachealloc_free", codes::UNKNOWN, || {
        api::free(ptr as u64).map_or_else(|e| to_code("cachealloc_free", e), |()| codes::SUCCESS)
    })
}

/// Record that the allocation at `ptr` is also used by work on `stream` (PyTorch's
/// `Tensor.record_stream`), a stream that stays alive until the allocation is freed. Its
/// `cachealloc_free` then records an event on each recorded stream, and the block is reused
/// once they have completed, as with PyTorch's allocator, whatever `free_sync` says: the pool
/// obtains new memory rather than wait for them (a synchronization it makes anyway, as in its
/// out-of-memory retry or `cachealloc_empty_cache`, completes them). A free during a CUDA graph
/// capture that cachealloc follows records them only once no capture is underway, at the
/// device's next request or synchronization, as PyTorch's allocator defers them (an event
/// recorded on a capturing stream can never be queried, and one on the legacy stream ends the
/// capture of a blocking stream): the recorded streams must then stay alive until that
/// request, or be destroyed with the `cudaStreamDestroy` that cachealloc interposes (preloaded,
/// or linked before the runtime), which records the stream's event first. A stream of another
/// device gets an event of that device (with a runtime older than CUDA 12.8, which cannot name
/// a stream's device, it is not waited for, and the free logs a warning). The program's own
/// `cudaFree` of it waits for the recorded streams too, and, as any interposed `cudaFree`, for
/// the `free_sync` policy's fence. Its own stream or NULL `ptr`:
/// nothing to do, 0. A pointer that is not a live allocation of cachealloc: 1
/// (`cudaErrorInvalidValue`; checked while the library is active — under
/// `CACHEALLOC_DISABLE=1` this does nothing and answers 0).
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_record_stream(ptr: *mut c_void, stream: *mut c_void) -> c_int {
    boundary("cachealloc_record_stream", codes::UNKNOWN, || {
        api::record_stream(ptr as u64, StreamId(stream as u64)).map_or_else(
            |e| to_code("cachealloc_record_stream", e),
            |()| codes::SUCCESS,
        )
    })
}

/// Release every fully free cached segment of `device` to the driver (after waiting for pending
/// frees), like `torch.cuda.empty_cache()`; during a CUDA graph capture it does nothing and
/// answers 0, as PyTorch's leaves its pools alone then. cachealloc follows the captures begun
/// through its own `cudaStreamBeginCapture`: those of a program that preloads it, or links it
/// before `libcudart`. Where the program's call reaches the runtime directly (`-lcudart`
/// first, or the library loaded by `ctypes` alone), a capture is not seen: this call, like a
/// request's out-of-memory retry, then synchronizes the device and frees memory, which ends
/// the capture. A device the process does not have: 101 (`cudaErrorInvalidDevice`; checked
/// while the library is active, not under `CACHEALLOC_DISABLE=1`).
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_empty_cache(device: c_int) -> c_int {
    boundary("cachealloc_empty_cache", codes::UNKNOWN, || {
        api::empty_cache(DeviceId(device)).map_or_else(
            |e| to_code("cachealloc_empty_cache", e),
            |()| codes::SUCCESS,
        )
    })
}

/// Limit what `device`'s pool may reserve to `fraction` of the device's total memory, as
/// `torch.cuda.set_per_process_memory_fraction` limits PyTorch's allocator (1 = no limit, the
/// default unless `per_process_memory_fraction` is configured). The next request that needs
/// memory from the device meets the new limit — a request the cache cannot serve within it
/// gets 2 (`cudaErrorMemoryAllocation`), after the cached segments are released as in any
/// out-of-memory retry — and so does a pool made later (after a `cudaDeviceReset`); memory
/// already reserved stays. `garbage_collection_threshold` acts only while a limit is set. A
/// fraction outside [0, 1] (or NaN): 1 (`cudaErrorInvalidValue`); a device the process does not
/// have: 101 (`cudaErrorInvalidDevice`; checked while the library is active — under
/// `CACHEALLOC_DISABLE=1` there is no pool to limit and a valid fraction answers 0).
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_set_memory_fraction(device: c_int, fraction: f64) -> c_int {
    boundary("cachealloc_set_memory_fraction", codes::UNKNOWN, || {
        api::set_memory_fraction(DeviceId(device), fraction).map_or_else(
            |e| to_code("cachealloc_set_memory_fraction", e),
            |()| codes::SUCCESS,
        )
    })
}

/// Fill `*out` with the statistics of `device`. Set `out->size = sizeof(CacheallocStats)`
/// first: only fields that fit in that size are written; `size` and `version` are written back.
/// A NULL `out` or a `size` below 8: 1 (`cudaErrorInvalidValue`); a device the process does
/// not have: 101 (`cudaErrorInvalidDevice`; checked while the library is active).
///
/// # Safety
/// `out` is NULL or points to at least `out->size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachealloc_get_stats(device: c_int, out: *mut CacheallocStats) -> c_int {
    boundary("cachealloc_get_stats", codes::UNKNOWN, || {
        if out.is_null() {
            return to_code(
                "cachealloc_get_stats",
                ShimError::InvalidArgument("out is NULL"),
            );
        }
        // SAFETY: `out` is non-null and its first field is readable by the caller's contract.
        let caller_size = unsafe { (*out.cast::<u32>()).to_owned() };
        let Some(len) = CacheallocStats::fill_len(caller_size) else {
            return to_code(
                "cachealloc_get_stats",
                ShimError::InvalidArgument("out->size must be at least 8 (set it to sizeof)"),
            );
        };
        match api::stats(DeviceId(device)) {
            Ok((stats, cached)) => {
                let mut full = CacheallocStats::from_stats(&stats, cached);
                full.size = len as u32;
                // SAFETY: `len` ≤ both the caller's declared size and our struct's size; the
                // regions cannot overlap (`full` is a local).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (&full as *const CacheallocStats).cast::<u8>(),
                        out.cast::<u8>(),
                        len,
                    );
                }
                codes::SUCCESS
            }
            Err(e) => to_code("cachealloc_get_stats", e),
        }
    })
}

/// Write the statistics of `device` as JSON (PyTorch's `memory_stats()` keys) into `buf`, like
/// `snprintf`: at most `len - 1` bytes plus a terminating NUL when `len > 0`. Returns the length
/// of the whole JSON text without the NUL (call with `len = 0` to size the buffer), or 0 when
/// there are no statistics to give: a device the process does not have (checked while the
/// library is active), a configuration error, no CUDA runtime in the process.
/// `cachealloc_get_stats` returns the reason as a code.
///
/// # Safety
/// `buf` is valid for writing `len` bytes (it may be NULL when `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachealloc_stats_json(
    device: c_int,
    buf: *mut c_char,
    len: usize,
) -> usize {
    boundary("cachealloc_stats_json", 0, || {
        let text = match api::stats(DeviceId(device)) {
            Ok((stats, _)) => crate::report::stats_json_string(&stats),
            Err(e) => {
                to_code("cachealloc_stats_json", e);
                String::new()
            }
        };
        if !buf.is_null() && len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: `n + 1 ≤ len` bytes are written into `buf`, valid for `len` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                buf.add(n).write(0);
            }
        }
        text.len()
    })
}

/// Reset the peak values of `device`'s statistics to their current values. A device the process
/// does not have: 101 (`cudaErrorInvalidDevice`; checked while the library is active).
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_reset_peak_stats(device: c_int) -> c_int {
    boundary("cachealloc_reset_peak_stats", codes::UNKNOWN, || {
        api::reset_peak_stats(DeviceId(device)).map_or_else(
            |e| to_code("cachealloc_reset_peak_stats", e),
            |()| codes::SUCCESS,
        )
    })
}

/// Reset the running totals of `device`'s statistics (each stat's `allocated` and `freed`, and
/// the counts such as `num_device_alloc`, `num_alloc_retries` and `num_ooms`) to zero, as
/// PyTorch's `reset_accumulated_memory_stats`; current values and peaks stay. A device the
/// process does not have: 101 (`cudaErrorInvalidDevice`; checked while the library is active).
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_reset_accumulated_stats(device: c_int) -> c_int {
    boundary("cachealloc_reset_accumulated_stats", codes::UNKNOWN, || {
        api::reset_accumulated_stats(DeviceId(device)).map_or_else(
            |e| to_code("cachealloc_reset_accumulated_stats", e),
            |()| codes::SUCCESS,
        )
    })
}

/// The library version, a static NUL-terminated string such as "0.1.0".
#[unsafe(no_mangle)]
pub extern "C" fn cachealloc_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
