//! Frees that waited for a device synchronization, in a cachealloc recording older than
//! version 7 (from version 7 on, each `free_requested` line says what its free waits for:
//! `waits`, and this inference is not used).
//!
//! Under `free_sync:device` or `event` the library's `cudaFree` leaves its block pending
//! (`free_deferred`) until a device synchronization that began after it (or until its event),
//! and while such a free waits, a request that no free block serves makes the pool synchronize
//! before it grows: every free still waiting completes (a device synchronization covers the
//! streams' work too), and the pool searches again. A free recorded as used on other streams
//! (`cachealloc_record_stream`, `free_after_streams`; every one under `free_sync:none`), and a
//! `cudaFreeAsync` of pool memory, waits for their events: the pool grows rather than synchronize for it, and only an out-of-memory
//! retry or `empty_cache()` synchronizes. Both show as a `free_requested` and, later, its
//! `free_completed`. A replay on another device or under other settings grows where the
//! recording did not, and must know whether the pool would have synchronized there.
//!
//! The lines tell the second kind where the pool took new memory (`segment_alloc`,
//! `segment_map`) while the free waited, outside a CUDA graph capture (during which the pool
//! synchronizes for nothing): a free of the first kind would have completed first. Any other
//! free that waited, in a recording under `free_sync:device` or `event`, is taken as the first
//! kind (`Op::FreeRequested`'s `until_device_sync`): a free recorded as used on other streams
//! (or a `cudaFreeAsync`) that never waited across new memory is taken as one too, and a
//! replay that grows while it waits synchronizes where the program would not have, had no
//! `cudaFree` been pending then.

use super::{Action, Event};
use rustc_hash::FxHashMap;

/// For each event, whether it is a `free_requested` whose free waited while the pool took new
/// memory outside a capture (so it did not wait for a device synchronization).
pub fn waited_across_growth(events: &[Event]) -> Vec<bool> {
    let mut across = vec![false; events.len()];
    // Address → index of the `free_requested` not completed yet.
    let mut waiting: FxHashMap<u64, usize> = FxHashMap::default();
    for (index, e) in events.iter().enumerate() {
        match e.action {
            Action::FreeRequested => {
                waiting.insert(e.addr, index);
            }
            Action::FreeCompleted => {
                waiting.remove(&e.addr);
            }
            Action::DeviceReset => waiting.clear(),
            Action::SegmentAlloc | Action::SegmentMap if !captured(events, index) => {
                for (_, at) in waiting.drain() {
                    across[at] = true;
                }
            }
            _ => {}
        }
    }
    across
}

/// Whether the new memory at `index` is a request's during a capture: its `capture` line comes
/// right before the request's new memory.
fn captured(events: &[Event], index: usize) -> bool {
    events[..index]
        .iter()
        .rev()
        .find(|e| {
            !matches!(
                e.action,
                Action::SegmentAlloc | Action::SegmentMap | Action::RangeReserve
            )
        })
        .is_some_and(|e| e.action == Action::Capture)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(action: Action, addr: u64) -> Event {
        Event {
            t_us: 0,
            device: 0,
            action,
            addr,
            size: 1 << 20,
            stream: 0,
            device_free: None,
            page: None,
            requested: None,
            fraction: None,
            waits: None,
        }
    }

    /// A free waiting while the pool took new memory did not wait for a device synchronization;
    /// one completed before it, or waiting only while a capture took new memory, may have.
    #[test]
    fn a_free_waiting_across_new_memory_waited_for_streams() {
        use Action::*;
        let events = [
            event(FreeRequested, 1),
            event(FreeRequested, 2),
            event(FreeCompleted, 2),
            event(SegmentAlloc, 3),
            event(FreeRequested, 4),
            event(Capture, 0),
            event(RangeReserve, 5),
            event(SegmentMap, 5),
            event(Alloc, 5),
            event(FreeCompleted, 1),
            event(FreeCompleted, 4),
        ];
        let across: Vec<usize> = (0..events.len())
            .filter(|&i| waited_across_growth(&events)[i])
            .collect();
        assert_eq!(across, [0]);
    }
}
