//! Recordings cut mid-run and replayed faithfully: how a replay departs from the recording, the
//! places a recording can be cut (between two of the program's calls), and a sweep that cuts
//! the pool's own recordings (`pool_recorder`) at many such places.

use super::pool_recorder::{PoolRecording, Shape, record};
use cachealloc::trace::CapacityEstimate;
use cachealloc::trace::recording::{Action, BlockState, CallSite, DeviceRecording, TraceEntry};
use cachealloc::trace::{Op, ReplayConfig, replay_faithful};

/// `recording` and `cut` (it cut short) both replay exactly on a device of `device` bytes,
/// with the device's memory given and without it.
pub fn assert_replays_exactly(recording: &PoolRecording, cut: &PoolRecording, device: u64) {
    for memory_known in [true, false] {
        for rec in [recording, cut] {
            assert_eq!(departures(rec, device, memory_known), Vec::<String>::new());
        }
    }
}

/// How a faithful replay of `recording` on a device of `device` bytes departs from the
/// recording (empty: not at all). The replay is given the device's capacity, and its memory
/// when `memory_known` (else the memory is estimated from the recording). Its retries are
/// compared with those the pool made, and the recording's count of them must be those, or
/// where it says it may count more (under `max_split_size`), at least those.
pub fn departures(recording: &PoolRecording, device: u64, memory_known: bool) -> Vec<String> {
    let rec = &recording.rec;
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
            "cudaMallocs and maps",
            s.counts.num_device_alloc,
            (recorded.recorded_segment_allocs + recorded.recorded_segment_maps) as u64,
        ),
        (
            "cudaFrees and unmaps",
            s.counts.num_device_free,
            (recorded.recorded_segment_frees + recorded.recorded_segment_unmaps) as u64,
        ),
        (
            "retries",
            s.counts.num_alloc_retries,
            recording.retries() as u64,
        ),
        (
            "retries counted in the trace",
            recorded.recorded_retries as u64,
            if recorded.retries_upper_bound {
                (recorded.recorded_retries as u64).max(recording.retries() as u64)
            } else {
                recording.retries() as u64
            },
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

/// The places between two of the program's calls: no cut falls inside a malloc's cudaMallocs
/// or maps, its release of cached memory and retry (half of that call's work would lie before
/// the cut), or an `empty_cache()`'s cudaFrees or unmaps.
pub fn between_operations(rec: &DeviceRecording) -> impl Iterator<Item = usize> + '_ {
    let call = |e: &TraceEntry| {
        matches!(
            e.action,
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted
        )
    };
    (1..rec.entries.len()).filter(move |&at| call(&rec.entries[at - 1]) && call(&rec.entries[at]))
}

/// The places where a snapshot's trace of `recording` may begin: `between_operations`, and
/// outside every `malloc` and `empty_cache()` (whose completions of frees that waited lie
/// between two of the program's calls' entries, but inside the call).
pub fn cut_points(recording: &PoolRecording) -> impl Iterator<Item = usize> + '_ {
    between_operations(&recording.rec).filter(|&at| !recording.inside_a_call(at))
}

/// For each place in `rec`, the frees that waited for other streams' work requested before it
/// and not completed before it: how many complete after it, and how many never (their blocks
/// `active_pending_free` at the end). A free's own completion, right after its request, carries
/// the free's frames (`CallSite::Other`); a completion found later, the call's that found it.
fn waiting_at(rec: &DeviceRecording) -> Vec<(usize, usize)> {
    let entries = &rec.entries;
    let mut waiting = vec![(0, 0); entries.len() + 1];
    let mut requested = std::collections::HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        match e.action {
            Action::FreeRequested => {
                requested.insert(e.addr, i);
            }
            Action::FreeCompleted => {
                let Some(r) = requested.remove(&e.addr) else {
                    continue;
                };
                if !(i == r + 1 && e.call_site == CallSite::Other) {
                    waiting[r + 1..=i].iter_mut().for_each(|w| w.0 += 1);
                }
            }
            _ => {}
        }
    }
    for r in requested.into_values() {
        waiting[r + 1..].iter_mut().for_each(|w| w.1 += 1);
    }
    waiting
}

/// The recordings per shape a sweep makes (`CACHEALLOC_CUT_SEEDS`; `None`: the default run)
/// and its first seed (`CACHEALLOC_CUT_FIRST_SEED`, default 0: to look at one recording).
pub fn sweep_seeds() -> (Option<u64>, u64) {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse().ok());
    (
        var("CACHEALLOC_CUT_SEEDS"),
        var("CACHEALLOC_CUT_FIRST_SEED").unwrap_or(0),
    )
}

/// What a sweep met.
#[derive(Default)]
pub struct CutSweep {
    pub cuts: usize,
    /// Recordings that ran out of memory.
    pub ooms: usize,
    /// Retries the pool made.
    pub retries: usize,
    /// cudaFrees and unmaps, `empty_cache()`'s and the retries' releases alike.
    pub device_frees: usize,
    /// Cut recordings that begin with frees waiting for other streams' work (their blocks
    /// taken as allocated at the start) that complete in the cut recording; that begin with
    /// some that never complete in it.
    pub cuts_completing_waiting_frees: usize,
    pub cuts_with_frees_waiting_throughout: usize,
    /// Recordings whose state holds blocks `active_pending_free` at the end.
    pub recordings_pending_at_end: usize,
    /// Frees that waited, completed by a retry's synchronization (as the faithful replay reads
    /// the trace: `Op::FreeAtSync`), or by `empty_cache()`'s.
    pub completed_at_retries: usize,
    pub completed_by_empty_cache: usize,
    /// Segments returned inside a `malloc` that made no retry (garbage collection's).
    pub releases_without_retry: usize,
    /// Cut recordings that departed with the device's memory given, and with the capacity alone.
    pub known: Vec<String>,
    pub unknown: Vec<String>,
    /// Recordings that departed whole (given the capacity alone).
    pub wholes: Vec<String>,
    /// Recordings, whole or cut, that departed in more than their retries, either way.
    pub beyond_retries: Vec<String>,
    /// Recordings, whole or cut, whose inferred capacity (`DeviceRecording::capacity`) is not
    /// the device's: an exact one of another size, or a bracket it lies outside.
    pub capacity_misread: Vec<String>,
}

/// How the capacity `rec` implies misreads a device of `device` bytes, if it does.
fn capacity_misread(rec: &DeviceRecording, device: u64) -> Option<String> {
    match rec.capacity()? {
        CapacityEstimate::Exact { bytes, .. } if bytes != device => {
            Some(format!("capacity {bytes} inferred exactly"))
        }
        CapacityEstimate::Bracket { low, high } if !(low <= device && device < high) => {
            Some(format!("capacity bracketed in [{low}, {high})"))
        }
        _ => None,
    }
}

impl CutSweep {
    /// Record `seeds` random workloads of each of `shapes` under the settings of `conf`, and
    /// replay each faithfully whole; then cut each at every `step`-th place between two calls
    /// and replay each cut on the recording's device size twice: given the capacity and the
    /// device's memory, and given the capacity alone.
    pub fn run(shapes: &[Shape], conf: &str, seeds: std::ops::Range<u64>, step: usize) -> Self {
        let mut sweep = CutSweep::default();
        for &shape in shapes {
            for seed in seeds.clone() {
                let recording = record(seed, shape, conf);
                let whole = departures(&recording, shape.device, false);
                let rec = &recording.rec;
                if !whole.is_empty() {
                    if whole.iter().any(|d| !d.starts_with("retries")) {
                        sweep.beyond_retries.push(rec.source.clone());
                    }
                    sweep
                        .wholes
                        .push(format!("{}: {}", rec.source, whole.join(", ")));
                }
                if let Some(misread) = capacity_misread(rec, shape.device) {
                    sweep
                        .capacity_misread
                        .push(format!("{}: {misread}", rec.source));
                }
                let figures = rec.figures();
                sweep.ooms += usize::from(figures.recorded_oom.is_some());
                sweep.retries += recording.retries();
                sweep.releases_without_retry += recording.releases_without_retry();
                sweep.device_frees +=
                    figures.recorded_segment_frees + figures.recorded_segment_unmaps;
                sweep.recordings_pending_at_end += usize::from(
                    rec.segments
                        .iter()
                        .any(|s| s.blocks.iter().any(|b| b.state == BlockState::PendingFree)),
                );
                let ops = rec.faithful().unwrap().workload.ops;
                sweep.completed_at_retries += ops
                    .iter()
                    .filter(|op| matches!(op, Op::FreeAtSync { .. }))
                    .count();
                sweep.completed_by_empty_cache += rec
                    .entries
                    .iter()
                    .filter(|e| {
                        e.action == Action::FreeCompleted && e.call_site == CallSite::EmptyCache
                    })
                    .count();
                let waiting = waiting_at(rec);
                for at in cut_points(&recording).step_by(step) {
                    let cut = recording.cut(at);
                    sweep.cuts += 1;
                    let (completing, throughout) = waiting[at];
                    sweep.cuts_completing_waiting_frees += usize::from(completing > 0);
                    sweep.cuts_with_frees_waiting_throughout += usize::from(throughout > 0);
                    if let Some(misread) = capacity_misread(&cut.rec, shape.device) {
                        let source = &rec.source;
                        sweep
                            .capacity_misread
                            .push(format!("{source} cut at {at}: {misread}"));
                    }
                    for (memory_known, failures) in
                        [(true, &mut sweep.known), (false, &mut sweep.unknown)]
                    {
                        let found = departures(&cut, shape.device, memory_known);
                        if found.iter().any(|d| !d.starts_with("retries")) {
                            sweep
                                .beyond_retries
                                .push(format!("{} cut at {at}", rec.source));
                        }
                        if !found.is_empty() {
                            failures.push(format!(
                                "{} cut at {at}: {}",
                                rec.source,
                                found.join(", ")
                            ));
                        }
                    }
                }
            }
        }
        sweep
    }

    /// What the sweep met of frees that waited for other streams.
    pub fn waiting_frees_met(&self) -> String {
        format!(
            "{} of {} cuts begin with frees waiting that complete, {} with some that never do; \
             {} recordings end with blocks pending; {} frees completed at retries, {} by \
             empty_cache(); {} retries",
            self.cuts_completing_waiting_frees,
            self.cuts,
            self.cuts_with_frees_waiting_throughout,
            self.recordings_pending_at_end,
            self.completed_at_retries,
            self.completed_by_empty_cache,
            self.retries
        )
    }

    /// Fail unless a sweep of `seeds` recordings per shape of two shapes (one that calls
    /// `empty_cache()`, one that runs out of memory) met frees that waited for other streams
    /// as it should to test them: many cuts beginning with such frees that complete later,
    /// some with frees waiting throughout, every recording ending with some waiting, some
    /// completed by retries and by `empty_cache()`.
    pub fn assert_waiting_frees_met(&self, seeds: usize) {
        assert!(
            self.cuts_completing_waiting_frees >= 10 * seeds
                && self.cuts_with_frees_waiting_throughout >= seeds
                && self.recordings_pending_at_end >= 2 * seeds
                && self.completed_at_retries >= seeds
                && self.completed_by_empty_cache >= seeds
                && self.retries >= 2 * seeds,
            "{}",
            self.waiting_frees_met()
        );
    }

    /// Say how many cut recordings replayed exactly, and fail if a whole recording departed,
    /// or more than 1 cut recording in `per_known` departed with the memory given or 1 in
    /// `per_unknown` with the capacity alone (`None`: none may).
    pub fn check(&self, allowed_per: Option<(usize, usize)>) {
        assert!(self.wholes.is_empty(), "departed whole: {:?}", self.wholes);
        self.check_cuts(allowed_per);
    }

    /// As `check`, allowing 1 recording in `per`, whole or cut, to depart either way, in its
    /// retries only.
    pub fn check_retries_only(&self, per: usize) {
        assert!(
            self.beyond_retries.is_empty(),
            "departed beyond their retries: {:?}",
            self.beyond_retries
        );
        self.check_with_wholes(Some((per, per)));
    }

    /// As `check`, allowing as many whole recordings to depart as cut ones with the capacity
    /// alone (a whole recording is replayed so).
    pub fn check_with_wholes(&self, allowed_per: Option<(usize, usize)>) {
        let allowed = allowed_per.map_or(0, |(_, per)| self.cuts / per);
        eprintln!("{} recordings departed whole", self.wholes.len());
        assert!(
            self.wholes.len() <= allowed,
            "{} recordings departed whole (at most {allowed} allowed):\n{}",
            self.wholes.len(),
            self.wholes[..self.wholes.len().min(10)].join("\n")
        );
        self.check_cuts(allowed_per);
    }

    fn check_cuts(&self, allowed_per: Option<(usize, usize)>) {
        let cuts = self.cuts;
        assert!(
            self.capacity_misread.is_empty(),
            "{} of {cuts} cut recordings (and the whole ones) misread the device's capacity:\n{}",
            self.capacity_misread.len(),
            self.capacity_misread[..self.capacity_misread.len().min(10)].join("\n")
        );
        let (per_known, per_unknown) =
            allowed_per.map_or((None, None), |(k, u)| (Some(k), Some(u)));
        for (failures, per, given) in [
            (&self.known, per_known, "the device's memory given"),
            (&self.unknown, per_unknown, "the capacity alone"),
        ] {
            let allowed = per.map_or(0, |per| cuts / per);
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
}
