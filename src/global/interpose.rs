//! What the interposed runtime calls do, decided here and carried out by `ffi`: serve from a
//! pool, or forward to the real runtime untouched.

use super::error::ShimError;
use super::forward;
use super::init::{Mode, mode};
use super::peer_notice;
use super::pools::{self, Pool};
use super::reentry;
use super::stream_uses;
use super::trace_file;
use crate::backend::Backend;
use crate::backend::cuda::captures;
use crate::backend::cuda::device_guard::current_device;
use crate::backend::cuda::epoch::SyncEpochs;
use crate::backend::cuda::events::EventFences;
use crate::backend::cuda::runtime::{
    CudaError, Runtime, STREAM_LEGACY, clear_last_error, codes, runtime,
};
use crate::backend::cuda::unread_error;
use crate::backend::cuda::{CudaBackend, FencePolicy};
use crate::config::{Config, FreeSync};
use crate::pool::{DeviceAllocator, DeviceId, DevicePtr, StreamId};
use crate::trace::record::buffer::DeviceSink;
use std::ffi::c_int;

/// Where an interposed call goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Routed<T> {
    /// Served by cachealloc.
    Pool(T),
    /// To be forwarded to the real runtime with the program's own arguments.
    Forward,
}

/// The active configuration and the real runtime; `Ok(None)` when the library passes through.
pub(super) fn active() -> Result<Option<(&'static Config, &'static Runtime)>, ShimError> {
    match mode() {
        Mode::PassThrough => Ok(None),
        Mode::ConfigFailed => Err(ShimError::ConfigInvalid),
        Mode::Active(config) => runtime()
            .map(|rt| Some((&**config, rt)))
            .ok_or(ShimError::NoRuntime),
    }
}

/// Run `f` on the pool of `device`, made first if the device has none. The pool is made before
/// the pool lock is taken (enabling expandable segments may load the driver library), and a
/// warning about it is logged once the lock is released.
#[inline]
pub(super) fn with_device_pool<R>(
    config: &Config,
    rt: &'static Runtime,
    device: DeviceId,
    f: impl FnOnce(&mut Pool) -> R,
) -> Result<Option<R>, ShimError> {
    if pools::is_live(device) {
        return pools::with_pool_or_create(device, || made_under_lock(config, rt, device), f);
    }
    with_new_device_pool(config, rt, device, f)
}

/// A pool made under the lock: another thread dropped the device's pool (a device reset) after
/// `with_device_pool` saw it. Nothing is logged here (the lock is held).
#[cold]
#[inline(never)]
fn made_under_lock(config: &Config, rt: &'static Runtime, device: DeviceId) -> Pool {
    new_pool(config, rt, device).installed(device)
}

/// `with_device_pool` for a device with no pool yet.
#[cold]
#[inline(never)]
fn with_new_device_pool<R>(
    config: &Config,
    rt: &'static Runtime,
    device: DeviceId,
    f: impl FnOnce(&mut Pool) -> R,
) -> Result<Option<R>, ShimError> {
    let made = new_pool(config, rt, device);
    let why = made.unsupported.clone();
    let mut used = false;
    let served = pools::with_pool_or_create(
        device,
        || {
            used = true;
            made.installed(device)
        },
        f,
    );
    // (When another thread made the pool first, that thread reports about it; a pool made
    // again after a device reset does not repeat it.)
    match (why, used) {
        (Some(why), true) if first_unsupported(device) => log_event!(
            warn,
            "{}: expandable_segments:True is not supported on device {}: {why}; using fixed \
             segments there (PyTorch's native policy: one cudaMalloc per segment)",
            config.source.name(),
            device.0
        ),
        // Only a pool with expandable segments maps pages another device must be granted.
        (None, true) if config.settings.expandable_segments => {
            peer_notice::warn_once_if_unseen(rt, device, config.source.name())
        }
        _ => {}
    }
    served
}

/// The devices whose lack of expandable segments was said (once per device and process, as
/// PyTorch's `TORCH_WARN_ONCE` says it).
static UNSUPPORTED_SAID: std::sync::Mutex<Vec<DeviceId>> = std::sync::Mutex::new(Vec::new());

/// Whether `device`'s lack of expandable segments is said now for the first time.
fn first_unsupported(device: DeviceId) -> bool {
    let mut said = UNSUPPORTED_SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said.contains(&device) {
        return false;
    }
    said.push(device);
    true
}

/// A pool made for a device, not yet its device's.
struct MadePool {
    pool: Pool,
    /// Why it could not have the expandable segments the settings ask for.
    unsupported: Option<String>,
    /// The device's total memory, when a trace is recorded.
    memory: Option<u64>,
    /// Where its events go, when a trace is recorded (attached once it is its device's).
    sink: Option<DeviceSink>,
}

impl MadePool {
    /// The pool, now its device's: a memory fraction the program set for the device is in
    /// force (before the pool records its events: the call was recorded when it was made), and
    /// a recording notes the device's memory (for a faithful replay: it sizes the ranges of
    /// expandable segments and the limit of a memory fraction, which the pool's events do not
    /// show). A pool another thread made first is dropped without a note.
    fn installed(mut self, device: DeviceId) -> Pool {
        if let Some(fraction) = pools::memory_fraction(device) {
            // (Checked when the program set it: nothing to refuse.)
            let _ = self.pool.set_memory_fraction(fraction);
        }
        if let Some(total) = self.memory {
            trace_file::note_device_memory(device, total);
        }
        if let Some(sink) = self.sink {
            self.pool.set_event_sink(Some(Box::new(sink)));
        }
        self.pool
    }
}

/// A new pool for `device` with the configured settings and `free_sync` policy.
fn new_pool(config: &Config, rt: &'static Runtime, device: DeviceId) -> MadePool {
    let fences = match (config.free_sync, pools::epochs(device)) {
        (FreeSync::Device, Some(epochs)) => FencePolicy::DeviceSync(epochs),
        (FreeSync::Device, None) | (FreeSync::Event, _) => {
            FencePolicy::LegacyStreamEvent(EventFences::default())
        }
        (FreeSync::None, _) => FencePolicy::Immediate,
    };
    let mut backend = CudaBackend::new(rt, device, fences);
    let unsupported = if config.settings.expandable_segments {
        match pools::peers(device) {
            Some(peers) => backend.enable_expandable_segments(peers).err(),
            None => Some("the device has no pool slot".to_string()),
        }
    } else {
        None
    };
    let sink = trace_file::sink(device);
    let memory = sink
        .as_ref()
        .and_then(|_| backend.mem_info().ok())
        .map(|info| info.total);
    MadePool {
        pool: DeviceAllocator::new(backend, config.settings.clone()),
        unsupported,
        memory,
        sink,
    }
}

fn runtime_error(call: &'static str) -> impl Fn(CudaError) -> ShimError {
    move |code| ShimError::Runtime { code, call }
}

/// `cudaMalloc(&p, size)` with a valid out-pointer: a block of the current device's pool.
/// Size 0 is forwarded (the runtime answers success with a NULL pointer).
pub fn cuda_malloc(size: usize) -> Result<Routed<DevicePtr>, ShimError> {
    let Some(_inside) = reentry::enter() else {
        return Ok(Routed::Forward);
    };
    let Some((config, rt)) = active()? else {
        return Ok(Routed::Forward);
    };
    if size == 0 {
        return Ok(Routed::Forward);
    }
    let device = current_device(rt).map_err(runtime_error("cudaGetDevice"))?;
    let served = with_device_pool(config, rt, device, |pool| {
        pool.malloc(size as u64, StreamId(0))
    });
    trace_file::flush();
    match served? {
        Some(result) => Ok(Routed::Pool(result?)),
        None => Ok(Routed::Forward),
    }
}

/// `cudaFree(ptr)`: a pointer of a pool goes back to its owner (whatever device is current),
/// pending until its fence under the `device` and `event` policies; NULL and foreign pointers
/// are forwarded. A double free or an interior pointer is an error and leaves the pool intact.
pub fn cuda_free(addr: u64) -> Result<Routed<()>, ShimError> {
    let Some(_inside) = reentry::enter() else {
        return Ok(Routed::Forward);
    };
    // Passing through or misconfigured: forwarded, so memory obtained elsewhere can be released.
    // (Matched on the mode itself, not on `active()`'s error, so that no error value is built
    // and dropped on this path.)
    let config = match mode() {
        Mode::Active(config) if runtime().is_some() => &**config,
        Mode::Active(_) => return Err(ShimError::NoRuntime),
        Mode::PassThrough | Mode::ConfigFailed => return Ok(Routed::Forward),
    };
    let Some(ptr) = DevicePtr::new(addr) else {
        return Ok(Routed::Forward);
    };
    // A record of other streams' use (C API, pluggable allocator) ends with the allocation.
    if let Some(streams) = stream_uses::take(addr) {
        return cuda_free_recorded(config, ptr, streams);
    }
    let immediate = config.free_sync == FreeSync::None;
    let freed = pools::with_owner(addr, |pool| {
        if immediate {
            pool.free(ptr)
        } else {
            pool.free_deferred(ptr)
        }
    });
    trace_file::flush();
    match freed? {
        Some(result) => Ok(Routed::Pool(result?)),
        // Memory of a pool dropped for a reset that failed: still in use around it.
        None if pools::is_retired(addr) => Ok(Routed::Pool(())),
        None => Ok(Routed::Forward),
    }
}

/// `cudaFree` of an allocation recorded as used on `streams`: it waits for the policy's fence and
/// for those streams too (under `device`, the device-wide synchronization, which the pool makes
/// before growing as for any cudaFree, covers every stream of the block's device; the streams'
/// events are then waited for only on another device's streams).
#[cold]
#[inline(never)]
fn cuda_free_recorded(
    config: &Config,
    ptr: DevicePtr,
    streams: Vec<StreamId>,
) -> Result<Routed<()>, ShimError> {
    let freed = stream_uses::free_recorded(ptr, streams, |pool, streams| match config.free_sync {
        FreeSync::Device => pool.free_deferred_after_streams(ptr, streams),
        FreeSync::Event => {
            let legacy = StreamId(STREAM_LEGACY as u64);
            let with_legacy: Vec<StreamId> = streams.iter().copied().chain([legacy]).collect();
            pool.free_after_streams(ptr, &with_legacy)
        }
        FreeSync::None => pool.free_after_streams(ptr, streams),
    });
    match freed? {
        Some(result) => Ok(Routed::Pool(result?)),
        None => Ok(Routed::Forward),
    }
}

/// `cudaDeviceSynchronize()`: forwarded; when it succeeds, every block freed on the current
/// device before it started is ready for reuse.
pub fn cuda_device_synchronize() -> CudaError {
    let pooled = reentry::enter().and_then(|_inside| {
        let (_, rt) = active().ok().flatten()?;
        let device = current_device(rt).ok()?;
        Some((device, pools::epochs(device)?))
    });
    match pooled {
        Some((device, epochs)) => synchronize_completing(device, epochs),
        None => forward::device_synchronize(),
    }
}

/// The real `cudaDeviceSynchronize()` of `device` (the current one); when it succeeds, every
/// free of `device` made before it began is complete (`epochs` marks when it began).
fn synchronize_completing(device: DeviceId, epochs: &SyncEpochs) -> CudaError {
    let ticket = epochs.begin();
    let code = forward::device_synchronize();
    if code == codes::SUCCESS {
        epochs.end(ticket);
        complete_pending(device);
    }
    code
}

/// Before the program begins a CUDA graph capture: when frees of the current device still wait
/// for the device (`free_sync`), it is synchronized now, while that is allowed, and they are
/// complete, as after the program's own `cudaDeviceSynchronize()`. During the capture a
/// synchronization would end it, so their blocks could not be reused until it ends: its requests
/// would take new memory beside them, or fail on a full device. `torch.cuda.graph` gives
/// PyTorch's whole cache back (`empty_cache()`, a `cudaFree` of each segment) just after it
/// synchronizes and just before it begins the capture. Nothing is done when no free waits,
/// when another capture is underway (the synchronization would end it), or when another thread
/// holds the pool; a failed synchronization leaves the program's last error as it was.
pub fn complete_pending_before_capture() {
    let ready = reentry::enter().and_then(|_inside| {
        let (_, rt) = active().ok().flatten()?;
        let device = current_device(rt).ok()?;
        // Asked first: during another capture even an event query may end it.
        if !pools::is_live(device) || captures::underway(rt) {
            return None;
        }
        // Those whose fences are done already need no synchronization (free_sync:event).
        let waiting = pools::try_with_pool(device, |pool| {
            pool.process_pending().is_err() || pool.pending_frees() > 0
        })?;
        trace_file::flush();
        waiting.then_some((rt, device, pools::epochs(device)?))
    });
    let Some((rt, device, epochs)) = ready else {
        return;
    };
    unread_error::keep_unread(rt);
    if synchronize_completing(device, epochs) != codes::SUCCESS {
        clear_last_error(rt);
    }
}

/// The frees of `device` that were waiting for device work are complete after a device-wide
/// synchronization: they go back to the pool now, not at its next call, so that a run ending
/// here reports them freed in its statistics and trace (a `device_synchronize` line, then
/// their `free_completed`s: a replay completes there what its own pool was left to complete).
/// Skipped when another thread holds the pool: its call (or the pool's next) completes them.
fn complete_pending(device: DeviceId) {
    let Some(_inside) = reentry::enter() else {
        return;
    };
    let completed = pools::try_with_pool(device, |pool| pool.device_synchronized());
    trace_file::flush();
    if let Some(Err(e)) = completed {
        log_event!(
            debug,
            "cudaDeviceSynchronize: completing pending frees: {e}"
        );
    }
}

/// `cudaDeviceReset()`: the current device's pool is dropped (its memory goes with the reset,
/// nothing is freed one by one; the events it recorded on other devices' streams are destroyed),
/// and other devices' pools set aside their events of this device, which the reset destroys;
/// then the reset is forwarded, and those events count as complete if it succeeded.
pub fn cuda_device_reset() -> CudaError {
    let mut reset_device = None;
    let dropped = reentry::enter().and_then(|_inside| {
        let (_, rt) = active().ok().flatten()?;
        let device = current_device(rt).ok()?;
        reset_device = Some(device);
        captures::resetting(rt, device);
        with_other_pools(device, |backend| backend.begin_reset_of(device));
        let mut pool = pools::take(device)?;
        pools::note_ended(device, pool.stats());
        pool.backend_mut().destroy_events_elsewhere();
        pool.backend_mut().release_expandable_segments();
        stream_uses::forget(|addr| pool.contains(addr));
        trace_file::note_device_reset(device);
        Some((device, pool))
    });
    // The segments of the dropped pool, should the reset fail: the fixed ones stay allocated,
    // the expandable ones' memory was released above (a reset does not free it).
    let mut segments = Vec::new();
    let mut released = Vec::new();
    if let Some((device, pool)) = dropped {
        log_event!(
            debug,
            "cudaDeviceReset: dropping the pool of device {} ({} bytes reserved)",
            device.0,
            pool.stats().reserved_bytes.all.current
        );
        for s in pool.segments() {
            let range = (s.addr, s.addr + s.size);
            if s.expandable {
                released.push(range);
            } else {
                segments.push(range);
            }
        }
        drop(pool);
        trace_file::flush();
    }
    let code = forward::device_reset();
    if let Some(device) = reset_device
        && let Some(_inside) = reentry::enter()
    {
        let happened = code == codes::SUCCESS;
        with_other_pools(device, |backend| backend.end_reset_of(device, happened));
        if happened {
            pools::forget_peers(device);
            pools::forget_retired(device);
        } else if !segments.is_empty() || !released.is_empty() {
            log_event!(
                warn,
                "cudaDeviceReset failed with CUDA error {code} after cachealloc had let go of \
                 device {}'s pool: {}; cudaFree of an allocation in them does nothing",
                device.0,
                left_behind(segments.len(), released.len())
            );
            segments.extend(released);
            pools::retire_segments(device, segments);
        }
    }
    code
}

/// What a failed reset leaves of the pool cachealloc let go of: `fixed` segments still
/// allocated, and `expandable` ones whose memory it released before the reset.
fn left_behind(fixed: usize, expandable: usize) -> String {
    let stay = match fixed {
        0 => None,
        1 => Some("its segment stays".to_string()),
        n => Some(format!("its {n} segments stay")),
    };
    let stay = stay.map(|s| format!("{s} allocated until the process ends or the device is reset"));
    let gone = match expandable {
        0 => None,
        1 => Some("its expandable segment".to_string()),
        n => Some(format!("its {n} expandable segments")),
    };
    let gone = gone.map(|s| {
        format!(
            "the memory of {s} was released before the reset (a reset does not free it), so the \
             allocations in it are gone: do not use them"
        )
    });
    [stay, gone]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ")
}

/// `cudaIpcGetMemHandle` of `addr`: `Ok` to forward, or why the runtime's handle would not name
/// the allocation at `addr`. The handle names the whole device allocation holding `addr` and
/// another process opens it at its start: right for the start of a fixed segment (the handle
/// shares the rest of the segment too, as the runtime's own sub-allocations do), wrong anywhere
/// else in it. Memory of expandable segments has no such handle at all (the runtime would
/// refuse it with less of an explanation).
pub fn cuda_ipc_get_mem_handle(addr: u64) -> Result<(), ShimError> {
    let Some(_inside) = reentry::enter() else {
        return Ok(());
    };
    if !matches!(active(), Ok(Some(_))) {
        return Ok(());
    }
    // A pool found broken on the way leaves the owner unknown: the runtime answers.
    match pools::with_owner(addr, |pool| pool.segment_of(addr)) {
        Ok(Some(Some(segment))) if segment.expandable || segment.start != addr => {
            Err(ShimError::NotExportable { addr, segment })
        }
        _ => Ok(()),
    }
}

/// After `cudaDeviceEnablePeerAccess(peer)` left peer access on: the current device may use
/// `peer`'s memory, so `peer`'s expandable segments (mapped memory, which peer access alone
/// does not open) grant it access: the pages mapped so far now, later ones as they are mapped.
/// Repeating it changes nothing.
pub fn grant_peer_access(peer: c_int) {
    let Some(_inside) = reentry::enter() else {
        return;
    };
    let Ok(Some((_, rt))) = active() else {
        return;
    };
    let (owner, Ok(device)) = (DeviceId(peer), current_device(rt)) else {
        return;
    };
    if !pools::add_peer(owner, device) {
        return;
    }
    let granted = pools::with_pool(owner, |pool| pool.backend_mut().grant_peer_access(device));
    if let Ok(Some(Err(e))) = granted {
        log_event!(
            warn,
            "cudaDeviceEnablePeerAccess: device {} may not reach the expandable segments of \
             device {peer} mapped so far: {e}",
            device.0
        );
    }
}

/// Run `f` on the backend of every pool but `device`'s (tensors of theirs may be recorded on its
/// streams), one pool lock at a time.
fn with_other_pools(device: DeviceId, f: impl Fn(&mut CudaBackend)) {
    for other in pools::used_devices().filter(|&d| d != device) {
        let _ = pools::with_pool(other, |pool| f(pool.backend_mut()));
    }
}

/// Bytes to add to `cudaMemGetInfo`'s free memory: with `count_cached_as_free:True`, the
/// current device's cached free blocks (not blocks whose free is still pending).
pub fn cached_free_bytes_for_mem_info() -> u64 {
    let Some(_inside) = reentry::enter() else {
        return 0;
    };
    let Ok(Some((config, rt))) = active() else {
        return 0;
    };
    if !config.count_cached_as_free {
        return 0;
    }
    let Ok(device) = current_device(rt) else {
        return 0;
    };
    // Blocks whose fence has completed count too: move them back to their pools first.
    let cached = pools::with_pool(device, |pool| {
        let _ = pool.process_pending();
        pool.cached_free_bytes()
    });
    trace_file::flush();
    cached.ok().flatten().unwrap_or(0)
}
