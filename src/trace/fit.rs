//! Settings that fit: when a replay runs out of memory, replay the same workload under other
//! `max_split_size_mb` values and report the ones that avoid every OOM — or, when none does, the
//! one that gets furthest past the first. The suggestion is then a measured fact about this
//! workload on this device, not a rule of thumb. The values tried are
//! the standard ones the OOM report picks its suggestion from, so the report's value is always
//! among them. Where none fits with the replay's other settings, the search also goes without
//! the replay's own padding settings (`roundup_power2_divisions`, a `max_split_size_mb` it set)
//! and, failing that, without its memory fraction: a workload is said to need more memory only
//! when none of that fits.

use super::record::settings_text;
use super::replay::{OomAt, ReplayConfig, ReplayOutcome, StartLayout, replay};
use super::workload::Workload;
pub use crate::pool::oom::MAX_SPLIT_LADDER_MB;
use crate::pool::oom::OLDER_PYTORCH_REFUSES_MB;
use crate::pool::rounding::ROUNDUP_INTERVALS;
use crate::pool::{Error, OomHint, Settings};

/// The replay's own `roundup_power2_divisions`, as a setting a trial goes without.
pub const DIVISIONS: &str = "roundup_power2_divisions";
/// The replay's own `max_split_size_mb`, as a setting a trial goes without.
pub const MAX_SPLIT: &str = "max_split_size_mb";

/// One setting that replays without an OOM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FittingSetting {
    /// The standard value tried; `None`: the replay's settings without `dropped`, no value set
    /// in their place.
    pub max_split_size_mb: Option<u64>,
    /// The replay's own settings this one goes without (`DIVISIONS`, `MAX_SPLIT`), in that
    /// order; empty when it keeps them all.
    pub dropped: Vec<&'static str>,
    /// Every setting of the replay that found it, in `CACHEALLOC_CONF` syntax (the keys that
    /// differ from the defaults), e.g. `max_split_size_mb:128,roundup_power2_divisions:4`:
    /// what `--conf` or `CACHEALLOC_CONF` must say to reproduce it.
    pub conf: String,
    pub peak_reserved_bytes: u64,
    pub num_device_alloc: u64,
    pub num_alloc_retries: u64,
    /// Standard `max_split_size_mb` values that fit with the same other settings (`dropped`)
    /// and the same figures (peak reserved memory, device calls, retries), folded into this
    /// one: the value set makes no difference the figures show.
    pub same_figures_mb: Vec<u64>,
}

impl FittingSetting {
    fn figures(&self) -> (u64, u64, u64) {
        (
            self.peak_reserved_bytes,
            self.num_device_alloc,
            self.num_alloc_retries,
        )
    }
}

/// `settings` with `max_split_size_mb` set to `mb`.
fn with_max_split(settings: &Settings, mb: u64) -> Settings {
    Settings {
        max_split_size: mb << 20,
        ..settings.clone()
    }
}

/// `settings` with `max_split_size_mb:MB`, in `CACHEALLOC_CONF` syntax (the keys that differ
/// from the defaults).
pub fn max_split_conf(settings: &Settings, mb: u64) -> String {
    settings_text(&with_max_split(settings, mb))
}

/// `settings` without the replay's own settings `dropped` (`DIVISIONS`, `MAX_SPLIT`).
fn without(settings: &Settings, dropped: &[&'static str]) -> Settings {
    let mut s = settings.clone();
    for &key in dropped {
        match key {
            DIVISIONS => s.roundup_power2_divisions = [0; ROUNDUP_INTERVALS],
            MAX_SPLIT => s.max_split_size = Settings::default().max_split_size,
            _ => unreachable!("no setting {key} is dropped"),
        }
    }
    s
}

/// `workload` replayed as `config` says, but under `settings`.
fn replay_under(
    workload: &Workload,
    config: &ReplayConfig,
    settings: Settings,
    start: Option<&StartLayout>,
) -> Result<ReplayOutcome, Error> {
    let trial = ReplayConfig {
        settings,
        ..config.clone()
    };
    replay(workload, &trial, start)
}

/// A replay's peak reserved memory, in bytes.
fn peak_reserved(out: &ReplayOutcome) -> u64 {
    out.stats.reserved_bytes.all.peak.max(0) as u64
}

/// A setting that gets past the first OOM of the replay it was tried for, but runs out of
/// memory later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetsFurther {
    /// As in `FittingSetting`.
    pub max_split_size_mb: Option<u64>,
    pub dropped: Vec<&'static str>,
    pub conf: String,
    /// Its own first OOM: the workload's op index.
    pub first_oom_op: usize,
    /// The same place as a user counts it (`OomAt::event_index`).
    pub first_oom_event_index: usize,
}

/// The replay without its `per_process_memory_fraction` (its other settings kept), tried when
/// no `max_split_size_mb` value fits within the fraction's limit.
#[derive(Clone, Debug, PartialEq)]
pub struct FractionTrial {
    /// The fraction in force at the replay's requests (`Workload::fraction_throughout`; the
    /// lowest set, when the program changed it between requests).
    pub fraction: f64,
    /// The program set its fraction as it ran (`Op::MemoryFraction`), which no setting
    /// overrides: the trial lifted those calls too, and `enough` is a fraction set in their
    /// place.
    pub set_by_program: bool,
    /// The replay's settings without it, in `CACHEALLOC_CONF` syntax.
    pub conf: String,
    pub peak_reserved_bytes: u64,
    /// Without the limit it runs without any OOM.
    pub fits: bool,
    /// When it fits: a fraction in hundredths below 1 that fits too (replayed), found by
    /// halving, and the replay's settings with it in `CACHEALLOC_CONF` syntax. Where the
    /// program set its fraction, only while one held throughout (then the program's calls set
    /// it too).
    pub enough: Option<(f64, String)>,
}

/// What replaying under the standard `max_split_size_mb` values found.
#[derive(Clone, Debug, PartialEq)]
pub struct MaxSplitSearch {
    /// The values that replay without any OOM, by peak reserved memory; of those with the
    /// same other settings and figures only one is listed (`same_figures_mb`).
    pub fits: Vec<FittingSetting>,
    /// Of the others, the one whose first OOM comes latest, if later than the replay's own;
    /// of values whose first OOMs come equally late, the first in `MAX_SPLIT_LADDER_MB`'s
    /// order (and the search with the replay's own settings before the ones without them).
    pub gets_furthest: Option<GetsFurther>,
    /// The values that run out of memory, but later than the replay itself.
    pub get_further: Vec<u64>,
    /// Values under which the replay cannot start: the start state rebuilt from a snapshot
    /// holds blocks that could not exist under them (not tried).
    pub cannot_start: Vec<u64>,
    /// The settings of the replay searched from (every value was tried with them).
    pub settings: Settings,
    /// Every value was also tried without the replay's `roundup_power2_divisions`, and `fits`
    /// and `gets_furthest` include those replays (`search_after_oom`).
    pub also_without_divisions: bool,
    /// The replay was also tried without the `max_split_size_mb` it set (and without its
    /// divisions too, when `also_without_divisions`).
    pub also_without_max_split: bool,
    /// When nothing fits within the replay's memory fraction: the replay without it.
    pub fraction: Option<FractionTrial>,
    /// When `max_split_size_mb:20` is listed as fitting: the same settings with 21, the
    /// smallest value PyTorch 2.9 and older accept (`older_pytorch_trial`).
    pub older_pytorch: Option<OlderPytorchTrial>,
}

/// A listed `max_split_size_mb:20` replayed as 21, which PyTorch 2.9 and older take where they
/// refuse 20 (their parser wants more than 20).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OlderPytorchTrial {
    /// The fitting setting's other settings with `max_split_size_mb:21`, as in
    /// `FittingSetting::conf`.
    pub conf: String,
    pub peak_reserved_bytes: u64,
    /// Its first OOM, counted like `OomAt::event_index`; `None`: it fits.
    pub first_oom_event_index: Option<usize>,
}

/// The smallest `max_split_size_mb` PyTorch 2.9 and older accept.
pub const OLDER_PYTORCH_SMALLEST_MB: u64 = OLDER_PYTORCH_REFUSES_MB + 1;

impl MaxSplitSearch {
    /// The replay's settings with `max_split_size_mb:MB`, in `CACHEALLOC_CONF` syntax.
    pub fn conf_for(&self, mb: u64) -> String {
        max_split_conf(&self.settings, mb)
    }
}

/// Replay `workload` under each standard `max_split_size_mb` value (other settings as in
/// `config`). `first_oom_op` is the op of the first OOM under `config` itself. Values under
/// which the replay cannot even start (a start state that cannot exist under them) are
/// listed in `cannot_start`.
pub fn search_max_split_sizes(
    workload: &Workload,
    config: &ReplayConfig,
    start: Option<&StartLayout>,
    first_oom_op: usize,
) -> MaxSplitSearch {
    let mut search = MaxSplitSearch {
        fits: Vec::new(),
        gets_furthest: None,
        get_further: Vec::new(),
        cannot_start: Vec::new(),
        settings: config.settings.clone(),
        also_without_divisions: false,
        also_without_max_split: false,
        fraction: None,
        older_pytorch: None,
    };
    search.try_without((workload, config, start, first_oom_op), &[], false, true);
    search
}

/// What `MaxSplitSearch::try_without` replays: the workload, the replay's configuration, its
/// start state and the op of its first OOM.
type Searched<'a> = (
    &'a Workload,
    &'a ReplayConfig,
    Option<&'a StartLayout>,
    usize,
);

impl MaxSplitSearch {
    /// Replay without the replay's own settings `dropped`: under those settings alone (`own`)
    /// and under each standard value (`ladder`), adding what fits (one of each figures) and
    /// what gets furthest. Of the replay's own settings (nothing dropped), values that cannot
    /// start or get further are noted too.
    fn try_without(
        &mut self,
        (workload, config, start, first_oom_op): Searched<'_>,
        dropped: &[&'static str],
        own: bool,
        ladder: bool,
    ) {
        let base = without(&config.settings, dropped);
        let mut runs: Vec<(Option<u64>, Settings)> = Vec::new();
        if own {
            runs.push((None, base.clone()));
        }
        if ladder {
            runs.extend(MAX_SPLIT_LADDER_MB.map(|mb| (Some(mb), with_max_split(&base, mb))));
        }
        let mut found: Vec<FittingSetting> = Vec::new();
        for (mb, settings) in runs {
            let conf = settings_text(&settings);
            let out = match replay_under(workload, config, settings, start) {
                Ok(out) => out,
                Err(Error::SeedForbiddenBySettings(_)) => {
                    if let (Some(mb), true) = (mb, dropped.is_empty()) {
                        self.cannot_start.push(mb);
                    }
                    continue;
                }
                // Any other failure is the workload's or the pool's, not this value's: the
                // baseline replay meets it too.
                Err(_) => continue,
            };
            let Some(oom) = &out.first_oom else {
                let fit = FittingSetting {
                    max_split_size_mb: mb,
                    dropped: dropped.to_vec(),
                    conf,
                    peak_reserved_bytes: peak_reserved(&out),
                    num_device_alloc: out.stats.counts.num_device_alloc,
                    num_alloc_retries: out.stats.counts.num_alloc_retries,
                    same_figures_mb: Vec::new(),
                };
                // The first of the same figures stands for the others (the settings alone,
                // else the largest value).
                match found.iter_mut().find(|f| f.figures() == fit.figures()) {
                    Some(alike) => alike.same_figures_mb.extend(mb),
                    None => found.push(fit),
                }
                continue;
            };
            if let (Some(mb), true) = (mb, dropped.is_empty())
                && oom.op_index > first_oom_op
            {
                self.get_further.push(mb);
            }
            let best = self
                .gets_furthest
                .as_ref()
                .map_or(first_oom_op, |g| g.first_oom_op);
            if oom.op_index > best {
                self.gets_furthest = Some(GetsFurther {
                    max_split_size_mb: mb,
                    dropped: dropped.to_vec(),
                    conf,
                    first_oom_op: oom.op_index,
                    first_oom_event_index: oom.event_index(),
                });
            }
        }
        self.fits.extend(found);
        self.fits.sort_by_key(|f| f.peak_reserved_bytes);
    }

    /// Whether standard value `mb` fits with the replay's own settings (listed, or folded into
    /// one listed).
    pub fn value_fits(&self, mb: u64) -> bool {
        self.fits.iter().any(|f| {
            f.dropped.is_empty()
                && (f.max_split_size_mb == Some(mb) || f.same_figures_mb.contains(&mb))
        })
    }
}

/// The search after the replay's first OOM, `first_oom`: `search_max_split_sizes`; then, when
/// no value fits or that OOM was a padding one (the requests fit, their blocks did not) under
/// `roundup_power2_divisions`, the same search without them, and the replay's settings without
/// them alone; when still none fits and the replay set `max_split_size_mb`, its settings
/// without that (and without both); and when still none fits under a memory fraction, the
/// replay without the fraction (`FractionTrial`). Each `conf` found says which settings it has.
pub fn search_after_oom(
    workload: &Workload,
    config: &ReplayConfig,
    start: Option<&StartLayout>,
    first_oom: &OomAt,
) -> MaxSplitSearch {
    let searched = (workload, config, start, first_oom.op_index);
    let mut search = search_max_split_sizes(workload, config, start, first_oom.op_index);
    let padded = matches!(first_oom.report.hint(), OomHint::Padding { .. });
    let divided = config.settings.rounds_by_divisions();
    if divided && (padded || search.fits.is_empty()) {
        search.try_without(searched, &[DIVISIONS], true, true);
        search.also_without_divisions = true;
    }
    if config.settings.has_max_split_size() && search.fits.is_empty() {
        search.try_without(searched, &[MAX_SPLIT], true, false);
        if divided {
            search.try_without(searched, &[DIVISIONS, MAX_SPLIT], true, false);
        }
        search.also_without_max_split = true;
    }
    if search.fits.is_empty() {
        search.fraction = try_without_fraction(workload, config, start);
    }
    search.older_pytorch = try_for_older_pytorch(&search, workload, config, start);
    search
}

/// When `max_split_size_mb:20` is listed as fitting, the same settings with 21 replayed: a
/// user who copies the setting to an older PyTorch's `PYTORCH_CUDA_ALLOC_CONF` must write 21.
fn try_for_older_pytorch(
    search: &MaxSplitSearch,
    workload: &Workload,
    config: &ReplayConfig,
    start: Option<&StartLayout>,
) -> Option<OlderPytorchTrial> {
    let twenty = search
        .fits
        .iter()
        .find(|f| f.max_split_size_mb == Some(OLDER_PYTORCH_REFUSES_MB))?;
    let settings = with_max_split(
        &without(&config.settings, &twenty.dropped),
        OLDER_PYTORCH_SMALLEST_MB,
    );
    let conf = settings_text(&settings);
    let out = replay_under(workload, config, settings, start).ok()?;
    Some(OlderPytorchTrial {
        conf,
        peak_reserved_bytes: peak_reserved(&out),
        first_oom_event_index: out.first_oom.as_ref().map(|o| o.event_index()),
    })
}

/// The replay without its `per_process_memory_fraction` below 1 (`None` when it has none, or
/// the device's total is not known, or the replay fails), and when that fits, a fraction in
/// hundredths that fits too: halving the range between the replay's fraction and 1 while the
/// upper end fits (fitting need not grow with the fraction, so a smaller one may fit too). A
/// fraction the program set as it ran is the one in force: the trials set its calls too.
fn try_without_fraction(
    workload: &Workload,
    config: &ReplayConfig,
    start: Option<&StartLayout>,
) -> Option<FractionTrial> {
    config.total()?;
    let configured = config.settings.per_process_memory_fraction;
    let throughout = workload.fraction_throughout(configured);
    // Changed between requests: the lowest it was set to (no one fraction to search above).
    let fraction =
        throughout.unwrap_or_else(|| workload.memory_fractions().fold(configured, f64::min));
    if fraction >= 1.0 {
        return None;
    }
    let set_by_program = workload.memory_fractions().next().is_some();
    // The program's calls, which no setting overrides, set to the trial's fraction too.
    let mut trial_workload = set_by_program.then(|| workload.clone());
    let mut replay_at = |fraction: f64| {
        let config = ReplayConfig {
            settings: Settings {
                per_process_memory_fraction: fraction,
                ..config.settings.clone()
            },
            ..config.clone()
        };
        let workload = match trial_workload.as_mut() {
            Some(trial) => {
                trial.set_memory_fractions(fraction);
                &*trial
            }
            None => workload,
        };
        let out = replay(workload, &config, start);
        (out, settings_text(&config.settings))
    };
    let (out, conf) = replay_at(1.0);
    let out = out.ok()?;
    let fits = out.first_oom.is_none();
    let mut fits_at = |hundredths: u64| {
        replay_at(hundredths as f64 / 100.0)
            .0
            .is_ok_and(|out| out.first_oom.is_none())
    };
    // The replay's fraction ran out of memory; 100 hundredths is no limit, which fits.
    let (mut low, mut high) = ((fraction * 100.0).floor() as u64, 100);
    let searched = fits && throughout.is_some();
    while searched && high - low > 1 {
        let mid = (low + high) / 2;
        if fits_at(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    let enough = (searched && high < 100).then(|| {
        let f = high as f64 / 100.0;
        let settings = Settings {
            per_process_memory_fraction: f,
            ..config.settings.clone()
        };
        (f, settings_text(&settings))
    });
    Some(FractionTrial {
        fraction,
        set_by_program,
        conf,
        peak_reserved_bytes: peak_reserved(&out),
        fits,
        enough,
    })
}

/// What replaying with expandable segments switched found, for a replay that ran out of memory:
/// on, for one without them (PyTorch's own out-of-memory message suggests them against
/// fragmentation); off, for one with them (they grow by whole pages of 20 MiB, where a native
/// segment is the request rounded to 2 MiB).
#[derive(Clone, Debug, PartialEq)]
pub struct ExpandableTrial {
    /// Whether the trial had expandable segments (the opposite of the replay's setting).
    pub expandable_segments: bool,
    /// The replay's settings with expandable segments switched, as in `FittingSetting::conf`.
    pub conf: String,
    pub peak_reserved_bytes: u64,
    /// Page maps, or cudaMalloc calls without expandable segments.
    pub num_device_alloc: u64,
    /// Its first OOM, counted like `OomAt::event_index`; `None`: it fits.
    pub first_oom_event_index: Option<usize>,
    /// When it runs out of memory too: the same trial without the replay's own padding
    /// settings that fits — without its `roundup_power2_divisions`, else without the
    /// `max_split_size_mb` it set, else without both (`None` when none of those fits, or the
    /// replay set neither).
    pub fits_without: Option<ExpandableFit>,
    /// The settings of the replay the trial switched (what `fits_without` drops from).
    pub settings: Settings,
}

/// The expandable-segments trial without some of the replay's own settings, when it fits so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpandableFit {
    /// The replay's own settings it goes without (`DIVISIONS`, `MAX_SPLIT`), in that order.
    pub dropped: Vec<&'static str>,
    /// Its settings, as in `FittingSetting::conf`.
    pub conf: String,
    pub peak_reserved_bytes: u64,
    /// Page maps, or cudaMalloc calls without expandable segments.
    pub num_device_alloc: u64,
}

/// Replay `workload` with expandable segments switched (other settings as in `config`); `None`
/// when the replay cannot start so (a start state rebuilt from a snapshot of the other kind).
/// When that runs out of memory too, it is tried without the replay's own padding settings
/// (`ExpandableTrial::fits_without`), as the `max_split_size_mb` search is.
pub fn try_expandable_segments(
    workload: &Workload,
    config: &ReplayConfig,
    start: Option<&StartLayout>,
) -> Option<ExpandableTrial> {
    let mut trial = config.clone();
    trial.settings.expandable_segments = !config.settings.expandable_segments;
    let out = replay(workload, &trial, start).ok()?;
    let first_oom_event_index = out.first_oom.as_ref().map(|o| o.event_index());
    let fits_without = if first_oom_event_index.is_some() {
        fit_without_own_settings(workload, &trial, start)
    } else {
        None
    };
    Some(ExpandableTrial {
        expandable_segments: trial.settings.expandable_segments,
        conf: settings_text(&trial.settings),
        peak_reserved_bytes: peak_reserved(&out),
        num_device_alloc: out.stats.counts.num_device_alloc,
        first_oom_event_index,
        fits_without,
        settings: config.settings.clone(),
    })
}

/// The first of `config` without its `roundup_power2_divisions`, without its own
/// `max_split_size_mb`, without both, that replays without an OOM.
fn fit_without_own_settings(
    workload: &Workload,
    config: &ReplayConfig,
    start: Option<&StartLayout>,
) -> Option<ExpandableFit> {
    let divided = config.settings.rounds_by_divisions();
    let split = config.settings.has_max_split_size();
    let drops: [(bool, &[&'static str]); 3] = [
        (divided, &[DIVISIONS]),
        (split, &[MAX_SPLIT]),
        (divided && split, &[DIVISIONS, MAX_SPLIT]),
    ];
    drops
        .into_iter()
        .filter(|(applies, _)| *applies)
        .find_map(|(_, dropped)| {
            let settings = without(&config.settings, dropped);
            let conf = settings_text(&settings);
            let out = replay_under(workload, config, settings, start).ok()?;
            out.first_oom.is_none().then(|| ExpandableFit {
                dropped: dropped.to_vec(),
                conf,
                peak_reserved_bytes: peak_reserved(&out),
                num_device_alloc: out.stats.counts.num_device_alloc,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::pool::StreamId;
    use crate::trace::record::setting_text;
    use crate::trace::synth::{SynthKind, SynthSpec};
    use crate::trace::workload::{AllocId, Op};

    const MIB: u64 = 1 << 20;

    /// The default transformer workload, replayed on a device of `capacity` bytes.
    fn transformer_on(capacity: u64) -> (Workload, ReplayConfig) {
        let workload = SynthSpec::new(SynthKind::Transformer).generate(1).unwrap();
        let config = ReplayConfig {
            capacity: Some(capacity),
            ..ReplayConfig::default()
        };
        (workload, config)
    }

    /// The search after the first OOM of the workload under `config`.
    fn search(workload: &Workload, config: &ReplayConfig) -> MaxSplitSearch {
        let baseline = replay(workload, config, None).unwrap();
        let first_oom = baseline
            .first_oom
            .expect("an out-of-memory to search after");
        search_max_split_sizes(workload, config, None, first_oom.op_index)
    }

    #[test]
    fn finds_max_split_sizes_that_turn_a_fragmentation_oom_into_a_fit() {
        let (workload, config) = transformer_on(5800 << 20);
        let baseline = replay(&workload, &config, None).unwrap();
        assert!(
            baseline.stats.counts.num_ooms > 0,
            "the default settings run out of memory here"
        );
        let fits = search(&workload, &config).fits;
        assert!(!fits.is_empty());
        for fit in &fits {
            // The setting as printed, read back as `--conf` reads it, reproduces the fit.
            let mut trial = config.clone();
            trial.settings = Config::parse_conf_str(&fit.conf).unwrap().settings;
            assert_eq!(
                Some(trial.settings.max_split_size),
                fit.max_split_size_mb.map(|mb| mb << 20)
            );
            let again = replay(&workload, &trial, None).unwrap();
            assert_eq!(
                again.stats.counts.num_ooms, 0,
                "{} was reported as fitting",
                fit.conf
            );
            assert_eq!(
                again.stats.reserved_bytes.all.peak as u64,
                fit.peak_reserved_bytes
            );
        }
        assert!(
            fits.windows(2)
                .all(|w| w[0].peak_reserved_bytes <= w[1].peak_reserved_bytes)
        );
    }

    #[test]
    fn nothing_fits_when_live_memory_exceeds_the_device() {
        let (workload, config) = transformer_on(2 << 30);
        let found = search(&workload, &config);
        assert!(found.fits.is_empty());
        assert_eq!(found.gets_furthest, None, "no value gets past exhaustion");
        assert_eq!(found.get_further, Vec::<u64>::new(), "nor gets further");
        let trial = try_expandable_segments(&workload, &config, None).unwrap();
        assert!(
            trial.first_oom_event_index.is_some(),
            "nor do expandable segments"
        );
    }

    /// The fragmentation OOM of the transformer workload: expandable segments avoid it, with
    /// less reserved memory than the default settings need on an unlimited device.
    #[test]
    fn expandable_segments_are_tried_against_a_fragmentation_oom() {
        let (workload, config) = transformer_on(5800 << 20);
        let trial = try_expandable_segments(&workload, &config, None).unwrap();
        assert_eq!(trial.conf, "expandable_segments:True");
        assert_eq!(trial.first_oom_event_index, None, "{trial:?}");
        let unlimited = replay(&workload, &ReplayConfig::default(), None).unwrap();
        assert!(trial.peak_reserved_bytes < unlimited.stats.reserved_bytes.all.peak as u64);
        let mut on = config.clone();
        on.settings.expandable_segments = true;
        let off = try_expandable_segments(&workload, &on, None).unwrap();
        assert!(!off.expandable_segments);
        assert_eq!(off.conf, "", "the defaults");
    }

    /// Between fitting and exhaustion: no value fits, and the one named as getting furthest
    /// runs out where the search says, later than the default settings, and no other value
    /// gets further.
    #[test]
    fn without_a_fit_the_value_that_gets_furthest_is_named() {
        let (mut workload, config) = transformer_on(4812 << 20);
        // As if converted from a trace whose entries are not one op each: the furthest OOM is
        // then counted in trace entries.
        workload.source_index = (0..workload.ops.len()).map(|i| 2 * i + 5).collect();
        let first = replay(&workload, &config, None).unwrap().first_oom.unwrap();
        let found = search(&workload, &config);
        assert!(found.fits.is_empty());
        let furthest = found
            .gets_furthest
            .expect("a value gets past the first OOM");
        assert!(furthest.first_oom_op > first.op_index);
        for mb in MAX_SPLIT_LADDER_MB {
            let mut trial = config.clone();
            trial.settings.max_split_size = mb << 20;
            let oom = replay(&workload, &trial, None).unwrap().first_oom.unwrap();
            if Some(mb) == furthest.max_split_size_mb {
                assert_eq!(furthest.conf, format!("max_split_size_mb:{mb}"));
                assert_eq!(oom.op_index, furthest.first_oom_op);
                assert_eq!(oom.event_index(), furthest.first_oom_event_index);
                assert_eq!(oom.event_index(), 2 * oom.op_index + 5);
            } else {
                assert!(oom.op_index <= furthest.first_oom_op, "{mb} gets further");
            }
        }
    }

    /// A workload of one op per trace entry: `(Some(size), id)` allocates `id`, `(None, id)`
    /// frees it.
    fn ops(list: &[(Option<u64>, AllocId)]) -> Workload {
        let mut workload = Workload::new("test");
        for (index, &(size, id)) in list.iter().enumerate() {
            let op = match size {
                Some(size) => Op::Alloc {
                    id,
                    size,
                    stream: StreamId(0),
                    recorded_addr: None,
                },
                None => Op::Free { id },
            };
            workload.push(op, index);
        }
        workload
    }

    /// Every standard value is tried, and those that fit with the same figures are listed
    /// once, the largest standing for the others: here any value keeps a cached 1200 MiB block
    /// whole for the 1200 MiB request that needs it, where the default settings cut a 100 MiB
    /// request from it (two segments, 1300 MiB).
    #[test]
    fn standard_values_that_fit_with_the_same_figures_are_listed_once() {
        let workload = ops(&[
            (Some(1200 * MIB), 0),
            (None, 0),
            (Some(100 * MIB), 1),
            (Some(1200 * MIB), 2),
        ]);
        let config = ReplayConfig {
            capacity: Some(2200 * MIB),
            ..ReplayConfig::default()
        };
        let found = search(&workload, &config);
        let [fit] = &found.fits[..] else {
            panic!("one fit listed: {:?}", found.fits);
        };
        assert_eq!(fit.max_split_size_mb, Some(1024));
        assert_eq!(fit.conf, "max_split_size_mb:1024");
        assert_eq!(fit.same_figures_mb, MAX_SPLIT_LADDER_MB[1..].to_vec());
        assert_eq!(fit.figures(), (1300 * MIB, 2, 0), "{fit:?}");
        for mb in MAX_SPLIT_LADDER_MB {
            assert!(found.value_fits(mb), "{mb}");
            let trial = ReplayConfig {
                settings: with_max_split(&config.settings, mb),
                ..config.clone()
            };
            let stats = replay(&workload, &trial, None).unwrap().stats;
            assert_eq!(
                (
                    stats.reserved_bytes.all.peak as u64,
                    stats.counts.num_device_alloc,
                    stats.counts.num_alloc_retries
                ),
                fit.figures(),
                "max_split_size_mb:{mb}"
            );
        }
    }

    /// After a padding OOM without `roundup_power2_divisions` there are none to drop: the
    /// search runs once and does not say it also tried without them. (Two 19.5 MiB requests
    /// fill a 20 MiB block each, the 0.5 MiB rest not split off, on a 40 MiB device: a 0.75 MiB
    /// request then fits the requests' bytes, not their blocks'.)
    #[test]
    fn a_padding_oom_without_divisions_is_searched_once() {
        let workload = ops(&[
            (Some(39 * MIB / 2), 0),
            (Some(39 * MIB / 2), 1),
            (Some(3 * MIB / 4), 2),
        ]);
        let config = ReplayConfig {
            capacity: Some(40 * MIB),
            ..ReplayConfig::default()
        };
        let first = replay(&workload, &config, None).unwrap().first_oom.unwrap();
        assert!(
            matches!(first.report.hint(), OomHint::Padding { .. }),
            "{}",
            first.report
        );
        let found = search_after_oom(&workload, &config, None, &first);
        assert!(!found.also_without_divisions);
        assert_eq!((found.fits, found.gets_furthest), (Vec::new(), None));
        // Under divisions (which round these requests as before) the search also drops them,
        // and no value of either search gets past the first OOM.
        let divided = ReplayConfig {
            settings: Config::parse_conf_str("roundup_power2_divisions:4")
                .unwrap()
                .settings,
            ..config
        };
        let first = replay(&workload, &divided, None)
            .unwrap()
            .first_oom
            .unwrap();
        assert_eq!(first.op_index, 2);
        let found = search_after_oom(&workload, &divided, None, &first);
        assert!(found.also_without_divisions);
        assert_eq!(found.gets_furthest, None);
        assert_eq!(found.get_further, Vec::<u64>::new());
    }

    /// Where no value fits, the values that run out one operation after the first OOM get
    /// past it; of equals the search names the first tried, the largest.
    #[test]
    fn a_value_that_runs_out_one_op_later_gets_further() {
        // The default settings cut the 100 MiB request from the cached 1200 MiB block and run
        // out at the second 1200 MiB request (op 3); every value keeps that block whole, serves
        // the request, and runs out at the 1000 MiB one (op 4), which the default settings serve
        // from the 1100 MiB rest.
        let mut workload = ops(&[
            (Some(1200 * MIB), 0),
            (None, 0),
            (Some(100 * MIB), 1),
            (Some(1200 * MIB), 2),
            (Some(1000 * MIB), 3),
        ]);
        workload.source_index = vec![0, 2, 4, 6, 8];
        let config = ReplayConfig {
            capacity: Some(2200 * MIB),
            ..ReplayConfig::default()
        };
        let first = replay(&workload, &config, None).unwrap().first_oom.unwrap();
        assert_eq!(first.op_index, 3);
        let found = search_after_oom(&workload, &config, None, &first);
        assert!(found.fits.is_empty());
        assert_eq!(found.get_further, MAX_SPLIT_LADDER_MB.to_vec());
        let furthest = found.gets_furthest.unwrap();
        assert_eq!(
            (furthest.max_split_size_mb, furthest.first_oom_op),
            (Some(1024), 4)
        );
        assert_eq!(furthest.first_oom_event_index, 8);
    }

    /// The expandable-segments trial's figures are those of its replay: its peak (above what it
    /// holds at the end, after an `empty_cache()`) and its page maps (more than its unmaps).
    #[test]
    fn the_expandable_trial_reports_its_replays_figures() {
        let mut workload = ops(&[(Some(60 * MIB), 0), (None, 0)]);
        workload.push(Op::EmptyCache, 2);
        workload.push(
            Op::Alloc {
                id: 1,
                size: 20 * MIB,
                stream: StreamId(0),
                recorded_addr: None,
            },
            3,
        );
        let config = ReplayConfig {
            capacity: Some(100 * MIB),
            ..ReplayConfig::default()
        };
        let trial = try_expandable_segments(&workload, &config, None).unwrap();
        let mut on = config.clone();
        on.settings.expandable_segments = true;
        let stats = replay(&workload, &on, None).unwrap().stats;
        let reserved = stats.reserved_bytes.all;
        assert!(reserved.peak > reserved.current, "{reserved:?}");
        let counts = stats.counts;
        assert!(
            counts.num_device_alloc > counts.num_device_free,
            "{counts:?}"
        );
        assert_eq!(
            (trial.peak_reserved_bytes, trial.num_device_alloc),
            (reserved.peak as u64, counts.num_device_alloc)
        );
        assert_eq!(trial.first_oom_event_index, None);
    }

    /// The expandable-segments trial counts its OOM as a user does: in trace entries, when the
    /// workload came from a trace.
    #[test]
    fn the_expandable_trial_counts_its_oom_in_trace_entries() {
        let mut workload = Workload::new("test");
        for (id, index) in [(0, 10), (1, 12)] {
            let op = Op::Alloc {
                id,
                size: 60 * MIB,
                stream: StreamId(0),
                recorded_addr: None,
            };
            workload.push(op, index);
        }
        let config = ReplayConfig {
            capacity: Some(100 * MIB),
            ..ReplayConfig::default()
        };
        let trial = try_expandable_segments(&workload, &config, None).unwrap();
        assert_eq!(trial.first_oom_event_index, Some(12));
    }

    /// On the demo's fragmentation OOM the report's suggestion is one of the values that fit
    /// (the request's size, 765 MiB, which an earlier rule named, does not fit here).
    #[test]
    fn the_reports_suggestion_fits_on_the_demo_workload() {
        let (workload, config) = transformer_on(5800 << 20);
        let oom = replay(&workload, &config, None).unwrap().first_oom;
        let report = oom
            .expect("the default settings run out of memory here")
            .report;
        let mb = report
            .suggested_max_split_size_mb()
            .expect("a fragmentation OOM suggests a value");
        assert!(
            MAX_SPLIT_LADDER_MB.contains(&mb),
            "{mb} is not a standard value"
        );
        let fits = search(&workload, &config).fits;
        assert!(
            search(&workload, &config).value_fits(mb),
            "max_split_size_mb:{mb} does not fit: {fits:?}"
        );
        let mut at_request = config.clone();
        at_request.settings.max_split_size = report.rounded / MIB * MIB;
        assert!(
            replay(&workload, &at_request, None)
                .unwrap()
                .stats
                .counts
                .num_ooms
                > 0
        );
    }

    /// With other settings in force, each value's `conf` carries them too: pasted as `--conf`
    /// it replays the same run (the search keeps them; `--conf` replaces all settings).
    #[test]
    fn a_fitting_conf_keeps_the_other_settings() {
        let (workload, mut config) = transformer_on(6000 << 20);
        config.settings = Config::parse_conf_str("roundup_power2_divisions:4")
            .unwrap()
            .settings;
        let baseline = replay(&workload, &config, None).unwrap();
        let Some(first_oom) = baseline.first_oom else {
            panic!("expected an out-of-memory under roundup_power2_divisions:4");
        };
        let found = search_max_split_sizes(&workload, &config, None, first_oom.op_index);
        assert!(!found.fits.is_empty() && found.cannot_start.is_empty());
        for fit in &found.fits {
            assert!(
                fit.conf.contains("roundup_power2_divisions:4"),
                "{}",
                fit.conf
            );
            let trial = ReplayConfig {
                settings: Config::parse_conf_str(&fit.conf).unwrap().settings,
                ..config.clone()
            };
            let again = replay(&workload, &trial, None).unwrap();
            assert_eq!(again.stats.counts.num_ooms, 0, "{}", fit.conf);
            assert_eq!(
                again.stats.reserved_bytes.all.peak as u64,
                fit.peak_reserved_bytes
            );
            let mb = fit.max_split_size_mb.unwrap();
            assert_eq!(max_split_conf(&config.settings, mb), fit.conf);
            // What the report's suggestion is given as, were it this value.
            assert_eq!(found.conf_for(mb), fit.conf);
        }
    }

    /// `config` with the settings `conf` says.
    fn with_conf(config: &ReplayConfig, conf: &str) -> ReplayConfig {
        ReplayConfig {
            settings: Config::parse_conf_str(conf).unwrap().settings,
            ..config.clone()
        }
    }

    /// Whether `workload` replays without an OOM under `config` with the settings `conf`.
    fn fits_under(workload: &Workload, config: &ReplayConfig, conf: &str) -> bool {
        let out = replay(workload, &with_conf(config, conf), None).unwrap();
        out.stats.counts.num_ooms == 0
    }

    /// The search after the first OOM, as the CLI makes it.
    fn after_oom(workload: &Workload, config: &ReplayConfig) -> MaxSplitSearch {
        let first = replay(workload, config, None).unwrap().first_oom.unwrap();
        search_after_oom(workload, config, None, &first)
    }

    /// A fragmentation OOM under `roundup_power2_divisions:4` that no value fixes with them:
    /// without them values fit, and the search finds those (each saying it drops them), not
    /// only after a padding OOM.
    #[test]
    fn without_a_fit_the_search_drops_the_replays_divisions() {
        let (workload, config) = transformer_on(5734 << 20);
        let config = with_conf(&config, "roundup_power2_divisions:4");
        let first = replay(&workload, &config, None).unwrap().first_oom.unwrap();
        assert!(
            matches!(first.report.hint(), OomHint::Fragmentation { .. }),
            "{}",
            first.report
        );
        assert!(search(&workload, &config).fits.is_empty(), "none with them");
        let found = search_after_oom(&workload, &config, None, &first);
        assert!(found.also_without_divisions);
        assert!(!found.fits.is_empty());
        for fit in &found.fits {
            assert_eq!(fit.dropped, vec![DIVISIONS], "{fit:?}");
            assert!(!fit.conf.contains(DIVISIONS), "{}", fit.conf);
            assert!(fits_under(&workload, &config, &fit.conf), "{}", fit.conf);
        }
    }

    /// The expandable-segments trial under `roundup_power2_divisions:4` runs out of memory;
    /// without the divisions it fits, and the trial says so (a replay that set neither finds
    /// nothing to drop).
    #[test]
    fn the_expandable_trial_drops_the_replays_divisions_when_they_stand_in_the_way() {
        let (workload, plain) = transformer_on(5734 << 20);
        let config = with_conf(&plain, "roundup_power2_divisions:4");
        let trial = try_expandable_segments(&workload, &config, None).unwrap();
        assert!(trial.first_oom_event_index.is_some(), "{trial:?}");
        let fit = trial.fits_without.expect("a fit without the divisions");
        assert_eq!(fit.dropped, vec![DIVISIONS]);
        assert_eq!(fit.conf, "expandable_segments:True");
        assert!(fits_under(&workload, &config, &fit.conf));
        assert!(
            !fits_under(&workload, &config, &trial.conf),
            "{}",
            trial.conf
        );

        // Without settings of its own to drop, an OOM under expandable segments stays one.
        let (workload, small) = transformer_on(4 << 30);
        let trial = try_expandable_segments(&workload, &small, None).unwrap();
        assert!(trial.first_oom_event_index.is_some(), "{trial:?}");
        assert_eq!(trial.fits_without, None);
    }

    /// The replay's own `max_split_size_mb` stands in the way: under it and under every
    /// standard value a 2000 MiB request takes a cached 2010 MiB block whole, and a 5 MiB one
    /// then needs a segment the device does not have; without any, the 2000 MiB request is cut
    /// from the block and the 5 MiB one served from its rest. The search says to drop it.
    #[test]
    fn without_a_fit_the_search_drops_the_replays_max_split_size() {
        let workload = ops(&[
            (Some(2010 * MIB), 0),
            (None, 0),
            (Some(2000 * MIB), 1),
            (Some(5 * MIB), 2),
        ]);
        let config = ReplayConfig {
            capacity: Some(2012 * MIB),
            ..ReplayConfig::default()
        };
        assert!(fits_under(&workload, &config, ""));
        let config = with_conf(&config, "max_split_size_mb:2000");
        let found = after_oom(&workload, &config);
        assert!(found.also_without_max_split && !found.also_without_divisions);
        let [fit] = &found.fits[..] else {
            panic!("one fit: {:?}", found.fits);
        };
        assert_eq!(
            (fit.max_split_size_mb, &fit.dropped[..], &fit.conf[..]),
            (None, &[MAX_SPLIT][..], "")
        );
        assert_eq!(found.fraction, None);
        assert_eq!(
            setting_text(&config.settings, MAX_SPLIT).as_deref(),
            Some("max_split_size_mb:2000")
        );
    }

    /// Where every value fits only without the replay's divisions, and just as the settings
    /// without them do alone, the one fit listed is those settings: the values are folded in.
    #[test]
    fn values_that_change_nothing_fold_into_the_settings_without_divisions() {
        let workload = "loguniform:ops=50000,min=512,max=1048576,budget_gib=1"
            .parse::<SynthSpec>()
            .unwrap()
            .generate(0)
            .unwrap();
        let config = ReplayConfig {
            capacity: Some(1150 * MIB),
            ..ReplayConfig::default()
        };
        assert!(fits_under(&workload, &config, ""), "the defaults fit");
        let config = with_conf(&config, "roundup_power2_divisions:2");
        let found = after_oom(&workload, &config);
        let [fit] = &found.fits[..] else {
            panic!("one fit: {:?}", found.fits);
        };
        assert_eq!(
            (fit.max_split_size_mb, &fit.dropped[..], &fit.conf[..]),
            (None, &[DIVISIONS][..], "")
        );
        assert_eq!(fit.same_figures_mb, MAX_SPLIT_LADDER_MB.to_vec());
        assert!(!found.value_fits(1024), "no value fits with the divisions");
    }

    /// Under a memory fraction that binds, where the device would hold the run: the search
    /// tries the replay without it, and names a fraction that fits, both replayed.
    #[test]
    fn without_a_fit_the_search_tries_without_the_memory_fraction() {
        let (workload, mut config) = transformer_on(8 << 30);
        config.device_total = Some(8 << 30);
        let config = with_conf(&config, "per_process_memory_fraction:0.6");
        let found = after_oom(&workload, &config);
        assert!(found.fits.is_empty());
        let trial = found.fraction.expect("tried without the fraction");
        assert_eq!(
            (trial.fraction, trial.fits, &trial.conf[..]),
            (0.6, true, "")
        );
        assert!(fits_under(&workload, &config, ""));
        let (fraction, conf) = trial.enough.expect("a fraction that fits");
        assert!(fraction > 0.6 && fraction < 1.0, "{fraction}");
        assert_eq!(conf, format!("per_process_memory_fraction:{fraction}"));
        assert!(fits_under(&workload, &config, &conf));
        // Without a fraction there is none to drop.
        let workload = ops(&[(Some(60 * MIB), 0), (Some(60 * MIB), 1)]);
        let config = ReplayConfig {
            capacity: Some(100 * MIB),
            ..ReplayConfig::default()
        };
        assert_eq!(after_oom(&workload, &config).fraction, None);
    }
}
