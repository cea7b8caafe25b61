//! The recording sink: pool events become [`Event`]s in a shared in-memory buffer.
//!
//! `record` runs under the pool lock, so it only timestamps and pushes (no formatting, no
//! system call); whoever owns the buffer takes the events out with [`EventBuffer::take`] after
//! the lock is released and writes them (see `global::trace_file`). All devices of a process
//! share one buffer, and the timestamp is taken under the buffer's own lock, so the events of
//! every device come out in one order with non-decreasing times.
//!
//! A replay that saves its run as a trace (`cachealloc synth --save`) has no clock worth
//! recording: its buffer is [`EventBuffer::numbered`], whose `t_us` numbers the events, so the
//! same workload always writes the same file.

use super::Event;
use crate::pool::{EventSink, PoolEvent};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What an event's `t_us` is.
#[derive(Debug)]
enum Clock {
    /// Microseconds since this instant.
    Since(Instant),
    /// The number of events pushed before it.
    Count,
}

/// Events recorded and not yet written, plus the clock they are timed with.
#[derive(Debug)]
pub struct EventBuffer {
    clock: Clock,
    events: Mutex<Pushed>,
}

#[derive(Debug, Default)]
struct Pushed {
    events: Vec<Event>,
    /// Events pushed so far, taken or not.
    count: u64,
}

impl EventBuffer {
    /// An empty buffer whose clock starts now.
    pub fn new() -> Arc<Self> {
        Self::with_clock(Clock::Since(Instant::now()))
    }

    /// An empty buffer whose `t_us` numbers the events (0, 1, 2, …): for a replay, whose
    /// wall-clock time says nothing about the program it stands for.
    pub fn numbered() -> Arc<Self> {
        Self::with_clock(Clock::Count)
    }

    fn with_clock(clock: Clock) -> Arc<Self> {
        Arc::new(Self {
            clock,
            events: Mutex::new(Pushed::default()),
        })
    }

    /// Append an event made from the current time.
    pub fn push_with(&self, make: impl FnOnce(u64) -> Event) {
        let mut pushed = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let t_us = match self.clock {
            Clock::Since(start) => u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
            Clock::Count => pushed.count,
        };
        pushed.count += 1;
        pushed.events.push(make(t_us));
    }

    /// Take every buffered event, oldest first.
    pub fn take(&self) -> Vec<Event> {
        let mut pushed = self.events.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut pushed.events)
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
    use crate::pool::{DevicePtr, StreamId};
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

    #[test]
    fn a_numbered_buffer_counts_events_across_takes() {
        let buffer = EventBuffer::numbered();
        let mut sink = buffer.sink(0);
        sink.record(&PoolEvent::EmptyCache);
        sink.record(&PoolEvent::EmptyCache);
        let first: Vec<u64> = buffer.take().iter().map(|e| e.t_us).collect();
        sink.record(&PoolEvent::EmptyCache);
        let second: Vec<u64> = buffer.take().iter().map(|e| e.t_us).collect();
        assert_eq!((first, second), (vec![0, 1], vec![2]));
    }
}
