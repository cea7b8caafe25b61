//! Frees completed by an out-of-memory retry's synchronization, in a cachealloc recording.
//!
//! A free that waited (`free_after_streams`, PyTorch's `record_stream`; `free_deferred` under
//! `free_sync:event`) completes where the pool finds its fence done: at the start of a later
//! `malloc` (`process_pending`, before the search for a free block), where the pool
//! synchronizes before growing (`free_deferred` frees pending: it searches again after), in
//! `empty_cache()` (before its `empty_cache` line), or in the retry of a request whose new
//! segment did not fit: `release_cached_blocks` synchronizes (a `free_completed` line for every
//! free still waiting), releases the whole free segments, and asks again (the `retry` line).
//! Only that last kind was not free when the request searched, and a replay that completes it
//! before the request serves the request from its block instead of retrying.
//!
//! The lines say which: the run of `free_completed`s right before the retry's releases
//! (`segment_free`, `segment_unmap`, `range_release`) and its `retry` line — or, in files
//! without `retry` lines (before version 3), right before the releases ahead of an `oom` or of
//! a new segment (`segment_alloc`, or a `segment_map` after its `range_reserve`) — is freed with
//! `Op::FreeAtSync`, which the replay holds until its own synchronization. A completion of the
//! other kinds can stand in that run only where nothing came between it and the retry's
//! synchronization but a search that failed with its block free (the request's, or the search
//! after the synchronization before growing): fewer free blocks serve no more, so holding it
//! changes nothing. (Under `max_split_size` or a garbage-collection threshold the oversize
//! release or a collection ahead of the retry may release the segments such a completion left
//! free, which the replay then releases at the retry; without `retry` lines such a release
//! before a new segment may also be no retry's, as `convert` counts it.)

use super::{Action, Event};

/// Whether the release lines of a retry (or of `empty_cache`) pass by here.
fn releases(action: Action) -> bool {
    matches!(
        action,
        Action::SegmentFree | Action::SegmentUnmap | Action::RangeRelease
    )
}

/// For each event, whether it is a `free_completed` made by an out-of-memory retry's
/// synchronization; `retries_marked`: the file has `retry` lines (version 3 on).
pub fn completed_at_retries(events: &[Event], retries_marked: bool) -> Vec<bool> {
    let mut at_sync = vec![false; events.len()];
    for (index, e) in events.iter().enumerate() {
        let (mut before, needs_release) = match e.action {
            Action::Retry => (index, false),
            Action::Oom if !retries_marked => (index, false),
            Action::SegmentAlloc | Action::SegmentMap if !retries_marked => {
                // Past the reservation a mapped retry makes first.
                let mut before = index;
                while before > 0 && events[before - 1].action == Action::RangeReserve {
                    before -= 1;
                }
                (before, true)
            }
            _ => continue,
        };
        let end = before;
        while before > 0 && releases(events[before - 1].action) {
            before -= 1;
        }
        if needs_release && before == end {
            // A new segment with no release before it: no retry.
            continue;
        }
        while before > 0 && events[before - 1].action == Action::FreeCompleted {
            before -= 1;
            at_sync[before] = true;
        }
    }
    at_sync
}
