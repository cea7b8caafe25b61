//! Event fences of the `free_sync:event` policy: at free time an event is recorded on the legacy
//! default stream; the block is ready once the event has completed.
//!
//! The legacy default stream waits for earlier work of every blocking stream, so the event
//! completes after all such work issued before the free. Work on streams created with
//! `cudaStreamNonBlocking` is not covered — that is the documented limit of this policy.
//!
//! Events are created once with `cudaEventDisableTiming` and reused from a small free list.
//!
//! During a CUDA graph capture no event is recorded: while a blocking stream captures, the legacy
//! stream is unusable (an action there would join the capture, and the runtime ends it). A fence
//! made then waits, without an event, until the capture has ended; its event is recorded before
//! any later fence is asked about, covering everything issued before the free and more.

use super::runtime::{CudaError, Runtime, STREAM_LEGACY, codes};
use rustc_hash::FxHashMap;
use std::ffi::c_void;

/// Idle events kept for reuse; beyond this, completed events are destroyed. (At 64, a stress
/// run of 8 threads recording frees on side streams created and destroyed some 22,000 events.)
const IDLE_EVENTS_KEPT: usize = 1024;

/// A `cudaEvent_t` handle (stored as an address; owned by one device's backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct EventHandle(usize);

/// Events of one device not recorded on anything now, for reuse.
#[derive(Debug, Default)]
pub(super) struct IdleEvents(Vec<EventHandle>);

impl IdleEvents {
    /// An idle event, or a new one of the current device.
    pub(super) fn take(&mut self, rt: &Runtime) -> Result<EventHandle, (CudaError, &'static str)> {
        match self.0.pop() {
            Some(event) => Ok(event),
            None => create(rt),
        }
    }

    /// Give back an event that has completed (or was never recorded): kept for reuse, or
    /// destroyed when enough are kept.
    pub(super) fn put(&mut self, rt: &Runtime, event: EventHandle) {
        if self.0.len() < IDLE_EVENTS_KEPT {
            self.0.push(event);
        } else {
            destroy(rt, event);
        }
    }
}

/// The events of one device: recorded ones by fence number, and idle ones.
#[derive(Debug, Default)]
pub struct EventFences {
    recorded: FxHashMap<u64, EventHandle>,
    /// Fences made during a capture, oldest first, whose events are not recorded yet.
    deferred: Vec<u64>,
    idle: IdleEvents,
    next_fence: u64,
}

impl EventFences {
    /// Record an event on the legacy default stream; the caller has made the device current.
    pub fn record(&mut self, rt: &Runtime) -> Result<u64, (CudaError, &'static str)> {
        let event = self.record_on_legacy(rt)?;
        self.next_fence += 1;
        self.recorded.insert(self.next_fence, event);
        Ok(self.next_fence)
    }

    /// An event recorded on the legacy default stream of the current device.
    fn record_on_legacy(&mut self, rt: &Runtime) -> Result<EventHandle, (CudaError, &'static str)> {
        let event = self.idle.take(rt)?;
        let code = record(rt, event, STREAM_LEGACY as *mut c_void);
        if code != codes::SUCCESS {
            self.idle.put(rt, event);
            return Err((code, "cudaEventRecord"));
        }
        Ok(event)
    }

    /// A fence made during a capture: its event is recorded by `record_deferred`, once the
    /// capture has ended.
    pub fn defer(&mut self) -> u64 {
        self.next_fence += 1;
        self.deferred.push(self.next_fence);
        self.next_fence
    }

    /// Whether fences made during a capture wait for their events.
    #[inline]
    pub fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// Record the events of the fences made during a capture, oldest first; the caller has made
    /// the device current, and no capture is underway. An error leaves that fence and the later
    /// ones waiting.
    pub fn record_deferred(&mut self, rt: &Runtime) -> Result<(), (CudaError, &'static str)> {
        for i in 0..self.deferred.len() {
            let recorded = self.record_on_legacy(rt);
            match recorded {
                Ok(event) => {
                    self.recorded.insert(self.deferred[i], event);
                }
                Err(e) => {
                    self.deferred.drain(..i);
                    return Err(e);
                }
            }
        }
        self.deferred.clear();
        Ok(())
    }

    /// Whether the event behind `fence` has completed (unknown fences are done; one waiting
    /// for its event is not).
    pub fn done(&mut self, rt: &Runtime, fence: u64) -> Result<bool, (CudaError, &'static str)> {
        let Some(&event) = self.recorded.get(&fence) else {
            return Ok(!self.deferred.contains(&fence));
        };
        match query(rt, event) {
            codes::SUCCESS => {
                self.recorded.remove(&fence);
                self.idle.put(rt, event);
                Ok(true)
            }
            codes::NOT_READY => Ok(false),
            code => Err((code, "cudaEventQuery")),
        }
    }

    /// After a device-wide synchronization every recorded event has completed, and the work
    /// before every fence made during a capture (which ended before it) too.
    pub fn all_done(&mut self, rt: &Runtime) {
        self.deferred.clear();
        let events: Vec<EventHandle> = self.recorded.drain().map(|(_, e)| e).collect();
        for event in events {
            self.idle.put(rt, event);
        }
    }
}

/// A new event of the current device, without timing.
pub(super) fn create(rt: &Runtime) -> Result<EventHandle, (CudaError, &'static str)> {
    let mut event: *mut c_void = std::ptr::null_mut();
    // SAFETY: `event` is a valid out-pointer; the flag is a documented event flag.
    let code =
        unsafe { (rt.event_create_with_flags)(&mut event, super::runtime::EVENT_DISABLE_TIMING) };
    if code == codes::SUCCESS {
        Ok(EventHandle(event as usize))
    } else {
        Err((code, "cudaEventCreateWithFlags"))
    }
}

/// Record `event` on `stream`: the legacy-stream handle, or a stream the program named and keeps
/// alive until the free (a stream of another device than the event's is answered with an error).
pub(super) fn record(rt: &Runtime, event: EventHandle, stream: *mut c_void) -> CudaError {
    // SAFETY: `event` is a live event (created by `create`, not destroyed); `stream` is the
    // legacy stream's handle or one the program keeps alive until the free (the caller's
    // contract, as `cachealloc_record_stream` states it); the runtime checks that it belongs
    // to the event's device.
    unsafe { (rt.event_record)(event.0 as *mut c_void, stream) }
}

/// Whether `event` has completed: SUCCESS, NOT_READY, or an error. Never blocks.
pub(super) fn query(rt: &Runtime, event: EventHandle) -> CudaError {
    // SAFETY: `event` is a live, recorded event; querying never blocks.
    unsafe { (rt.event_query)(event.0 as *mut c_void) }
}

/// Destroy an event that is referenced nowhere any more.
pub(super) fn destroy(rt: &Runtime, event: EventHandle) -> CudaError {
    // SAFETY: `event` is live (created by `create`, destroyed only here, once).
    unsafe { (rt.event_destroy)(event.0 as *mut c_void) }
}

/// Wait until `event` has completed.
pub(super) fn synchronize(rt: &Runtime, event: EventHandle) -> CudaError {
    // SAFETY: `event` is a live, recorded event; the wait ends when its work has.
    unsafe { (rt.event_synchronize)(event.0 as *mut c_void) }
}
