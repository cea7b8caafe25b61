//! Expandable-segments recordings that begin mid-run, made by the pool itself: random
//! workloads (several streams, `empty_cache()` calls that unmap pages and give ranges back,
//! a device small enough to run out of memory) run through the pool with expandable segments,
//! their events written down as a PyTorch snapshot's trace and their final segments as its
//! state. Each recording replays faithfully to its own figures; then its first entries are cut
//! off between two of the program's calls, at every third such place, and each cut recording —
//! which begins with pages mapped, blocks live and ranges whose lowest pages may be unmapped —
//! must replay exactly too: peak reserved, maps, unmaps, retries, the out-of-memory point and
//! every allocation's address. Each cut is replayed twice on the recording's device size: given
//! as the capacity and as the device's memory, as a user who knows the GPU would give
//! `--capacity` and `--device-memory`; and given as the capacity alone, so that the memory that
//! sizes the ranges at the start is estimated from the recording. (Without a capacity it is
//! inferred from the cut recording, which a cut that leaves no out-of-memory error can only
//! bracket.)
//!
//! `CACHEALLOC_CUT_SEEDS` (default 3, whose cuts must all replay exactly both ways) sets the
//! recordings per shape. A longer sweep meets what a cut recording cannot show: pages that were
//! mapped, wholly free, when the recording began and that it only unmaps, whose pool is then a
//! guess, and the lowest pages of a range that it never maps again; and where such a guess is
//! wrong, device memory estimated from ranges placed wrong. The sweep allows at most 1 cut
//! recording in 2,000 to depart with the memory given, 1 in 800 without
//! (`CACHEALLOC_CUT_SEEDS=60 cargo test --release --test expandable_cuts -- --nocapture`: 8 and
//! 13 of 48,203; 160 seeds: 23 and 44 of 128,655). `CACHEALLOC_CUT_FIRST_SEED` starts the
//! sweep at another seed, to look at one recording.

use cachealloc::trace::recording::Action;
use support::cli::{cachealloc, json};
use support::cut_replay::{CutSweep, assert_replays_exactly, departures, sweep_seeds};
use support::pool_recorder::{GIB, MIB, Recorder, Shape, StreamFrees, record};
use support::snapshot_pickle::write_recording;

mod support;

/// The settings of the recordings.
const CONF: &str = "expandable_segments:True";

const SHAPES: [Shape; 5] = [
    Shape {
        streams: 1,
        ops: 400,
        empty_cache_every: 0,
        small_percent: 40,
        max_large: 60 * MIB,
        live_max: 40,
        device: 8 * GIB,
        stream_frees: None,
    },
    Shape {
        streams: 1,
        ops: 400,
        empty_cache_every: 37,
        small_percent: 40,
        max_large: 60 * MIB,
        live_max: 40,
        device: 8 * GIB,
        stream_frees: None,
    },
    Shape {
        streams: 2,
        ops: 400,
        empty_cache_every: 50,
        small_percent: 40,
        max_large: 60 * MIB,
        live_max: 40,
        device: 8 * GIB,
        stream_frees: None,
    },
    Shape {
        streams: 3,
        ops: 300,
        empty_cache_every: 23,
        small_percent: 75,
        max_large: 30 * MIB,
        live_max: 60,
        device: 8 * GIB,
        stream_frees: None,
    },
    // Runs out of memory: retries unmap cached pages, some requests fail.
    Shape {
        streams: 2,
        ops: 400,
        empty_cache_every: 0,
        small_percent: 20,
        max_large: 120 * MIB,
        live_max: 40,
        device: GIB,
        stream_frees: None,
    },
];

#[test]
fn recordings_cut_mid_run_replay_exactly() {
    let (sweep, first) = sweep_seeds();
    let seeds = sweep.unwrap_or(3);
    let found = CutSweep::run(&SHAPES, CONF, first..first + seeds, 3);
    // The shapes do what they are for (over the seeds from 0: a chosen one may not run out).
    assert!(
        first > 0 || (found.ooms >= 1 && found.device_frees >= 20 * seeds as usize),
        "{} OOMs, {} unmaps",
        found.ooms,
        found.device_frees
    );
    found.check(sweep.map(|_| (2000, 800)));
}

/// A fifth of the frees wait for a side stream's work (`record_stream`), which the device
/// finishes before one operation in ten (as in tests/fixed_cuts.rs): cut recordings begin with
/// blocks whose free completes after the start, taken as allocated there, and end with blocks
/// `active_pending_free`; a retry's synchronization, which completes waiting frees before it
/// unmaps pages, and `empty_cache()`'s replay as recorded. Each shape, cut at every 8th place;
/// none may depart.
///
/// A sweep cuts at every third place. Besides what the sweep above meets, it meets a retry
/// that gave back no pages and mapped new ones, after a synchronization that completed frees
/// whose blocks, free, left fewer pages to map: the trace shows those completions right before
/// the new pages, as it shows completions found at the request's start (`process_events`) before
/// pages mapped without a retry, far the more common, and the replay reads them so; the
/// replay's request then finds room without a retry (the state there would tell the two apart:
/// whether the pages would have fitted with the blocks still waiting; not done). And cut
/// recordings that begin right before out-of-memory errors whose replay finds room (two
/// recordings at 100 seeds; not explained yet). Allowed in a sweep: 1 recording in 300, whole
/// or cut, departing either way (`CACHEALLOC_CUT_SEEDS=40 cargo test --release --test
/// expandable_cuts waiting -- --nocapture`: all 30,774 exact with the memory given, 4 departing
/// with the capacity alone, all of one recording; 100 seeds: 82 and 90 of 76,892, of five
/// recordings, and 1 of the 500 whole recordings).
#[test]
fn recordings_with_frees_waiting_for_streams_cut_mid_run_replay_exactly() {
    let (sweep, first) = sweep_seeds();
    let seeds = sweep.unwrap_or(1);
    let step = if sweep.is_some() { 3 } else { 8 };
    let shapes = SHAPES.map(|shape| Shape {
        stream_frees: Some(StreamFrees {
            percent: 20,
            complete_percent: 10,
        }),
        ..shape
    });
    let found = CutSweep::run(&shapes, CONF, first..first + seeds, step);
    eprintln!("{}", found.waiting_frees_met());
    // Over the seeds from 0 (a chosen one may lack some).
    if first == 0 {
        found.assert_waiting_frees_met(seeds as usize);
    }
    found.check_with_wholes(sweep.map(|_| (300, 300)));
}

/// Under `per_process_memory_fraction:0.5` the limit, half the device, refuses pages: it weighs
/// the segment a request would get without expandable segments, and the pages then mapped may
/// pass it by less than a page, so the capacity inferred from a cut recording's failures
/// (every recording's must be the device's) counts those segments, not the pages. A shape
/// with `empty_cache()` calls on a 2 GiB device, cut at every 8th place (a sweep: every third);
/// no cut recording may depart (`CACHEALLOC_CUT_SEEDS=40`: all 6,751 exact both ways).
#[test]
fn recordings_cut_mid_run_replay_exactly_under_a_memory_fraction() {
    let (sweep, first) = sweep_seeds();
    let shapes = [Shape {
        device: 2 * GIB,
        ..SHAPES[2]
    }];
    let conf = "expandable_segments:True,per_process_memory_fraction:0.5";
    let step = if sweep.is_some() { 3 } else { 8 };
    let found = CutSweep::run(&shapes, conf, first..first + sweep.unwrap_or(1), step);
    // The limit is reached (over the seeds from 0: a chosen one may not reach it).
    assert!(
        first > 0 || (found.ooms >= 1 && found.retries >= 5),
        "{} OOMs, {} retries",
        found.ooms,
        found.retries
    );
    found.check(None);
}

/// A small range given back by `empty_cache()` and grown again from its start: its pages, which
/// the cut recording unmaps wholly free, are the small pool's (those mapped again at their start
/// say so, though the last seen of them lies above their start).
#[test]
fn a_small_range_given_back_and_grown_again_replays_exactly() {
    let mut recorder = Recorder::new(8 * GIB, CONF);
    let small: Vec<_> = (0..20).map(|_| recorder.malloc(MIB, 0).unwrap()).collect();
    let _kept = recorder.malloc(20 * MIB, 0).unwrap();
    for ptr in small {
        recorder.free(ptr);
    }
    let cut_at = recorder.entries();
    recorder.malloc(20 * MIB, 0).unwrap();
    recorder.empty_cache();
    for _ in 0..3 {
        recorder.malloc(MIB, 0).unwrap();
    }
    let rec = recorder.recording("a small range grown again".into());
    let cut = rec.cut(cut_at);
    assert!(
        cut.rec
            .entries
            .iter()
            .any(|e| e.action == Action::SegmentUnmap)
    );
    assert_replays_exactly(&rec, &cut, 8 * GIB);
}

/// The device's memory, given, sizes the ranges the cut recording begins with, through
/// `replay_faithful` and through `cachealloc replay --device-memory` alike. Three streams'
/// ranges, one cut short by the next: their memory, estimated from the recording, misplaces
/// requests. (Should the estimate come to get this case right, pick another that departs with
/// the capacity alone; the sweep lists them.)
#[test]
fn the_device_memory_given_sizes_the_ranges_at_the_start() {
    let shape = SHAPES[3];
    let rec = record(41, shape, CONF);
    let cut = rec.cut(374);
    assert_eq!(departures(&cut, shape.device, true), Vec::<String>::new());
    assert_ne!(departures(&cut, shape.device, false), Vec::<String>::new());
    let path = write_recording("cut-seed-41.pickle", &cut.rec);
    let path = path.to_str().unwrap();
    let replay = |memory: Option<&str>| {
        let mut args = vec!["replay", path, "--faithful", "--capacity", "8GiB", "--json"];
        args.extend(memory.map(|m| ["--device-memory", m]).into_iter().flatten());
        let j = json(&cachealloc(&args));
        let at = j["allocs_at_recorded_addr"].as_u64().unwrap();
        let maps = (
            j["num_device_alloc"].clone(),
            j["recorded_segment_maps"].clone(),
        );
        (at, j["allocs"].as_u64().unwrap(), maps.0 == maps.1)
    };
    let (at, allocs, same_maps) = replay(Some("8GiB"));
    assert!(at == allocs && allocs > 20 && same_maps, "{at} of {allocs}");
    let (at, allocs, _) = replay(None);
    std::fs::remove_file(path).unwrap();
    assert!(at < allocs, "{at} of {allocs}");
}
