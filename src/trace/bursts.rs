//! Release bursts: runs of consecutive `segment_free` (or `segment_unmap`) entries, and whether
//! each one is an explicit `empty_cache()` call or the allocator's own release inside `malloc`.
//!
//! Rules (measured on the real traces; see the replay-parity reference §2):
//! - A burst is a maximal run of consecutive release entries whose stack frames agree: a change
//!   between frames naming `emptyCache` and frames naming `malloc` starts a new burst.
//! - Frames naming `emptyCache`/`empty_cache` → [`BurstKind::EmptyCache`]: replay it as one
//!   `empty_cache()` call.
//! - Frames naming `malloc` → [`BurstKind::MallocRelease`]: the OOM ladder's
//!   `release_cached_blocks` (or, with `max_split_size` set, `release_available_cached_blocks`;
//!   with a garbage-collection threshold, the collector). Not replayed as an operation: the
//!   replay reproduces it by running with the right device capacity.
//! - No frames (or frames naming neither): a burst immediately followed by an `oom` or a
//!   `segment_alloc` / `segment_map` is a malloc release (cudaMalloc failed, the cache was
//!   released, the retry followed); any other burst is an `empty_cache()` call. An explicit
//!   `empty_cache()` immediately followed by a fresh cudaMalloc cannot be told apart without
//!   frames; it would be read as a malloc release.

use super::recording::{Action, CallSite, TraceEntry};

/// What caused a release burst.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BurstKind {
    /// An explicit `torch.cuda.empty_cache()`.
    EmptyCache,
    /// The allocator releasing cached segments inside `malloc` after a failed cudaMalloc.
    MallocRelease,
}

/// A run of consecutive release entries with one cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseBurst {
    /// Index of the first entry of the burst.
    pub start: usize,
    /// One past the last entry of the burst.
    pub end: usize,
    pub kind: BurstKind,
    /// Bytes released by the burst.
    pub bytes: u64,
}

impl ReleaseBurst {
    /// The entry right after the burst, if any.
    pub fn next_entry<'a>(&self, entries: &'a [TraceEntry]) -> Option<&'a TraceEntry> {
        entries.get(self.end)
    }

    /// A malloc release directly followed by a new segment or pages mapped (`is_new_memory`).
    pub fn precedes_new_memory(&self, entries: &[TraceEntry]) -> bool {
        self.kind == BurstKind::MallocRelease
            && self
                .next_entry(entries)
                .is_some_and(|e| is_new_memory(e.action))
    }

    /// An expandable-segments retry that found room without mapping pages: a malloc release of
    /// pages directly followed by the `alloc` (the retry's synchronization completed frees that
    /// waited for other streams, whose blocks then served the request).
    pub fn retried_without_growth(&self, entries: &[TraceEntry]) -> bool {
        self.kind == BurstKind::MallocRelease
            && entries[self.start].action == Action::SegmentUnmap
            && self
                .next_entry(entries)
                .is_some_and(|e| e.action == Action::Alloc)
    }
}

/// A segment returned, or pages unmapped.
pub(super) fn is_release(action: Action) -> bool {
    matches!(action, Action::SegmentFree | Action::SegmentUnmap)
}

/// A new segment, or pages mapped.
pub(super) fn is_new_memory(action: Action) -> bool {
    matches!(action, Action::SegmentAlloc | Action::SegmentMap)
}

/// The cause a stack names, if it names one.
fn named_kind(site: CallSite) -> Option<BurstKind> {
    match site {
        CallSite::EmptyCache => Some(BurstKind::EmptyCache),
        CallSite::Malloc => Some(BurstKind::MallocRelease),
        CallSite::Other | CallSite::Unrecorded => None,
    }
}

/// Find and classify every release burst of a trace, in order.
pub fn release_bursts(entries: &[TraceEntry]) -> Vec<ReleaseBurst> {
    let mut bursts = Vec::new();
    let mut i = 0;
    while i < entries.len() {
        if !is_release(entries[i].action) {
            i += 1;
            continue;
        }
        let start = i;
        let mut named = named_kind(entries[i].call_site);
        let mut bytes = 0u64;
        while i < entries.len() && is_release(entries[i].action) {
            let here = named_kind(entries[i].call_site);
            if here.is_some() && named.is_some() && here != named {
                break;
            }
            named = named.or(here);
            bytes = bytes.saturating_add(entries[i].size);
            i += 1;
        }
        let kind = named.unwrap_or_else(|| match entries.get(i).map(|e| e.action) {
            Some(a) if a == Action::Oom || is_new_memory(a) => BurstKind::MallocRelease,
            _ => BurstKind::EmptyCache,
        });
        bursts.push(ReleaseBurst {
            start,
            end: i,
            kind,
            bytes,
        });
    }
    bursts
}

/// Counted allocation retries (`num_alloc_retries`) visible in a trace.
///
/// A retry is the `alloc_block(isRetry=true)` after `release_cached_blocks` inside `malloc`. It
/// shows as either an `oom` entry (the retry failed; every OOM outside graph capture went
/// through one) or a malloc-release burst followed directly by a `segment_alloc` /
/// `segment_map` (the retry succeeded). With default settings this is exact; with
/// `max_split_size` or a garbage-collection threshold set, a malloc release can also come from
/// `release_available_cached_blocks` or the collector without a retry, so the count is an upper
/// bound.
///
/// With expandable segments a retry may also succeed without mapping pages
/// (`ReleaseBurst::retried_without_growth`).
pub fn count_retries(entries: &[TraceEntry], bursts: &[ReleaseBurst]) -> usize {
    let ooms = entries.iter().filter(|e| e.action == Action::Oom).count();
    let without_growth = bursts
        .iter()
        .filter(|b| b.retried_without_growth(entries))
        .count();
    ooms + releases_before_new_segments(entries, bursts) + without_growth
}

/// The malloc releases followed directly by a new segment: the successful retries, under
/// default settings; under `max_split_size` or a garbage-collection threshold, some of them may
/// be the oversize release or a collection instead.
pub fn releases_before_new_segments(entries: &[TraceEntry], bursts: &[ReleaseBurst]) -> usize {
    bursts
        .iter()
        .filter(|b| b.precedes_new_memory(entries))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::fixtures::{MIB, at, entry, oom};

    #[test]
    fn frames_decide_and_split_bursts() {
        let entries = vec![
            at(Action::SegmentFree, MIB, 2 * MIB, CallSite::EmptyCache),
            at(Action::SegmentFree, 4 * MIB, 2 * MIB, CallSite::EmptyCache),
            at(Action::SegmentFree, 8 * MIB, 2 * MIB, CallSite::Malloc),
            entry(Action::SegmentAlloc, 8 * MIB, 40 * MIB),
        ];
        let bursts = release_bursts(&entries);
        let kinds: Vec<_> = bursts.iter().map(|b| (b.start, b.end, b.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (0, 2, BurstKind::EmptyCache),
                (2, 3, BurstKind::MallocRelease)
            ]
        );
        assert_eq!(bursts[0].bytes, 4 * MIB);
        assert_eq!(count_retries(&entries, &bursts), 1);
    }

    #[test]
    fn without_frames_what_follows_decides() {
        let entries = vec![
            entry(Action::SegmentFree, MIB, 2 * MIB),
            oom(64 * MIB, 0),
            entry(Action::Alloc, MIB, 512),
            entry(Action::SegmentFree, 4 * MIB, 2 * MIB),
            entry(Action::SegmentAlloc, 4 * MIB, 20 * MIB),
            entry(Action::SegmentFree, 8 * MIB, 2 * MIB),
            entry(Action::Alloc, 8 * MIB, 512),
            entry(Action::SegmentFree, 9 * MIB, 2 * MIB),
        ];
        let kinds: Vec<_> = release_bursts(&entries).iter().map(|b| b.kind).collect();
        assert_eq!(
            kinds,
            vec![
                BurstKind::MallocRelease,
                BurstKind::MallocRelease,
                BurstKind::EmptyCache,
                BurstKind::EmptyCache
            ]
        );
        // The OOM's failed retry and the successful one before the segment_alloc.
        assert_eq!(count_retries(&entries, &release_bursts(&entries)), 2);
    }

    /// An `empty_cache()` call followed by a new segment is no retry: only the OOM ladder's
    /// releases before a new segment are.
    #[test]
    fn an_empty_cache_call_before_a_new_segment_is_no_retry() {
        let entries = vec![
            at(Action::SegmentFree, MIB, 2 * MIB, CallSite::EmptyCache),
            entry(Action::SegmentAlloc, 4 * MIB, 20 * MIB),
        ];
        assert_eq!(count_retries(&entries, &release_bursts(&entries)), 0);
    }

    /// An entry without frames between entries whose frames name `emptyCache` is part of their
    /// burst: only frames naming the other cause start a new one.
    #[test]
    fn an_unnamed_release_joins_the_named_burst_around_it() {
        let entries = vec![
            at(Action::SegmentFree, MIB, 2 * MIB, CallSite::EmptyCache),
            entry(Action::SegmentFree, 4 * MIB, 2 * MIB),
            at(Action::SegmentFree, 8 * MIB, 2 * MIB, CallSite::EmptyCache),
            entry(Action::Alloc, 8 * MIB, 512),
        ];
        let bursts = release_bursts(&entries);
        let kinds: Vec<_> = bursts.iter().map(|b| (b.start, b.end, b.kind)).collect();
        assert_eq!(kinds, vec![(0, 3, BurstKind::EmptyCache)]);
        assert_eq!(bursts[0].bytes, 6 * MIB);
    }

    /// Frames that name neither cause say nothing: what follows the burst decides, as without
    /// frames.
    #[test]
    fn frames_naming_neither_leave_the_cause_to_what_follows() {
        let kind = |next: Action| {
            let entries = vec![
                at(Action::SegmentFree, MIB, 2 * MIB, CallSite::Other),
                entry(next, 4 * MIB, 20 * MIB),
            ];
            release_bursts(&entries)[0].kind
        };
        assert_eq!(kind(Action::SegmentAlloc), BurstKind::MallocRelease);
        assert_eq!(kind(Action::Alloc), BurstKind::EmptyCache);
    }

    /// A release of pages inside `malloc` followed directly by the allocation is a retry that
    /// found room without mapping pages (expandable segments); one of whole segments is not.
    #[test]
    fn an_unmapping_retry_may_map_nothing() {
        let entries = vec![
            at(Action::FreeCompleted, 40 * MIB, 512, CallSite::Malloc),
            at(Action::SegmentUnmap, 40 * MIB, 2 * MIB, CallSite::Malloc),
            entry(Action::Alloc, 30 * MIB, 512),
            at(Action::SegmentFree, MIB, 2 * MIB, CallSite::Malloc),
            entry(Action::Alloc, 8 * MIB, 512),
        ];
        assert_eq!(count_retries(&entries, &release_bursts(&entries)), 1);
    }
}
