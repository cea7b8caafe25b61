//! Fences of frees recorded on other streams (`Tensor.record_stream`): an event on each recorded
//! stream, as PyTorch's allocator records them (`insert_events`), polled as it polls them
//! (`process_events`): each stream's events in the order they were recorded, up to the first one
//! not complete (work on one stream completes in order), so a poll queries about one event per
//! stream that has any. A fence is done once every one of its events has completed, whatever
//! other streams' fences are still waiting.
//!
//! A stream of another device cannot carry an event of this one: the event is created on the
//! stream's device (`cudaStreamGetDevice`, CUDA 12.8 and later; that device's context exists
//! since the stream does) and destroyed once complete, as PyTorch records on the stream's own
//! device. A device synchronization does not cover such a stream's work, so `all_done` waits for
//! its last event. Where the runtime cannot name the stream's device, the stream is left out and
//! returned to the caller.

use super::device_guard::DeviceGuard;
use super::events::{self, EventHandle, IdleEvents, query, record};
use super::runtime::{CudaError, Runtime, clear_last_error, codes};
use crate::pool::{DeviceId, StreamId};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};

/// A recorded fence, and the streams the runtime refused to record on with its answers.
pub type Recorded = (u64, Vec<(StreamId, CudaError)>);

/// A recorded event: the fence it belongs to, and its device when that is not the backend's
/// (the stream's device, where it was created).
#[derive(Clone, Copy, Debug)]
struct StreamEvent {
    event: EventHandle,
    fence: u64,
    elsewhere: Option<DeviceId>,
}

/// The stream fences of one device.
#[derive(Debug, Default)]
pub struct StreamEvents {
    /// Per stream, its recorded events in order.
    queues: FxHashMap<StreamId, VecDeque<StreamEvent>>,
    /// Fences with events not seen complete yet, and how many.
    outstanding: FxHashMap<u64, usize>,
    /// Idle events of the backend's own device.
    idle: IdleEvents,
    /// Fences done outside a poll (with no event recorded, or by `forget_device`), for the next
    /// poll to report.
    done_unpolled: Vec<u64>,
    next_fence: u64,
}

impl StreamEvents {
    /// Record an event on each of `streams`; the caller has made `own` (the backend's device)
    /// current. A stream of another device gets an event of its device. A stream the runtime
    /// refuses to record on, even so, is left out, that error cleared from the runtime's last
    /// error, and returned with its code.
    pub fn record(
        &mut self,
        rt: &Runtime,
        own: DeviceId,
        streams: &[StreamId],
    ) -> Result<Recorded, (CudaError, &'static str)> {
        let mut events = Vec::with_capacity(streams.len());
        for _ in streams {
            match self.idle.take(rt) {
                Ok(event) => events.push(event),
                Err(e) => {
                    for event in events {
                        self.idle.put(rt, event);
                    }
                    return Err(e);
                }
            }
        }
        self.next_fence += 1;
        let fence = self.next_fence;
        let mut refused = Vec::new();
        let mut recorded = 0;
        for (&stream, event) in streams.iter().zip(events) {
            let (event, elsewhere) = match record(rt, event, stream.0 as *mut c_void) {
                codes::SUCCESS => (event, None),
                code => {
                    clear_last_error(rt);
                    self.idle.put(rt, event);
                    match record_elsewhere(rt, own, stream) {
                        Some((event, device)) => (event, Some(device)),
                        None => {
                            refused.push((stream, code));
                            continue;
                        }
                    }
                }
            };
            self.queues
                .entry(stream)
                .or_default()
                .push_back(StreamEvent {
                    event,
                    fence,
                    elsewhere,
                });
            recorded += 1;
        }
        if recorded > 0 {
            self.outstanding.insert(fence, recorded);
        } else {
            // Nothing to wait for: done, and reported as such by the next poll.
            self.done_unpolled.push(fence);
        }
        Ok((fence, refused))
    }

    /// Retire the events that have completed since the last poll: each stream's, in order, up
    /// to its first one still running. Appends to `done` each fence whose last event this was.
    pub fn poll(
        &mut self,
        rt: &Runtime,
        done: &mut Vec<u64>,
    ) -> Result<(), (CudaError, &'static str)> {
        done.append(&mut self.done_unpolled);
        let Self {
            queues,
            outstanding,
            idle,
            ..
        } = self;
        for queue in queues.values_mut() {
            while let Some(&recorded) = queue.front() {
                let live = match query(rt, recorded.event) {
                    codes::SUCCESS => true,
                    codes::NOT_READY => break,
                    // The other device failed, or was reset without this library seeing it
                    // (its events went with it, so this one is not destroyed): nothing of its
                    // will touch the block any more.
                    _ if recorded.elsewhere.is_some() => {
                        clear_last_error(rt);
                        false
                    }
                    code => return Err((code, "cudaEventQuery")),
                };
                queue.pop_front();
                if live {
                    retire(rt, idle, recorded);
                }
                count_complete(outstanding, recorded.fence, done);
            }
        }
        queues.retain(|_, queue| !queue.is_empty());
        Ok(())
    }

    /// Whether every event of `fence` was seen complete (by `poll` or a synchronization).
    pub fn done(&self, fence: u64) -> bool {
        !self.outstanding.contains_key(&fence)
    }

    /// After a synchronization of the backend's device: its events have completed; the events of
    /// other devices' streams are waited for here (on each stream the last, which completes
    /// after the others), as PyTorch synchronizes every outstanding event before it frees
    /// memory.
    pub fn all_done(&mut self, rt: &Runtime) {
        if self.outstanding.is_empty() {
            // Nothing recorded is outstanding, and queues hold only outstanding events.
            return;
        }
        for (_, queue) in self.queues.drain() {
            let last_elsewhere = queue.iter().rev().find(|e| e.elsewhere.is_some());
            let mut live = true;
            if let Some(last) = last_elsewhere
                && events::synchronize(rt, last.event) != codes::SUCCESS
            {
                // As in `poll`: a failed or reset device's work is over.
                clear_last_error(rt);
                live = false;
            }
            for recorded in queue {
                if live || recorded.elsewhere.is_none() {
                    retire(rt, &mut self.idle, recorded);
                }
            }
        }
        self.outstanding.clear();
        self.done_unpolled.clear();
    }

    /// `device` (not the backend's) was reset: its events are gone and its work with them. They
    /// count as complete, without a call on them (their handles may already name new events).
    pub fn forget_device(&mut self, device: DeviceId) {
        for queue in self.queues.values_mut() {
            queue.retain(|recorded| {
                if recorded.elsewhere != Some(device) {
                    return true;
                }
                count_complete(
                    &mut self.outstanding,
                    recorded.fence,
                    &mut self.done_unpolled,
                );
                false
            });
        }
        self.queues.retain(|_, queue| !queue.is_empty());
    }
}

/// One event of `fence` completed: when it was the last, the fence is done.
fn count_complete(outstanding: &mut FxHashMap<u64, usize>, fence: u64, done: &mut Vec<u64>) {
    if let Some(left) = outstanding.get_mut(&fence) {
        *left -= 1;
        if *left == 0 {
            outstanding.remove(&fence);
            done.push(fence);
        }
    }
}

/// A completed event leaves its queue: the backend's own is kept for reuse, another device's is
/// destroyed on that device.
fn retire(rt: &Runtime, idle: &mut IdleEvents, recorded: StreamEvent) {
    match recorded.elsewhere {
        None => idle.put(rt, recorded.event),
        Some(device) => {
            if let Ok(_on_device) = DeviceGuard::enter(rt, device) {
                events::destroy(rt, recorded.event);
            }
            clear_last_error(rt);
        }
    }
}

/// Record a new event of `stream`'s device on it, when the runtime can name that device and it
/// is not `own`. Leaves `own` current and no error of its own in the last error.
fn record_elsewhere(
    rt: &Runtime,
    own: DeviceId,
    stream: StreamId,
) -> Option<(EventHandle, DeviceId)> {
    let get_device = rt.stream_get_device?;
    let mut device: c_int = -1;
    // SAFETY: `stream` is a stream handle the program passed for this free (the runtime checks
    // it); `device` is a valid out-pointer.
    let code = unsafe { get_device(stream.0 as *mut c_void, &mut device) };
    if code != codes::SUCCESS || device == own.0 {
        clear_last_error(rt);
        return None;
    }
    let device = DeviceId(device);
    let on_device = DeviceGuard::enter(rt, device);
    let recorded = on_device.as_ref().ok().and_then(|_| {
        let event = events::create(rt).ok()?;
        if record(rt, event, stream.0 as *mut c_void) == codes::SUCCESS {
            Some((event, device))
        } else {
            events::destroy(rt, event);
            None
        }
    });
    drop(on_device);
    if recorded.is_none() {
        clear_last_error(rt);
    }
    recorded
}
