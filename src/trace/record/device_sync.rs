//! Frees that waited for a device synchronization, in a cachealloc recording older than
//! version 7 (from version 7 on, each `free_requested` line says what its free waits for:
//! `waits`, and this inference is not used); and, from version 7 on, frees that outlasted one
//! (`outlasting_growth_syncs`).
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
use crate::pool::FreeWaits;
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

/// For each event, whether it is a `free_requested` of a free that waits for streams
/// (`waits`: `streams` or `device_then_streams`, version 7) still waiting after a
/// `sync_before_growth` line and the `free_completed`s of its synchronization: it waits for a
/// stream of another device, which a synchronization of this device does not cover. (The pool
/// synchronizes before growing with its lock held: no free is made while it runs, unlike the
/// program's `cudaDeviceSynchronize`, whose lines are not read here. A free that waits for the
/// device alone always completes there. A file that ends in that run — cut while it was
/// written — does not say what completed.)
pub fn outlasting_growth_syncs(events: &[Event]) -> Vec<bool> {
    let mut outlasts = vec![false; events.len()];
    // Address → index of the `free_requested` of streams not completed yet.
    let mut waiting: FxHashMap<u64, usize> = FxHashMap::default();
    for (index, e) in events.iter().enumerate() {
        match e.action {
            Action::FreeRequested => {
                if matches!(
                    e.waits,
                    Some(FreeWaits::Streams | FreeWaits::DeviceThenStreams)
                ) {
                    waiting.insert(e.addr, index);
                } else {
                    waiting.remove(&e.addr);
                }
            }
            Action::FreeCompleted => {
                waiting.remove(&e.addr);
            }
            Action::DeviceReset => waiting.clear(),
            Action::SyncBeforeGrowth => {
                let run = &events[index + 1..];
                let ran = run
                    .iter()
                    .take_while(|c| c.action == Action::FreeCompleted)
                    .count();
                if ran == run.len() {
                    continue;
                }
                let completed: Vec<u64> = run[..ran].iter().map(|c| c.addr).collect();
                for (&addr, &at) in &waiting {
                    outlasts[at] |= !completed.contains(&addr);
                }
            }
            _ => {}
        }
    }
    outlasts
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
        Event::plain(0, 0, action, addr, 1 << 20)
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

    /// A free of streams still waiting after a synchronization before growing and the
    /// completions that follow it outlasted it; one completed there, or requested after, did
    /// not. Nor did one of the device (a file that shows it waiting there lacks its lines), nor
    /// any at a synchronization that ends the file (what it completed was not written).
    #[test]
    fn a_free_waiting_past_a_growth_synchronization_outlasts_it() {
        use Action::*;
        let waiting = |addr, waits| Event {
            waits: Some(waits),
            ..event(FreeRequested, addr)
        };
        let events = [
            waiting(1, FreeWaits::Streams),
            waiting(2, FreeWaits::DeviceThenStreams),
            waiting(5, FreeWaits::Device),
            event(SyncBeforeGrowth, 0),
            event(FreeCompleted, 2),
            event(SegmentAlloc, 3),
            event(Alloc, 3),
            waiting(4, FreeWaits::DeviceThenStreams),
            event(FreeCompleted, 1),
            event(SyncBeforeGrowth, 0),
        ];
        let outlasts: Vec<usize> = (0..events.len())
            .filter(|&i| outlasting_growth_syncs(&events)[i])
            .collect();
        assert_eq!(outlasts, [0]);
    }
}
