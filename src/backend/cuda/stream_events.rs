//! Fences of frees recorded on other streams (`Tensor.record_stream`): an event on each recorded
//! stream, as PyTorch's allocator records them (`insert_events`), polled as it polls them
//! (`process_events`): each stream's events in the order they were recorded, up to the first one
//! not complete (work on one stream completes in order), so a poll queries about one event per
//! stream that has any. A fence is done once every one of its events has completed, whatever
//! other streams' fences are still waiting.

use super::events::{EventHandle, IdleEvents, query, record};
use super::runtime::{CudaError, Runtime, clear_last_error, codes};
use crate::pool::StreamId;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::ffi::c_void;

/// A recorded fence, and the streams the runtime refused to record on with its answers.
pub type Recorded = (u64, Vec<(StreamId, CudaError)>);

/// The stream fences of one device.
#[derive(Debug, Default)]
pub struct StreamEvents {
    /// Per stream, its recorded events in order, each with the fence it belongs to.
    queues: FxHashMap<StreamId, VecDeque<(EventHandle, u64)>>,
    /// Fences with events not seen complete yet, and how many.
    outstanding: FxHashMap<u64, usize>,
    idle: IdleEvents,
    next_fence: u64,
}

impl StreamEvents {
    /// Record an event on each of `streams`; the caller has made the device current. A stream
    /// the runtime refuses to record on (a stream of another device) is left out, that error
    /// cleared from the runtime's last error, and returned with its code.
    pub fn record(
        &mut self,
        rt: &Runtime,
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
            match record(rt, event, stream.0 as *mut c_void) {
                codes::SUCCESS => {
                    self.queues
                        .entry(stream)
                        .or_default()
                        .push_back((event, fence));
                    recorded += 1;
                }
                code => {
                    clear_last_error(rt);
                    self.idle.put(rt, event);
                    refused.push((stream, code));
                }
            }
        }
        if recorded > 0 {
            self.outstanding.insert(fence, recorded);
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
        let Self {
            queues,
            outstanding,
            idle,
            ..
        } = self;
        for queue in queues.values_mut() {
            while let Some(&(event, fence)) = queue.front() {
                match query(rt, event) {
                    codes::SUCCESS => {}
                    codes::NOT_READY => break,
                    code => return Err((code, "cudaEventQuery")),
                }
                queue.pop_front();
                idle.put(rt, event);
                if let Some(left) = outstanding.get_mut(&fence) {
                    *left -= 1;
                    if *left == 0 {
                        outstanding.remove(&fence);
                        done.push(fence);
                    }
                }
            }
        }
        queues.retain(|_, queue| !queue.is_empty());
        Ok(())
    }

    /// Whether every event of `fence` was seen complete (by `poll` or a synchronization).
    pub fn done(&self, fence: u64) -> bool {
        !self.outstanding.contains_key(&fence)
    }

    /// After a device-wide synchronization every recorded event has completed.
    pub fn all_done(&mut self, rt: &Runtime) {
        if self.outstanding.is_empty() {
            // Nothing recorded is outstanding, and queues hold only outstanding events.
            return;
        }
        for (_, queue) in self.queues.drain() {
            for (event, _) in queue {
                self.idle.put(rt, event);
            }
        }
        self.outstanding.clear();
    }
}
