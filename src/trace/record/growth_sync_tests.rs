//! Synchronizations a replay must make where its own pool would, not where the recorded one
//! did: the pool's synchronization before growing (`sync_before_growth`, whose completions
//! the replay leaves to its own pool) and the program's (`device_synchronize`, which completes
//! every free the replay still holds). A pool on the simulated device, whose frees wait until
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
