//! Settings that fit: when a replay runs out of memory, replay the same workload under other
//! `max_split_size_mb` values and report the ones that avoid every OOM. The suggestion is then a
//! measured fact about this workload on this device, not a rule of thumb.

use super::replay::{ReplayConfig, StartLayout, replay};
use super::workload::Workload;

/// `max_split_size_mb` values tried, largest first (20 is PyTorch's minimum).
pub const MAX_SPLIT_CANDIDATES_MB: [u64; 8] = [1024, 512, 256, 128, 64, 48, 32, 20];

/// One setting that replays without an OOM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FittingSetting {
    /// In `CACHEALLOC_CONF` syntax, e.g. `max_split_size_mb:128`.
    pub conf: String,
    pub peak_reserved_bytes: u64,
    pub num_device_alloc: u64,
    pub num_alloc_retries: u64,
}

/// The values tried, in order: the standard candidates, then `also_try` when it is not one of
/// them.
pub fn candidates_mb(also_try: Option<u64>) -> impl Iterator<Item = u64> {
    let extra = also_try.filter(|mb| !MAX_SPLIT_CANDIDATES_MB.contains(mb));
    MAX_SPLIT_CANDIDATES_MB.into_iter().chain(extra)
}

/// The setting `max_split_size_mb:MB` in `CACHEALLOC_CONF` syntax.
pub fn max_split_conf(mb: u64) -> String {
    format!("max_split_size_mb:{mb}")
}

/// The `max_split_size_mb` values (other settings as in `config`) under which `workload`
/// replays without any OOM, ordered by peak reserved memory: the standard candidates, and
/// `also_try` (the out-of-memory report's own suggestion) when it is not one of them.
/// Candidates that cannot even start (a start state that cannot exist under them) are skipped.
pub fn fitting_max_split_sizes(
    workload: &Workload,
    config: &ReplayConfig,
    start: Option<&StartLayout>,
    also_try: Option<u64>,
) -> Vec<FittingSetting> {
    let mut found: Vec<FittingSetting> = candidates_mb(also_try)
        .filter_map(|mb| {
            let mut trial = config.clone();
            trial.settings.max_split_size = mb << 20;
            let out = replay(workload, &trial, start).ok()?;
            (out.stats.num_ooms == 0).then(|| FittingSetting {
                conf: max_split_conf(mb),
                peak_reserved_bytes: out.stats.reserved_bytes.all.peak.max(0) as u64,
                num_device_alloc: out.stats.num_device_alloc,
                num_alloc_retries: out.stats.num_alloc_retries,
            })
        })
        .collect();
    found.sort_by_key(|f| f.peak_reserved_bytes);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::synth::{SynthKind, SynthSpec};

    /// The default transformer workload, replayed on a device of `capacity` bytes.
    fn transformer_on(capacity: u64) -> (Workload, ReplayConfig) {
        let workload = SynthSpec::new(SynthKind::Transformer).generate(1).unwrap();
        let config = ReplayConfig {
            capacity: Some(capacity),
            ..ReplayConfig::default()
        };
        (workload, config)
    }

    #[test]
    fn finds_max_split_sizes_that_turn_a_fragmentation_oom_into_a_fit() {
        let (workload, config) = transformer_on(5800 << 20);
        let baseline = replay(&workload, &config, None).unwrap();
        assert!(
            baseline.stats.num_ooms > 0,
            "the default settings run out of memory here"
        );
        let fits = fitting_max_split_sizes(&workload, &config, None, None);
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
                again.stats.num_ooms, 0,
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
        assert!(fitting_max_split_sizes(&workload, &config, None, None).is_empty());
    }

    /// The report's own suggestion is replayed too, and listed only if it fits.
    #[test]
    fn the_reports_suggestion_is_tried_as_well() {
        let (workload, config) = transformer_on(5800 << 20);
        let listed =
            |fits: &[FittingSetting], mb: u64| fits.iter().any(|f| f.conf == max_split_conf(mb));
        // 200 MiB is not a standard candidate and fits here; 765 MiB does not fit.
        let fits = fitting_max_split_sizes(&workload, &config, None, Some(200));
        assert!(listed(&fits, 200), "200 fits and is listed");
        let fits = fitting_max_split_sizes(&workload, &config, None, Some(765));
        assert!(!listed(&fits, 765), "765 still runs out of memory");
        assert_eq!(
            fits,
            fitting_max_split_sizes(&workload, &config, None, None)
        );
    }
}
