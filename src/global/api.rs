//! The operations behind the C API (`cachealloc_*`) and the PyTorch pluggable-allocator entry
//! points. Devices and streams are explicit, as in PyTorch: a block belongs to the stream it was
//! allocated on and is reused only on that stream, so a free is immediate.
//!
//! With `CACHEALLOC_DISABLE=1` these pass through to the real runtime on the given device (a
//! request during a capture with the thread's capture mode relaxed, as when enabled).

use super::error::ShimError;
use super::interpose::{active, with_device_pool};
use super::pools::{self, Pool};
use super::reentry;
use super::stream_uses;
use super::trace_file;
use crate::backend::BackendError;
use crate::backend::cuda::captures;
use crate::backend::cuda::device_guard::DeviceGuard;
use crate::backend::cuda::runtime::{self, CudaError, Runtime, STREAM_PER_THREAD, codes, runtime};
use crate::backend::cuda::unread_error;
use crate::pool::layout::SegmentSpan;
use crate::pool::{DeviceId, DevicePtr, DeviceStats, Error, Settings, StreamId, check_fraction};
use std::ffi::c_void;

const DEVICE_RANGE: &str = "device ordinal out of range (0..63 have pools)";

fn inside() -> Result<reentry::Inside, ShimError> {
    reentry::enter().ok_or(ShimError::InvalidArgument(
        "cachealloc C API called from inside cachealloc",
    ))
}

fn real_runtime() -> Result<&'static Runtime, ShimError> {
    runtime().ok_or(ShimError::NoRuntime)
}

/// Allocate `size` bytes on `device` for `stream`; size 0 gives the null address (once the
/// configuration, the runtime and, on a device without a pool yet, the device are known good).
pub fn malloc(size: usize, device: DeviceId, stream: StreamId) -> Result<u64, ShimError> {
    let _inside = inside()?;
    let Some((config, rt)) = active()? else {
        let rt = real_runtime()?;
        // Relaxed as when enabled: the request's cudaMalloc is the library's, not the program's.
        let _relaxed = captures::RelaxedMode::enter(rt);
        return returned_only(rt, real_malloc(rt, size, device));
    };
    if !pools::has_pool(device) {
        // Checked before a pool is made: a device the process does not have gets no pool (and
        // so no statistics), and no failed cudaSetDevice is left as the program's last error.
        check_device(rt, device)?;
    }
    if size == 0 {
        return Ok(0);
    }
    let stream = block_stream(stream);
    let relaxed = captures::RelaxedMode::enter(rt);
    let served = with_device_pool(config, rt, device, |pool| pool.malloc(size as u64, stream));
    drop(relaxed);
    trace_file::flush();
    let served = served?.ok_or(ShimError::InvalidArgument(DEVICE_RANGE))?;
    returned_only(rt, served.map(DevicePtr::addr).map_err(ShimError::from))
}

/// The stream whose blocks serve a request of `stream`. `cudaStreamPerThread` names the calling
/// thread's own default stream, another one in each thread, whose work is not ordered with
/// another thread's: its blocks are kept apart per thread, under an address of the thread's own
/// (no stream handle is one while the thread lives). A thread started after one that exited may
/// get the same address, and with it the blocks the exited thread freed; work that thread left
/// queued on its stream is not waited for. And a `record_stream` of `cudaStreamPerThread` is
/// kept as that handle: the free waits on the per-thread stream of the thread that frees, which
/// is the recorded one only when that thread recorded it.
fn block_stream(stream: StreamId) -> StreamId {
    thread_local! {
        static OWN: u8 = const { 0 };
    }
    if stream.0 != STREAM_PER_THREAD as u64 {
        return stream;
    }
    OWN.with(|own| StreamId(std::ptr::from_ref(own) as u64))
}

/// Return an allocation of the C API to its pool at once. NULL is a no-op; a pointer that no
/// pool owns is `Error::NotOwned` (the C API does not forward).
pub fn free(addr: u64) -> Result<(), ShimError> {
    let _inside = inside()?;
    let Some(ptr) = DevicePtr::new(addr) else {
        return Ok(());
    };
    let Some((_, rt)) = active()? else {
        let rt = real_runtime()?;
        return returned_only(rt, real_free(rt, addr));
    };
    // A block recorded as used on other streams waits for their work (see `stream_uses`).
    if let Some(streams) = stream_uses::take(addr) {
        return free_recorded(rt, ptr, streams);
    }
    let freed = pools::with_owner(addr, |pool| pool.free(ptr));
    trace_file::flush();
    returned_only(rt, owned_free(addr, freed))
}

/// A free's outcome, where no pool owning the pointer is `Error::NotOwned` (the C API does not
/// forward).
fn owned_free(
    addr: u64,
    freed: Result<Option<Result<(), Error>>, ShimError>,
) -> Result<(), ShimError> {
    freed.and_then(|f| {
        f.unwrap_or(Err(Error::NotOwned { addr }))
            .map_err(ShimError::from)
    })
}

/// `free` of an allocation recorded as used on `streams`.
#[cold]
#[inline(never)]
fn free_recorded(rt: &Runtime, ptr: DevicePtr, streams: Vec<StreamId>) -> Result<(), ShimError> {
    let freed = stream_uses::free_recorded(ptr, streams, |pool, streams| {
        pool.free_after_streams(ptr, streams)
    });
    returned_only(rt, owned_free(ptr.addr(), freed))
}

/// The allocation at `addr` is used on `stream` as well as on its allocation stream: its free
/// will wait for the work issued on `stream` until then (see `stream_uses`). Its own stream and
/// NULL change nothing; a pointer inside a pool's segment that is not a live allocation there
/// (freed, or interior) is `Error::InvalidPointer`, one outside every pool `Error::NotOwned`.
pub fn record_stream(addr: u64, stream: StreamId) -> Result<(), ShimError> {
    let _inside = inside()?;
    let Some(ptr) = DevicePtr::new(addr) else {
        return Ok(());
    };
    if active()?.is_none() {
        return Ok(());
    }
    let allocated_on = pools::with_owner(addr, |pool| pool.allocation_stream(ptr))?
        .unwrap_or(Err(Error::NotOwned { addr }))?;
    if allocated_on != block_stream(stream) {
        stream_uses::record(addr, stream);
    }
    Ok(())
}

/// The segment that holds `addr`, for PyTorch's `getBaseAllocation`: an IPC handle names a whole
/// device allocation, so a tensor is shared as its segment's start and an offset. `None` for
/// NULL, a pointer no pool owns, and with the library disabled (where the runtime made each
/// allocation itself).
pub fn segment_of(addr: u64) -> Result<Option<SegmentSpan>, ShimError> {
    let _inside = inside()?;
    if addr == 0 || active()?.is_none() {
        return Ok(None);
    }
    Ok(pools::with_owner(addr, |pool| pool.segment_of(addr))?.flatten())
}

/// Release every fully free cached segment of every device that has a pool.
/// A device that fails does not keep the others from being emptied; the first error is returned.
pub fn empty_cache_all() -> Result<(), ShimError> {
    let mut first_error = Ok(());
    for device in pools::used_devices() {
        if let Err(e) = empty_cache(device)
            && first_error.is_ok()
        {
            first_error = Err(e);
        }
    }
    first_error
}

/// Release every fully free cached segment of `device`.
pub fn empty_cache(device: DeviceId) -> Result<(), ShimError> {
    let _inside = inside()?;
    let Some((_, rt)) = active()? else {
        return Ok(());
    };
    check_device(rt, device)?;
    let emptied = pools::with_pool(device, |pool| pool.empty_cache());
    trace_file::flush();
    returned_only(rt, emptied?.unwrap_or(Ok(())).map_err(ShimError::from))
}

/// Limit what `device`'s pool may reserve to `fraction` of the device's total memory (1 = no
/// limit), as `torch.cuda.set_per_process_memory_fraction` limits PyTorch's allocator: the next
/// request that needs memory from the device meets the new limit, and so does a pool made
/// later (the device's first allocation, or after a device reset). A fraction outside [0, 1]
/// is refused. With the library disabled there is no pool to limit.
pub fn set_memory_fraction(device: DeviceId, fraction: f64) -> Result<(), ShimError> {
    let _inside = inside()?;
    check_fraction(fraction)?;
    let Some((_, rt)) = active()? else {
        return Ok(());
    };
    check_device(rt, device)?;
    let set = pools::set_memory_fraction(device, fraction, |pool| match pool {
        Some(pool) => pool.set_memory_fraction(fraction),
        None => {
            // The pool made next starts with it and records nothing of it: noted here.
            trace_file::note_memory_fraction(device, fraction);
            Ok(())
        }
    });
    trace_file::flush();
    returned_only(rt, set?.unwrap_or(Ok(())).map_err(ShimError::from))
}

/// The C API reports a failure by its return code only: a runtime call of the pool's that
/// failed on the way (the code passed through) must not stay as the program's last error; nor,
/// with `CACHEALLOC_DISABLE=1`, the runtime's own answer to the call passed through (the
/// `cudaSetDevice` to the device asked for is the library's, not the program's).
fn returned_only<T>(rt: &Runtime, result: Result<T, ShimError>) -> Result<T, ShimError> {
    if let Err(
        ShimError::Runtime { .. } | ShimError::Pool(Error::Backend(BackendError::Device { .. })),
    ) = result
    {
        runtime::clear_last_error(rt);
    }
    result
}

/// `device` is an ordinal the runtime has (else `cudaErrorInvalidDevice`, 101, as the runtime's
/// `cudaSetDevice` answers) and one the pools cover. (Not the hot path: one
/// `cudaGetDeviceCount` each.)
fn check_device(rt: &Runtime, device: DeviceId) -> Result<(), ShimError> {
    if device.0 < 0 {
        return Err(ShimError::NoSuchDevice {
            device: device.0,
            count: None,
        });
    }
    let count = device_count(rt).map_err(|code| ShimError::Runtime {
        code,
        call: "cudaGetDeviceCount",
    })?;
    if device.0 >= count {
        return Err(ShimError::NoSuchDevice {
            device: device.0,
            count: Some(count),
        });
    }
    in_pool_range(device)
}

/// The runtime's device count, asked for the library's own purposes: a failure's error is not
/// left as the program's last error, and an error the program had not read is kept.
pub(super) fn device_count(rt: &Runtime) -> Result<std::ffi::c_int, CudaError> {
    let mut count: std::ffi::c_int = 0;
    unread_error::keep_unread(rt);
    // SAFETY: `count` is a valid out-pointer; this is the real runtime's cudaGetDeviceCount.
    let code = unsafe { (rt.get_device_count)(&mut count) };
    if code != codes::SUCCESS {
        runtime::clear_last_error(rt);
        return Err(code);
    }
    Ok(count)
}

/// `device` is one of the ordinals the pools cover: a negative one is no device at all (101),
/// one past the pools is refused as an argument.
fn in_pool_range(device: DeviceId) -> Result<(), ShimError> {
    if device.0 < 0 {
        return Err(ShimError::NoSuchDevice {
            device: device.0,
            count: None,
        });
    }
    match pools::epochs(device) {
        Some(_) => Ok(()),
        None => Err(ShimError::InvalidArgument(DEVICE_RANGE)),
    }
}

/// Statistics of `device` and its cached free bytes (zeros before its first allocation, and
/// when the library is disabled, with `max_split_size` as the settings give it: -1, no limit,
/// unless set).
pub fn stats(device: DeviceId) -> Result<(DeviceStats, u64), ShimError> {
    let _inside = inside()?;
    let unused = |settings: &Settings| {
        let max_split_size = if settings.has_max_split_size() {
            settings.max_split_size as i64
        } else {
            -1
        };
        let stats = DeviceStats {
            max_split_size,
            ..DeviceStats::default()
        };
        (stats, 0)
    };
    let Some((config, rt)) = active()? else {
        in_pool_range(device)?;
        return Ok(unused(&Settings::default()));
    };
    check_device(rt, device)?;
    let found = pools::with_pool(device, |pool| (pool.stats(), pool.cached_free_bytes()))?;
    Ok(found.unwrap_or_else(|| unused(&config.settings)))
}

/// Reset the peaks of `device`'s statistics to their current values.
pub fn reset_peak_stats(device: DeviceId) -> Result<(), ShimError> {
    reset_stats(device, Pool::reset_peak_stats, DeviceStats::forget_peaks)
}

/// Reset the running totals (`allocated`, `freed`) and event counts of `device`'s statistics.
pub fn reset_accumulated_stats(device: DeviceId) -> Result<(), ShimError> {
    reset_stats(
        device,
        Pool::reset_accumulated_stats,
        DeviceStats::forget_totals,
    )
}

/// Reset part of `device`'s statistics: `on_pool` in its pool, `on_ended` in those of the pools
/// device resets ended (their part of the run's figures, see `pools::note_ended`).
fn reset_stats(
    device: DeviceId,
    on_pool: fn(&mut Pool),
    on_ended: fn(&mut DeviceStats),
) -> Result<(), ShimError> {
    let _inside = inside()?;
    if let Some((_, rt)) = active()? {
        check_device(rt, device)?;
        pools::with_pool(device, on_pool)?;
        pools::with_ended(device, on_ended);
    }
    Ok(())
}

fn real_malloc(rt: &'static Runtime, size: usize, device: DeviceId) -> Result<u64, ShimError> {
    let _on_device = DeviceGuard::enter(rt, device).map_err(|code| ShimError::Runtime {
        code,
        call: "cudaSetDevice",
    })?;
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `ptr` is a valid out-pointer; this is the real runtime's cudaMalloc.
    let code = unsafe { (rt.malloc)(&mut ptr, size) };
    if code == codes::SUCCESS {
        Ok(ptr as u64)
    } else {
        Err(ShimError::Runtime {
            code,
            call: "cudaMalloc",
        })
    }
}

fn real_free(rt: &'static Runtime, addr: u64) -> Result<(), ShimError> {
    unread_error::keep_unread(rt);
    // SAFETY: the program's pointer goes to the real cudaFree, which validates it.
    let code = unsafe { (rt.free)(addr as *mut c_void) };
    if code == codes::SUCCESS {
        Ok(())
    } else {
        Err(ShimError::Runtime {
            code,
            call: "cudaFree",
        })
    }
}
