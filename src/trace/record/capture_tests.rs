//! Round trip of a recording made while a CUDA graph capture was underway: a pool on the
//! simulated device, capturing for a while, records through the recording sink and the line
//! writer a miss that grows although a free is still pending, an `empty_cache()` that does
//! nothing and a request that fails rather than give cached memory back. The faithful replay
//! of the written trace (capacity and recorded addresses given, as `cachealloc replay
//! --faithful` gives them) must make the device calls the pool made, each allocation at its
//! recorded address — with native segments and with expandable ones. Without the `capture`
//! lines (a version 5 file) the replay gives the cached memory back and departs.

use super::buffer::EventBuffer;
use super::written::{self, expandable};
use super::{Action, Event, FORMAT_VERSION};
use crate::backend::sim::{Placement, SimDevice};
use crate::pool::{DeviceAllocator, Error, Settings, StreamId};
use crate::trace::replay::ReplayOutcome;

const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 100 * MIB;
const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

/// The pool's counts `(device allocs, device frees, retries, ooms, synchronizations)`.
type Counts = [u64; 5];

fn counts(stats: &crate::pool::DeviceStats) -> Counts {
    let c = &stats.counts;
    [
        c.num_device_alloc,
        c.num_device_free,
        c.num_alloc_retries,
        c.num_ooms,
        c.num_sync_all_streams,
    ]
}

/// On `CAPACITY` bytes whose device work stays pending until it completes: a cached segment
/// of stream 1 (10 MiB; with expandable segments a 20 MiB page), 40 MiB freed while device
/// work still uses it; then during a capture 40 MiB (a miss: new memory, the free still
/// pending), `empty_cache()` (nothing) and 15 MiB, for which only the cached segment given
/// back makes room (out of memory); after it, the device done, 30 MiB from the freed block and
/// `empty_cache()` giving the cached segment back.
fn record(settings: &Settings) -> (Vec<Event>, Counts) {
    let buffer = EventBuffer::new();
    let sim = SimDevice::new(CAPACITY)
        .with_placement(Placement::BottomUp)
        .with_pending_work();
    let mut pool = DeviceAllocator::new(sim, settings.clone());
    pool.set_event_sink(Some(Box::new(buffer.sink(0))));
    let cached = pool.malloc(10 * MIB, S1).unwrap();
    pool.free(cached).unwrap();
    let pending = pool.malloc(40 * MIB, S0).unwrap();
    pool.free_deferred(pending).unwrap();
    pool.backend_mut().set_capturing(true);
    let grown = pool.malloc(40 * MIB, S0).unwrap();
    assert_ne!(grown, pending, "the pending block stays pending");
    pool.empty_cache().unwrap();
    match pool.malloc(15 * MIB, S0) {
        Err(Error::OutOfMemory(report)) => assert!(report.capture_underway),
        other => panic!("only the cached segment given back makes room: {other:?}"),
    }
    pool.backend_mut().set_capturing(false);
    pool.backend_mut().complete_work();
    assert_eq!(pool.malloc(30 * MIB, S0).unwrap(), pending);
    pool.empty_cache().unwrap();
    (buffer.take(), counts(&pool.stats()))
}

/// Replay `events`, written as a file of `version`, on `CAPACITY` bytes at the recorded
/// addresses.
fn replay_written(settings: &Settings, version: u32, events: &[Event]) -> ReplayOutcome {
    written::replay_written(settings, "device", version, events, CAPACITY)
}

#[test]
fn a_recording_made_during_a_capture_replays_as_the_pool_ran() {
    for settings in [Settings::default(), expandable()] {
        let (events, recorded) = record(&settings);
        let expandable = settings.expandable_segments;
        // A `capture` line before the miss's new memory, the `empty_cache` and the `oom`.
        let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
        let captured: Vec<(Action, u64)> = actions
            .windows(2)
            .zip(&events)
            .filter(|(pair, _)| pair[0] == Action::Capture)
            .map(|(pair, e)| (pair[1], e.size))
            .collect();
        let grows = if expandable {
            Action::SegmentMap
        } else {
            Action::SegmentAlloc
        };
        assert_eq!(
            captured,
            [
                (grows, 40 * MIB),
                (Action::EmptyCache, 0),
                (Action::Oom, 15 * MIB)
            ],
            "expandable {expandable}: {actions:?}"
        );
        // 3 segments (or maps of pages); the cached one given back after the capture; one
        // out of memory; one synchronization (the last `empty_cache()`).
        assert_eq!(recorded, [3, 1, 0, 1, 1], "expandable {expandable}");

        let out = replay_written(&settings, FORMAT_VERSION, &events);
        assert_eq!(counts(&out.stats), recorded, "expandable {expandable}");
        assert_eq!(out.allocs, 4);
        assert_eq!(out.allocs_at_recorded_addr, out.allocs);
        assert_eq!(out.captured_requests, 3);
        assert_eq!(out.first_oom.map(|o| o.report.capture_underway), Some(true));

        // Without the lines the replay gives the cached segment back during the capture, and
        // the request it failed fits.
        let unmarked: Vec<Event> = events
            .iter()
            .filter(|e| e.action != Action::Capture)
            .copied()
            .collect();
        let out = replay_written(&settings, 5, &unmarked);
        assert_eq!(out.captured_requests, 0);
        assert_eq!(out.stats.counts.num_ooms, 0, "expandable {expandable}");
        assert_ne!(counts(&out.stats), recorded, "expandable {expandable}");
    }
}

/// A recording pool on `CAPACITY` bytes holding a cached 60 MiB segment of stream 1, with a
/// capture underway.
fn capturing_beside_a_cached_segment(
    settings: &Settings,
) -> (std::sync::Arc<EventBuffer>, DeviceAllocator<SimDevice>) {
    let buffer = EventBuffer::new();
    let sim = SimDevice::new(CAPACITY).with_placement(Placement::BottomUp);
    let mut pool = DeviceAllocator::new(sim, settings.clone());
    pool.set_event_sink(Some(Box::new(buffer.sink(0))));
    let cached = pool.malloc(60 * MIB, S1).unwrap();
    pool.free(cached).unwrap();
    pool.backend_mut().set_capturing(true);
    (buffer, pool)
}

/// A request during a capture that the device refused with another error than out of memory
/// (a plain cudaMalloc during a global-mode capture gets `cudaErrorStreamCaptureUnsupported`)
/// leaves its `capture` line with no `alloc` or `oom` after it. The capture marks nothing
/// else: the next request, made after the capture and needing the cached segment given back,
/// replays as made outside a capture (a retry, no out-of-memory error).
#[test]
fn a_capture_line_whose_request_failed_marks_no_later_request() {
    use crate::backend::BackendError;
    for settings in [Settings::default(), expandable()] {
        let expandable = settings.expandable_segments;
        let (buffer, mut pool) = capturing_beside_a_cached_segment(&settings);
        let refused = BackendError::Device {
            code: 900,
            call: "cudaMalloc",
        };
        pool.backend_mut().inject_failure(refused.clone());
        assert_eq!(pool.malloc(30 * MIB, S0), Err(Error::Backend(refused)));
        pool.backend_mut().set_capturing(false);
        pool.malloc(50 * MIB, S0).unwrap();
        let events = buffer.take();
        let recorded = counts(&pool.stats());
        assert_eq!(
            recorded[2..4],
            [1, 0],
            "expandable {expandable}: a retry, no OOM"
        );
        assert_eq!(
            events
                .iter()
                .filter(|e| e.action == Action::Capture)
                .count(),
            1,
            "expandable {expandable}: {events:?}"
        );

        let out = replay_written(&settings, FORMAT_VERSION, &events);
        assert_eq!(counts(&out.stats), recorded, "expandable {expandable}");
        assert!(out.first_oom.is_none(), "expandable {expandable}");
        assert_eq!(out.captured_requests, 0, "expandable {expandable}");
    }
}

/// An `empty_cache()` made during a capture gives nothing back, so the `segment_free`s right
/// after its line are not its own: they are the next request's release before its retry, from
/// which the recording bounds the device's capacity as without the call.
#[test]
fn releases_after_an_empty_cache_made_during_a_capture_are_the_next_requests() {
    for settings in [Settings::default(), expandable()] {
        let expandable = settings.expandable_segments;
        let (buffer, mut pool) = capturing_beside_a_cached_segment(&settings);
        pool.empty_cache().unwrap();
        pool.backend_mut().set_capturing(false);
        pool.malloc(50 * MIB, S0).unwrap();
        assert_eq!(pool.stats().counts.num_alloc_retries, 1);
        let events = buffer.take();
        let without_call: Vec<Event> = events
            .iter()
            .filter(|e| !matches!(e.action, Action::Capture | Action::EmptyCache))
            .copied()
            .collect();
        let bracket =
            written::convert_written(&settings, "device", FORMAT_VERSION, &without_call).capacity;
        assert!(
            bracket.is_some(),
            "expandable {expandable}: {without_call:?}"
        );
        let rec = written::convert_written(&settings, "device", FORMAT_VERSION, &events);
        assert_eq!(rec.capacity, bracket, "expandable {expandable}: {events:?}");
        assert_eq!(rec.figures.recorded_retries, 1, "expandable {expandable}");
    }
}
