//! Event fences of the `free_sync:event` policy: at free time an event is recorded on the legacy
//! default stream; the block is ready once the event has completed.
//!
//! The legacy default stream waits for earlier work of every blocking stream, so the event
//! completes after all such work issued before the free. Work on streams created with
//! `cudaStreamNonBlocking` is not covered — that is the documented limit of this policy.
//!
//! Events are created once with `cudaEventDisableTiming` and reused from a small free list.

use super::runtime::{CudaError, Runtime, STREAM_LEGACY, codes};
use rustc_hash::FxHashMap;
use std::ffi::c_void;

/// Idle events kept for reuse; beyond this, completed events are destroyed.
const IDLE_EVENTS_KEPT: usize = 64;

/// A `cudaEvent_t` handle (stored as an address; owned by one device's backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct EventHandle(usize);

/// The events of one device: recorded ones by fence number, and idle ones.
#[derive(Debug, Default)]
pub struct EventFences {
    recorded: FxHashMap<u64, EventHandle>,
    idle: Vec<EventHandle>,
    next_fence: u64,
}

impl EventFences {
    /// Record an event on the legacy default stream; the caller has made the device current.
    pub fn record(&mut self, rt: &Runtime) -> Result<u64, (CudaError, &'static str)> {
        let event = match self.idle.pop() {
            Some(event) => event,
            None => create(rt)?,
        };
        // SAFETY: `event` is a live event of the current device (created by `create` and not
        // destroyed); STREAM_LEGACY is the runtime's legacy-stream handle.
        let code =
            unsafe { (rt.event_record)(event.0 as *mut c_void, STREAM_LEGACY as *mut c_void) };
        if code != codes::SUCCESS {
            self.idle.push(event);
            return Err((code, "cudaEventRecord"));
        }
        self.next_fence += 1;
        self.recorded.insert(self.next_fence, event);
        Ok(self.next_fence)
    }

    /// Whether the event behind `fence` has completed (unknown fences are done).
    pub fn done(&mut self, rt: &Runtime, fence: u64) -> Result<bool, (CudaError, &'static str)> {
        let Some(&event) = self.recorded.get(&fence) else {
            return Ok(true);
        };
        // SAFETY: `event` is a live, recorded event; querying never blocks.
        let code = unsafe { (rt.event_query)(event.0 as *mut c_void) };
        match code {
            codes::SUCCESS => {
                self.recorded.remove(&fence);
                self.retire(rt, event);
                Ok(true)
            }
            codes::NOT_READY => Ok(false),
            code => Err((code, "cudaEventQuery")),
        }
    }

    /// After a device-wide synchronization every recorded event has completed.
    pub fn all_done(&mut self, rt: &Runtime) {
        let events: Vec<EventHandle> = self.recorded.drain().map(|(_, e)| e).collect();
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
