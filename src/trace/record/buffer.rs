//! The recording sink: pool events become [`Event`]s in a shared in-memory buffer.
//!
//! `record` runs under the pool lock, so it only timestamps and pushes (no formatting, no
//! system call); whoever owns the buffer takes the events out with [`EventBuffer::take`] after
//! the lock is released and writes them (see `global::trace_file`). All devices of a process
//! share one buffer, and the timestamp is taken under the buffer's own lock, so the events of
//! every device come out in one order with non-decreasing times.

use super::Event;
use crate::pool::{EventSink, PoolEvent};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Events recorded and not yet written, plus the clock they are timed with.
#[derive(Debug)]
pub struct EventBuffer {
    start: Instant,
    events: Mutex<Vec<Event>>,
}

impl EventBuffer {
    /// An empty buffer whose clock starts now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
        })
    }

    /// Append an event made from the current time.
    pub fn push_with(&self, make: impl FnOnce(u64) -> Event) {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let t_us = self.elapsed_us();
        events.push(make(t_us));
    }

    /// Take every buffered event, and the time on this buffer's clock then (no event pushed
    /// before reads a later time), with the buffer's lock taken by `lock`, which may give up:
    /// `None` when it does. The exit handler's take: the thread that holds the lock may never
    /// let go of it (`exit` called by a signal handler that interrupted that thread's push).
    pub fn take_with_time(
        &self,
        lock: impl for<'a> FnOnce(&'a Mutex<Vec<Event>>) -> Option<MutexGuard<'a, Vec<Event>>>,
    ) -> Option<(Vec<Event>, u64)> {
        let mut events = lock(&self.events)?;
        let t_us = self.elapsed_us();
        Some((std::mem::take(&mut *events), t_us))
    }

    fn elapsed_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Take every buffered event, oldest first.
    pub fn take(&self) -> Vec<Event> {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *events)
    }

    /// A sink for the pool of `device` that records into this buffer.
    pub fn sink(self: &Arc<Self>, device: i32) -> DeviceSink {
        DeviceSink {
            buffer: Arc::clone(self),
            device,
        }
    }
}

/// The [`EventSink`] installed in one device's pool.
#[derive(Debug)]
pub struct DeviceSink {
    buffer: Arc<EventBuffer>,
    device: i32,
}

impl EventSink for DeviceSink {
    fn record(&mut self, event: &PoolEvent) {
        let device = self.device;
        self.buffer
            .push_with(|t_us| Event::from_pool(event, device, t_us));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{DevicePtr, FreeWaits, StreamId};
    use crate::trace::record::Action;

    #[test]
    fn sinks_of_two_devices_share_one_ordered_buffer() {
        let buffer = EventBuffer::new();
        let mut d0 = buffer.sink(0);
        let mut d1 = buffer.sink(1);
        let ptr = DevicePtr::new(0x1000).unwrap();
        d0.record(&PoolEvent::Alloc {
            ptr,
            size: 8,
            stream: StreamId(0),
        });
        d1.record(&PoolEvent::EmptyCache);
        d0.record(&PoolEvent::FreeRequested {
            ptr,
            size: 8,
            stream: StreamId(0),
            waits: FreeWaits::Nothing,
        });
        let events = buffer.take();
        let seen: Vec<(i32, Action)> = events.iter().map(|e| (e.device, e.action)).collect();
        assert_eq!(
            seen,
            [
                (0, Action::Alloc),
                (1, Action::EmptyCache),
                (0, Action::FreeRequested)
            ]
        );
        assert!(events.windows(2).all(|w| w[0].t_us <= w[1].t_us));
        assert!(buffer.take().is_empty(), "take empties the buffer");
    }

    /// A take whose lock gives up takes nothing; once the lock is had, every event, and a time
    /// no earlier than theirs.
    #[test]
    fn a_take_with_time_whose_lock_gives_up_leaves_the_events() {
        let buffer = EventBuffer::new();
        buffer.sink(0).record(&PoolEvent::EmptyCache);
        let held = buffer.events.lock().unwrap();
        assert!(buffer.take_with_time(|m| m.try_lock().ok()).is_none());
        drop(held);
        let (events, t_us) = buffer.take_with_time(|m| m.try_lock().ok()).unwrap();
        assert_eq!(events.len(), 1);
        assert!(t_us >= events[0].t_us);
        assert!(buffer.take().is_empty());
    }
}
