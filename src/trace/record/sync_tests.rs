//! Round trip of frees that waited: a pool on the simulated device records, through the
//! recording sink and the line writer, a request whose search finds no free block while a free
//! waits for device work; the replay of the written trace (with its `retry` lines, and
//! without them as a version 2 file has none) must do what the pool did — with native segments
//! and with expandable ones (where the device's allocs and frees count page maps and unmaps).
//! Replayed on a smaller device, the trace must do what the pool does there.

use super::buffer::EventBuffer;
use super::written::{self, expandable};
use super::{Action, Event, FORMAT_VERSION};
use crate::backend::sim::{Placement, SimDevice};
use crate::pool::{DeviceAllocator, DevicePtr, Error, FreeWaits, Settings, StreamId};
use crate::trace::replay::ReplayOutcome;

const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 100 * MIB;

/// Record what `drive` does to a pool with `settings` on `CAPACITY` bytes with bottom-up
/// addresses whose device work stays pending until a synchronization; return the recording's
/// actions, the pool's counts `(device allocs, device frees, retries, ooms)` and the replays of
/// the written trace, at the recorded segments and ranges: as this version writes it, and as a
/// version 2 file (without `retry` lines).
fn record_and_replay(
    settings: &Settings,
    drive: impl FnOnce(&mut DeviceAllocator<SimDevice>),
) -> (Vec<Action>, [u64; 4], [ReplayOutcome; 2]) {
    let buffer = EventBuffer::new();
    let sim = SimDevice::new(CAPACITY)
        .with_placement(Placement::BottomUp)
        .with_pending_work();
    let mut pool = DeviceAllocator::new(sim, settings.clone());
    pool.set_event_sink(Some(Box::new(buffer.sink(0))));
    drive(&mut pool);
    let c = pool.stats().counts;
    let recorded = [
        c.num_device_alloc,
        c.num_device_free,
        c.num_alloc_retries,
        c.num_ooms,
    ];
    let events = buffer.take();
    let actions = events.iter().map(|e| e.action).collect();
    let unmarked: Vec<Event> = events
        .iter()
        .filter(|e| e.action != Action::Retry)
        .cloned()
        .collect();
    let replays = [(FORMAT_VERSION, &events), (2, &unmarked)].map(|(version, events)| {
        written::replay_written(settings, "event", version, events, CAPACITY)
    });
    (actions, recorded, replays)
}

fn malloc(pool: &mut DeviceAllocator<SimDevice>, size: u64) -> DevicePtr {
    pool.malloc(size, StreamId(0)).expect("the request fits")
}

/// Each replay's `(allocs at the recorded address, device allocs, device frees, retries,
/// ooms)`.
fn replayed(outs: &[ReplayOutcome; 2]) -> [[u64; 5]; 2] {
    outs.each_ref().map(|out| {
        let c = &out.stats.counts;
        [
            out.allocs_at_recorded_addr,
            c.num_device_alloc,
            c.num_device_free,
            c.num_alloc_retries,
            c.num_ooms,
        ]
    })
}

/// A free that waits for another stream (`record_stream`: `free_after_streams`) is still
/// waiting when a 30 MiB request finds no free block and 80 + 30 MiB do not fit in 100: the
/// retry's synchronization completes it after the search, releases its whole segment and gets
/// a new one. The trace shows the completion inside that request, before the release; replayed
/// before the request, it would serve the request from the freed block, with no retry.
#[test]
fn a_free_completed_by_a_retry_returns_after_the_search() {
    use Action::*;
    retry_completes_after_the_search(
        &Settings::default(),
        &[FreeCompleted, SegmentFree, Retry, SegmentAlloc, Alloc],
    );
}

/// A 40 MiB free waiting for stream 1, 40 MiB more, then a 30 MiB request that finds no free
/// block and no room, recorded under `settings`: its trace must end with `retry` (the retry's
/// synchronization completing the free, its release, the retry and the request served), and
/// both replays make what the pool made: 3 segments or maps, 1 release, 1 retry, no oom.
fn retry_completes_after_the_search(settings: &Settings, retry: &[Action]) {
    let (actions, recorded, out) = record_and_replay(settings, |pool| {
        let a = malloc(pool, 40 * MIB);
        pool.free_after_streams(a, &[StreamId(1)]).unwrap();
        malloc(pool, 40 * MIB);
        malloc(pool, 30 * MIB);
    });
    assert!(
        actions.ends_with(retry),
        "the retry's synchronization completes the free: {actions:?}"
    );
    assert_eq!(recorded, [3, 1, 1, 0]);
    assert_eq!(replayed(&out), [[3, 3, 1, 1, 0]; 2]);
}

/// The retry fails too: the waiting free leaves part of a segment another allocation still
/// holds, so the synchronization completes it (before the `retry` and `oom` lines) but releases
/// nothing. Replayed before the request, the completion would serve it: no retry, no `oom`.
#[test]
fn a_free_completed_by_a_failed_retry_returns_after_the_search() {
    let (actions, recorded, out) = record_and_replay(&Settings::default(), |pool| {
        let whole = malloc(pool, 40 * MIB);
        pool.free(whole).unwrap();
        // 30 and 10 MiB of that 40 MiB segment, then 40 and 20 MiB more: 100 MiB reserved.
        let part = malloc(pool, 30 * MIB);
        malloc(pool, 10 * MIB);
        malloc(pool, 40 * MIB);
        malloc(pool, 20 * MIB);
        pool.free_after_streams(part, &[StreamId(1)]).unwrap();
        match pool.malloc(30 * MIB, StreamId(0)) {
            Err(Error::OutOfMemory(_)) => {}
            other => panic!("no free block and no room: {other:?}"),
        }
    });
    use Action::*;
    let retry = [FreeRequested, FreeCompleted, Retry, Oom];
    assert!(actions.ends_with(&retry), "{actions:?}");
    assert_eq!(recorded, [3, 0, 1, 1]);
    // The failed request is probed (a replay that knows the capacity) and fails the same way.
    assert_eq!(replayed(&out), [[5, 3, 0, 1, 1]; 2]);
}

/// A free that waits for a fence (`free_sync:event`: `free_deferred`) completes where the
/// pool synchronizes before growing (its `sync_before_growth` line comes first), and the pool
/// searches again and serves the request from its block. The replay leaves the completion to
/// its own pool, which synchronizes there too: one synchronization, as in the recording.
#[test]
fn a_free_completed_before_growing_serves_the_request() {
    let mut syncs = 0;
    let (actions, recorded, out) = record_and_replay(&Settings::default(), |pool| {
        let a = malloc(pool, 40 * MIB);
        malloc(pool, 40 * MIB);
        pool.free_deferred(a).unwrap();
        // No free block; 80 + 30 MiB do not fit in 100, but the synchronization before growing
        // frees `a`, which the search after it finds.
        malloc(pool, 30 * MIB);
        syncs = pool.stats().counts.num_sync_all_streams;
    });
    use Action::*;
    let grow_sync = [FreeRequested, SyncBeforeGrowth, FreeCompleted, Alloc];
    assert!(actions.ends_with(&grow_sync), "{actions:?}");
    assert_eq!(recorded, [2, 0, 0, 0]);
    assert_eq!(replayed(&out), [[3, 2, 0, 0, 0]; 2]);
    assert_eq!(syncs, 1);
    for out in &out {
        assert_eq!(out.stats.counts.num_sync_all_streams, syncs);
    }
}

/// With expandable segments (20 MiB pages, in one range per stream): a 40 MiB free waits for
/// another stream while 40 MiB more are mapped after it; a 30 MiB request finds no free block
/// and the 40 MiB of pages it needs do not fit in 100. The retry's synchronization completes
/// the free and unmaps its pages, and the retry maps them again for the request. Replayed
/// before the request, the completion would serve it from the freed block: no unmap, no map,
/// no retry.
#[test]
fn an_expandable_free_completed_by_a_retry_returns_after_the_search() {
    use Action::*;
    retry_completes_after_the_search(
        &expandable(),
        &[FreeCompleted, SegmentUnmap, Retry, SegmentMap, Alloc],
    );
}

/// The same on a range of its own: the waiting free is all that stream 2 has mapped, so the
/// retry's synchronization completes it, unmaps its pages and gives the emptied range back
/// (`range_release`); the retry reserves a new range for the request and maps there (in a
/// version 2 file, a `segment_map` after its `range_reserve`, after the releases). Replayed
/// before the request, the completion would serve it from the freed block.
#[test]
fn an_expandable_free_completed_by_a_retry_that_releases_its_range_returns_after_the_search() {
    let (actions, recorded, out) = record_and_replay(&expandable(), |pool| {
        let a = pool.malloc(40 * MIB, StreamId(2)).unwrap();
        pool.free_after_streams(a, &[StreamId(1)]).unwrap();
        malloc(pool, 40 * MIB);
        pool.malloc(30 * MIB, StreamId(2))
            .expect("the retry makes room");
    });
    use Action::*;
    let retry = [
        FreeCompleted,
        SegmentUnmap,
        RangeRelease,
        Retry,
        RangeReserve,
        SegmentMap,
        Alloc,
    ];
    assert!(
        actions.ends_with(&retry),
        "the retry's synchronization completes the free: {actions:?}"
    );
    assert_eq!(recorded, [3, 1, 1, 0]);
    assert_eq!(replayed(&out), [[3, 3, 1, 1, 0]; 2]);
}

/// The counts `(device allocs, device frees, retries, ooms)` of `counts`.
fn device_calls(c: &crate::pool::Counts) -> [u64; 4] {
    [
        c.num_device_alloc,
        c.num_device_free,
        c.num_alloc_retries,
        c.num_ooms,
    ]
}

/// A free that waits for another stream (`free_after_streams`: `cudaFreeAsync`, or one
/// recorded as used on other streams), in a recording under `free_sync:device`, completes
/// before the pool grows again on 200 MiB: a 25 MiB request is served from a cached 40 MiB
/// segment while it waits. On 100 MiB that segment went back to the device at the retry of a
/// 50 MiB request, and the 25 MiB one grows without waiting for the free: its retry
/// completes it and releases its 30 MiB segment. The version 7 line names the free's wait
/// (`streams`), and its replay on 100 MiB does what the pool does there; a version 6 file has
/// no such word, and its replay takes the free for a `cudaFree`'s, which makes the pool
/// synchronize before growing and serve the request from its block.
#[test]
fn a_free_waiting_for_streams_replays_on_a_smaller_device_as_the_pool_runs_there() {
    let drive = |pool: &mut DeviceAllocator<SimDevice>| {
        let a = malloc(pool, 30 * MIB);
        let cached = malloc(pool, 40 * MIB);
        pool.free(cached).unwrap();
        malloc(pool, 50 * MIB);
        pool.free_after_streams(a, &[StreamId(1)]).unwrap();
        malloc(pool, 25 * MIB);
        // The stream's work ends, and the next request completes the free.
        pool.backend_mut().complete_work();
        malloc(pool, 1000);
    };
    let run = |capacity: u64, sink: Option<&std::sync::Arc<EventBuffer>>| {
        let sim = SimDevice::new(capacity).with_pending_work();
        let mut pool = DeviceAllocator::new(sim, Settings::default());
        if let Some(buffer) = sink {
            pool.set_event_sink(Some(Box::new(buffer.sink(0))));
        }
        drive(&mut pool);
        device_calls(&pool.stats().counts)
    };
    let buffer = EventBuffer::new();
    assert_eq!(run(200 * MIB, Some(&buffer)), [4, 0, 0, 0]);
    let there = run(100 * MIB, None);
    assert_eq!(there, [5, 2, 2, 0], "both retries release a segment");
    let events = buffer.take();
    assert!(
        events.iter().any(|e| e.waits == Some(FreeWaits::Streams)),
        "{events:?}"
    );
    let unnamed: Vec<Event> = events.iter().map(|e| Event { waits: None, ..*e }).collect();
    let settings = Settings::default();
    let replayed = |version, events: &[Event]| {
        let out = written::replay_written_what_if(&settings, "device", version, events, 100 * MIB);
        device_calls(&out.stats.counts)
    };
    assert_eq!(replayed(FORMAT_VERSION, &events), there);
    assert_eq!(replayed(6, &unnamed), [4, 1, 1, 0]);
}
