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
use crate::pool::{Counts, DeviceAllocator, DevicePtr, Settings, StreamId};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

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
