//! Event fences: a fence is one or more events, recorded at free time, and done once all of them
//! have completed.
//!
//! The `free_sync:event` policy records one event on the legacy default stream. The legacy
//! default stream waits for earlier work of every blocking stream, so the event completes after
//! all such work issued before the free. Work on streams created with `cudaStreamNonBlocking` is
//! not covered — that is the documented limit of this policy.
//!
//! A free of a block recorded as used on other streams (`Tensor.record_stream`) records one event
//! on each of them, as PyTorch's allocator does: those fences cover exactly the streams named,
//! blocking or not.
//!
//! Events are created once with `cudaEventDisableTiming` and reused from a small free list.

use super::runtime::{CudaError, Runtime, STREAM_LEGACY, clear_last_error, codes};
use crate::pool::StreamId;
use rustc_hash::FxHashMap;
use std::ffi::c_void;

/// Idle events kept for reuse; beyond this, completed events are destroyed.
const IDLE_EVENTS_KEPT: usize = 64;

/// A `cudaEvent_t` handle (stored as an address; owned by one device's backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct EventHandle(usize);

/// The events of one device: recorded ones by fence number (those of a fence not yet seen
/// completed), and idle ones.
#[derive(Debug, Default)]
pub struct EventFences {
    recorded: FxHashMap<u64, Vec<EventHandle>>,
    idle: Vec<EventHandle>,
    next_fence: u64,
}

impl EventFences {
    /// Record an event on the legacy default stream; the caller has made the device current.
    pub fn record(&mut self, rt: &Runtime) -> Result<u64, (CudaError, &'static str)> {
        let event = self.idle_or_new(rt)?;
        let code = record_event(rt, event, STREAM_LEGACY as *mut c_void);
        if code != codes::SUCCESS {
            self.idle.push(event);
            return Err((code, "cudaEventRecord"));
        }
        Ok(self.add_fence(vec![event]))
    }

    /// Record an event on each of `streams`; the caller has made the device current. A stream
    /// the runtime refuses as a foreign handle (a stream of another device) is skipped, that
    /// error cleared from the runtime's last error, and returned in the second part; any other
    /// failure fails the whole fence.
    pub fn record_on(
        &mut self,
        rt: &Runtime,
        streams: &[StreamId],
    ) -> Result<(u64, Vec<StreamId>), (CudaError, &'static str)> {
        let mut events = Vec::with_capacity(streams.len());
        let mut skipped = Vec::new();
        for &stream in streams {
            let recorded = self.idle_or_new(rt).and_then(|event| {
                match record_event(rt, event, stream.0 as *mut c_void) {
                    codes::SUCCESS => Ok(Some(event)),
                    code => {
                        self.idle.push(event);
                        if code != codes::INVALID_RESOURCE_HANDLE {
                            return Err((code, "cudaEventRecord"));
                        }
                        clear_last_error(rt);
                        Ok(None)
                    }
                }
            });
            match recorded {
                Ok(Some(event)) => events.push(event),
                Ok(None) => skipped.push(stream),
                Err(e) => {
                    // The events recorded so far are reusable (a new record replaces one).
                    self.idle.extend(events);
                    return Err(e);
                }
            }
        }
        Ok((self.add_fence(events), skipped))
    }

    fn idle_or_new(&mut self, rt: &Runtime) -> Result<EventHandle, (CudaError, &'static str)> {
        match self.idle.pop() {
            Some(event) => Ok(event),
            None => create(rt),
        }
    }

    fn add_fence(&mut self, events: Vec<EventHandle>) -> u64 {
        self.next_fence += 1;
        if !events.is_empty() {
            self.recorded.insert(self.next_fence, events);
        }
        self.next_fence
    }

    /// Whether every event behind `fence` has completed (unknown fences are done). Completed
    /// events are retired as they are seen, so each is queried until it completes only.
    pub fn done(&mut self, rt: &Runtime, fence: u64) -> Result<bool, (CudaError, &'static str)> {
        let Some(events) = self.recorded.get_mut(&fence) else {
            return Ok(true);
        };
        let mut completed = Vec::new();
        let mut result = Ok(());
        events.retain(|&event| {
            if result.is_err() {
                return true;
            }
            // SAFETY: `event` is a live, recorded event; querying never blocks.
            match unsafe { (rt.event_query)(event.0 as *mut c_void) } {
                codes::SUCCESS => {
                    completed.push(event);
                    false
                }
                codes::NOT_READY => true,
                code => {
                    result = Err((code, "cudaEventQuery"));
                    true
                }
            }
        });
        let all_done = events.is_empty();
        if all_done {
            self.recorded.remove(&fence);
        }
        for event in completed {
            self.retire(rt, event);
        }
        result.map(|()| all_done)
    }

    /// After a device-wide synchronization every recorded event has completed.
    pub fn all_done(&mut self, rt: &Runtime) {
        let events: Vec<EventHandle> = self.recorded.drain().flat_map(|(_, e)| e).collect();
        for event in events {
            self.retire(rt, event);
        }
    }

    fn retire(&mut self, rt: &Runtime, event: EventHandle) {
        if self.idle.len() < IDLE_EVENTS_KEPT {
            self.idle.push(event);
        } else {
            // SAFETY: `event` has completed and is no longer referenced anywhere.
            let _ = unsafe { (rt.event_destroy)(event.0 as *mut c_void) };
        }
    }
}

/// Record `event` (a live event of the current device) on `stream`.
fn record_event(rt: &Runtime, event: EventHandle, stream: *mut c_void) -> CudaError {
    // SAFETY: `event` is a live event of the current device (created by `create` and not
    // destroyed); `stream` is the legacy-stream handle or a stream the program recorded and keeps
    // alive until the free (one of another device is answered with an error).
    unsafe { (rt.event_record)(event.0 as *mut c_void, stream) }
}

fn create(rt: &Runtime) -> Result<EventHandle, (CudaError, &'static str)> {
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
