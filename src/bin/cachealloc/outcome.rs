//! What `replay` and `synth` print: one record, rendered as JSON or as a readable summary.

use cachealloc::backend::sim::Placement;
use cachealloc::config::shell_word;
use cachealloc::pool::rounding::LARGE_BUFFER;
use cachealloc::pool::{DeviceId, DeviceStats, OomHint, OomReport, Settings, format_size};
use cachealloc::report::{memory_summary, stats_json};
use cachealloc::trace::ReplayOutcome;
use cachealloc::trace::fit::{ExpandableTrial, FittingSetting, FractionTrial, MaxSplitSearch};
use cachealloc::trace::record::setting_text;
use serde::Serialize;

/// The recorded figures a trace carries, to compare a replay against.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Recorded {
    pub peak_reserved_bytes: Option<u64>,
    pub segment_allocs: Option<u64>,
    pub segment_frees: Option<u64>,
    /// Expandable segments: pages mapped into and unmapped from reserved ranges.
    pub segment_maps: Option<u64>,
    pub segment_unmaps: Option<u64>,
    /// The recording used expandable segments.
    pub expandable_segments: bool,
    /// The recording holds native segments and expandable ones, which no replay reproduces.
    pub both_segment_kinds: bool,
    pub retries: Option<u64>,
    /// `retries` may count more than the recording made (see `RecordedFigures`).
    pub retries_upper_bound: bool,
    pub oom: Option<RecordedOomJson>,
    /// Frees in the trace of memory allocated before recording began.
    pub orphan_frees: u64,
    /// Allocations at an address still live in the trace (its free is missing).
    pub missing_frees: u64,
    /// Allocations whose free was requested but had not completed when the recording ended.
    pub pending_frees: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RecordedOomJson {
    pub event_index: usize,
    pub size: u64,
    pub device_free: u64,
}

/// One replay, in the shape of the `--json` output.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayJson {
    pub trace: String,
    pub device: i32,
    pub mode: &'static str,
    pub settings: String,
    /// Whether the replay ran with expandable segments: then `num_device_alloc` and
    /// `num_device_free` count page maps and unmaps, not cudaMalloc and cudaFree calls.
    pub expandable_segments: bool,
    pub capacity_bytes: Option<u64>,
    /// In a faithful replay: the capacity is the device's whole memory (the memory the
    /// recording names or its ranges imply), since nothing in the recording brackets less.
    pub capacity_is_device_memory: bool,
    /// The total memory the simulated device reports (it sizes the ranges of expandable
    /// segments and the limit of a memory fraction): `--device-memory`, else the capacity, or in
    /// a faithful replay the memory the recording names or its ranges imply; null when
    /// unlimited.
    pub device_memory_bytes: Option<u64>,
    /// Where the simulated driver placed new segments (`top-down`, `bottom-up`); a faithful
    /// replay places them at their recorded addresses first.
    pub placement: &'static str,
    pub events: usize,
    pub allocs: u64,
    pub allocs_at_recorded_addr: Option<u64>,
    pub frees: u64,
    /// Frees in the trace of memory allocated before recording began: skipped in plain mode;
    /// in a faithful replay of a snapshot they free blocks of the rebuilt start state, and are
    /// part of `frees`.
    pub orphan_frees: u64,
    /// Frees of allocations that failed with an out-of-memory in this replay (skipped).
    pub frees_of_failed_allocs: u64,
    /// Allocations the trace makes at an address it has not freed since its last allocation
    /// there: the replay adds a free of the earlier allocation before each (counted in `events`
    /// and in `frees`, or in `frees_of_failed_allocs` when that allocation failed).
    pub missing_frees: u64,
    /// Allocations whose free the program requested but that had not completed (waiting for
    /// device work) when the recording ended: freed but still active at the end of the replay,
    /// as in the recording's final statistics.
    pub pending_frees: u64,
    /// Requests of 1 EB or more, refused with an out-of-memory error as PyTorch refuses them.
    pub requests_too_large: u64,
    pub empty_cache_calls: u64,
    /// The program's calls setting the memory fraction as it ran (a cachealloc trace's
    /// `memory_fraction`), replayed where it made them.
    pub memory_fraction_calls: u64,
    /// The program's synchronizations of the device (a cachealloc trace's `device_synchronize`,
    /// version 7), which complete the frees that waited for its work.
    pub device_synchronize_calls: u64,
    /// The recording's device resets (a cachealloc trace's `device_reset`): replayed as freeing
    /// what was live and returning every segment, which the counts of device calls and of
    /// synchronizations leave out (the reset made no cudaFree and no
    /// `synchronize_and_free_events`).
    pub device_resets: u64,
    /// The recording's failed requests (`oom` entries), requested again when the replay has a
    /// capacity.
    pub recorded_oom_requests: u64,
    /// The recording's requests that no cached block served, and `empty_cache()` calls, made
    /// during a CUDA graph capture (a cachealloc trace's `capture` lines): replayed capturing,
    /// so that the pool only takes new memory for them (or does nothing), as it did.
    pub captured_requests: u64,
    pub peak_allocated_bytes: i64,
    pub peak_requested_bytes: i64,
    pub peak_reserved_bytes: i64,
    pub final_reserved_bytes: i64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub first_oom_event_index: Option<usize>,
    pub recorded_peak_reserved_bytes: Option<u64>,
    pub recorded_segment_allocs: Option<u64>,
    pub recorded_segment_frees: Option<u64>,
    /// The recording's `segment_map` / `segment_unmap` calls (expandable segments: the
    /// driver calls that reserve and give back memory, in place of cudaMalloc and cudaFree).
    pub recorded_segment_maps: Option<u64>,
    pub recorded_segment_unmaps: Option<u64>,
    /// Whether the recording used `expandable_segments:True` (compare with
    /// `expandable_segments`: a replay without them shows what native segments would have
    /// done, not a reproduction).
    pub recorded_expandable_segments: bool,
    /// The recording holds both native segments (cudaMalloc) and expandable ones (page maps):
    /// the setting changed while it ran, or PyTorch kept private pools on native segments. A
    /// replay runs with one kind throughout (`expandable_segments`), so its device calls and
    /// addresses cannot all be the recording's.
    pub recorded_both_segment_kinds: bool,
    pub recorded_retries: Option<u64>,
    /// `recorded_retries` is an upper bound: the recording's retries are told by the releases
    /// before new segments, and under max_split_size_mb or a garbage-collection threshold some
    /// of those are no retry (a cachealloc trace from version 3 on marks each retry: exact).
    pub recorded_retries_upper_bound: bool,
    pub recorded_oom: Option<RecordedOomJson>,
    /// When the replay ran out of memory: the settings that replay without any OOM (null when
    /// there was no OOM).
    pub fitting_settings: Option<Vec<FittingJson>>,
    /// When no setting fits: the `max_split_size_mb` value that gets furthest past this
    /// replay's first OOM before running out of memory itself (null when none gets past it).
    pub gets_furthest: Option<GetsFurtherJson>,
    /// When no setting fits within the replay's `per_process_memory_fraction` below 1: the
    /// replay without it (null otherwise).
    pub fraction_trial: Option<FractionTrialJson>,
    /// When `max_split_size_mb:20` is among `fitting_settings`: its settings with 21, which
    /// PyTorch 2.9 and older take where they refuse 20, replayed (null otherwise).
    pub older_pytorch_trial: Option<OlderPytorchJson>,
    /// The `max_split_size_mb` the out-of-memory report suggests, replayed like the others
    /// (null when there was no OOM or the report suggests no value).
    pub report_suggestion: Option<SuggestionJson>,
    /// The `max_split_size_mb` values the search could not replay: the start state rebuilt
    /// from the snapshot holds blocks that could not exist under them (null when there was no
    /// search).
    pub max_split_sizes_not_replayable: Option<Vec<u64>>,
    /// When the replay ran out of memory: the same replay with expandable segments switched,
    /// on when it ran without them, off when it ran with them (null when there was no OOM, or
    /// the replay cannot start so).
    pub expandable_segments_trial: Option<ExpandableTrialJson>,
    /// The first out-of-memory report (null when there was none).
    pub first_oom_report: Option<OomReportJson>,
    /// Every statistic at the end of the replay, under the flattened keys of
    /// `torch.cuda.memory_stats()` (`"allocated_bytes.all.peak"`, …).
    pub memory_stats: serde_json::Value,
    #[serde(skip)]
    pub stats: DeviceStats,
    /// Whether the orphan frees were replayed (against a rebuilt start state).
    #[serde(skip)]
    pub orphans_replayed: bool,
    /// Whether a faithful replay would replay them (the trace is a PyTorch snapshot).
    #[serde(skip)]
    pub start_rebuildable: bool,
    /// The most the pool may reserve: the capacity, or less under a memory fraction.
    #[serde(skip)]
    pub memory_limit: Option<u64>,
    /// The search also tried each value without the replay's `roundup_power2_divisions` (after
    /// a padding out-of-memory); the settings found say which they have.
    #[serde(skip)]
    pub searched_without_divisions: bool,
    /// The search also tried the replay without the `max_split_size_mb` it set.
    #[serde(skip)]
    pub searched_without_max_split: bool,
}

/// The replay with expandable segments on.
#[derive(Clone, Debug, Serialize)]
pub struct ExpandableTrialJson {
    /// Whether the trial had expandable segments: on for a replay without them, off for one
    /// with them.
    pub expandable_segments: bool,
    /// A complete `--conf` value, as in `FittingJson`.
    pub conf: String,
    pub fits: bool,
    pub peak_reserved_bytes: u64,
    /// Page maps.
    pub num_device_alloc: u64,
    /// Its first out-of-memory, counted like `first_oom_event_index` (null when it fits).
    pub first_oom_event_index: Option<usize>,
    /// When it runs out of memory too: the same trial without some of the replay's own
    /// settings (`roundup_power2_divisions`, the `max_split_size_mb` it set) that fits (null
    /// when none does, or the replay set neither).
    pub fits_without: Option<ExpandableFitJson>,
}

/// The expandable-segments trial without some of the replay's own settings, which fits.
#[derive(Clone, Debug, Serialize)]
pub struct ExpandableFitJson {
    /// The replay's own settings it goes without, as they were set, as in `FittingJson`.
    pub dropped_settings: Vec<String>,
    /// A complete `--conf` value.
    pub conf: String,
    pub peak_reserved_bytes: u64,
    /// Page maps, or cudaMalloc calls without expandable segments.
    pub num_device_alloc: u64,
}

impl From<ExpandableTrial> for ExpandableTrialJson {
    fn from(t: ExpandableTrial) -> Self {
        ExpandableTrialJson {
            expandable_segments: t.expandable_segments,
            conf: t.conf,
            fits: t.first_oom_event_index.is_none(),
            peak_reserved_bytes: t.peak_reserved_bytes,
            num_device_alloc: t.num_device_alloc,
            first_oom_event_index: t.first_oom_event_index,
            fits_without: t.fits_without.map(|f| ExpandableFitJson {
                dropped_settings: dropped_texts(&f.dropped, &t.settings),
                conf: f.conf,
                peak_reserved_bytes: f.peak_reserved_bytes,
                num_device_alloc: f.num_device_alloc,
            }),
        }
    }
}

/// A setting verified to replay without an OOM.
#[derive(Clone, Debug, Serialize)]
pub struct FittingJson {
    /// The standard value tried; null: the replay's settings without `dropped_settings`, no
    /// value in their place.
    pub max_split_size_mb: Option<u64>,
    /// The replay's own settings it goes without, as they were set
    /// (`roundup_power2_divisions:4`, `max_split_size_mb:300`); empty when it keeps them all.
    pub dropped_settings: Vec<String>,
    /// Every setting of the replay with this value: a complete `--conf` value.
    pub conf: String,
    pub peak_reserved_bytes: u64,
    pub num_device_alloc: u64,
    pub num_alloc_retries: u64,
    /// Its peak reserved memory fills the device, or the limit of a memory fraction below 1
    /// (within a 20 MiB segment): it fits by releasing cached blocks, its retries.
    pub fills_memory_limit: bool,
    /// Other standard values that fit with the same other settings and the same figures: the
    /// value set makes no difference the figures show.
    pub same_figures_max_split_size_mb: Vec<u64>,
}

impl FittingJson {
    fn new(f: FittingSetting, memory_limit: Option<u64>, settings: &Settings) -> Self {
        FittingJson {
            max_split_size_mb: f.max_split_size_mb,
            dropped_settings: dropped_texts(&f.dropped, settings),
            conf: f.conf,
            peak_reserved_bytes: f.peak_reserved_bytes,
            num_device_alloc: f.num_device_alloc,
            num_alloc_retries: f.num_alloc_retries,
            fills_memory_limit: memory_limit.is_some_and(|l| fills(l, f.peak_reserved_bytes)),
            same_figures_max_split_size_mb: f.same_figures_mb,
        }
    }
}

/// The replay's own settings `dropped` (keys), as `settings` set them.
fn dropped_texts(dropped: &[&'static str], settings: &Settings) -> Vec<String> {
    dropped
        .iter()
        .map(|key| setting_text(settings, key).unwrap_or_else(|| key.to_string()))
        .collect()
}

/// A fitting `max_split_size_mb:20` replayed as 21 (PyTorch 2.9 and older refuse 20).
#[derive(Clone, Debug, Serialize)]
pub struct OlderPytorchJson {
    /// A complete `--conf` value.
    pub conf: String,
    pub fits: bool,
    pub peak_reserved_bytes: u64,
    /// Its first out-of-memory, counted like `first_oom_event_index` (null when it fits).
    pub first_oom_event_index: Option<usize>,
}

/// The replay without its memory fraction, tried when no value fits within its limit.
#[derive(Clone, Debug, Serialize)]
pub struct FractionTrialJson {
    /// The `per_process_memory_fraction` in force at the replay's requests: the replay's, or
    /// the one the program set as it ran (the lowest, when it changed it between requests).
    pub fraction: f64,
    /// The program set its fraction as it ran (a cachealloc trace's `memory_fraction` lines),
    /// which `--conf` does not override: the trial lifted its calls as well, which only a
    /// program (or its trace) without them reproduces, and `enough_fraction` is one set by
    /// the program in their place (`enough_conf` null).
    pub set_by_program: bool,
    /// The replay's settings without it: a complete `--conf` value.
    pub conf: String,
    pub fits: bool,
    pub peak_reserved_bytes: u64,
    /// When it fits: a fraction in hundredths below 1 that fits too, replayed (found by halving
    /// the range between the replay's fraction and 1: a smaller one may fit too), and its
    /// `--conf` value (null otherwise).
    pub enough_fraction: Option<f64>,
    pub enough_conf: Option<String>,
}

impl From<FractionTrial> for FractionTrialJson {
    fn from(t: FractionTrial) -> Self {
        let (enough_fraction, enough_conf) = t.enough.unzip();
        // A --conf does not override the program's calls: the fraction is the program's to set.
        let enough_conf = enough_conf.filter(|_| !t.set_by_program);
        FractionTrialJson {
            fraction: t.fraction,
            set_by_program: t.set_by_program,
            conf: t.conf,
            fits: t.fits,
            peak_reserved_bytes: t.peak_reserved_bytes,
            enough_fraction,
            enough_conf,
        }
    }
}

/// An out-of-memory report: its figures, what it concludes, and its text.
#[derive(Clone, Debug, Serialize)]
pub struct OomReportJson {
    /// `exhausted` (live memory alone exceeds what the device offers), `segment_too_large` (the
    /// request's new segment is larger than the memory left), `padding` (the requests fit, their
    /// rounded blocks do not), `untracked` (memory outside the allocator holds what is
    /// missing), `fragmentation`, `small_pool_held` (only the small pool's memory, which serves
    /// requests of 1 MiB or less, would make room), `other_stream` (a free block large enough
    /// is cached for another stream), `freed_during_request` (a block freed while the
    /// request failed now holds it), `pending_during_capture` (frees a CUDA graph capture
    /// kept the pool from waiting for would leave a block that holds it) or
    /// `held_during_capture` (whole free segments a capture kept cached would make room), or
    /// `device_memory_unknown` (`cudaMemGetInfo` failed as the report was built).
    pub kind: &'static str,
    pub requested_bytes: u64,
    pub rounded_bytes: u64,
    /// The segment the pool tried to obtain from the device.
    pub segment_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub device_total_bytes: u64,
    pub device_free_bytes: u64,
    /// The `per_process_memory_fraction` limit, when one is set.
    pub allowed_maximum_bytes: Option<u64>,
    /// Sizes in bytes of the largest free cached blocks, largest first (at most 16).
    pub largest_free_blocks_bytes: Vec<u64>,
    /// How many free cached blocks the device had (listed or not).
    pub free_blocks: usize,
    /// Free cached bytes of the request's pool held for other streams, which it cannot use.
    pub other_streams_free_bytes: u64,
    /// The largest of those blocks (0 when none).
    pub other_streams_largest_free_block_bytes: u64,
    /// The `max_split_size_mb` the hint suggests (null when it suggests none).
    pub suggested_max_split_size_mb: Option<u64>,
    /// For a padding hint whose requests would fit only without the memory held outside
    /// cachealloc: that memory (0 otherwise).
    pub padding_held_outside_bytes: u64,
    /// The report as the summary and the library's log print it.
    pub text: String,
}

impl From<&OomReport> for OomReportJson {
    fn from(r: &OomReport) -> Self {
        let hint = r.hint();
        OomReportJson {
            kind: match hint {
                OomHint::Exhausted { .. } => "exhausted",
                OomHint::SegmentTooLarge { .. } => "segment_too_large",
                OomHint::Padding { .. } => "padding",
                OomHint::Untracked { .. } => "untracked",
                OomHint::Fragmentation { .. } => "fragmentation",
                OomHint::SmallPoolHeld { .. } => "small_pool_held",
                OomHint::OtherStream { .. } => "other_stream",
                OomHint::FreedDuringRequest { .. } => "freed_during_request",
                OomHint::PendingDuringCapture { .. } => "pending_during_capture",
                OomHint::HeldDuringCapture { .. } => "held_during_capture",
                OomHint::DeviceMemoryUnknown => "device_memory_unknown",
            },
            requested_bytes: r.requested,
            rounded_bytes: r.rounded,
            segment_bytes: r.alloc_size,
            allocated_bytes: r.allocated,
            reserved_bytes: r.reserved,
            device_total_bytes: r.device_total,
            device_free_bytes: r.device_free,
            allowed_maximum_bytes: r.allowed_maximum,
            largest_free_blocks_bytes: r.largest_free_blocks.clone(),
            free_blocks: r.free_blocks,
            other_streams_free_bytes: r.other_streams_free,
            other_streams_largest_free_block_bytes: r.other_streams_largest_free_block,
            suggested_max_split_size_mb: hint.suggested_max_split_size_mb(),
            padding_held_outside_bytes: match hint {
                OomHint::Padding { held_outside, .. } => held_outside,
                _ => 0,
            },
            // The replay's own search follows the report: no pointer to a replay in its hint.
            text: format!("{r:#}"),
        }
    }
}

/// A setting that gets past the replay's first OOM, and where it runs out of memory itself.
#[derive(Clone, Debug, Serialize)]
pub struct GetsFurtherJson {
    /// As in `FittingJson`.
    pub max_split_size_mb: Option<u64>,
    pub dropped_settings: Vec<String>,
    /// A complete `--conf` value, as in `FittingJson`.
    pub conf: String,
    /// Counted like `first_oom_event_index`.
    pub first_oom_event_index: usize,
}

/// The out-of-memory report's suggested setting and whether replaying under it fits.
#[derive(Clone, Debug, Serialize)]
pub struct SuggestionJson {
    pub conf: String,
    pub fits: bool,
    /// It runs out of memory too, but later than the replay (false when it fits).
    pub gets_further: bool,
    /// False when the value could not be replayed at all: the start state rebuilt from the
    /// snapshot holds blocks that could not exist under it.
    pub tried: bool,
}

/// Where the workload came from and how it was replayed.
pub struct Context {
    pub trace: String,
    pub device: i32,
    pub mode: &'static str,
    pub settings: String,
    /// The replay ran with expandable segments.
    pub expandable_segments: bool,
    pub capacity: Option<u64>,
    /// A faithful replay's capacity is the device's whole memory: nothing in the recording
    /// brackets less.
    pub capacity_is_device_memory: bool,
    /// The total memory the simulated device reports (`ReplayConfig::total`).
    pub device_memory: Option<u64>,
    pub placement: &'static str,
    pub recorded: Recorded,
    pub faithful: bool,
    /// The replay started from the state rebuilt from the snapshot, so frees of memory from
    /// before the trace were replayed.
    pub orphans_replayed: bool,
    /// A faithful replay rebuilds that state (the trace is a PyTorch snapshot; a faithful
    /// replay of one has replayed the orphan frees).
    pub start_rebuildable: bool,
    /// The most the pool may reserve: the capacity, or less under a memory fraction.
    pub memory_limit: Option<u64>,
}

impl ReplayJson {
    pub fn new(ctx: Context, out: ReplayOutcome) -> Self {
        let s = &out.stats;
        ReplayJson {
            trace: ctx.trace,
            device: ctx.device,
            mode: ctx.mode,
            settings: ctx.settings,
            capacity_bytes: ctx.capacity,
            capacity_is_device_memory: ctx.capacity_is_device_memory,
            device_memory_bytes: ctx.device_memory,
            placement: ctx.placement,
            events: out.ops,
            allocs: out.allocs,
            allocs_at_recorded_addr: ctx.faithful.then_some(out.allocs_at_recorded_addr),
            frees: out.frees,
            orphan_frees: ctx.recorded.orphan_frees,
            frees_of_failed_allocs: out.skipped_frees,
            missing_frees: ctx.recorded.missing_frees,
            pending_frees: ctx.recorded.pending_frees,
            requests_too_large: out.requests_too_large,
            empty_cache_calls: out.empty_cache_calls,
            memory_fraction_calls: out.memory_fraction_calls,
            device_synchronize_calls: out.device_synchronize_calls,
            device_resets: out.device_resets,
            recorded_oom_requests: out.recorded_oom_requests,
            captured_requests: out.captured_requests,
            peak_allocated_bytes: s.allocated_bytes.all.peak,
            peak_requested_bytes: s.requested_bytes.all.peak,
            peak_reserved_bytes: s.reserved_bytes.all.peak,
            final_reserved_bytes: s.reserved_bytes.all.current,
            num_device_alloc: s.counts.num_device_alloc,
            num_device_free: s.counts.num_device_free,
            num_alloc_retries: s.counts.num_alloc_retries,
            num_ooms: s.counts.num_ooms,
            first_oom_event_index: out.first_oom.as_ref().map(|o| o.event_index()),
            recorded_peak_reserved_bytes: ctx.recorded.peak_reserved_bytes,
            recorded_segment_allocs: ctx.recorded.segment_allocs,
            recorded_segment_frees: ctx.recorded.segment_frees,
            recorded_segment_maps: ctx.recorded.segment_maps,
            recorded_segment_unmaps: ctx.recorded.segment_unmaps,
            recorded_expandable_segments: ctx.recorded.expandable_segments,
            recorded_both_segment_kinds: ctx.recorded.both_segment_kinds,
            recorded_retries: ctx.recorded.retries,
            recorded_retries_upper_bound: ctx.recorded.retries_upper_bound,
            recorded_oom: ctx.recorded.oom,
            fitting_settings: None,
            gets_furthest: None,
            fraction_trial: None,
            older_pytorch_trial: None,
            report_suggestion: None,
            max_split_sizes_not_replayable: None,
            expandable_segments_trial: None,
            first_oom_report: out.first_oom.as_ref().map(|o| (&o.report).into()),
            memory_stats: stats_json(&out.stats),
            stats: out.stats.clone(),
            orphans_replayed: ctx.orphans_replayed,
            start_rebuildable: ctx.start_rebuildable,
            memory_limit: ctx.memory_limit,
            searched_without_divisions: false,
            searched_without_max_split: false,
            expandable_segments: ctx.expandable_segments,
        }
    }

    /// Attach the settings found to fit after an OOM (the report's suggestion among those
    /// tried).
    pub fn with_fits(mut self, search: Option<MaxSplitSearch>) -> Self {
        let Some(search) = search else {
            return self;
        };
        if search.fits.is_empty() {
            self.gets_furthest = search.gets_furthest.as_ref().map(|g| GetsFurtherJson {
                max_split_size_mb: g.max_split_size_mb,
                dropped_settings: dropped_texts(&g.dropped, &search.settings),
                conf: g.conf.clone(),
                first_oom_event_index: g.first_oom_event_index,
            });
        }
        let suggested = self
            .first_oom_report
            .as_ref()
            .and_then(|r| r.suggested_max_split_size_mb);
        if let Some(mb) = suggested {
            self.report_suggestion = Some(SuggestionJson {
                conf: search.conf_for(mb),
                fits: search.value_fits(mb),
                gets_further: search.get_further.contains(&mb),
                tried: !search.cannot_start.contains(&mb),
            });
        }
        self.max_split_sizes_not_replayable = Some(search.cannot_start.clone());
        self.searched_without_divisions = search.also_without_divisions;
        self.searched_without_max_split = search.also_without_max_split;
        self.fraction_trial = search.fraction.map(FractionTrialJson::from);
        self.older_pytorch_trial = search.older_pytorch.map(|t| OlderPytorchJson {
            conf: t.conf,
            fits: t.first_oom_event_index.is_none(),
            peak_reserved_bytes: t.peak_reserved_bytes,
            first_oom_event_index: t.first_oom_event_index,
        });
        let limit = self.memory_limit;
        let settings = &search.settings;
        self.fitting_settings = Some(
            search
                .fits
                .into_iter()
                .map(|f| FittingJson::new(f, limit, settings))
                .collect(),
        );
        self
    }

    /// The recording's device calls: cudaMalloc and cudaFree, and with expandable segments its
    /// page maps and unmaps (with cudaMalloc and cudaFree too when it made any: the setting
    /// changed during the recording).
    fn recorded_device_calls(&self) -> String {
        let native = format!(
            "{} cudaMalloc, {} cudaFree",
            opt(self.recorded_segment_allocs),
            opt(self.recorded_segment_frees)
        );
        if !self.recorded_expandable_segments {
            return native;
        }
        let mapped = format!(
            "{}, {}",
            opt_counted(self.recorded_segment_maps, "segment map"),
            opt_counted(self.recorded_segment_unmaps, "unmap")
        );
        let made_native = [self.recorded_segment_allocs, self.recorded_segment_frees]
            .iter()
            .any(|n| n.unwrap_or(0) > 0);
        if made_native {
            format!("{native}, {mapped}")
        } else {
            mapped
        }
    }

    /// Attach the replay with expandable segments on (tried after an OOM without them).
    pub fn with_expandable_trial(mut self, trial: Option<ExpandableTrial>) -> Self {
        self.expandable_segments_trial = trial.map(ExpandableTrialJson::from);
        self
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plain data serializes")
    }

    /// The readable summary: headline figures, the comparison with the recording, the stats
    /// table and the first OOM report.
    pub fn to_text(&self) -> String {
        let mut t = String::new();
        let fs = |b: i64| format_size(b.max(0) as u64);
        t += &format!(
            "cachealloc replay of {} (device {}, {} mode)\n",
            self.trace, self.device, self.mode
        );
        t += &format!(
            "  settings: {}\n",
            if self.settings.is_empty() {
                "defaults"
            } else {
                &self.settings
            }
        );
        if let Some(c) = self.capacity_bytes {
            t += &format!("  device capacity: {}", format_size(c));
            if self.capacity_is_device_memory {
                t += " (the device's whole memory: nothing in the recording brackets less)";
            }
            t += "\n";
        }
        if let Some(m) = self.device_memory_bytes
            && self.capacity_bytes != Some(m)
        {
            t += &format!(
                "  device memory: {} (it sizes the ranges of expandable segments and the limit \
                 of a memory fraction)\n",
                format_size(m)
            );
        }
        // Top-down is the default and what the Linux driver mostly does: named only otherwise.
        if self.placement != Placement::TopDown.name() {
            t += &format!("  segment placement: {}\n", self.placement);
        }
        // The parts add up to `events`; what the replay left out, or notes about a part, come
        // after it.
        let allocs = counted(self.allocs, "allocation");
        let mut frees = counted(self.frees, "free");
        let mut of_frees = Vec::new();
        if self.orphans_replayed && self.orphan_frees > 0 {
            of_frees.push(format!(
                "{} of memory from before the trace, freed from the rebuilt start state",
                self.orphan_frees
            ));
        }
        if self.missing_frees > 0 {
            of_frees.push(format!(
                "{} added: the trace allocates at an address it has not freed since its last \
                 allocation there, so the replay frees the earlier allocation first",
                self.missing_frees
            ));
        }
        if !of_frees.is_empty() {
            frees += &format!(" ({})", of_frees.join("; "));
        }
        let mut parts = vec![allocs, frees];
        if self.frees_of_failed_allocs > 0 {
            parts.push(format!(
                "{} of allocations that ran out of memory, skipped",
                counted(self.frees_of_failed_allocs, "free")
            ));
        }
        parts.push(counted(self.empty_cache_calls, "empty_cache call"));
        if self.memory_fraction_calls > 0 {
            parts.push(format!(
                "{} of the program's, each in force from where it was made",
                counted(self.memory_fraction_calls, "memory fraction call")
            ));
        }
        if self.device_synchronize_calls > 0 {
            parts.push(format!(
                "{} (cudaDeviceSynchronize)",
                counted(self.device_synchronize_calls, "device synchronization")
            ));
        }
        if self.device_resets > 0 {
            parts.push(format!(
                "{}: what was live freed and every segment returned, without cudaFree calls",
                counted(self.device_resets, "device reset")
            ));
        }
        if self.recorded_oom_requests > 0 {
            parts.push(format!(
                "{} of the recording, {}",
                counted(self.recorded_oom_requests, "failed request"),
                if self.capacity_bytes.is_some() {
                    "requested again"
                } else {
                    "not requested again (no capacity)"
                }
            ));
        }
        if self.captured_requests > 0 {
            parts.push(format!(
                "of these, {} made during a CUDA graph capture (requests that missed, \
                 empty_cache calls), replayed capturing: new memory only, no synchronization, \
                 nothing given back",
                self.captured_requests
            ));
        }
        t += &format!("  events: {} ({})\n", self.events, parts.join(", "));
        if self.requests_too_large > 0 {
            t += &format!(
                "  refused: {} of 1 EB or more (as PyTorch refuses them)\n",
                counted(self.requests_too_large, "request")
            );
        }
        if !self.orphans_replayed && self.orphan_frees > 0 {
            let rebuild = if self.start_rebuildable {
                " (the recording began with memory allocated, which this replay starts without: \
                 --faithful rebuilds it)"
            } else {
                ""
            };
            t += &format!(
                "  not replayed: {} of memory from before the trace{rebuild}\n",
                counted(self.orphan_frees, "free")
            );
        }
        if self.pending_frees > 0 {
            t += &format!(
                "  still pending at the end: {} whose free was waiting for device work when the \
                 recording ended (freed, still active: their blocks are not reusable yet)\n",
                counted(self.pending_frees, "allocation")
            );
        }
        t += &format!(
            "  peak allocated {} | peak requested {} | peak reserved {} | final reserved {}\n",
            fs(self.peak_allocated_bytes),
            fs(self.peak_requested_bytes),
            fs(self.peak_reserved_bytes),
            fs(self.final_reserved_bytes)
        );
        t += &format!(
            "  device calls: {} | retries {} | OOMs {}\n",
            device_calls(
                self.expandable_segments,
                self.num_device_alloc,
                self.num_device_free
            ),
            self.num_alloc_retries,
            self.num_ooms
        );
        if let Some(at) = self.allocs_at_recorded_addr {
            t += &format!(
                "  allocations at their recorded address: {} of {}\n",
                at, self.allocs
            );
        }
        if let Some(peak) = self.recorded_peak_reserved_bytes {
            t += &format!(
                "  recorded{}: peak reserved {} | {} | retries {}{}{}\n",
                if self.recorded_expandable_segments {
                    " (expandable segments)"
                } else {
                    ""
                },
                format_size(peak),
                self.recorded_device_calls(),
                if self.recorded_retries_upper_bound {
                    "at most "
                } else {
                    ""
                },
                opt(self.recorded_retries),
                match &self.recorded_oom {
                    Some(o) => format!(
                        " | OOM at trace entry {} ({} requested)",
                        o.event_index,
                        format_size(o.size)
                    ),
                    None => String::new(),
                }
            );
        }
        if self.recorded_both_segment_kinds {
            t += &format!(
                "  the recording holds both native segments (cudaMalloc) and expandable ones \
                 (page maps): the setting changed while it ran, or PyTorch kept private pools \
                 (CUDA graphs') on native segments; the trace does not say which segment was \
                 made under which setting, and this replay used {} segments for all of them, so \
                 its device calls and addresses cannot all match the recording's\n",
                if self.expandable_segments {
                    "expandable"
                } else {
                    "native"
                }
            );
        }
        if self.recorded_expandable_segments && !self.expandable_segments {
            t += "  the recording used expandable_segments:True and this replay did not: its \
                  reserved memory and device calls are what native segments would have done \
                  (";
            t += if self.mode == "faithful" {
                "add expandable_segments:True to --conf, which replaces the recording's settings, \
                 to replay them)\n"
            } else {
                "--conf expandable_segments:True or --faithful replays them)\n"
            };
        }
        t += "\n";
        t += &memory_summary(&self.stats, DeviceId(self.device), false);
        if let Some(report) = &self.first_oom_report {
            let at = self
                .first_oom_event_index
                .map(|i| format!(" at {}", event_at(self.mode, i)))
                .unwrap_or_default();
            t += &format!("\nFirst out-of-memory{at}:\n{}\n", report.text);
        }
        let expandable_fits = self
            .expandable_segments_trial
            .as_ref()
            .is_some_and(|e| e.fits || e.fits_without.is_some());
        if let Some(fits) = &self.fitting_settings {
            t += &self.fits_text(fits, expandable_fits);
        }
        if let Some(e) = &self.expandable_segments_trial {
            t += &expandable_text(e, self.mode);
        }
        t
    }
}

/// Whether a replay that reserved at most `peak` bytes filled the `limit` it could reserve:
/// less than a large segment (20 MiB) was left. A setting that fits only so lives on releasing
/// its cache (the retries), which the summary says rather than repeat the limit.
fn fills(limit: u64, peak: u64) -> bool {
    limit.saturating_sub(peak) < LARGE_BUFFER
}

/// The replay with expandable segments, in words.
fn expandable_text(e: &ExpandableTrialJson, mode: &str) -> String {
    let with = if e.expandable_segments {
        "With"
    } else {
        "Without"
    };
    match e.first_oom_event_index {
        None => format!(
            "{with} expandable segments (--conf {}) it runs without an out-of-memory: peak \
             reserved {}, {}.\n",
            shell_word(&e.conf),
            format_size(e.peak_reserved_bytes),
            device_allocs(e.expandable_segments, e.num_device_alloc)
        ),
        Some(at) => {
            let mut t = format!(
                "{with} expandable segments (--conf {}) it runs out of memory too, first at {}",
                shell_word(&e.conf),
                event_at(mode, at)
            );
            if let Some(f) = &e.fits_without {
                t += &format!(
                    "; without this replay's {} as well (--conf {}) it runs without an \
                     out-of-memory: peak reserved {}, {}",
                    f.dropped_settings.join(" and "),
                    shell_word(&f.conf),
                    format_size(f.peak_reserved_bytes),
                    device_allocs(e.expandable_segments, f.num_device_alloc)
                );
            }
            t + ".\n"
        }
    }
}

/// Where an event is, in words: "trace entry N" or, for a synthetic workload, "operation N".
pub(crate) fn event_at(mode: &str, index: usize) -> String {
    match mode {
        // A trace's index counts all of its entries (segment calls included).
        "synthetic" => format!("operation {index}"),
        _ => format!("trace entry {index}"),
    }
}

fn opt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
}

/// `counted`, or "? maps" when the figure is unknown.
fn opt_counted(v: Option<u64>, noun: &str) -> String {
    v.map_or_else(|| format!("? {noun}s"), |n| counted(n, noun))
}

/// The device calls a replay made: "3 cudaMalloc, 1 cudaFree" (the calls' names), or with
/// expandable segments "1 segment map, 2 unmaps".
fn device_calls(expandable_segments: bool, allocs: u64, frees: u64) -> String {
    let frees = if expandable_segments {
        counted(frees, "unmap")
    } else {
        format!("{frees} cudaFree")
    };
    format!("{}, {frees}", device_allocs(expandable_segments, allocs))
}

/// The device allocations a replay made: "3 cudaMalloc", or "1 segment map".
pub(crate) fn device_allocs(expandable_segments: bool, n: u64) -> String {
    if expandable_segments {
        counted(n, "segment map")
    } else {
        format!("{n} cudaMalloc")
    }
}

/// `n` and the noun, plural unless `n` is 1: "1 free", "3 frees".
pub(crate) fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::{device_calls, fills, opt_counted};

    #[test]
    fn a_limit_is_filled_when_less_than_a_large_segment_is_left() {
        let limit = 5800u64 << 20;
        assert!(fills(limit, limit));
        assert!(fills(limit, limit - (20 << 20) + 1));
        assert!(!fills(limit, limit - (20 << 20)));
    }

    /// Page maps are counted with their noun, in the singular for one; the native calls are
    /// named by the function.
    #[test]
    fn device_calls_read_as_counts() {
        assert_eq!(device_calls(true, 1, 1), "1 segment map, 1 unmap");
        assert_eq!(device_calls(true, 2, 0), "2 segment maps, 0 unmaps");
        assert_eq!(device_calls(false, 1, 1), "1 cudaMalloc, 1 cudaFree");
        assert_eq!(opt_counted(None, "unmap"), "? unmaps");
        assert_eq!(opt_counted(Some(1), "segment map"), "1 segment map");
    }
}
