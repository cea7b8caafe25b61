//! The device capacity a recording implies (replay-parity reference §3).
//!
//! - With an `oom` entry: capacity = bytes reserved at the OOM + the `device_free` it reports.
//!   That is what cudaMalloc could still have had; a replay given this capacity fails the same
//!   request, runs the same release and retry, and raises the OOM at the same entry.
//! - Without one, the recorded cudaMalloc calls bracket it: every one that succeeded fitted,
//!   so capacity ≥ the recorded peak reserved (`low`); every malloc-release burst followed by a
//!   `segment_alloc` marks a cudaMalloc of that segment's size that failed at the reserved level
//!   before the burst, so capacity < that level + the size (`high`, the smallest such value).
//!   With no failure seen there is no upper bound and no capacity to impose.
//! - Under `per_process_memory_fraction` f below 1 the pool may reserve f of the device's
//!   memory: the recorded cudaMallocs bound that limit, not the device (the limit refuses a
//!   segment before the device would), so the bracket is theirs divided by f. An `oom` entry's
//!   `device_free` is the device's, so its capacity stands as it is.
//!   With expandable segments the limit weighs the segment a request would get without them
//!   (`rounding::segment_size`, from the `alloc` after the pages), not the pages then mapped,
//!   which may pass the limit by less than a page: the bounds are the reserved level before
//!   the pages plus that segment.
//! - With garbage collection on too (`garbage_collection_threshold` g and a fraction), the pool
//!   releases cached segments before asking for a new one whenever more than g of the limit is
//!   reserved: such a burst before a new segment marks no failed cudaMalloc. A burst bounds the
//!   capacity only where no collection can have run: at most g × the limit's lower bound
//!   reserved before it.

use super::bursts::{BurstKind, release_bursts};
use super::figures::reserved_before_each;
use super::recording::{Action, DeviceRecording};
use crate::pool::rounding::{round_size, segment_size};
use crate::pool::{PoolKind, Settings, page_size};

/// Segment-size granularity used to pick a capacity inside a bracket.
const CAPACITY_STEP: u64 = 2 << 20; // 2 MiB

/// What the recording says about the device's capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapacityEstimate {
    /// From the `oom` entry at `oom_index`: reserved there + `device_free`.
    Exact { bytes: u64, oom_index: usize },
    /// Capacity in `[low, high)`: `low` = recorded peak reserved, `high` = the smallest
    /// reserved level + segment size whose cudaMalloc failed (under a memory fraction, the
    /// bounds of its limit over the fraction).
    Bracket { low: u64, high: u64 },
}

impl CapacityEstimate {
    /// True unless the bracket is empty (the recorded successes and failures contradict one
    /// fixed capacity, e.g. another process took memory in between).
    pub fn is_consistent(&self) -> bool {
        match *self {
            CapacityEstimate::Exact { .. } => true,
            CapacityEstimate::Bracket { low, high } => low < high,
        }
    }

    /// A capacity to replay with: the exact value, or the middle of the bracket rounded down to
    /// 2 MiB (never below `low`); `None` for an empty bracket.
    pub fn replay_capacity(&self) -> Option<u64> {
        match *self {
            CapacityEstimate::Exact { bytes, .. } => Some(bytes),
            CapacityEstimate::Bracket { low, high } if low < high => {
                let mid = low + (high - low) / 2;
                Some((mid / CAPACITY_STEP * CAPACITY_STEP).max(low))
            }
            CapacityEstimate::Bracket { .. } => None,
        }
    }

    /// The most the capacity can be: the exact value, or the bracket's `high`; `None` for an
    /// empty bracket.
    pub fn most(&self) -> Option<u64> {
        match *self {
            CapacityEstimate::Exact { bytes, .. } => Some(bytes),
            CapacityEstimate::Bracket { low, high } => (low < high).then_some(high),
        }
    }
}

impl DeviceRecording {
    /// Infer the device capacity; `None` when the trace shows no failed cudaMalloc.
    pub fn capacity(&self) -> Option<CapacityEstimate> {
        let reserved = reserved_before_each(self);
        if let Some((index, entry)) = self
            .entries
            .iter()
            .enumerate()
            .find(|(_, e)| e.action == Action::Oom)
        {
            return Some(CapacityEstimate::Exact {
                bytes: reserved[index].saturating_add(entry.device_free.unwrap_or(0)),
                oom_index: index,
            });
        }
        let peak = reserved.iter().copied().max().unwrap_or(0);
        let settings = self.replay_settings();
        let fraction = settings.per_process_memory_fraction;
        if fraction >= 1.0 {
            let high = self
                .failed_growths(&reserved, None)
                .filter_map(|(before, at)| Some(before.saturating_add(self.entries.get(at)?.size)))
                .min()?;
            return Some(CapacityEstimate::Bracket { low: peak, high });
        }
        // The limit: every growth it let through fitted (with expandable segments the pages
        // then mapped may pass it by less than a page), every one it refused did not.
        let weighed = |at: usize| self.weighed_by_limit(at, &settings);
        let overshoot = if self.is_expandable() {
            page_size(PoolKind::Large) - 1
        } else {
            0
        };
        let growths = (0..self.entries.len()).filter(|&at| {
            let action = |at: usize| self.entries[at].action;
            action(at) == Action::SegmentAlloc
                || (action(at) == Action::SegmentMap
                    && (at == 0 || action(at - 1) != Action::SegmentMap))
        });
        let low = growths
            .filter_map(|at| Some(reserved[at].saturating_add(weighed(at)?)))
            .fold(peak.saturating_sub(overshoot), u64::max);
        // Above this many bytes reserved, a collection may have run before a new segment.
        let collected_above = settings
            .collects_garbage()
            .then_some((settings.garbage_collection_threshold * low as f64) as u64);
        let high = self
            .failed_growths(&reserved, collected_above)
            .filter_map(|(before, at)| Some(before.saturating_add(weighed(at)?)))
            .min()?;
        // The limit is `fraction` of the device's memory, rounded down.
        let device = |limit: u64| (limit as f64 / fraction).ceil() as u64;
        Some(CapacityEstimate::Bracket {
            low: device(low),
            high: device(high),
        })
    }

    /// The growths (a `segment_alloc`, or the first `segment_map` of a request) that follow a
    /// release inside `malloc`, where no collection can have run (at most `collected_above`
    /// bytes reserved before it, when collections run): the bytes reserved before the release
    /// and the growth's index. The first request for memory failed there. A release that
    /// follows another of the same request, with only completions of frees between them (the
    /// retry's synchronization, after the oversize release), began with the first.
    fn failed_growths<'a>(
        &'a self,
        reserved: &'a [u64],
        collected_above: Option<u64>,
    ) -> impl Iterator<Item = (u64, usize)> + 'a {
        let bursts = release_bursts(&self.entries);
        let mut began = Vec::with_capacity(bursts.len());
        for (i, b) in bursts.iter().enumerate() {
            let continues = i > 0 && {
                let before = &bursts[i - 1];
                before.kind == BurstKind::MallocRelease
                    && self.entries[before.end..b.start]
                        .iter()
                        .all(|e| e.action == Action::FreeCompleted)
            };
            began.push(if continues { began[i - 1] } else { b.start });
        }
        bursts
            .into_iter()
            .zip(began)
            .filter(move |&(_, start)| collected_above.is_none_or(|above| reserved[start] <= above))
            .filter(|(b, _)| b.precedes_new_memory(&self.entries))
            .map(|(b, start)| (reserved[start], b.end))
    }

    /// The bytes the fraction's limit weighed for the growth at entry `at`: a new segment's
    /// size; for pages of expandable segments, the segment the request would get without them
    /// (from the `alloc` after them, whose size is the request's), not the pages mapped.
    /// `None` where no `alloc` follows the pages.
    fn weighed_by_limit(&self, at: usize, settings: &Settings) -> Option<u64> {
        let growth = &self.entries[at];
        if growth.action == Action::SegmentAlloc {
            return Some(growth.size);
        }
        let request = self.entries[at..]
            .iter()
            .find(|e| e.action != Action::SegmentMap)
            .filter(|e| e.action == Action::Alloc)?;
        Some(segment_size(round_size(settings, request.size)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::fixtures::{BASE, MIB, at, entry, oom, recording, segment};
    use crate::trace::recording::{CallSite, RecordedSegment, RecordedSettings};

    #[test]
    fn oom_gives_reserved_plus_device_free() {
        let rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                oom(40 * MIB, 7 * MIB),
            ],
            vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
        );
        assert_eq!(
            rec.capacity(),
            Some(CapacityEstimate::Exact {
                bytes: 27 * MIB,
                oom_index: 1
            })
        );
    }

    #[test]
    fn a_retried_cudamalloc_brackets_the_capacity() {
        // 20 MiB reserved; a 40 MiB cudaMalloc failed, the 20 MiB segment was released and the
        // retry succeeded: capacity in [40, 60) MiB.
        let rec = retried_under(Settings::default());
        let estimate = rec.capacity().unwrap();
        assert_eq!(
            estimate,
            CapacityEstimate::Bracket {
                low: 40 * MIB,
                high: 60 * MIB
            }
        );
        assert_eq!(estimate.replay_capacity(), Some(50 * MIB));
        assert_eq!(rec.figures().recorded_retries, 1);
    }

    /// Two retries: each failed cudaMalloc bounds the capacity, and the lower bound holds.
    /// Capacity 50 MiB: with 40 MiB reserved a 30 MiB cudaMalloc failed (< 70 MiB), later with
    /// 40 MiB reserved a 20 MiB one (< 60 MiB); 50 MiB were reserved at the end.
    #[test]
    fn the_lowest_failed_cudamalloc_bounds_the_capacity() {
        let rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                entry(Action::SegmentAlloc, BASE + 32 * MIB, 20 * MIB),
                at(Action::SegmentFree, BASE, 20 * MIB, CallSite::Malloc),
                at(
                    Action::SegmentFree,
                    BASE + 32 * MIB,
                    20 * MIB,
                    CallSite::Malloc,
                ),
                entry(Action::SegmentAlloc, BASE + 64 * MIB, 30 * MIB),
                entry(Action::SegmentAlloc, BASE + 100 * MIB, 10 * MIB),
                at(
                    Action::SegmentFree,
                    BASE + 100 * MIB,
                    10 * MIB,
                    CallSite::Malloc,
                ),
                entry(Action::SegmentAlloc, BASE + 128 * MIB, 20 * MIB),
            ],
            vec![
                segment(BASE + 64 * MIB, 30 * MIB, &[(0, 30 * MIB, 0, false)]),
                segment(BASE + 128 * MIB, 20 * MIB, &[(0, 20 * MIB, 0, false)]),
            ],
        );
        assert_eq!(
            rec.capacity(),
            Some(CapacityEstimate::Bracket {
                low: 50 * MIB,
                high: 60 * MIB
            })
        );
    }

    /// The lower bound is the highest level reserved anywhere in the trace, not what is left
    /// at its end; an `empty_cache()` call before a new segment bounds nothing.
    #[test]
    fn the_peak_not_the_end_bounds_the_capacity_from_below() {
        let rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                at(Action::SegmentFree, BASE, 20 * MIB, CallSite::Malloc),
                entry(Action::SegmentAlloc, BASE + 64 * MIB, 40 * MIB),
                at(
                    Action::SegmentFree,
                    BASE + 64 * MIB,
                    40 * MIB,
                    CallSite::EmptyCache,
                ),
                entry(Action::SegmentAlloc, BASE + 128 * MIB, 2 * MIB),
            ],
            vec![segment(
                BASE + 128 * MIB,
                2 * MIB,
                &[(0, 2 * MIB, 0, false)],
            )],
        );
        assert_eq!(
            rec.capacity(),
            Some(CapacityEstimate::Bracket {
                low: 40 * MIB,
                high: 60 * MIB
            })
        );
        let only_empty_cache = recording(rec.entries[2..].to_vec(), rec.segments.clone());
        assert_eq!(only_empty_cache.capacity(), None);
    }

    /// Of several `oom` entries, the first gives the capacity: the replay fails there first.
    #[test]
    fn the_first_oom_gives_the_capacity() {
        let rec = recording(
            vec![
                oom(40 * MIB, 7 * MIB),
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                oom(40 * MIB, 3 * MIB),
            ],
            vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
        );
        assert_eq!(
            rec.capacity(),
            Some(CapacityEstimate::Exact {
                bytes: 7 * MIB,
                oom_index: 0
            })
        );
    }

    /// A bracket narrower than the 2 MiB step replays at its low end, never below it (below,
    /// the recorded peak would not fit).
    #[test]
    fn a_narrow_bracket_replays_at_its_low_end() {
        let narrow = CapacityEstimate::Bracket {
            low: 41 * MIB,
            high: 42 * MIB,
        };
        assert_eq!(narrow.replay_capacity(), Some(41 * MIB));
    }

    /// A 20 MiB segment released for a 40 MiB cudaMalloc that then succeeded, recorded under
    /// `settings`.
    fn retried_under(settings: Settings) -> DeviceRecording {
        let mut rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                at(Action::SegmentFree, BASE, 20 * MIB, CallSite::Malloc),
                entry(Action::SegmentAlloc, BASE + 64 * MIB, 40 * MIB),
            ],
            vec![segment(
                BASE + 64 * MIB,
                40 * MIB,
                &[(0, 40 * MIB, 0, false)],
            )],
        );
        rec.settings = Some(RecordedSettings::assumed(&settings));
        rec
    }

    /// Under `max_split_size` a request's oversize release that frees too little is followed
    /// by the retry's release; frees that waited for other streams, completed by the retry's
    /// synchronization, come between the two and split them. The cudaMalloc failed before the
    /// first: 140 MiB reserved, a 60 MiB one failed (capacity below 200 MiB), not 90 MiB
    /// (below 150). The device has 160.
    #[test]
    fn a_release_split_by_completions_bounds_the_capacity_from_its_start() {
        let malloc = |action, addr, size| at(action, addr, size, CallSite::Malloc);
        let (a, b, x, c) = (BASE, BASE + 64 * MIB, BASE + 160 * MIB, BASE + 192 * MIB);
        let mut rec = recording(
            vec![
                malloc(Action::SegmentAlloc, a, 50 * MIB),
                malloc(Action::SegmentAlloc, b, 70 * MIB),
                malloc(Action::SegmentAlloc, x, 20 * MIB),
                // A 60 MiB request: the cached 50 MiB oversize segment is released, too little.
                malloc(Action::SegmentFree, a, 50 * MIB),
                malloc(Action::FreeCompleted, x, 20 * MIB),
                malloc(Action::SegmentFree, x, 20 * MIB),
                malloc(Action::SegmentAlloc, c, 60 * MIB),
            ],
            vec![
                segment(b, 70 * MIB, &[(0, 70 * MIB, 70 * MIB, true)]),
                segment(c, 60 * MIB, &[(0, 60 * MIB, 0, false)]),
            ],
        );
        let settings = crate::config::Config::parse_pytorch_conf("max_split_size_mb:40")
            .unwrap()
            .settings;
        rec.settings = Some(RecordedSettings::assumed(&settings));
        assert_eq!(
            rec.capacity(),
            Some(CapacityEstimate::Bracket {
                low: 140 * MIB,
                high: 200 * MIB
            })
        );
    }

    /// Under a memory fraction the failed cudaMalloc met the limit, half the device: the
    /// device's capacity is in [80, 120) MiB, not the limit's [40, 60).
    #[test]
    fn under_a_memory_fraction_the_bracket_is_the_limits_over_the_fraction() {
        let half = Settings {
            per_process_memory_fraction: 0.5,
            ..Settings::default()
        };
        assert_eq!(
            retried_under(half).capacity(),
            Some(CapacityEstimate::Bracket {
                low: 80 * MIB,
                high: 120 * MIB
            })
        );
    }

    /// With garbage collection on, a release before a new segment bounds the capacity only
    /// where no collection can have run: 20 MiB reserved before it, at most 0.6 of the 40 MiB
    /// peak, is below any threshold; 40 MiB reserved before a release is not, and the release
    /// may be the collector's, with no failed cudaMalloc (no bound: no capacity).
    #[test]
    fn a_release_that_may_be_a_collection_bounds_nothing() {
        let collecting = Settings {
            per_process_memory_fraction: 0.5,
            garbage_collection_threshold: 0.6,
            ..Settings::default()
        };
        assert_eq!(
            retried_under(collecting.clone()).capacity(),
            Some(CapacityEstimate::Bracket {
                low: 80 * MIB,
                high: 120 * MIB
            })
        );
        let mut rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                entry(Action::SegmentAlloc, BASE + 32 * MIB, 20 * MIB),
                at(Action::SegmentFree, BASE, 20 * MIB, CallSite::Malloc),
                entry(Action::SegmentAlloc, BASE + 64 * MIB, 10 * MIB),
            ],
            vec![
                segment(BASE + 32 * MIB, 20 * MIB, &[(0, 20 * MIB, 0, false)]),
                segment(BASE + 64 * MIB, 10 * MIB, &[(0, 10 * MIB, 0, false)]),
            ],
        );
        assert!(rec.capacity().is_some(), "without settings: a retry");
        rec.settings = Some(RecordedSettings::assumed(&collecting));
        assert_eq!(rec.capacity(), None);
    }

    /// With expandable segments the limit (50 MiB: a device of 100 MiB at 0.5) weighs the
    /// segment a request would get without them: 42 MiB for 41 MiB, through, though 60 MiB of
    /// pages were then mapped, past the limit; at 60 MiB reserved a 30 MiB one failed, and
    /// mapped 40 MiB once the pages were given back. The device: in [84, 180) MiB, not at
    /// least 120 MiB as the peak would say.
    #[test]
    fn under_a_fraction_pages_mapped_past_the_limit_do_not_bound_it() {
        let mut rec = recording(
            vec![
                entry(Action::SegmentMap, BASE, 60 * MIB),
                entry(Action::Alloc, BASE, 41 * MIB),
                entry(Action::FreeCompleted, BASE, 41 * MIB),
                at(Action::SegmentUnmap, BASE, 60 * MIB, CallSite::Malloc),
                entry(Action::SegmentMap, BASE, 40 * MIB),
                entry(Action::Alloc, BASE, 30 * MIB),
            ],
            vec![RecordedSegment {
                is_expandable: true,
                ..segment(
                    BASE,
                    40 * MIB,
                    &[
                        (0, 30 * MIB, 30 * MIB, true),
                        (30 * MIB, 10 * MIB, 0, false),
                    ],
                )
            }],
        );
        rec.settings = Some(RecordedSettings::assumed(&Settings {
            per_process_memory_fraction: 0.5,
            expandable_segments: true,
            ..Settings::default()
        }));
        assert_eq!(
            rec.capacity(),
            Some(CapacityEstimate::Bracket {
                low: 84 * MIB,
                high: 180 * MIB
            })
        );
    }

    #[test]
    fn no_failure_means_no_capacity_and_an_empty_bracket_none() {
        let rec = recording(
            vec![entry(Action::SegmentAlloc, BASE, 20 * MIB)],
            vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
        );
        assert_eq!(rec.capacity(), None);
        let empty = CapacityEstimate::Bracket {
            low: 60 * MIB,
            high: 60 * MIB,
        };
        assert!(!empty.is_consistent());
        assert_eq!(empty.replay_capacity(), None);
    }
}
