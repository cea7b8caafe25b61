//! Synchronizations a replay must make where its own pool would, not where the recorded one
//! did: the pool's synchronization before growing (`sync_before_growth`, whose completions
//! the replay leaves to its own pool) and the program's (`device_synchronize`, which completes
//! those, and leaves the others to their recorded completions). A pool on the simulated
//! device, whose frees wait until
//! the program synchronizes (`device_synchronized`) or the pool does, records a trace on one
//! device; its replay on another must do what the pool does there.

use super::buffer::EventBuffer;
use super::written;
use super::{Action, Event, FORMAT_VERSION};
use crate::backend::sim::SimDevice;
use crate::pool::{Counts, DeviceAllocator, DevicePtr, FreeWaits, Settings, StreamId};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn malloc(pool: &mut DeviceAllocator<SimDevice>, size: u64) -> DevicePtr {
    pool.malloc(size, StreamId(0)).expect("the request fits")
}

/// `(device allocs, device frees, retries, ooms, synchronizations)`.
fn counts(c: &Counts) -> [u64; 5] {
    [
        c.num_device_alloc,
        c.num_device_free,
        c.num_alloc_retries,
        c.num_ooms,
        c.num_sync_all_streams,
    ]
}

/// The program: 10 MiB, a cached 40 MiB segment, 42 MiB (on 80 MiB, its retry gives the
/// cached segment back), the 10 MiB freed with a `cudaFree` (pending), then 12 MiB: on 80 MiB
/// no free block serves it, and the pool synchronizes before growing (completing the free,
/// whose block is too small); on 200 MiB the cached segment serves it, and the free waits for
/// the program's synchronization. Then 14 MiB on another stream, which no free block serves:
/// the pool grows, with nothing left to synchronize for.
fn program(pool: &mut DeviceAllocator<SimDevice>) {
    let freed = malloc(pool, 10 * MIB);
    let cached = malloc(pool, 40 * MIB);
    pool.free(cached).unwrap();
    malloc(pool, 42 * MIB);
    pool.free_deferred(freed).unwrap();
    malloc(pool, 12 * MIB);
    // The device's work is done when the program's synchronization returns.
    pool.backend_mut().complete_work();
    pool.device_synchronized().unwrap();
    pool.malloc(14 * MIB, StreamId(1))
        .expect("the request fits");
}

/// Run `program` on `capacity` bytes, recording into `buffer` when given; its counts.
fn run(capacity: u64, buffer: Option<&Arc<EventBuffer>>) -> [u64; 5] {
    let sim = SimDevice::new(capacity).with_pending_work();
    let mut pool = DeviceAllocator::new(sim, Settings::default());
    if let Some(buffer) = buffer {
        pool.set_event_sink(Some(Box::new(buffer.sink(0))));
    }
    program(&mut pool);
    counts(&pool.stats().counts)
}

/// Recorded on 80 MiB, where the pool synchronized before growing for the 12 MiB request, and
/// replayed on 200 MiB, where the cached segment serves it: the free stays pending in the
/// replay, as in the program there, until the program's synchronization, and the last request
/// grows without synchronizing. The faithful replay on 80 MiB makes the recorded pool's
/// synchronization (before, it completed the free ahead of the request and made none).
/// Without the `device_synchronize` line the replay would hold the free until its pool
/// synchronized, which the last request would then do.
#[test]
fn a_replay_synchronizes_where_its_pool_would() {
    let buffer = EventBuffer::new();
    let recorded = run(80 * MIB, Some(&buffer));
    assert_eq!(
        recorded,
        [5, 1, 1, 0, 2],
        "a retry, and a synchronization before growing"
    );
    let there = run(200 * MIB, None);
    assert_eq!(there, [4, 0, 0, 0, 0]);
    let events = buffer.take();
    let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
    use Action::*;
    let grow_sync = [
        FreeRequested,
        SyncBeforeGrowth,
        FreeCompleted,
        SegmentAlloc,
        Alloc,
    ];
    let program_sync = [DeviceSynchronize, SegmentAlloc, Alloc];
    assert!(
        actions.ends_with(&[&grow_sync[..], &program_sync[..]].concat()),
        "{actions:?}"
    );
    let settings = Settings::default();
    let replayed = |events: &[Event], capacity| {
        let out =
            written::replay_written_what_if(&settings, "device", FORMAT_VERSION, events, capacity);
        counts(&out.stats.counts)
    };
    assert_eq!(replayed(&events, 200 * MIB), there);
    let faithful = written::replay_written(&settings, "device", FORMAT_VERSION, &events, 80 * MIB);
    assert_eq!(counts(&faithful.stats.counts), recorded);
    let without_program_sync: Vec<Event> = events
        .iter()
        .filter(|e| e.action != DeviceSynchronize)
        .copied()
        .collect();
    assert_eq!(replayed(&without_program_sync, 200 * MIB), [4, 0, 0, 0, 1]);
}

/// The program's synchronization of its device completes the frees that waited for that
/// device's work, not one that waits for a stream still busy on another device (a block
/// recorded as used there, `free_after_streams`; or, from another thread, a free made while
/// the synchronization ran): the recording shows no completion of it after the
/// `device_synchronize` line, and the next request takes a new segment beside its block. The
/// faithful replay must do the same, not complete the free there and serve the request from
/// its block.
#[test]
fn the_program_s_synchronization_completes_only_what_the_recording_completed() {
    let buffer = EventBuffer::new();
    let sim = SimDevice::new(80 * MIB).with_pending_work();
    let mut pool = DeviceAllocator::new(sim, Settings::default());
    pool.set_event_sink(Some(Box::new(buffer.sink(0))));
    let used_elsewhere = malloc(&mut pool, 20 * MIB);
    pool.free_after_streams(used_elsewhere, &[StreamId(7)])
        .unwrap();
    // This device's work is done; the stream of the other device is still busy.
    pool.device_synchronized().unwrap();
    assert_ne!(malloc(&mut pool, 20 * MIB), used_elsewhere);
    let recorded = counts(&pool.stats().counts);
    assert_eq!(recorded, [2, 0, 0, 0, 0]);
    let events = buffer.take();
    let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
    use Action::*;
    let program_sync = [FreeRequested, DeviceSynchronize, SegmentAlloc, Alloc];
    assert!(actions.ends_with(&program_sync), "{actions:?}");
    let settings = Settings::default();
    let faithful = written::replay_written(&settings, "none", FORMAT_VERSION, &events, 80 * MIB);
    assert_eq!(counts(&faithful.stats.counts), recorded);
    assert_eq!(faithful.allocs_at_recorded_addr, 2);
}

/// The frees the program's synchronization completed (the `free_completed`s right after its
/// `device_synchronize` line) are complete there, though the next request's retry releases
/// their blocks (its `segment_free` and `retry` lines follow them, as after the completions of
/// the retry's own synchronization): the faithful replay synchronizes once, for the retry, as
/// the pool did, not also before growing for a free it took as still waiting.
#[test]
fn the_frees_the_program_s_synchronization_completed_are_complete_before_the_next_request() {
    let buffer = EventBuffer::new();
    let sim = SimDevice::new(400 * MIB).with_pending_work();
    let mut pool = DeviceAllocator::new(sim, Settings::default());
    pool.set_event_sink(Some(Box::new(buffer.sink(0))));
    let freed = malloc(&mut pool, 300 * MIB);
    pool.free_deferred(freed).unwrap();
    pool.backend_mut().complete_work();
    pool.device_synchronized().unwrap();
    // 300 + 400 MiB do not fit: the retry gives the freed segment back.
    malloc(&mut pool, 400 * MIB);
    let recorded = counts(&pool.stats().counts);
    assert_eq!(recorded, [2, 1, 1, 0, 1]);
    let events = buffer.take();
    let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
    use Action::*;
    let program_sync = [
        FreeRequested,
        DeviceSynchronize,
        FreeCompleted,
        SegmentFree,
        Retry,
    ];
    assert!(
        actions.ends_with(&[&program_sync[..], &[SegmentAlloc, Alloc]].concat()),
        "{actions:?}"
    );
    let settings = Settings::default();
    let faithful = written::replay_written(&settings, "device", FORMAT_VERSION, &events, 400 * MIB);
    assert_eq!(counts(&faithful.stats.counts), recorded);
}

/// The lines of device 0 in `lines` (action, address, size, waits), a microsecond apart.
fn lines(lines: &[(Action, u64, u64, Option<FreeWaits>)]) -> Vec<Event> {
    let at = |(t, &(action, addr, size, waits)): (usize, _)| Event {
        waits,
        ..Event::plain(t as u64 + 1, 0, action, addr, size)
    };
    lines.iter().enumerate().map(at).collect()
}

/// A synchronization of the device does not cover a stream of another device: a free that
/// waits for one still busy (a block recorded as used there; under `free_sync:device` its
/// `cudaFree` waits for the device, then for those streams) outlasts the pool's
/// synchronization before growing, which completes the others (a stream simulated on one
/// device cannot show it: these are the lines the library writes). The recording shows the
/// synchronization with no completion of it, and the request takes new memory, or a block
/// the synchronization freed, beside its block. The faithful replay synchronizes there too,
/// and must not complete that free: it completes at its own line, as recorded.
#[test]
fn a_free_waiting_for_another_device_s_stream_outlasts_the_synchronization_before_growing() {
    use Action::*;
    use FreeWaits::{Device, DeviceThenStreams, Streams};
    let (a, b, c) = (0x7f00_0000_0000, 0x7f10_0000_0000, 0x7f20_0000_0000);
    let recordings = [
        // A cudaFree under free_sync:device of a block used on another device's stream.
        lines(&[
            (SegmentAlloc, a, 20 * MIB, None),
            (Alloc, a, 20 * MIB, None),
            (FreeRequested, a, 20 * MIB, Some(DeviceThenStreams)),
            (SyncBeforeGrowth, 0, 20 * MIB, None),
            (SegmentAlloc, b, 20 * MIB, None),
            (Alloc, b, 20 * MIB, None),
            (FreeCompleted, a, 20 * MIB, None),
        ]),
        // A free waiting for another device's stream while a cudaFree waits: the
        // synchronization completes the cudaFree's block (too small), not the other.
        lines(&[
            (SegmentAlloc, a, 40 * MIB, None),
            (Alloc, a, 40 * MIB, None),
            (SegmentAlloc, c, 20 * MIB, None),
            (Alloc, c, 20 * MIB, None),
            (FreeRequested, a, 40 * MIB, Some(Streams)),
            (FreeRequested, c, 20 * MIB, Some(Device)),
            (SyncBeforeGrowth, 0, 30 * MIB, None),
            (FreeCompleted, c, 20 * MIB, None),
            (SegmentAlloc, b, 30 * MIB, None),
            (Alloc, b, 30 * MIB, None),
            (FreeCompleted, a, 40 * MIB, None),
        ]),
        // A free waiting for another device's stream past one synchronization, which a later
        // one completes (the stream's work was done by then): the request after it is served
        // from its block.
        lines(&[
            (SegmentAlloc, a, 30 * MIB, None),
            (Alloc, a, 30 * MIB, None),
            (SegmentAlloc, c, 20 * MIB, None),
            (Alloc, c, 20 * MIB, None),
            (FreeRequested, a, 30 * MIB, Some(Streams)),
            (FreeRequested, c, 20 * MIB, Some(Device)),
            (SyncBeforeGrowth, 0, 20 * MIB, None),
            (FreeCompleted, c, 20 * MIB, None),
            (Alloc, c, 20 * MIB, None),
            (FreeRequested, c, 20 * MIB, Some(Device)),
            (SyncBeforeGrowth, 0, 25 * MIB, None),
            (FreeCompleted, c, 20 * MIB, None),
            (FreeCompleted, a, 30 * MIB, None),
            (Alloc, a, 25 * MIB, None),
        ]),
    ];
    let settings = Settings::default();
    // (Device allocs, allocations at their recorded address, synchronizations.)
    let replayed = recordings.map(|events| {
        let out = written::replay_written(&settings, "device", FORMAT_VERSION, &events, GIB);
        let c = out.stats.counts;
        let at = out.allocs_at_recorded_addr;
        [c.num_device_alloc, at, c.num_sync_all_streams]
    });
    assert_eq!(replayed, [[2, 2, 1], [3, 3, 1], [2, 4, 2]]);
}

/// A file cut right after a `sync_before_growth` line (a process killed while its trace was
/// written) does not show that synchronization's completions: the line says nothing of the
/// frees still waiting then, and replays as if it were not there — for a free that waits for
/// the device (which never outlasts a synchronization of it), and for one that waits for
/// streams (beside a small one that waits for the device). Replayed on 95 MiB, where a retry
/// gave the cached 40 MiB segment back, the 20 MiB request synchronizes before growing and
/// completes the 10 MiB free, whose block then serves the 8 MiB request.
#[test]
fn a_file_cut_after_a_synchronization_before_growing_replays_as_without_that_line() {
    for waits_for_streams in [false, true] {
        let buffer = EventBuffer::new();
        let sim = SimDevice::new(GIB).with_pending_work();
        let mut pool = DeviceAllocator::new(sim, Settings::default());
        pool.set_event_sink(Some(Box::new(buffer.sink(0))));
        let cached = malloc(&mut pool, 40 * MIB);
        pool.free(cached).unwrap();
        malloc(&mut pool, 60 * MIB);
        let freed = malloc(&mut pool, 10 * MIB);
        if waits_for_streams {
            pool.free_after_streams(freed, &[StreamId(7)]).unwrap();
            let small = malloc(&mut pool, MIB);
            pool.free_deferred(small).unwrap();
        } else {
            pool.free_deferred(freed).unwrap();
        }
        malloc(&mut pool, 20 * MIB);
        malloc(&mut pool, 8 * MIB);
        malloc(&mut pool, 600 * MIB);
        let mut events = buffer.take();
        let cut = events
            .iter()
            .rposition(|e| e.action == Action::SyncBeforeGrowth)
            .expect("the last request synchronized before growing");
        events.truncate(cut + 1);
        let settings = Settings::default();
        let replayed = |events: &[Event]| {
            let out = written::replay_written_what_if(
                &settings,
                "device",
                FORMAT_VERSION,
                events,
                95 * MIB,
            );
            counts(&out.stats.counts)
        };
        let without_line = replayed(&events[..cut]);
        let devices_allocs = 4 + u64::from(waits_for_streams);
        assert_eq!(without_line, [devices_allocs, 1, 1, 0, 2]);
        assert_eq!(replayed(&events), without_line, "{waits_for_streams}");
    }
}
