//! The real device: segments from the real `cudaMalloc`/`cudaFree`, memory info from the real
//! `cudaMemGetInfo`, and fences for the `free_sync` policies.
//!
//! Every call runs on the backend's own device, switching the calling thread's current device
//! for the duration of the call when another one is current (`device_guard`). An out-of-memory
//! answer of the real `cudaMalloc` leaves a sticky last error in the runtime; the backend clears
//! it before reporting `OutOfMemory`, because the pool recovers from it (and PyTorch checks
//! `cudaGetLastError()` before every allocation); an error the program had not read is kept
//! first (`unread_error`, on entering the device). Any other error is reported with the
//! runtime's code and passed to the program unchanged.
//!
//! Dropping a backend makes no CUDA call (it happens on `cudaDeviceReset`, which destroys the
//! device's events and memory itself, and never at exit).

pub mod captures;
pub mod device_guard;
pub mod driver;
pub mod epoch;
pub mod events;
pub mod loader;
pub mod notices;
pub mod runtime;
pub mod stream_events;
pub mod unread_error;
pub mod vmm;

use super::{Backend, BackendError, Fence, MemInfo, StreamFence};
use crate::pool::{DeviceId, DevicePtr, StreamId};
use device_guard::DeviceGuard;
use epoch::SyncEpochs;
use events::EventFences;
use runtime::{CudaError, Runtime, STREAM_LEGACY, STREAM_PER_THREAD, codes};
use std::ffi::c_void;
use std::sync::atomic::AtomicU64;
use stream_events::{STREAM_FENCE, StreamEvents};
use vmm::Vmm;

/// When a freed block may be reused (the backend side of `free_sync`).
#[derive(Debug)]
pub enum FencePolicy {
    /// After a device-wide synchronization that started after the free.
    DeviceSync(&'static SyncEpochs),
    /// After an event recorded on the legacy default stream at free time completes.
    LegacyStreamEvent(EventFences),
    /// At once: every fence is done when recorded.
    Immediate,
}

/// One CUDA device, reached through the real runtime.
#[derive(Debug)]
pub struct CudaBackend {
    rt: &'static Runtime,
    device: DeviceId,
    fences: FencePolicy,
    /// The fences of frees recorded on other streams: an event on each (any policy).
    stream_events: StreamEvents,
    /// The driver's virtual-memory calls, when expandable segments are on and the device has
    /// them.
    vmm: Option<Vmm>,
    /// A poll could not record the events of frees made during a capture, and some such free
    /// has waited for its events since.
    deferred_failing: bool,
}

impl CudaBackend {
    pub fn new(rt: &'static Runtime, device: DeviceId, fences: FencePolicy) -> Self {
        Self {
            rt,
            device,
            fences,
            stream_events: StreamEvents::default(),
            vmm: None,
            deferred_failing: false,
        }
    }

    /// Use the driver's virtual-memory calls for expandable segments; `Err` says why this
    /// device cannot (no driver library, no support on the device), and nothing changes.
    /// `peers` has bit `d` set for each device `d` given access to this device's memory.
    pub fn enable_expandable_segments(&mut self, peers: &'static AtomicU64) -> Result<(), String> {
        let _on_device = self.enter().map_err(|e| e.to_string())?;
        self.vmm = Some(Vmm::for_device(self.device, peers)?);
        Ok(())
    }

    /// `device` was given access to this device's memory (`cudaDeviceEnablePeerAccess`, its bit
    /// already set in the `peers` mask): the pages of expandable segments mapped so far are
    /// opened to it.
    pub fn grant_peer_access(&mut self, device: DeviceId) -> Result<(), BackendError> {
        let Some(vmm) = self.vmm.as_ref() else {
            return Ok(());
        };
        let _on_device = enter(self.rt, self.device)?;
        vmm.grant(device)
    }

    /// Before a reset of this backend's device: wait for its work, then unmap and release the
    /// memory of expandable segments and give their ranges back (a reset frees only what the
    /// runtime allocated). Errors are skipped: the reset goes ahead.
    pub fn release_expandable_segments(&mut self) {
        let Some(vmm) = self.vmm.as_mut() else {
            return;
        };
        let Ok(_on_device) = enter(self.rt, self.device) else {
            return;
        };
        // SAFETY: cudaDeviceSynchronize takes no arguments; it waits for the current device.
        let _ = unsafe { (self.rt.device_synchronize)() };
        vmm.release_everything();
        runtime::clear_last_error(self.rt);
    }

    fn vmm(&mut self) -> Result<&mut Vmm, BackendError> {
        self.vmm.as_mut().ok_or(BackendError::Device {
            code: codes::NOT_SUPPORTED,
            call: "expandable segments (not enabled on this backend)",
        })
    }

    /// `device`, another one, is about to be reset: the events this backend recorded on its
    /// streams are set aside until `end_reset_of`. The frees made during a capture that ended
    /// get their events first, while the streams they name still exist; during a capture, only
    /// their events on `device`'s streams, which the reset destroys (`stream_destroying`: set
    /// aside then with the others). When that fails, the events wait for the next poll.
    pub fn begin_reset_of(&mut self, device: DeviceId) {
        if captures::underway(self.rt) {
            self.record_deferred_of(device);
        } else if let Ok(_on_device) = self.enter()
            && self
                .stream_events
                .record_deferred(self.rt, self.device)
                .is_err()
        {
            runtime::clear_last_error(self.rt);
        }
        self.stream_events.park(device);
    }

    /// During a capture, before a reset of `device`: the frees made during a capture that wait
    /// for an event on one of its streams get it now (the default streams' handles outlive a
    /// reset). A stream whose device the runtime cannot name is left to the next poll.
    #[cold]
    #[inline(never)]
    fn record_deferred_of(&mut self, device: DeviceId) {
        for stream in self.stream_events.deferred_streams() {
            if matches!(stream.0 as usize, 0 | STREAM_LEGACY | STREAM_PER_THREAD) {
                continue;
            }
            unread_error::keep_unread(self.rt);
            if runtime::stream_device(self.rt, stream.0 as usize) == Some(device) {
                self.stream_destroying(stream);
            }
        }
    }

    /// The program is about to destroy `stream`: the frees made during a capture that wait for
    /// an event on it get that event now, while its handle is live (after the destroy a handle
    /// may crash the runtime or name a newer stream), unless the stream itself captures (an event
    /// recorded there would be a captured one). Errors are cleared: the destroy goes ahead, and
    /// the frees' other streams wait as before.
    pub fn stream_destroying(&mut self, stream: StreamId) {
        if !self.stream_events.defers(stream)
            || (captures::underway(self.rt) && captures::is_capturing(self.rt, stream.0 as usize))
        {
            return;
        }
        if let Ok(_on_device) = self.enter()
            && self
                .stream_events
                .record_deferred_on(self.rt, self.device, stream)
                .is_err()
        {
            runtime::clear_last_error(self.rt);
        }
    }

    /// The reset of `device` is over: when it `happened`, the events set aside went with it and
    /// count as complete; else they are waited for again.
    pub fn end_reset_of(&mut self, device: DeviceId, happened: bool) {
        self.stream_events.end_park(device, happened);
    }

    /// This backend's device is being reset, and the backend dropped: destroy the events it
    /// recorded on other devices' streams (the reset takes only its own device's).
    pub fn destroy_events_elsewhere(&mut self) {
        self.stream_events.destroy_events_elsewhere(self.rt);
    }

    fn enter(&self) -> Result<DeviceGuard<'static>, BackendError> {
        enter(self.rt, self.device)
    }

    /// A poll's recording of the events of frees made during a capture that ended. On failure
    /// those frees keep waiting, for a later poll to record their events or for the pool's next
    /// synchronization, and the request that polled goes on: the failure is not its own. The
    /// runtime's error is cleared, and said once until no such free waits for its events any
    /// more (a poll that had none to record, while the other kind's still fail, is no success).
    fn deferred_recorded(&mut self, recorded: Result<(), BackendError>) {
        match recorded {
            Ok(()) => {
                if !self.defers_any() {
                    self.deferred_failing = false;
                }
            }
            Err(e) => self.deferred_recording_failed(e),
        }
    }

    /// Whether a free made during a capture waits for its events to be recorded: a stream
    /// fence's, or a `free_sync:event` fence's.
    fn defers_any(&self) -> bool {
        self.stream_events.has_deferred()
            || matches!(&self.fences, FencePolicy::LegacyStreamEvent(events) if events.has_deferred())
    }

    #[cold]
    #[inline(never)]
    fn deferred_recording_failed(&mut self, error: BackendError) {
        runtime::clear_last_error(self.rt);
        if !std::mem::replace(&mut self.deferred_failing, true) {
            notices::hold(notices::Notice::DeferredRecordingFailed {
                device: self.device,
                error,
            });
        }
    }

    /// `call` would end a capture under way: it is not made, and fails with the runtime's own
    /// answer to it during a capture (the pool avoids such calls then; this keeps any path it
    /// missed from ending the capture).
    fn refuse_during_capture(&self, call: &'static str) -> Result<(), BackendError> {
        if captures::underway(self.rt) {
            return Err(BackendError::Device {
                code: codes::STREAM_CAPTURE_UNSUPPORTED,
                call,
            });
        }
        Ok(())
    }
}

/// Make `device` current for the guard's lifetime.
fn enter(rt: &'static Runtime, device: DeviceId) -> Result<DeviceGuard<'static>, BackendError> {
    DeviceGuard::enter(rt, device).map_err(|code| BackendError::Device {
        code,
        call: "cudaSetDevice",
    })
}

/// Record the events of the fences made during a capture that has ended, on the device.
#[cold]
#[inline(never)]
fn record_deferred_fences(
    rt: &'static Runtime,
    device: DeviceId,
    events: &mut EventFences,
) -> Result<(), BackendError> {
    let _on_device = enter(rt, device)?;
    events.record_deferred(rt).map_err(device_error)
}

fn device_error((code, call): (CudaError, &'static str)) -> BackendError {
    BackendError::Device { code, call }
}

impl Backend for CudaBackend {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn allocate(&mut self, size: u64) -> Result<DevicePtr, BackendError> {
        let _on_device = self.enter()?;
        let size = usize::try_from(size).map_err(|_| BackendError::OutOfMemory)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; this is the real runtime's cudaMalloc.
        let code = unsafe { (self.rt.malloc)(&mut ptr, size) };
        match code {
            codes::SUCCESS => DevicePtr::new(ptr as u64).ok_or(BackendError::Device {
                code: codes::MEMORY_ALLOCATION,
                call: "cudaMalloc (returned NULL)",
            }),
            codes::MEMORY_ALLOCATION => {
                runtime::clear_last_error(self.rt);
                Err(BackendError::OutOfMemory)
            }
            code => Err(BackendError::Device {
                code,
                call: "cudaMalloc",
            }),
        }
    }

    fn release(&mut self, ptr: DevicePtr, _size: u64) -> Result<(), BackendError> {
        self.refuse_during_capture("cudaFree (not made: a CUDA graph capture is underway)")?;
        let _on_device = self.enter()?;
        // SAFETY: `ptr` is a segment this backend obtained from the real cudaMalloc and has not
        // released; the pool guarantees no work uses it any more.
        let code = unsafe { (self.rt.free)(ptr.addr() as *mut c_void) };
        if code == codes::SUCCESS {
            Ok(())
        } else {
            Err(BackendError::Device {
                code,
                call: "cudaFree",
            })
        }
    }

    fn mem_info(&mut self) -> Result<MemInfo, BackendError> {
        let _on_device = self.enter()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both out-pointers are valid for the duration of the call.
        let code = unsafe { (self.rt.mem_get_info)(&mut free, &mut total) };
        if code == codes::SUCCESS {
            Ok(MemInfo {
                free: free as u64,
                total: total as u64,
            })
        } else {
            Err(BackendError::Device {
                code,
                call: "cudaMemGetInfo",
            })
        }
    }

    #[inline]
    fn record_fence(&mut self) -> Result<Fence, BackendError> {
        match &mut self.fences {
            FencePolicy::DeviceSync(epochs) => Ok(Fence(epochs.fence())),
            FencePolicy::LegacyStreamEvent(events) => {
                if captures::underway(self.rt) {
                    // The legacy stream may be unusable (a blocking stream captures): the
                    // event is recorded after the capture (`EventFences`).
                    return Ok(Fence(events.defer()));
                }
                let _on_device = enter(self.rt, self.device)?;
                events.record(self.rt).map(Fence).map_err(device_error)
            }
            FencePolicy::Immediate => Ok(Fence(0)),
        }
    }

    fn record_stream_fence(&mut self, streams: &[StreamId]) -> Result<StreamFence, BackendError> {
        if captures::underway(self.rt) {
            // An event recorded now could end the capture, or never answer a query: the fence's
            // events are recorded after it (`stream_events`).
            let fence = self.stream_events.defer(streams);
            return Ok(StreamFence {
                fence,
                unfenced: Vec::new(),
            });
        }
        let _on_device = self.enter()?;
        let (fence, refused) = self
            .stream_events
            .record(self.rt, self.device, streams)
            .map_err(device_error)?;
        let unfenced = refused
            .into_iter()
            .map(|(stream, code)| {
                let error = BackendError::Device {
                    code,
                    call: "cudaEventRecord",
                };
                (stream, error)
            })
            .collect();
        Ok(StreamFence { fence, unfenced })
    }

    fn poll_fences(&mut self, done: &mut Vec<Fence>) -> Result<(), BackendError> {
        if captures::underway(self.rt) {
            // Event queries may end a capture: the fences wait for its end.
            return Ok(());
        }
        // On the device, as PyTorch queries and releases its events: a completed event may be
        // destroyed here. The frees made during a capture that ended get their events first.
        let _on_device = self.enter()?;
        let recorded = self.stream_events.record_deferred(self.rt, self.device);
        self.deferred_recorded(recorded.map_err(device_error));
        self.stream_events.poll(self.rt, done).map_err(device_error)
    }

    #[inline]
    fn fence_done(&mut self, fence: Fence) -> Result<bool, BackendError> {
        if fence.0 & STREAM_FENCE != 0 {
            return Ok(self.stream_events.done(fence));
        }
        match &mut self.fences {
            FencePolicy::DeviceSync(epochs) => Ok(epochs.done(fence.0)),
            FencePolicy::LegacyStreamEvent(events) => {
                // An event query may end a capture: the fence waits for its end.
                if captures::underway(self.rt) {
                    return Ok(false);
                }
                if events.has_deferred() {
                    let recorded = record_deferred_fences(self.rt, self.device, events);
                    let done = events.done(self.rt, fence.0).map_err(device_error);
                    self.deferred_recorded(recorded);
                    return done;
                }
                events.done(self.rt, fence.0).map_err(device_error)
            }
            FencePolicy::Immediate => Ok(true),
        }
    }

    fn capture_underway(&mut self) -> bool {
        captures::underway(self.rt)
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        self.refuse_during_capture(
            "cudaDeviceSynchronize (not made: a CUDA graph capture is underway)",
        )?;
        let ticket = match &self.fences {
            FencePolicy::DeviceSync(epochs) => Some(epochs.begin()),
            _ => None,
        };
        let _on_device = self.enter()?;
        // The frees made during a capture that ended get their events, which this completes.
        self.stream_events
            .record_deferred(self.rt, self.device)
            .map_err(device_error)?;
        // SAFETY: cudaDeviceSynchronize takes no arguments; it waits for the current device.
        let code = unsafe { (self.rt.device_synchronize)() };
        if code != codes::SUCCESS {
            return Err(BackendError::Device {
                code,
                call: "cudaDeviceSynchronize",
            });
        }
        match &mut self.fences {
            FencePolicy::DeviceSync(epochs) => {
                if let Some(ticket) = ticket {
                    epochs.end(ticket);
                }
            }
            FencePolicy::LegacyStreamEvent(events) => events.all_done(self.rt),
            FencePolicy::Immediate => {}
        }
        self.stream_events.device_synchronized(self.rt);
        Ok(())
    }

    fn supports_expandable_segments(&self) -> bool {
        self.vmm.is_some()
    }

    fn reserve_address_range(&mut self, size: u64, page: u64) -> Result<DevicePtr, BackendError> {
        let _on_device = self.enter()?;
        self.vmm()?.reserve(size, page)
    }

    fn map_pages(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let _on_device = self.enter()?;
        self.vmm()?.map(ptr, size)
    }

    fn unmap_pages(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        // cuMemUnmap does not wait for the work that may still use the pages. PyTorch waits for
        // the segment's stream; a block served by the interposed cudaMalloc (stream 0) may have
        // been used on any stream, and the fixed segments' cudaFree waits for the whole device,
        // so the whole device is waited for here (a destroyed stream is no hazard either).
        self.synchronize()?;
        let _on_device = self.enter()?;
        self.vmm()?.unmap(ptr, size)
    }

    fn release_address_range(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let _on_device = self.enter()?;
        self.vmm()?.release_range(ptr, size)
    }

    fn wait_stream_fences(&mut self) -> Result<(), BackendError> {
        // Events of other devices are waited for and destroyed there; no switch is needed for
        // the wait, and `retire` switches for the destroy.
        self.stream_events
            .wait_elsewhere(self.rt)
            .map_err(device_error)
    }
}
