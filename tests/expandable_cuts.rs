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

use cachealloc::backend::sim::SimDevice;
use cachealloc::pool::{BlockState as PoolBlockState, DeviceId, PoolEvent, Settings, StreamId};
use cachealloc::pool::{DeviceAllocator, DevicePtr};
use cachealloc::trace::recording::{
    Action, BlockState, CallSite, DeviceRecording, RecordedBlock, RecordedSegment,
    RecordedSettings, TraceEntry,
};
use cachealloc::trace::rng::SplitMix64;
use cachealloc::trace::{ReplayConfig, replay_faithful, seeded_pool};
use std::sync::{Arc, Mutex};
use support::cli::{cachealloc, json};
use support::snapshot_pickle::write_recording;

mod support;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// What a random workload looks like.
#[derive(Clone, Copy, Debug)]
struct Shape {
    streams: u64,
    ops: usize,
    /// An `empty_cache()` every this many operations (0: none).
    empty_cache_every: usize,
    /// Percent of requests of at most 1 MiB (the small pool).
    small_percent: u64,
    /// Large requests are 1 MiB to this.
    max_large: u64,
    live_max: usize,
    /// The device's memory, all of it the pool's.
    device: u64,
}

const SHAPES: [Shape; 5] = [
    Shape {
        streams: 1,
        ops: 400,
        empty_cache_every: 0,
        small_percent: 40,
        max_large: 60 * MIB,
        live_max: 40,
        device: 8 * GIB,
    },
    Shape {
        streams: 1,
        ops: 400,
        empty_cache_every: 37,
        small_percent: 40,
        max_large: 60 * MIB,
        live_max: 40,
        device: 8 * GIB,
    },
    Shape {
        streams: 2,
        ops: 400,
        empty_cache_every: 50,
        small_percent: 40,
        max_large: 60 * MIB,
        live_max: 40,
        device: 8 * GIB,
    },
    Shape {
        streams: 3,
        ops: 300,
        empty_cache_every: 23,
        small_percent: 75,
        max_large: 30 * MIB,
        live_max: 60,
        device: 8 * GIB,
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
    },
];

/// The trace entry of a pool event (`None` for those a PyTorch trace has no entry for).
fn entry(event: &PoolEvent, call_site: CallSite) -> Option<TraceEntry> {
    let e = |action, addr: u64, size, stream| TraceEntry {
        action,
        addr,
        size,
        stream,
        device_free: None,
        call_site,
    };
    Some(match *event {
        PoolEvent::Alloc { ptr, size, stream } => e(Action::Alloc, ptr.addr(), size, stream),
        PoolEvent::FreeRequested { ptr, size, stream } => {
            e(Action::FreeRequested, ptr.addr(), size, stream)
        }
        PoolEvent::FreeCompleted { ptr, size, stream } => {
            e(Action::FreeCompleted, ptr.addr(), size, stream)
        }
        PoolEvent::SegmentMap { ptr, size, stream } => {
            e(Action::SegmentMap, ptr.addr(), size, stream)
        }
        PoolEvent::SegmentUnmap { ptr, size, stream } => {
            e(Action::SegmentUnmap, ptr.addr(), size, stream)
        }
        // PyTorch's trace has the rounded request only.
        PoolEvent::Oom {
            size,
            stream,
            device_free,
            ..
        } => TraceEntry {
            device_free: Some(device_free),
            ..e(Action::Oom, 0, size, stream)
        },
        PoolEvent::SegmentAlloc { .. } | PoolEvent::SegmentFree { .. } => {
            panic!("a native segment with expandable segments on")
        }
        _ => return None,
    })
}

/// A pool with expandable segments, all of a device of `device` bytes its own, whose events
/// are written down as a PyTorch trace as the program's calls make them.
struct Recorder {
    pool: DeviceAllocator<SimDevice>,
    entries: Arc<Mutex<Vec<TraceEntry>>>,
    site: Arc<Mutex<CallSite>>,
}

impl Recorder {
    fn new(device: u64) -> Self {
        let settings = Settings {
            expandable_segments: true,
            ..Settings::default()
        };
        let config = ReplayConfig {
            settings,
            capacity: Some(device),
            device_total: Some(device),
            ..ReplayConfig::default()
        };
        let mut pool = seeded_pool(&config, None).unwrap();
        let entries: Arc<Mutex<Vec<TraceEntry>>> = Arc::default();
        let site = Arc::new(Mutex::new(CallSite::Other));
        let (sink_entries, sink_site) = (entries.clone(), site.clone());
        pool.set_event_sink(Some(Box::new(move |event: &PoolEvent| {
            if let Some(e) = entry(event, *sink_site.lock().unwrap()) {
                sink_entries.lock().unwrap().push(e);
            }
        })));
        Recorder {
            pool,
            entries,
            site,
        }
    }

    fn call(&self, site: CallSite) {
        *self.site.lock().unwrap() = site;
    }

    fn malloc(&mut self, size: u64, stream: u64) -> Option<DevicePtr> {
        self.call(CallSite::Malloc);
        self.pool.malloc(size, StreamId(stream)).ok()
    }

    fn free(&mut self, ptr: DevicePtr) {
        self.call(CallSite::Other);
        self.pool.free(ptr).unwrap();
    }

    fn empty_cache(&mut self) {
        self.call(CallSite::EmptyCache);
        self.pool.empty_cache().unwrap();
    }

    /// Trace entries written so far.
    fn entries(&self) -> usize {
        self.entries.lock().unwrap().len()
    }

    /// The snapshot: the trace, and the pool's segments as its state.
    fn recording(self, source: String) -> DeviceRecording {
        let segments = self
            .pool
            .segments()
            .into_iter()
            .map(|s| RecordedSegment {
                device: DeviceId(0),
                address: s.addr,
                total_size: s.size,
                stream: s.stream,
                pool: s.pool,
                private_pool: None,
                is_expandable: s.expandable,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| RecordedBlock {
                        address: b.addr,
                        size: b.size,
                        requested_size: b.requested,
                        state: match b.state {
                            PoolBlockState::Allocated => BlockState::Allocated,
                            PoolBlockState::Pending => BlockState::PendingFree,
                            _ => BlockState::Inactive,
                        },
                    })
                    .collect(),
            })
            .collect();
        let entries = self.entries.lock().unwrap().clone();
        DeviceRecording {
            source,
            device: DeviceId(0),
            entries,
            segments,
            settings: Some(RecordedSettings {
                expandable_segments: true,
                ..RecordedSettings::default()
            }),
        }
    }
}

/// A recording of a random workload of `shape`.
fn record(seed: u64, shape: Shape) -> DeviceRecording {
    let mut recorder = Recorder::new(shape.device);
    let mut rng = SplitMix64::new(seed);
    let mut live = Vec::new();
    for i in 0..shape.ops {
        if shape.empty_cache_every > 0 && i % shape.empty_cache_every == shape.empty_cache_every - 1
        {
            recorder.empty_cache();
        } else if live.len() < shape.live_max && (live.is_empty() || rng.below(100) < 55) {
            let size = if rng.below(100) < shape.small_percent {
                1 + rng.below(MIB)
            } else {
                MIB + rng.below(shape.max_large)
            };
            if let Some(ptr) = recorder.malloc(size, rng.below(shape.streams)) {
                live.push(ptr);
            }
        } else {
            let ptr = live.swap_remove(rng.below(live.len() as u64) as usize);
            recorder.free(ptr);
        }
    }
    recorder.recording(format!("seed {seed}, {shape:?}"))
}

/// How a faithful replay of `rec` on a device of `device` bytes departs from the recording
/// (empty: not at all). The replay is given the device's capacity, and its memory when
/// `memory_known` (else the memory is estimated from the recording).
fn departures(rec: &DeviceRecording, device: u64, memory_known: bool) -> Vec<String> {
    let config = ReplayConfig {
        settings: rec.replay_settings(),
        capacity: Some(device),
        device_total: memory_known.then_some(device),
        ..ReplayConfig::default()
    };
    let run = match replay_faithful(rec, &config) {
        Ok(run) => run,
        Err(e) => return vec![e],
    };
    let (out, recorded) = (&run.outcome, &run.recorded);
    let s = &out.stats;
    let replay_oom = out.first_oom.as_ref().and_then(|o| o.source_index);
    let recorded_oom = recorded.recorded_oom.as_ref().map(|o| o.event_index);
    [
        (
            "peak reserved",
            s.reserved_bytes.all.peak as u64,
            recorded.recorded_peak_reserved_bytes,
        ),
        (
            "maps",
            s.counts.num_device_alloc,
            recorded.recorded_segment_maps as u64,
        ),
        (
            "unmaps",
            s.counts.num_device_free,
            recorded.recorded_segment_unmaps as u64,
        ),
        (
            "retries",
            s.counts.num_alloc_retries,
            recorded.recorded_retries as u64,
        ),
        (
            "at recorded address",
            out.allocs_at_recorded_addr,
            out.allocs_with_recorded_addr,
        ),
        (
            "first OOM entry + 1",
            replay_oom.map_or(0, |i| i as u64 + 1),
            recorded_oom.map_or(0, |i| i as u64 + 1),
        ),
    ]
    .into_iter()
    .filter(|(_, replay, recorded)| replay != recorded)
    .map(|(what, replay, recorded)| format!("{what}: replay {replay}, recorded {recorded}"))
    .collect()
}

/// The places between two of the program's calls: no cut falls inside a malloc's maps, its
/// release of cached pages and retry (half of that call's work would lie before the cut), or
/// an `empty_cache()`'s unmaps.
fn between_operations(rec: &DeviceRecording) -> impl Iterator<Item = usize> + '_ {
    let call = |e: &TraceEntry| {
        matches!(
            e.action,
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted
        )
    };
    (1..rec.entries.len()).filter(move |&at| call(&rec.entries[at - 1]) && call(&rec.entries[at]))
}

#[test]
fn recordings_cut_mid_run_replay_exactly() {
    let sweep: Option<u64> = std::env::var("CACHEALLOC_CUT_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok());
    let seeds = sweep.unwrap_or(3);
    // Where a sweep starts (`CACHEALLOC_CUT_FIRST_SEED`, default 0): to look at one recording.
    let first: u64 = std::env::var("CACHEALLOC_CUT_FIRST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (mut cuts, mut ooms, mut unmaps) = (0, 0, 0);
    // Departures with the device's memory given, and with the capacity alone.
    let (mut known, mut unknown) = (Vec::new(), Vec::new());
    for shape in SHAPES {
        for seed in first..first + seeds {
            let rec = record(seed, shape);
            let whole = departures(&rec, shape.device, false);
            assert!(whole.is_empty(), "{}: {whole:?}", rec.source);
            let figures = rec.figures();
            ooms += usize::from(figures.recorded_oom.is_some());
            unmaps += figures.recorded_segment_unmaps;
            for at in between_operations(&rec).step_by(3) {
                let mut cut = rec.clone();
                cut.entries.drain(..at);
                cuts += 1;
                for (memory_known, failures) in [(true, &mut known), (false, &mut unknown)] {
                    let found = departures(&cut, shape.device, memory_known);
                    if !found.is_empty() {
                        failures.push(format!("{} cut at {at}: {}", rec.source, found.join(", ")));
                    }
                }
            }
        }
    }
    // The shapes do what they are for (over the seeds from 0: a chosen one may not run out).
    assert!(
        first > 0 || (ooms >= 1 && unmaps >= 20 * seeds as usize),
        "{ooms} OOMs, {unmaps} unmaps"
    );
    for (failures, per, given) in [
        (known, 2000, "the device's memory given"),
        (unknown, 800, "the capacity alone"),
    ] {
        let allowed = if sweep.is_some() { cuts / per } else { 0 };
        eprintln!(
            "{} of {cuts} cut recordings replayed exactly with {given}{}",
            cuts - failures.len(),
            failures
                .iter()
                .take(20)
                .map(|f| format!("\n  departed: {f}"))
                .collect::<String>()
        );
        assert!(
            failures.len() <= allowed,
            "{} of {cuts} cut recordings departed with {given} (at most {allowed} allowed):\n{}",
            failures.len(),
            failures[..failures.len().min(10)].join("\n")
        );
    }
}

/// A small range given back by `empty_cache()` and grown again from its start: its pages, which
/// the cut recording unmaps wholly free, are the small pool's (those mapped again at their start
/// say so, though the last seen of them lies above their start).
#[test]
fn a_small_range_given_back_and_grown_again_replays_exactly() {
    let mut recorder = Recorder::new(8 * GIB);
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
    let mut cut = rec.clone();
    cut.entries.drain(..cut_at);
    assert!(cut.entries.iter().any(|e| e.action == Action::SegmentUnmap));
    for memory_known in [true, false] {
        assert_eq!(
            departures(&rec, 8 * GIB, memory_known),
            Vec::<String>::new()
        );
        assert_eq!(
            departures(&cut, 8 * GIB, memory_known),
            Vec::<String>::new()
        );
    }
}

/// The device's memory, given, sizes the ranges the cut recording begins with, through
/// `replay_faithful` and through `cachealloc replay --device-memory` alike. Three streams'
/// ranges, one cut short by the next: their memory, estimated from the recording, misplaces
/// requests. (Should the estimate come to get this case right, pick another that departs with
/// the capacity alone; the sweep lists them.)
#[test]
fn the_device_memory_given_sizes_the_ranges_at_the_start() {
    let shape = SHAPES[3];
    let rec = record(41, shape);
    let mut cut = rec.clone();
    cut.entries.drain(..374);
    assert_eq!(departures(&cut, shape.device, true), Vec::<String>::new());
    assert_ne!(departures(&cut, shape.device, false), Vec::<String>::new());
    let path = write_recording("cut-seed-41.pickle", &cut);
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
