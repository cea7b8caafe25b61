//! Settings that fit: when a replay runs out of memory, replay the same workload under other
//! `max_split_size_mb` values and report the ones that avoid every OOM — or, when none does, the
//! one that gets furthest past the first. The suggestion is then a measured fact about this
//! workload on this device, not a rule of thumb. The values tried are
//! the standard ones the OOM report picks its suggestion from, so the report's value is always
//! among them.

use super::replay::{ReplayConfig, StartLayout, replay};
use super::workload::Workload;
pub use crate::pool::oom::MAX_SPLIT_LADDER_MB;

/// One setting that replays without an OOM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FittingSetting {
    /// In `CACHEALLOC_CONF` syntax, e.g. `max_split_size_mb:128`.
    pub conf: String,
    pub peak_reserved_bytes: u64,
    pub num_device_alloc: u64,
    pub num_alloc_retries: u64,
}

/// The setting `max_split_size_mb:MB` in `CACHEALLOC_CONF` syntax.
pub fn max_split_conf(mb: u64) -> String {
    format!("max_split_size_mb:{mb}")
}

/// A setting that gets past the first OOM of the replay it was tried for, but runs out of
/// memory later.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetsFurther {
    pub conf: String,
    /// Its own first OOM: the workload's op index.
    pub first_oom_op: usize,
    /// The same place as a user counts it (`OomAt::event_index`).
    pub first_oom_event_index: usize,
}

/// What replaying under the standard `max_split_size_mb` values found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaxSplitSearch {
    /// The values that replay without any OOM, by peak reserved memory.
    pub fits: Vec<FittingSetting>,
    /// Of the others, the one whose first OOM comes latest, if later than the replay's own.
    pub gets_furthest: Option<GetsFurther>,
}

/// Replay `workload` under each standard `max_split_size_mb` value (other settings as in
/// `config`). `first_oom_op` is the op of the first OOM under `config` itself. Values under
/// which the replay cannot even start (a start state that cannot exist under them) are
/// skipped.
pub fn search_max_split_sizes(
    workload: &Workload,
    config: &ReplayConfig,
    start: Option<&StartLayout>,
    first_oom_op: usize,
) -> MaxSplitSearch {
    let mut fits = Vec::new();
    let mut gets_furthest: Option<GetsFurther> = None;
    for mb in MAX_SPLIT_LADDER_MB {
        let mut trial = config.clone();
        trial.settings.max_split_size = mb << 20;
        let Ok(out) = replay(workload, &trial, start) else {
            continue;
        };
        match &out.first_oom {
            None => fits.push(FittingSetting {
                conf: max_split_conf(mb),
                peak_reserved_bytes: out.stats.reserved_bytes.all.peak.max(0) as u64,
                num_device_alloc: out.stats.counts.num_device_alloc,
                num_alloc_retries: out.stats.counts.num_alloc_retries,
            }),
            Some(oom) => {
                let best = gets_furthest
                    .as_ref()
                    .map_or(first_oom_op, |g| g.first_oom_op);
                if oom.op_index > best {
                    gets_furthest = Some(GetsFurther {
                        conf: max_split_conf(mb),
                        first_oom_op: oom.op_index,
                        first_oom_event_index: oom.event_index(),
                    });
                }
            }
        }
    }
    fits.sort_by_key(|f| f.peak_reserved_bytes);
    MaxSplitSearch {
        fits,
        gets_furthest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{SynthKind, SynthSpec};

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
            let mb: u64 = fit
                .conf
                .trim_start_matches("max_split_size_mb:")
                .parse()
                .unwrap();
            let mut trial = config.clone();
            trial.settings.max_split_size = mb << 20;
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
    }

    /// Between fitting and exhaustion: no value fits, and the one named as getting furthest
    /// runs out where the search says, later than the default settings, and no other value
    /// gets further.
    #[test]
    fn without_a_fit_the_value_that_gets_furthest_is_named() {
        let (workload, config) = transformer_on(4812 << 20);
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
            if max_split_conf(mb) == furthest.conf {
                assert_eq!(oom.op_index, furthest.first_oom_op);
                assert_eq!(oom.event_index(), furthest.first_oom_event_index);
            } else {
                assert!(oom.op_index <= furthest.first_oom_op, "{mb} gets further");
            }
        }
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
            fits.iter().any(|f| f.conf == max_split_conf(mb)),
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
}
