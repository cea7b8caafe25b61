//! Fences of frees recorded on other streams (`Tensor.record_stream`): an event on each recorded
//! stream, as PyTorch's allocator records them (`insert_events`), polled as it polls them
//! (`process_events`): each stream's events in the order they were recorded, up to the first one
//! not complete (work on one stream completes in order), so a poll queries about one event per
//! stream that has any. A fence is done once every one of its events has completed, whatever
//! other streams' fences are still waiting.
//!
//! A stream of another device cannot carry an event of this one: the event is created on the
//! stream's device (`cudaStreamGetDevice`, CUDA 12.8 and later; that device's context exists
//! since the stream does) and destroyed there once complete, as PyTorch records on the stream's
//! own device. A synchronization of this device does not cover such a stream's work: before
//! memory is given back, `wait_elsewhere` waits for its events. Where the runtime cannot name the
//! stream's device, the stream is left out and returned to the caller.
//!
//! During a CUDA graph capture no event is recorded (`defer`): one recorded on a capturing stream
//! is a captured event, which stands for no work that runs and which no query may ask about,
//! even after the capture (`cudaErrorCapturedEvent`, 907), and the legacy stream is unusable
//! while a blocking stream captures (a use of it ends that capture). As PyTorch's allocator defers
//! them (`needs_events_deferred_until_no_capture`), the fence's events are recorded once no
//! capture is underway (`record_deferred`: at the device's next poll or synchronization), after
//! the work issued until then. Streams the runtime refuses then are left out, as at free time,
//! with a warning (`warn_refused`: the free's caller has returned): their work is not waited
//! for. A stream the program destroys before then (CUDA lets its work run on) gets its events
//! as it is destroyed (`record_deferred_on`), while its handle is live.

use super::device_guard::DeviceGuard;
use super::events::{self, EventHandle, IdleEvents, query, record};
use super::notices;
use super::runtime::{
    CudaError, Runtime, STREAM_LEGACY, STREAM_PER_THREAD, clear_last_error, codes, stream_device,
};
use super::unread_error;
use crate::backend::Fence;
use crate::pool::{DeviceId, StreamId};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Marks the fences of `StreamEvents` (the `free_sync` policies' fences never reach this bit).
pub const STREAM_FENCE: u64 = 1 << 63;

/// A recorded fence, and the streams the runtime refused to record on with its answers.
pub type Recorded = (Fence, Vec<(StreamId, CudaError)>);

/// How many events were recorded, and the streams refused with the runtime's answers.
type Events = (usize, Vec<(StreamId, CudaError)>);

/// Deferred fences of every device's `StreamEvents`: a stream's destruction reads one atomic
/// while none waits (`any_deferred`).
static DEFERRED: AtomicUsize = AtomicUsize::new(0);

/// Whether a fence of any device waits for its events to be recorded after a capture.
#[inline]
pub fn any_deferred() -> bool {
    DEFERRED.load(Ordering::Acquire) != 0
}

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
    /// Fences done outside a poll (by `end_park` after a reset), for the next poll to report.
    done_unpolled: Vec<u64>,
    /// Queues of streams of a device being reset (`park`), touched by nothing until `end_park`.
    parked: Vec<(StreamId, VecDeque<StreamEvent>)>,
    /// Fences of frees made during a capture, with their streams, oldest first: no event yet
    /// (each counts one outstanding until `record_deferred`).
    deferred: Vec<(u64, Vec<StreamId>)>,
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
        let fence = self.new_fence();
        let (events, refused) = self.record_events(rt, own, fence, streams)?;
        if events > 0 {
            self.outstanding.insert(fence, events);
        }
        // Else nothing to wait for: `done` answers true at once.
        Ok((Fence(fence), refused))
    }

    /// A fence over `streams` whose events are recorded later, by `record_deferred` (a CUDA
    /// graph capture is underway): not done until then. Makes no call. The per-thread default
    /// stream (`cudaStreamPerThread`) is the calling thread's, and the events may be recorded by
    /// another thread: the legacy default stream stands for it, whose event, recorded after the
    /// capture, follows the earlier work of every thread's default stream (they are blocking).
    pub fn defer(&mut self, streams: &[StreamId]) -> Fence {
        let fence = self.new_fence();
        if !streams.is_empty() {
            let legacy = StreamId(STREAM_LEGACY as u64);
            let mut named = Vec::with_capacity(streams.len());
            for &stream in streams {
                let stream = if stream.0 == STREAM_PER_THREAD as u64 {
                    legacy
                } else {
                    stream
                };
                if !named.contains(&stream) {
                    named.push(stream);
                }
            }
            // One count for the streams whose events are not recorded yet (`settle_deferred`).
            self.outstanding.insert(fence, 1);
            self.deferred.push((fence, named));
            DEFERRED.fetch_add(1, Ordering::AcqRel);
        }
        Fence(fence)
    }

    /// Record the events of the deferred fences, oldest first, now that no capture is underway;
    /// the caller has made `own` current. A fence whose streams were all refused is done (the
    /// next poll reports it). An error leaves that fence and the later ones deferred.
    pub fn record_deferred(
        &mut self,
        rt: &Runtime,
        own: DeviceId,
    ) -> Result<(), (CudaError, &'static str)> {
        let mut deferred = std::mem::take(&mut self.deferred);
        let mut recorded = 0;
        let mut result = Ok(());
        for (fence, streams) in &deferred {
            match self.record_events(rt, own, *fence, streams) {
                Ok((events, refused)) => {
                    warn_refused(&refused);
                    self.settle_deferred(*fence, events, true);
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            recorded += 1;
        }
        deferred.drain(..recorded);
        DEFERRED.fetch_sub(recorded, Ordering::AcqRel);
        self.deferred = deferred;
        result
    }

    /// Whether a deferred fence waits for its events to be recorded.
    pub fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// The streams deferred fences wait to record events on, each once.
    pub fn deferred_streams(&self) -> Vec<StreamId> {
        let mut all = Vec::new();
        for (_, streams) in &self.deferred {
            for &stream in streams {
                if !all.contains(&stream) {
                    all.push(stream);
                }
            }
        }
        all
    }

    /// Whether a deferred fence waits for an event on `stream`.
    pub fn defers(&self, stream: StreamId) -> bool {
        self.deferred
            .iter()
            .any(|(_, streams)| streams.contains(&stream))
    }

    /// The program is about to destroy `stream`, which is not capturing: the deferred fences'
    /// events on it are recorded now, while its handle is live (its work runs on after the
    /// destroy, and the fences wait for it); their other streams wait for `record_deferred`. The
    /// caller has made `own` current. An error leaves the fences not reached as they were.
    pub fn record_deferred_on(
        &mut self,
        rt: &Runtime,
        own: DeviceId,
        stream: StreamId,
    ) -> Result<(), (CudaError, &'static str)> {
        let mut deferred = std::mem::take(&mut self.deferred);
        let mut result = Ok(());
        for (fence, streams) in deferred.iter_mut() {
            if !streams.contains(&stream) {
                continue;
            }
            match self.record_events(rt, own, *fence, &[stream]) {
                Ok((events, refused)) => {
                    warn_refused(&refused);
                    streams.retain(|&s| s != stream);
                    self.settle_deferred(*fence, events, streams.is_empty());
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let before = deferred.len();
        deferred.retain(|(_, streams)| !streams.is_empty());
        DEFERRED.fetch_sub(before - deferred.len(), Ordering::AcqRel);
        self.deferred = deferred;
        result
    }

    /// `events` more events of deferred `fence` are outstanding; once `settled` (no stream of it
    /// waits to be recorded on any more), the count its deferral held goes, and a fence with no
    /// event left is done (the next poll reports it).
    fn settle_deferred(&mut self, fence: u64, events: usize, settled: bool) {
        if let Some(left) = self.outstanding.get_mut(&fence) {
            *left += events;
        }
        if settled && count_complete(&mut self.outstanding, fence) {
            self.done_unpolled.push(fence);
        }
    }

    fn new_fence(&mut self) -> u64 {
        self.next_fence += 1;
        STREAM_FENCE | self.next_fence
    }

    /// Record an event of `fence` on each of `streams` (see `record`); how many were recorded
    /// (the caller counts them outstanding), and the streams refused.
    fn record_events(
        &mut self,
        rt: &Runtime,
        own: DeviceId,
        fence: u64,
        streams: &[StreamId],
    ) -> Result<Events, (CudaError, &'static str)> {
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
        Ok((recorded, refused))
    }

    /// Retire the events that have completed since the last poll: each stream's, in order, up
    /// to its first one still running. Appends to `done` each fence whose last event this was.
    pub fn poll(
        &mut self,
        rt: &Runtime,
        done: &mut Vec<Fence>,
    ) -> Result<(), (CudaError, &'static str)> {
        done.extend(self.done_unpolled.drain(..).map(Fence));
        self.retire_in_order(rt, (query, "cudaEventQuery"), |fence| {
            done.push(Fence(fence))
        })
    }

    /// Retire each stream's events in order while `check` (a query, or a wait) answers them
    /// complete, up to the first one still running; `fence_done` is told of each fence whose
    /// last event this was. Another device's event gone with its device's reset is complete.
    fn retire_in_order(
        &mut self,
        rt: &Runtime,
        (check, call): (fn(&Runtime, EventHandle) -> CudaError, &'static str),
        mut fence_done: impl FnMut(u64),
    ) -> Result<(), (CudaError, &'static str)> {
        let Self {
            queues,
            outstanding,
            idle,
            ..
        } = self;
        let mut result = Ok(());
        'streams: for queue in queues.values_mut() {
            while let Some(&recorded) = queue.front() {
                let live = match check(rt, recorded.event) {
                    codes::SUCCESS => true,
                    codes::NOT_READY => break,
                    code if gone_with_its_device(rt, recorded, code) => false,
                    code => {
                        result = Err((code, call));
                        break 'streams;
                    }
                };
                queue.pop_front();
                if live {
                    retire(rt, idle, recorded);
                }
                if count_complete(outstanding, recorded.fence) {
                    fence_done(recorded.fence);
                }
            }
        }
        queues.retain(|_, queue| !queue.is_empty());
        result
    }

    /// Whether every event of `fence` was seen complete (by `poll` or a synchronization).
    pub fn done(&self, fence: Fence) -> bool {
        !self.outstanding.contains_key(&fence.0)
    }

    /// After a synchronization of the backend's device: its events have completed, and the fences
    /// with no other device's event left are done (`done` answers; polls do not report them).
    /// Other devices' streams are not covered: `wait_elsewhere` waits for them.
    pub fn device_synchronized(&mut self, rt: &Runtime) {
        let Self {
            queues,
            outstanding,
            idle,
            ..
        } = self;
        for queue in queues.values_mut() {
            queue.retain(|&recorded| {
                if recorded.elsewhere.is_some() {
                    return true;
                }
                retire(rt, idle, recorded);
                count_complete(outstanding, recorded.fence);
                false
            });
        }
        queues.retain(|_, queue| !queue.is_empty());
    }

    /// Wait for every event on other devices' streams, as PyTorch synchronizes every outstanding
    /// event before it gives memory back (its out-of-memory retry, `empty_cache`). Call after
    /// `device_synchronized`: then every fence is done, but for the events of a device being
    /// reset (`park`), whose work the reset ends. An error leaves the events not yet waited for
    /// in place.
    pub fn wait_elsewhere(&mut self, rt: &Runtime) -> Result<(), (CudaError, &'static str)> {
        // Not on a device: the error the program has not read is kept here.
        unread_error::keep_unread(rt);
        self.retire_in_order(rt, (events::synchronize, "cudaEventSynchronize"), |_| {})
    }

    /// The backend's own device is being reset (and the backend dropped): the events it recorded
    /// on other devices' streams are destroyed there, complete or not (the runtime releases an
    /// event's resources once its work is done).
    pub fn destroy_events_elsewhere(&mut self, rt: &Runtime) {
        for (_, queue) in self.queues.drain() {
            for recorded in queue.into_iter().filter(|r| r.elsewhere.is_some()) {
                retire(rt, &mut self.idle, recorded);
            }
        }
        self.outstanding.clear();
    }

    /// `device` (not the backend's) is about to be reset, which destroys its events: the queues
    /// of its streams are set aside, touched by no poll or wait, until `end_park` says whether
    /// the reset happened.
    pub fn park(&mut self, device: DeviceId) {
        for (&stream, queue) in self.queues.iter_mut() {
            let (theirs, ours): (VecDeque<_>, VecDeque<_>) = queue
                .drain(..)
                .partition(|recorded| recorded.elsewhere == Some(device));
            *queue = ours;
            if !theirs.is_empty() {
                self.parked.push((stream, theirs));
            }
        }
        self.queues.retain(|_, queue| !queue.is_empty());
    }

    /// The reset of `device` is over. When it `happened`, its work ended and its events are gone:
    /// they count as complete (the next poll reports their fences), without a call on them —
    /// their handles may name new events by now. When it failed, the events go back to their
    /// queues, ahead of any recorded since.
    pub fn end_park(&mut self, device: DeviceId, happened: bool) {
        let (ended, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|(_, queue)| queue.iter().all(|r| r.elsewhere == Some(device)));
        self.parked = kept;
        for (stream, mut parked) in ended {
            if happened {
                for recorded in parked {
                    if count_complete(&mut self.outstanding, recorded.fence) {
                        self.done_unpolled.push(recorded.fence);
                    }
                }
            } else {
                let queue = self.queues.entry(stream).or_default();
                parked.append(queue);
                *queue = parked;
            }
        }
    }
}

impl Drop for StreamEvents {
    /// The backend is dropped (its device reset): its deferred fences go with it, uncounted.
    fn drop(&mut self) {
        DEFERRED.fetch_sub(self.deferred.len(), Ordering::AcqRel);
    }
}

/// One event of `fence` completed; whether it was the last, so that the fence is done.
fn count_complete(outstanding: &mut FxHashMap<u64, usize>, fence: u64) -> bool {
    let Some(left) = outstanding.get_mut(&fence) else {
        return false;
    };
    *left -= 1;
    if *left > 0 {
        return false;
    }
    outstanding.remove(&fence);
    true
}

/// Whether a call on another device's event failed because that device was reset without this
/// library seeing it (its events went with it; the error is cleared): its work is over, and
/// the event must not be touched again, its handle may name a new event by now. Any other
/// failure, and any failure of the backend's own events, is the caller's to report.
fn gone_with_its_device(rt: &Runtime, recorded: StreamEvent, code: CudaError) -> bool {
    let gone = recorded.elsewhere.is_some() && code == codes::INVALID_RESOURCE_HANDLE;
    if gone {
        clear_last_error(rt);
    }
    gone
}

/// A completed event leaves its queue: the backend's own is kept for reuse, another device's is
/// destroyed on that device.
fn retire(rt: &Runtime, idle: &mut IdleEvents, recorded: StreamEvent) {
    match recorded.elsewhere {
        None => idle.put(rt, recorded.event),
        Some(device) => {
            let destroyed = DeviceGuard::enter(rt, device)
                .map(|_on_device| events::destroy(rt, recorded.event) == codes::SUCCESS);
            if destroyed != Ok(true) {
                // Only this library's own failure is cleared, never the program's error.
                clear_last_error(rt);
            }
        }
    }
}

/// A free made during a capture cannot wait for these streams' work: the runtime refused an
/// event on each when the capture had ended. Said once the pool's lock is released, since the
/// free's caller has returned (`notices`).
fn warn_refused(refused: &[(StreamId, CudaError)]) {
    for &(stream, code) in refused {
        notices::hold(notices::Notice::StreamRefused { stream, code });
    }
}

/// Record a new event of `stream`'s device on it, when the runtime can name that device and it
/// is not `own`. Leaves `own` current and no error of its own in the last error.
fn record_elsewhere(
    rt: &Runtime,
    own: DeviceId,
    stream: StreamId,
) -> Option<(EventHandle, DeviceId)> {
    // `stream` is a stream handle the program passed for this free.
    let device = stream_device(rt, stream.0 as usize)?;
    if device == own {
        return None;
    }
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
