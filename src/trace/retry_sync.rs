//! Frees completed by an out-of-memory retry's synchronization.
//!
//! A free that waited for other streams' work (`record_stream`) completes where PyTorch finds
//! its event done: at the start of a later `malloc` (`process_events`, before the search for
//! a free block), or where the allocator synchronizes — `empty_cache()`, and a `malloc` whose
//! new segment did not fit: `release_cached_blocks` synchronizes (`free_completed` for every
//! free still waiting), releases the whole free segments and retries. The trace shows both
//! kinds inside the `malloc` alike, a run of `free_completed`s before its releases; but only
//! the first kind was free when the request searched. A replay that completes the second kind
//! before the request serves it from their blocks instead of retrying.
//!
//! So a run of completions right before a retry — an `oom`, or a malloc release followed by
//! an `oom` or a new segment (`bursts`; with expandable segments, unmaps followed by the
//! allocation, which found room without mapping pages) — or right after a malloc release of the
//! same request (`process_events` comes before any release) is completed at the replay's own
//! synchronization (`Op::FreeAtSync`). Under default settings that is exact for both kinds:
//! nothing runs between the search and the synchronization, the search fails without those
//! blocks as it failed with them (fewer free blocks serve no more), and the synchronization
//! frees them before the release. Stack frames, where the trace has them, tell a completion
//! found inside `malloc` from the program's own free (frames naming neither `malloc` nor
//! `empty_cache`) and from `empty_cache()`'s; without them a completion right after its
//! request is taken as the program's own free. (The replay also completes them before the
//! request where a new segment fits without a release: then there was no retry.)
//!
//! Under `max_split_size` or a garbage-collection threshold a malloc release before a new
//! segment may instead be the oversize release or a collection without a retry, which run
//! after the search and saw the blocks that `process_events` completed before it; the trace
//! shows those completions as it shows a retry's. Where the start state is known, the segments
//! followed through the trace tell some apart: a retry's release gives back every segment left
//! wholly free (both pools'), so a release that leaves one cached was no retry's, and the
//! completions before it were `process_events'`. The rest are read as the retry's: the trace
//! cannot tell a collection or an oversize release that happened to give back every free
//! segment from a retry's release; read the other way, far more of tests/fixed_cuts.rs's
//! recordings depart (that file gives the figures of what remains). But a collection runs
//! before a retry's synchronization: completions the trace shows before any release of their
//! request (`AtRetry::FirstInRequest`) came after a collection that released nothing, if they
//! were the retry's. The replay, which knows its reserved memory and the collection's
//! threshold, completes them before the request where its collection would release a segment
//! without them (`Op::FreeAtSync`'s `first_in_request`): the recording's would have released
//! one, ahead of them in the trace. Where only the segments they left free were released, the
//! trace reads the same either way.

use std::collections::BTreeMap;

use super::bursts::{BurstKind, ReleaseBurst, is_new_memory, is_release};
use super::convert::completes_at_once;
use super::recording::{Action, CallSite, TraceEntry};
use super::start_state::SeedSegment;

/// The segments (not expandable) as a trace goes on from its start state, each with the
/// blocks it holds: allocated, or freed and not yet completed.
struct Segments {
    /// Start address → (size, blocks held).
    held: BTreeMap<u64, (u64, usize)>,
}

impl Segments {
    fn new(start: &[SeedSegment]) -> Self {
        let held = start
            .iter()
            .map(|s| {
                (
                    s.addr,
                    (s.size, s.blocks.iter().filter(|b| b.allocated).count()),
                )
            })
            .collect();
        Segments { held }
    }

    /// The blocks held by the segment holding `addr`, if one does.
    fn blocks_at(&mut self, addr: u64) -> Option<&mut usize> {
        let (&start, (size, held)) = self.held.range_mut(..=addr).next_back()?;
        (addr < start + *size).then_some(held)
    }

    fn apply(&mut self, e: &TraceEntry) {
        match e.action {
            Action::SegmentAlloc => {
                self.held.insert(e.addr, (e.size, 0));
            }
            Action::SegmentFree => {
                self.held.remove(&e.addr);
            }
            Action::Alloc => {
                if let Some(held) = self.blocks_at(e.addr) {
                    *held += 1;
                }
            }
            Action::FreeCompleted => {
                if let Some(held) = self.blocks_at(e.addr) {
                    *held = held.saturating_sub(1);
                }
            }
            _ => {}
        }
    }

    /// Whether `burst` gives back every segment that holds no block.
    fn all_free_released(&self, entries: &[TraceEntry], burst: &ReleaseBurst) -> bool {
        let released = &entries[burst.start..burst.end];
        self.held
            .iter()
            .filter(|(_, (_, held))| *held == 0)
            .all(|(&addr, _)| released.iter().any(|e| e.addr == addr))
    }
}

/// A `free_completed` made by a retry's synchronization, as the trace shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtRetry {
    /// Before any release of the request's: a garbage collection before the synchronization
    /// released nothing (`Op::FreeAtSync`'s `first_in_request`).
    FirstInRequest,
    /// After a release of the request's (a collection's, or the oversize release).
    AfterRelease,
}

/// For each entry, whether it is a `free_completed` made by a retry's synchronization, and
/// where (see the module doc). `start`: the segments at trace start, where they are known.
pub fn completed_at_retries(
    entries: &[TraceEntry],
    bursts: &[ReleaseBurst],
    start: Option<&[SeedSegment]>,
) -> Vec<Option<AtRetry>> {
    let mut segments = start.map(Segments::new);
    let malloc_release_at = |index: usize| {
        let found = bursts.partition_point(|b| b.end <= index);
        bursts
            .get(found)
            .filter(|b| b.start <= index && b.kind == BurstKind::MallocRelease)
    };
    // Frames tell a completion found inside `malloc` from one of `empty_cache()` or of the
    // program's own free (frames naming neither); without frames, one that directly follows
    // its request may be the program's own free.
    let waited = |index: usize| {
        entries[index].action == Action::FreeCompleted
            && match entries[index].call_site {
                CallSite::Malloc => true,
                CallSite::EmptyCache | CallSite::Other => false,
                CallSite::Unrecorded => {
                    index == 0
                        || entries[index - 1].action != Action::FreeRequested
                        || !completes_at_once(entries, index - 1)
                }
            }
    };
    let mut at_retry = vec![None; entries.len()];
    let mut index = 0;
    while index < entries.len() {
        let run = index;
        while index < entries.len() && waited(index) {
            if let Some(s) = &mut segments {
                s.apply(&entries[index]);
            }
            index += 1;
        }
        if index == run {
            if let Some(s) = &mut segments {
                s.apply(&entries[index]);
            }
            index += 1;
            continue;
        }
        let start = run;
        let after_release = start > 0 && malloc_release_at(start - 1).is_some();
        let retried = match entries.get(index).map(|e| e.action) {
            Some(Action::Oom) => true,
            Some(a) if is_release(a) => malloc_release_at(index).is_some_and(|burst| {
                match burst.next_entry(entries).map(|e| e.action) {
                    Some(Action::Oom) => true,
                    // A release that left a free segment cached was no retry's.
                    Some(a) if is_new_memory(a) => {
                        after_release
                            || segments
                                .as_ref()
                                .is_none_or(|s| s.all_free_released(entries, burst))
                    }
                    // Expandable segments: the retry found room without mapping pages.
                    Some(Action::Alloc) => burst.retried_without_growth(entries),
                    _ => false,
                }
            }),
            Some(a) if is_new_memory(a) => after_release,
            _ => false,
        };
        let at = if after_release {
            AtRetry::AfterRelease
        } else {
            AtRetry::FirstInRequest
        };
        at_retry[start..index].fill(retried.then_some(at));
    }
    at_retry
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::bursts::release_bursts;
    use crate::trace::fixtures::{MIB, at, entry, oom};

    fn marked(entries: &[TraceEntry]) -> Vec<usize> {
        let at_retry = completed_at_retries(entries, &release_bursts(entries), None);
        (0..entries.len())
            .filter(|&i| at_retry[i].is_some())
            .collect()
    }

    fn malloc(action: Action, addr: u64) -> TraceEntry {
        at(action, addr, 20 * MIB, CallSite::Malloc)
    }

    /// Completions before a release and a new segment, or an `oom`, are the retry's; those
    /// before an allocation, and a free's own completion, are not.
    #[test]
    fn completions_right_before_a_retry_are_its_synchronization() {
        let entries = vec![
            entry(Action::FreeRequested, MIB, 512),
            entry(Action::FreeCompleted, MIB, 512),
            malloc(Action::FreeCompleted, 2 * MIB),
            malloc(Action::FreeCompleted, 3 * MIB),
            malloc(Action::SegmentFree, 3 * MIB),
            malloc(Action::SegmentAlloc, 4 * MIB),
            malloc(Action::Alloc, 4 * MIB),
            malloc(Action::FreeCompleted, 5 * MIB),
            malloc(Action::Alloc, 6 * MIB),
            malloc(Action::FreeCompleted, 7 * MIB),
            oom(64 * MIB, 0),
        ];
        assert_eq!(marked(&entries), vec![2, 3, 9]);
    }

    /// After a release of the same request (the collector's, or the oversize release), a
    /// completion is the synchronization's, also where the retry released nothing more:
    /// `process_events` comes first. Before it, one is `process_events'`. One whose frames name
    /// `empty_cache` is that call's, also right before a retry.
    #[test]
    fn completions_after_a_release_of_the_request_are_its_synchronization() {
        let entries = vec![
            malloc(Action::FreeCompleted, MIB),
            malloc(Action::SegmentFree, 2 * MIB),
            malloc(Action::FreeCompleted, 3 * MIB),
            malloc(Action::SegmentFree, 3 * MIB),
            malloc(Action::SegmentAlloc, 4 * MIB),
            malloc(Action::Alloc, 4 * MIB),
            malloc(Action::SegmentFree, 5 * MIB),
            malloc(Action::FreeCompleted, 6 * MIB),
            malloc(Action::SegmentAlloc, 7 * MIB),
            malloc(Action::Alloc, 7 * MIB),
            at(Action::SegmentFree, 8 * MIB, 20 * MIB, CallSite::EmptyCache),
            malloc(Action::FreeCompleted, 9 * MIB),
            malloc(Action::Alloc, 9 * MIB),
            at(
                Action::FreeCompleted,
                10 * MIB,
                20 * MIB,
                CallSite::EmptyCache,
            ),
            malloc(Action::SegmentFree, 10 * MIB),
            malloc(Action::SegmentAlloc, 11 * MIB),
        ];
        assert_eq!(marked(&entries), vec![2, 7]);
    }

    /// Completions before any release of their request are told from those after one of its
    /// releases (a collection's, before the synchronization, or the oversize release): the
    /// replay reads the first kind as `process_events'` where its collection would have
    /// released a segment.
    #[test]
    fn completions_before_the_request_s_releases_are_told_from_those_after() {
        let entries = vec![
            malloc(Action::FreeCompleted, MIB),
            malloc(Action::SegmentFree, 2 * MIB),
            malloc(Action::SegmentAlloc, 4 * MIB),
            malloc(Action::Alloc, 4 * MIB),
            malloc(Action::SegmentFree, 5 * MIB),
            malloc(Action::FreeCompleted, 6 * MIB),
            malloc(Action::SegmentFree, 6 * MIB),
            malloc(Action::SegmentAlloc, 7 * MIB),
            malloc(Action::Alloc, 7 * MIB),
            malloc(Action::FreeCompleted, 8 * MIB),
            oom(64 * MIB, 0),
        ];
        let at_retry = completed_at_retries(&entries, &release_bursts(&entries), None);
        let kinds: Vec<_> = at_retry
            .iter()
            .enumerate()
            .filter_map(|(i, at)| at.map(|at| (i, at)))
            .collect();
        assert_eq!(
            kinds,
            [
                (0, AtRetry::FirstInRequest),
                (5, AtRetry::AfterRelease),
                (9, AtRetry::FirstInRequest)
            ]
        );
    }

    /// A completion whose frames name neither `malloc` nor `empty_cache` is the program's own
    /// free, also where its request is not in the trace (one begun inside that free); without
    /// frames, one whose request is not in the trace may be a retry's.
    #[test]
    fn a_free_s_own_completion_is_no_retry_s() {
        let entries = vec![
            at(Action::FreeCompleted, MIB, 512, CallSite::Other),
            malloc(Action::SegmentFree, MIB),
            malloc(Action::SegmentAlloc, 2 * MIB),
            malloc(Action::Alloc, 2 * MIB),
            entry(Action::FreeCompleted, 3 * MIB, 512),
            malloc(Action::SegmentFree, 3 * MIB),
            malloc(Action::SegmentAlloc, 4 * MIB),
        ];
        assert_eq!(marked(&entries), vec![4]);
    }
}
