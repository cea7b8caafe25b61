//! What the recorded run did, in the numbers a replay is checked against: cudaMalloc and
//! cudaFree counts, peak reserved bytes (absolute, i.e. including what was reserved before
//! recording started), counted retries and the first OOM.
//!
//! Reserved bytes at trace start = end-state reserved (sum of the device's segment sizes) minus
//! the trace's net segment effect (`segment_alloc`/`segment_map` add, `segment_free`/
//! `segment_unmap` subtract). The peak is the highest running value from there, the start
//! included.

use super::bursts::{BurstKind, count_retries, release_bursts, releases_before_new_segments};
use super::recording::{Action, BlockState, DeviceRecording, TraceEntry};
use crate::pool::StreamId;

/// The first `oom` entry of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedOom {
    /// Index of the `oom` entry in the device trace.
    pub event_index: usize,
    /// The request that failed (rounded, as recorded).
    pub size: u64,
    pub stream: StreamId,
    /// Free device bytes reported at the failure.
    pub device_free: u64,
    /// Bytes the allocator had reserved at the failure.
    pub reserved_bytes: u64,
}

/// Figures of one device's recording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedFigures {
    pub entries: usize,
    pub allocs: usize,
    /// Frees of the kind the workload uses (see `DeviceRecording::free_action`).
    pub frees: usize,
    /// Frees of addresses not allocated during the trace (allocated before recording began).
    pub orphan_frees: usize,
    /// Allocations at an address the trace had not freed since its last allocation there: a
    /// free is missing (a trace written by PyTorch has none).
    pub missing_frees: usize,
    /// Allocations whose free the program requested (`free_requested`) but that had not
    /// completed (no `free_completed`) when the recording ended: frees waiting for device work,
    /// still live at the end of a replay, which frees on completion.
    pub pending_frees: usize,
    /// cudaMalloc calls (`segment_alloc`).
    pub recorded_segment_allocs: usize,
    /// cudaFree calls (`segment_free`), from `empty_cache()` and from the OOM ladder.
    pub recorded_segment_frees: usize,
    pub recorded_segment_maps: usize,
    pub recorded_segment_unmaps: usize,
    /// Explicit `empty_cache()` calls that released something.
    pub empty_cache_calls: usize,
    pub start_reserved_bytes: u64,
    pub end_reserved_bytes: u64,
    pub recorded_peak_reserved_bytes: u64,
    /// Counted allocation retries (see `bursts::count_retries`).
    pub recorded_retries: usize,
    /// `recorded_retries` may count more than the recording made: its retries are told by the
    /// releases before new segments, and under `max_split_size` or a garbage-collection
    /// threshold some of those releases are no retry.
    pub retries_upper_bound: bool,
    pub recorded_oom: Option<RecordedOom>,
}

/// Signed effect of one entry on reserved bytes.
pub(crate) fn reserved_delta(entry: &TraceEntry) -> i128 {
    match entry.action {
        Action::SegmentAlloc | Action::SegmentMap => i128::from(entry.size),
        Action::SegmentFree | Action::SegmentUnmap => -i128::from(entry.size),
        _ => 0,
    }
}

/// Net effect of the whole trace on reserved bytes.
pub(crate) fn net_reserved_change(entries: &[TraceEntry]) -> i128 {
    entries.iter().map(reserved_delta).sum()
}

/// Reserved bytes at trace start as recorded (may be negative for an inconsistent file).
pub(crate) fn start_reserved_signed(rec: &DeviceRecording) -> i128 {
    i128::from(rec.end_reserved_bytes()) - net_reserved_change(&rec.entries)
}

/// Reserved bytes just before each entry (clamped at 0), plus the value after the last one.
pub(crate) fn reserved_before_each(rec: &DeviceRecording) -> Vec<u64> {
    let mut reserved = start_reserved_signed(rec);
    let mut out = Vec::with_capacity(rec.entries.len() + 1);
    for entry in &rec.entries {
        out.push(clamp(reserved));
        reserved += reserved_delta(entry);
    }
    out.push(clamp(reserved));
    out
}

fn clamp(v: i128) -> u64 {
    u64::try_from(v.max(0)).unwrap_or(u64::MAX)
}

impl DeviceRecording {
    /// The action whose entries become `Op::Free`: `free_completed` when the trace has any
    /// (the block is back in the pool only then; without `record_stream` it directly follows
    /// its `free_requested`), else `free_requested` (a file recorded without completions) —
    /// unless every `free_requested` still waits at the end (`requests_all_wait`): such a
    /// trace, a short one ending while its frees wait for other streams, shows no completion
    /// because none came, and its requests free nothing.
    pub fn free_action(&self) -> Action {
        if self
            .entries
            .iter()
            .any(|e| e.action == Action::FreeCompleted)
            || self.requests_all_wait()
        {
            Action::FreeCompleted
        } else {
            Action::FreeRequested
        }
    }

    /// Whether each `free_requested` of the trace is of a block that the snapshot's state
    /// shows pending (`active_pending_free`) at that address and that the trace allocates no
    /// more after it: a free that had not completed when the snapshot was taken, whether the
    /// file records completions or not.
    fn requests_all_wait(&self) -> bool {
        let pending: rustc_hash::FxHashSet<u64> = self
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::PendingFree)
            .map(|b| b.address)
            .collect();
        let mut allocated_after = rustc_hash::FxHashSet::default();
        for e in self.entries.iter().rev() {
            match e.action {
                Action::Alloc => {
                    allocated_after.insert(e.addr);
                }
                Action::FreeRequested
                    if allocated_after.contains(&e.addr) || !pending.contains(&e.addr) =>
                {
                    return false;
                }
                _ => {}
            }
        }
        true
    }

    /// The recorded figures of this device.
    pub fn figures(&self) -> RecordedFigures {
        let entries = &self.entries;
        let count = |a: Action| entries.iter().filter(|e| e.action == a).count();
        let bursts = release_bursts(entries);
        let reserved = reserved_before_each(self);
        let recorded_oom = entries
            .iter()
            .enumerate()
            .find(|(_, e)| e.action == Action::Oom)
            .map(|(i, e)| RecordedOom {
                event_index: i,
                size: e.size,
                stream: e.stream,
                device_free: e.device_free.unwrap_or(0),
                reserved_bytes: reserved[i],
            });
        let free_action = self.free_action();
        let mut live = rustc_hash::FxHashSet::default();
        let mut orphan_frees = 0;
        let mut missing_frees = 0;
        let mut pending = rustc_hash::FxHashSet::default();
        for e in entries {
            if e.action == Action::Alloc {
                if !live.insert(e.addr) {
                    missing_frees += 1;
                }
                pending.remove(&e.addr);
            } else if e.action == free_action {
                if !live.remove(&e.addr) {
                    orphan_frees += 1;
                }
                pending.remove(&e.addr);
            } else if e.action == Action::FreeRequested && live.contains(&e.addr) {
                pending.insert(e.addr);
            }
        }
        RecordedFigures {
            entries: entries.len(),
            allocs: count(Action::Alloc),
            frees: count(free_action),
            orphan_frees,
            missing_frees,
            pending_frees: pending.len(),
            recorded_segment_allocs: count(Action::SegmentAlloc),
            recorded_segment_frees: count(Action::SegmentFree),
            recorded_segment_maps: count(Action::SegmentMap),
            recorded_segment_unmaps: count(Action::SegmentUnmap),
            empty_cache_calls: bursts
                .iter()
                .filter(|b| b.kind == BurstKind::EmptyCache)
                .count(),
            start_reserved_bytes: reserved[0],
            end_reserved_bytes: self.end_reserved_bytes(),
            recorded_peak_reserved_bytes: reserved.iter().copied().max().unwrap_or(0),
            recorded_retries: count_retries(entries, &bursts),
            // Any threshold, not only under a fraction below 1: a PyTorch program may set its
            // fraction as it runs (`set_per_process_memory_fraction`), which a snapshot does
            // not record.
            retries_upper_bound: releases_before_new_segments(entries, &bursts) > 0
                && self.settings.as_ref().is_some_and(|s| {
                    s.max_split_size.is_some() || s.garbage_collection_threshold > 0.0
                }),
            recorded_oom,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::fixtures::{BASE, MIB, at, entry, oom, recording, segment};
    use crate::trace::recording::{CallSite, RecordedSettings};

    #[test]
    fn peak_counts_what_was_reserved_before_the_trace() {
        // 2 MiB reserved before recording; +20, +40, -20 (empty_cache) during it.
        let rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                entry(Action::SegmentAlloc, BASE + 32 * MIB, 40 * MIB),
                at(Action::SegmentFree, BASE, 20 * MIB, CallSite::EmptyCache),
            ],
            vec![
                segment(BASE + 32 * MIB, 40 * MIB, &[(0, 40 * MIB, 0, false)]),
                segment(BASE + 128 * MIB, 2 * MIB, &[(0, 2 * MIB, 0, false)]),
            ],
        );
        let f = rec.figures();
        assert_eq!(f.start_reserved_bytes, 2 * MIB);
        assert_eq!(f.end_reserved_bytes, 42 * MIB);
        assert_eq!(f.recorded_peak_reserved_bytes, 62 * MIB);
        assert_eq!(
            (f.recorded_segment_allocs, f.recorded_segment_frees),
            (2, 1)
        );
        assert_eq!((f.empty_cache_calls, f.recorded_retries), (1, 0));
        assert_eq!(f.recorded_oom, None);
    }

    /// Only `empty_cache()` bursts count as calls; a file whose segments are fewer than its
    /// trace's net reservations starts at 0 reserved, not at a wrapped-around figure.
    #[test]
    fn empty_cache_calls_and_an_inconsistent_start() {
        let rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                at(Action::SegmentFree, BASE, 20 * MIB, CallSite::Malloc),
                entry(Action::SegmentAlloc, BASE + 32 * MIB, 40 * MIB),
                at(
                    Action::SegmentFree,
                    BASE + 32 * MIB,
                    40 * MIB,
                    CallSite::EmptyCache,
                ),
                entry(Action::SegmentAlloc, BASE + 128 * MIB, 40 * MIB),
            ],
            vec![],
        );
        let f = rec.figures();
        assert_eq!((f.empty_cache_calls, f.recorded_retries), (1, 1));
        assert_eq!(f.start_reserved_bytes, 0);
        assert_eq!(f.recorded_peak_reserved_bytes, 0);
    }

    /// A segment allocated by the last entry counts in the peak: the value after the last entry
    /// is a level the recording reached too.
    #[test]
    fn a_peak_reached_by_the_last_entry_counts() {
        let rec = recording(
            vec![entry(Action::SegmentAlloc, BASE, 20 * MIB)],
            vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
        );
        let f = rec.figures();
        assert_eq!(f.start_reserved_bytes, 0);
        assert_eq!(f.recorded_peak_reserved_bytes, 20 * MIB);
    }

    /// The recorded OOM is the first `oom` entry, with the reserved bytes and free memory there.
    #[test]
    fn the_recorded_oom_is_the_first_of_several() {
        let rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                oom(64 * MIB, 7 * MIB),
                entry(Action::SegmentAlloc, BASE + 32 * MIB, 2 * MIB),
                oom(128 * MIB, 5 * MIB),
            ],
            vec![
                segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)]),
                segment(BASE + 32 * MIB, 2 * MIB, &[(0, 2 * MIB, 0, false)]),
            ],
        );
        let oom = rec.figures().recorded_oom.unwrap();
        assert_eq!(
            (
                oom.event_index,
                oom.size,
                oom.device_free,
                oom.reserved_bytes
            ),
            (1, 64 * MIB, 7 * MIB, 20 * MIB)
        );
    }

    /// A release before a new segment is a retry under default settings, and may be the
    /// oversize release under max_split_size: the count is then a bound, when such a release
    /// counted.
    #[test]
    fn retries_from_releases_are_a_bound_under_max_split_size() {
        let entries = vec![
            entry(Action::SegmentAlloc, BASE, 200 * MIB),
            at(Action::SegmentFree, BASE, 200 * MIB, CallSite::Malloc),
            entry(Action::SegmentAlloc, BASE + 512 * MIB, 300 * MIB),
        ];
        let segments = vec![segment(
            BASE + 512 * MIB,
            300 * MIB,
            &[(0, 300 * MIB, 0, false)],
        )];
        let mut rec = recording(entries.clone(), segments.clone());
        let f = rec.figures();
        assert_eq!((f.recorded_retries, f.retries_upper_bound), (1, false));
        rec.settings = Some(RecordedSettings {
            max_split_size: Some(128 * MIB),
            ..RecordedSettings::default()
        });
        let f = rec.figures();
        assert_eq!((f.recorded_retries, f.retries_upper_bound), (1, true));
        // Settings recorded at their defaults: the count is exact.
        rec.settings = Some(RecordedSettings::default());
        assert!(!rec.figures().retries_upper_bound);
        // So may a release under a garbage-collection threshold (the collector's).
        rec.settings = Some(RecordedSettings {
            garbage_collection_threshold: 0.6,
            ..RecordedSettings::default()
        });
        assert!(rec.figures().retries_upper_bound);
        // No release before a new segment: nothing counted that could be no retry.
        let mut quiet = recording(entries[..1].to_vec(), vec![]);
        quiet.settings = rec.settings.clone();
        assert!(!quiet.figures().retries_upper_bound);
    }

    #[test]
    fn free_requested_is_used_only_without_completions() {
        let only_requested = recording(vec![entry(Action::FreeRequested, BASE, 512)], vec![]);
        assert_eq!(only_requested.free_action(), Action::FreeRequested);
        let both = recording(
            vec![
                entry(Action::FreeRequested, BASE, 512),
                entry(Action::FreeCompleted, BASE, 512),
            ],
            vec![],
        );
        assert_eq!(both.free_action(), Action::FreeCompleted);
        assert_eq!(both.figures().frees, 1);
        assert_eq!(both.figures().orphan_frees, 1);
        assert_eq!(both.figures().pending_frees, 0);
    }

    /// A trace whose frees all still wait at its end (each of a block the snapshot's state shows
    /// `active_pending_free`, not allocated again after) has no completion to show: it is not
    /// one recorded without completions, and its requests free nothing. (A recording cut
    /// shortly before its end, in tests/fixed_cuts.rs, met this.)
    #[test]
    fn a_trace_whose_frees_all_wait_uses_completions() {
        let mut seg = segment(BASE, 2 * MIB, &[(0, MIB, MIB, true), (MIB, MIB, 0, false)]);
        seg.blocks[0].state = BlockState::PendingFree;
        let waiting = recording(
            vec![
                entry(Action::Alloc, BASE, MIB),
                entry(Action::FreeRequested, BASE, MIB),
            ],
            vec![seg.clone()],
        );
        let replay = waiting.faithful().unwrap();
        assert!(replay.start.segments[0].blocks.iter().all(|b| !b.allocated));
        assert_eq!(waiting.free_action(), Action::FreeCompleted);
        let f = waiting.figures();
        assert_eq!((f.frees, f.pending_frees), (0, 1));
        // Requested again after it was allocated anew: that free completed, unrecorded.
        let again = recording(
            vec![
                entry(Action::Alloc, BASE, MIB),
                entry(Action::FreeRequested, BASE, MIB),
                entry(Action::Alloc, BASE, MIB),
                entry(Action::FreeRequested, BASE, MIB),
            ],
            vec![seg],
        );
        assert_eq!(again.free_action(), Action::FreeRequested);
        // Of a block the state shows free: it completed, unrecorded.
        let free = segment(BASE, 2 * MIB, &[(0, 2 * MIB, 0, false)]);
        let done = recording(waiting.entries.clone(), vec![free]);
        assert_eq!(done.free_action(), Action::FreeRequested);
    }

    /// A free requested in the trace but not completed by its end (a block used on another
    /// stream, its event not yet passed at the dump) is counted as pending; one completed, or
    /// one of memory from before the trace, is not.
    #[test]
    fn frees_not_completed_by_the_end_are_pending() {
        let rec = recording(
            vec![
                entry(Action::Alloc, BASE, 512),
                entry(Action::Alloc, BASE + 512, 512),
                entry(Action::FreeRequested, BASE, 512),
                entry(Action::FreeCompleted, BASE, 512),
                entry(Action::FreeRequested, BASE + 512, 512),
                entry(Action::FreeRequested, BASE + 4096, 512),
            ],
            vec![],
        );
        let f = rec.figures();
        assert_eq!((f.frees, f.orphan_frees, f.pending_frees), (1, 0, 1));
    }

    /// An allocation at an address whose free was requested but not completed shows the
    /// completion missing: the earlier allocation is counted as a missing free, not as pending.
    #[test]
    fn an_allocation_again_where_a_free_is_pending_ends_it() {
        let rec = recording(
            vec![
                entry(Action::Alloc, BASE, 512),
                entry(Action::FreeRequested, BASE, 512),
                entry(Action::Alloc, BASE, 512),
                entry(Action::Alloc, BASE + 512, 512),
                entry(Action::FreeRequested, BASE + 512, 512),
                entry(Action::FreeCompleted, BASE + 512, 512),
            ],
            vec![],
        );
        let f = rec.figures();
        assert_eq!((f.missing_frees, f.pending_frees, f.frees), (1, 0, 1));
    }
}
