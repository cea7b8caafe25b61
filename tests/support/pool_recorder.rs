//! Recordings the pool itself makes: a pool on a simulated device, all of it the pool's, whose
//! events are written down as a PyTorch snapshot's trace as the program's calls make them, and
//! whose final segments become the snapshot's state. Random workloads of a [`Shape`] run through
//! it give recordings whose every figure is known, to cut and replay (`cut_replay`).
//!
//! The device's work is asynchronous: a free made after other streams' work (`free_after`,
//! PyTorch's `record_stream`) stays pending — `free_requested` in the trace, the block
//! `active_pending_free` in the state — until the device has finished the work issued before it
//! (`complete_work`) and the pool sees so: at its next allocation, or when a retry or
//! `empty_cache()` synchronizes (`free_completed`). Frees made with `free` complete at once.

use cachealloc::backend::sim::SimDevice;
use cachealloc::config::Config;
use cachealloc::pool::{BlockState as PoolBlockState, DeviceId, PoolEvent, Settings, StreamId};
use cachealloc::pool::{DeviceAllocator, DevicePtr};
use cachealloc::trace::recording::{
    Action, BlockState, CallSite, DeviceRecording, RecordedBlock, RecordedSegment,
    RecordedSettings, TraceEntry,
};
use cachealloc::trace::rng::SplitMix64;
use cachealloc::trace::{ReplayConfig, seeded_pool};
use std::sync::{Arc, Mutex};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// What a random workload looks like.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub streams: u64,
    pub ops: usize,
    /// An `empty_cache()` every this many operations (0: none).
    pub empty_cache_every: usize,
    /// Percent of requests of at most 1 MiB (the small pool).
    pub small_percent: u64,
    /// Large requests are 1 MiB to this.
    pub max_large: u64,
    pub live_max: usize,
    /// The device's memory, all of it the pool's.
    pub device: u64,
    /// Frees that wait for another stream's work (`None`: every free completes at once, and
    /// the recordings are those made before this existed).
    pub stream_frees: Option<StreamFrees>,
}

/// How often a random workload frees after another stream's work, and how often the device
/// finishes its work.
#[derive(Clone, Copy, Debug)]
pub struct StreamFrees {
    /// Percent of frees that wait for the work of a side stream (`Recorder::free_after`).
    pub percent: u64,
    /// Percent of operations before which the device finishes the work issued so far
    /// (`Recorder::complete_work`): the frees waiting for it complete at the pool's next
    /// allocation. (The last quarter of the allocations still live at the end are freed so
    /// too, after the operations, and still wait when the snapshot is taken.)
    pub complete_percent: u64,
}

/// The trace entry of a pool event (`None` for those a PyTorch trace has no entry for).
fn entry(event: &PoolEvent, call_site: CallSite) -> Option<TraceEntry> {
    let e = |action, ptr: DevicePtr, size, stream| TraceEntry {
        action,
        addr: ptr.addr(),
        size,
        stream,
        device_free: None,
        call_site,
    };
    Some(match *event {
        PoolEvent::Alloc { ptr, size, stream } => e(Action::Alloc, ptr, size, stream),
        // (PyTorch's trace does not say what a free waits for.)
        PoolEvent::FreeRequested {
            ptr, size, stream, ..
        } => e(Action::FreeRequested, ptr, size, stream),
        PoolEvent::FreeCompleted { ptr, size, stream } => {
            e(Action::FreeCompleted, ptr, size, stream)
        }
        PoolEvent::SegmentAlloc { ptr, size, stream } => e(Action::SegmentAlloc, ptr, size, stream),
        PoolEvent::SegmentFree { ptr, size, stream } => e(Action::SegmentFree, ptr, size, stream),
        PoolEvent::SegmentMap { ptr, size, stream } => e(Action::SegmentMap, ptr, size, stream),
        PoolEvent::SegmentUnmap { ptr, size, stream } => e(Action::SegmentUnmap, ptr, size, stream),
        // PyTorch's trace has the rounded request only.
        PoolEvent::Oom {
            size,
            stream,
            device_free,
            ..
        } => TraceEntry {
            action: Action::Oom,
            addr: 0,
            size,
            stream,
            device_free: Some(device_free),
            call_site,
        },
        _ => return None,
    })
}

/// A pool with the settings of a `PYTORCH_CUDA_ALLOC_CONF` string, all of a device of `device`
/// bytes its own, whose events are written down as a PyTorch trace.
pub struct Recorder {
    pool: DeviceAllocator<SimDevice>,
    conf: String,
    settings: Settings,
    entries: Arc<Mutex<Vec<TraceEntry>>>,
    /// Where each retry fell: the number of entries before it.
    retries_at: Arc<Mutex<Vec<usize>>>,
    /// The program's call the pool is in.
    call: Arc<Mutex<Call>>,
    /// Where each segment returned inside a `malloc` that made no retry fell.
    releases_without_retry_at: Arc<Mutex<Vec<usize>>>,
    /// The places inside a `malloc` or an `empty_cache()` (between two of its entries).
    inside_calls: Vec<usize>,
}

/// The program's call the pool is in: where, the segments it returned so far (the number of
/// entries before each) and whether it retried.
struct Call {
    site: CallSite,
    /// The entries before it.
    start: usize,
    segment_frees: Vec<usize>,
    retried: bool,
}

/// A recording the pool made, and what its trace does not say for sure: the retries it made
/// (under `max_split_size` a release before a new segment may be none).
#[derive(Clone, Debug)]
pub struct PoolRecording {
    pub rec: DeviceRecording,
    /// Where each retry fell: the number of entries before it.
    retries_at: Vec<usize>,
    /// Where each segment returned inside a `malloc` that made no retry fell: garbage
    /// collection's (or, under `max_split_size`, the oversize release's).
    releases_without_retry_at: Vec<usize>,
    /// The places inside a `malloc` or an `empty_cache()`, where no snapshot's trace begins
    /// (the program starts recording between two of its calls).
    inside_calls: Vec<usize>,
}

impl PoolRecording {
    /// The recording with its first `at` entries cut off.
    pub fn cut(&self, at: usize) -> PoolRecording {
        let mut rec = self.rec.clone();
        rec.entries.drain(..at);
        let after = |positions: &[usize]| {
            positions
                .iter()
                .filter(|&&r| r >= at)
                .map(|r| r - at)
                .collect()
        };
        PoolRecording {
            rec,
            retries_at: after(&self.retries_at),
            releases_without_retry_at: after(&self.releases_without_retry_at),
            inside_calls: after(&self.inside_calls),
        }
    }

    /// Whether the recording's entry `at` is inside a `malloc` or an `empty_cache()` (another
    /// of its entries comes before it).
    pub fn inside_a_call(&self, at: usize) -> bool {
        self.inside_calls.binary_search(&at).is_ok()
    }

    /// The segments the pool returned inside a `malloc` that made no retry: garbage
    /// collection's (or, under `max_split_size`, the oversize release's).
    pub fn releases_without_retry(&self) -> usize {
        self.releases_without_retry_at.len()
    }

    /// The retries the pool made in the recording.
    pub fn retries(&self) -> usize {
        self.retries_at.len()
    }
}

impl Recorder {
    pub fn new(device: u64, conf: &str) -> Self {
        let settings = Config::parse_pytorch_conf(conf).unwrap().settings;
        let config = ReplayConfig {
            settings: settings.clone(),
            capacity: Some(device),
            device_total: Some(device),
            ..ReplayConfig::default()
        };
        let mut pool = seeded_pool(&config, None).unwrap();
        // Only `free_after` records fences: `free` still completes at once.
        pool.backend_mut().hold_work();
        let entries: Arc<Mutex<Vec<TraceEntry>>> = Arc::default();
        let retries_at: Arc<Mutex<Vec<usize>>> = Arc::default();
        let call = Arc::new(Mutex::new(Call {
            site: CallSite::Other,
            start: 0,
            segment_frees: Vec::new(),
            retried: false,
        }));
        let (sink_entries, sink_retries, sink_call) =
            (entries.clone(), retries_at.clone(), call.clone());
        pool.set_event_sink(Some(Box::new(move |event: &PoolEvent| {
            let mut entries = sink_entries.lock().unwrap();
            let mut call = sink_call.lock().unwrap();
            match event {
                PoolEvent::Retry { .. } => {
                    sink_retries.lock().unwrap().push(entries.len());
                    call.retried = true;
                }
                PoolEvent::SegmentFree { .. } => call.segment_frees.push(entries.len()),
                _ => {}
            }
            if let Some(e) = entry(event, call.site) {
                entries.push(e);
            }
        })));
        Recorder {
            pool,
            conf: conf.to_owned(),
            settings,
            entries,
            retries_at,
            call,
            releases_without_retry_at: Arc::default(),
            inside_calls: Vec::new(),
        }
    }

    /// The program's next call, at `site`: the one before it ended.
    fn call(&mut self, site: CallSite) {
        let now = self.entries();
        let mut call = self.call.lock().unwrap();
        if call.site == CallSite::Malloc && !call.retried {
            let mut releases = self.releases_without_retry_at.lock().unwrap();
            releases.extend(&call.segment_frees);
        }
        if matches!(call.site, CallSite::Malloc | CallSite::EmptyCache) {
            self.inside_calls.extend(call.start + 1..now);
        }
        *call = Call {
            site,
            start: now,
            segment_frees: Vec::new(),
            retried: false,
        };
    }

    pub fn malloc(&mut self, size: u64, stream: u64) -> Option<DevicePtr> {
        self.call(CallSite::Malloc);
        self.pool.malloc(size, StreamId(stream)).ok()
    }

    pub fn free(&mut self, ptr: DevicePtr) {
        self.call(CallSite::Other);
        self.pool.free(ptr).unwrap();
    }

    /// The program frees `ptr` after recording it used on `streams` (`record_stream`): its block
    /// stays pending until the device has finished the work issued so far (`complete_work`).
    pub fn free_after(&mut self, ptr: DevicePtr, streams: &[u64]) {
        self.call(CallSite::Other);
        let streams: Vec<_> = streams.iter().map(|&s| StreamId(s)).collect();
        let unfenced = self.pool.free_after_streams(ptr, &streams).unwrap();
        assert!(unfenced.is_empty(), "{unfenced:?}");
    }

    /// The device finishes the work issued so far: the frees waiting for it complete when the
    /// pool next looks (its next allocation), or synchronizes.
    pub fn complete_work(&mut self) {
        self.pool.backend_mut().complete_work();
    }

    pub fn empty_cache(&mut self) {
        self.call(CallSite::EmptyCache);
        self.pool.empty_cache().unwrap();
    }

    /// Trace entries written so far.
    pub fn entries(&self) -> usize {
        self.entries.lock().unwrap().len()
    }

    /// The snapshot: the trace, the pool's segments as its state, and the settings as PyTorch
    /// records them (its fields, and the string it read).
    pub fn recording(mut self, source: String) -> PoolRecording {
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
        let settings = RecordedSettings {
            conf: Some(self.conf.clone()),
            ..RecordedSettings::assumed(&self.settings)
        };
        let rec = DeviceRecording {
            source,
            device: DeviceId(0),
            entries,
            segments,
            settings: Some(settings),
        };
        let retries_at = self.retries_at.lock().unwrap().clone();
        self.call(CallSite::Other);
        let releases_without_retry_at = self.releases_without_retry_at.lock().unwrap().clone();
        PoolRecording {
            rec,
            retries_at,
            releases_without_retry_at,
            inside_calls: self.inside_calls,
        }
    }
}

/// A recording of a random workload of `shape`, under the settings of `conf`.
pub fn record(seed: u64, shape: Shape, conf: &str) -> PoolRecording {
    let mut recorder = Recorder::new(shape.device, conf);
    let mut rng = SplitMix64::new(seed);
    let mut live = Vec::new();
    // A stream no request uses, whose work frees wait for.
    let side_stream = shape.streams;
    for i in 0..shape.ops {
        if let Some(frees) = shape.stream_frees
            && rng.below(100) < frees.complete_percent
        {
            recorder.complete_work();
        }
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
            match shape.stream_frees {
                Some(frees) if rng.below(100) < frees.percent => {
                    recorder.free_after(ptr, &[side_stream]);
                }
                _ => recorder.free(ptr),
            }
        }
    }
    // The snapshot is taken while the program's last frees still wait for the side stream.
    if shape.stream_frees.is_some() {
        for ptr in live.split_off(live.len() - live.len().div_ceil(4)) {
            recorder.free_after(ptr, &[side_stream]);
        }
    }
    let source = if conf.is_empty() {
        format!("seed {seed}, {shape:?}")
    } else {
        format!("{conf}, seed {seed}, {shape:?}")
    };
    recorder.recording(source)
}
