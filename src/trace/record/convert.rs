//! One device's events → the [`Workload`] to replay and the figures the recording reached.
//!
//! - `alloc` → `Op::Alloc` with a fresh id and `recorded_addr`; `free_completed` → `Op::Free`
//!   of the id live at that address (the block is back in the pool only then), or
//!   `Op::FreeAtSync` where an out-of-memory retry's synchronization completed it
//!   (`retry_sync`: after the request's search); a `free_requested` that the next line does
//!   not complete (a free that waited for device work) → `Op::FreeRequested`, where the
//!   allocation statistics drop it (`until_device_sync` where its `waits` names the device
//!   first, `device`, `device_then_streams`; in files older than version 7, as `device_sync`
//!   infers; `outlasts_device_sync` where it was still waiting after a `sync_before_growth`
//!   line and its completions, `device_sync::outlasting_growth_syncs`);
//!   `empty_cache` → `Op::EmptyCache`; `oom` → `Op::Oom`; `memory_fraction` →
//!   `Op::MemoryFraction`; `capture` → `Op::Capture`, right before the op of the request
//!   (`alloc` or `oom`) or `empty_cache` it marks: the line of the same stream and rounded size
//!   (0: `empty_cache`) that ends it, only the new memory the request took (`segment_alloc`,
//!   `range_reserve`, `segment_map`) between them. A `capture` line that any other line follows
//!   marked a request the device refused with another error than out of memory (a cudaMalloc
//!   made during a global-mode capture without relaxing it): it gives no op, so that no later
//!   request replays as made during a capture.
//! - A `free_completed` of the synchronization a `sync_before_growth` line marks (the run of
//!   them right after it, also where the request's retry comes next), of a free held by an
//!   `Op::FreeRequested` → `Op::FreeAtGrowthSync`: the replay leaves its completion to its own
//!   pool, which synchronizes before growing where it too finds no free block (as the program
//!   did on the replay's device), or at its next synchronization otherwise;
//!   `device_synchronize` → `Op::DeviceSynchronize`, which completes those the replay left to
//!   its pool; the `free_completed`s right after it, the others it completed → `Op::Free`
//!   (also where the next request's retry comes next, which `retry_sync` cannot tell).
//! - `device_reset` → `Op::Free` of every live allocation, then `Op::DeviceReset`: the recorded
//!   pool was dropped and a new one starts empty. A replay returns to its device what the
//!   recording lost to the reset, and does not count those returns as cudaFree calls, nor a
//!   synchronization (the reset made neither).
//! - Segment events produce no op (the replayed pool makes its own device calls); they give the
//!   figures and the driver's addresses (`segment_addresses`, used as address hints).
//! - `range_reserve` and `range_release` produce no op either: with the page maps and unmaps
//!   they are the `range_changes` from which a faithful replay takes the ranges of expandable
//!   segments; `device_memory` gives `device_memory`. These lines (and `retry`,
//!   `memory_fraction`, `capture`, `sync_before_growth` and `device_synchronize`) hold no
//!   memory: they neither end a run of releases nor start one.
//!
//! Figures: a recording starts with its pool, so reserved bytes start at 0 and follow
//! `segment_alloc` / `segment_free` (a `device_reset` drops them to 0). Retries and capacity
//! follow the rules of the PyTorch reader (`bursts`, `capacity`), with one difference that makes
//! them simpler here: a run of `segment_free`s right after an `empty_cache` line is that call's
//! (unless a `capture` line marks the call, which then gave nothing back); any other run is the
//! allocator's own release inside `malloc`. Each `oom` is one failed
//! counted retry and each malloc release followed by `segment_alloc` one successful retry — exact
//! with default settings, an upper bound with `max_split_size` (whose oversize release is
//! counted too) or a garbage-collection threshold (whose collections are counted too, and then
//! give no capacity bound). A new segment that the memory fraction in force refused (past its
//! limit of the recorded `device_memory`) gives no capacity bound either. From version 3 on, a
//! file marks each counted retry with a `retry` line, and those are counted instead: exact
//! under every setting.

use super::device_sync::{outlasting_growth_syncs, waited_across_growth};
use super::read::DeviceEvents;
use super::retry_sync::completed_at_retries;
use super::{Action, Event};
use crate::pool::rounding::{round_size, segment_size};
use crate::pool::{Settings, StreamId, allowed_maximum, collects_garbage};
use crate::trace::capacity::CapacityEstimate;
use crate::trace::figures::{RecordedFigures, RecordedOom};
use crate::trace::ranges::RangeChange;
use crate::trace::workload::{AllocId, Op, Workload};
use rustc_hash::{FxHashMap, FxHashSet};

/// Whether the `free_requested` at `index` completes at once: the next line completes it.
fn completes_at_once(events: &[Event], index: usize) -> bool {
    let request = &events[index];
    events
        .get(index + 1)
        .is_some_and(|e| e.action == Action::FreeCompleted && e.addr == request.addr)
}

/// What a replay needs from one device's recording.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedDevice {
    pub workload: Workload,
    pub figures: RecordedFigures,
    /// `(size, address)` of every `segment_alloc`, in order: where the driver put them.
    pub segment_addresses: Vec<(u64, u64)>,
    /// The range reservations and releases, page maps, unmaps and device resets, in order:
    /// where the driver reserved the ranges of expandable segments (`ranges::range_hints`).
    pub range_changes: Vec<RangeChange>,
    /// What the recording says about the device's capacity (`None`: no cudaMalloc failed).
    pub capacity: Option<CapacityEstimate>,
    /// The device's total memory, from its `device_memory` line (`None`: the file has none).
    pub device_memory: Option<u64>,
}

/// The malloc-release run in progress: reserved bytes before it, and the rounded request of
/// its `retry` line once read.
struct Burst {
    reserved_before: u64,
    request: Option<u64>,
}

/// What a file says of how its lines were written, besides the lines themselves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WrittenAs {
    /// Each counted retry has its `retry` line (version 3 on), which are then what the retries
    /// count.
    pub retries_marked: bool,
    /// The program's `cudaFree` waited for a device synchronization or event
    /// (`free_sync:device` or `event`).
    pub frees_deferred: bool,
    /// Each `free_requested` names what its free waits for (`waits`, version 7 on; none where
    /// nothing): what `device_sync` infers for older files.
    pub waits_named: bool,
}

/// Convert the events of one device of `source`, recorded with `settings` and written as
/// `written` says.
pub fn convert_device(
    source: &str,
    device: &DeviceEvents,
    settings: &Settings,
    written: WrittenAs,
) -> RecordedDevice {
    let WrittenAs {
        retries_marked,
        frees_deferred,
        waits_named,
    } = written;
    let mut workload = Workload::new(format!("{source} (device {})", device.device.0));
    let mut figures = RecordedFigures {
        entries: device.events.len(),
        allocs: 0,
        frees: 0,
        orphan_frees: 0,
        missing_frees: 0,
        pending_frees: 0,
        recorded_segment_allocs: 0,
        recorded_segment_frees: 0,
        recorded_segment_maps: 0,
        recorded_segment_unmaps: 0,
        empty_cache_calls: 0,
        start_reserved_bytes: 0,
        end_reserved_bytes: 0,
        recorded_peak_reserved_bytes: 0,
        recorded_retries: 0,
        retries_upper_bound: false,
        recorded_oom: None,
    };
    // Whether garbage collection runs under the fraction in force, which the program may set
    // as it runs (`memory_fraction`).
    let collects =
        |fraction: f64| collects_garbage(settings.garbage_collection_threshold, fraction);
    // The fraction in force, whose limit (of the device's memory, once its line is read) may
    // be what refused a segment rather than the device.
    let mut fraction = settings.per_process_memory_fraction;
    // Counted from a release before a new segment, which under these settings may be no retry.
    let releases_may_be_no_retry =
        !retries_marked && (settings.has_max_split_size() || collects(fraction));
    let mut segment_addresses = Vec::new();
    let mut live: FxHashMap<u64, AllocId> = FxHashMap::default();
    // Addresses whose free was requested and has not completed yet.
    let mut pending = FxHashSet::default();
    // Those of them whose free is held (`Op::FreeRequested`).
    let mut held = FxHashSet::default();
    // The line (`sync_before_growth` or `device_synchronize`) of the synchronization whose
    // `free_completed`s run up to this line, if one does.
    let mut run_of: Option<Action> = None;
    let mut next_id: AllocId = 0;
    let mut reserved = 0u64;
    let mut in_empty_cache = false;
    let mut burst: Option<Burst> = None;
    let mut failed_level: Option<u64> = None;
    let mut device_memory = None;
    let at_retry = completed_at_retries(&device.events, retries_marked);
    // Older files: whether each free waited for a device synchronization is inferred.
    let across_growth = if waits_named {
        Vec::new()
    } else {
        waited_across_growth(&device.events)
    };
    // Frees that a synchronization of the device did not complete (version 7's lines).
    let outlasting = outlasting_growth_syncs(&device.events);
    // The `capture` line (and its index) whose request has not ended yet.
    let mut capture: Option<(usize, &Event)> = None;
    for (index, e) in device.events.iter().enumerate() {
        // What the `capture` line before marks: this line, when it ends the marked request.
        let marked = match capture.take() {
            Some(c) if ends_captured(c.1, e, settings) => Some(c.0),
            Some(c) if takes_new_memory(e.action) => {
                capture = Some(c);
                None
            }
            _ => None,
        };
        let mark = |workload: &mut Workload| {
            if let Some(at) = marked {
                workload.push(Op::Capture, at);
            }
        };
        // Lines that hold no memory: a release and the new segment after it are one retry
        // with a range line between them.
        let passes_by = matches!(
            e.action,
            Action::RangeReserve
                | Action::RangeRelease
                | Action::DeviceMemory
                | Action::Retry
                | Action::MemoryFraction
                | Action::Capture
                | Action::SyncBeforeGrowth
                | Action::DeviceSynchronize
        );
        if !passes_by
            && !matches!(e.action, Action::SegmentFree | Action::SegmentUnmap)
            && let Some(b) = burst.take()
            && matches!(e.action, Action::SegmentAlloc | Action::SegmentMap)
        {
            if !retries_marked {
                figures.recorded_retries += 1;
                figures.retries_upper_bound |= releases_may_be_no_retry;
            }
            // What the device refused: the new segment, or the pages mapped for the request.
            let level = b.reserved_before.saturating_add(e.size);
            // What the limit is checked against: the segment the request needs (more than the
            // pages mapped where the range's free end covers part of it), when the retry line
            // names the request.
            let limit_level = b
                .request
                .map_or(level, |r| b.reserved_before.saturating_add(segment_size(r)));
            if !collects(fraction) && !past_limit(limit_level, fraction, device_memory) {
                failed_level = Some(failed_level.map_or(level, |l| l.min(level)));
            }
        }
        match e.action {
            Action::Alloc => {
                figures.allocs += 1;
                let id = next_id;
                next_id += 1;
                if let Some(earlier) = live.insert(e.addr, id) {
                    // The recording lacks the earlier allocation's free: free it here.
                    figures.missing_frees += 1;
                    pending.remove(&e.addr);
                    held.remove(&e.addr);
                    workload.push(Op::Free { id: earlier }, index);
                }
                mark(&mut workload);
                workload.push(
                    Op::Alloc {
                        id,
                        size: e.size,
                        stream: StreamId(e.stream),
                        recorded_addr: Some(e.addr),
                    },
                    index,
                );
            }
            Action::FreeCompleted => {
                figures.frees += 1;
                pending.remove(&e.addr);
                let was_held = held.remove(&e.addr);
                match live.remove(&e.addr) {
                    // Completed by the recorded pool's synchronization before growing (also
                    // where its request's retry came next, with nothing more to complete):
                    // left to the replay's.
                    Some(id) if run_of == Some(Action::SyncBeforeGrowth) && was_held => {
                        workload.push(Op::FreeAtGrowthSync { id }, index);
                    }
                    // Completed by the program's synchronization, before the next request
                    // (also where that request's retry comes next, its releases after them).
                    Some(id) if run_of == Some(Action::DeviceSynchronize) => {
                        workload.push(Op::Free { id }, index);
                    }
                    // Told by the file's `retry` lines (or, without them, as `retry_sync`
                    // says): the replay completes them at its synchronization.
                    Some(id) if at_retry[index] => {
                        let op = Op::FreeAtSync {
                            id,
                            first_in_request: false,
                        };
                        workload.push(op, index);
                    }
                    Some(id) => workload.push(Op::Free { id }, index),
                    None => figures.orphan_frees += 1,
                }
            }
            Action::FreeRequested => {
                if let Some(&id) = live.get(&e.addr) {
                    pending.insert(e.addr);
                    if !completes_at_once(&device.events, index) {
                        let until_device_sync = match e.waits {
                            Some(waits) => waits.device_first(),
                            None if waits_named => false,
                            None => frees_deferred && !across_growth[index],
                        };
                        let op = Op::FreeRequested {
                            id,
                            until_device_sync,
                            outlasts_device_sync: outlasting[index],
                        };
                        workload.push(op, index);
                        held.insert(e.addr);
                    }
                }
            }
            Action::SegmentAlloc => {
                figures.recorded_segment_allocs += 1;
                segment_addresses.push((e.size, e.addr));
                reserved = reserved.saturating_add(e.size);
            }
            Action::SegmentMap => {
                figures.recorded_segment_maps += 1;
                reserved = reserved.saturating_add(e.size);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                if e.action == Action::SegmentFree {
                    figures.recorded_segment_frees += 1;
                } else {
                    figures.recorded_segment_unmaps += 1;
                }
                if !in_empty_cache && burst.is_none() {
                    burst = Some(Burst {
                        reserved_before: reserved,
                        request: None,
                    });
                }
                reserved = reserved.saturating_sub(e.size);
            }
            Action::Retry => {
                if retries_marked {
                    figures.recorded_retries += 1;
                }
                if let Some(b) = burst.as_mut() {
                    b.request = Some(e.size);
                }
            }
            Action::Oom => {
                if !retries_marked {
                    figures.recorded_retries += 1;
                }
                if figures.recorded_oom.is_none() {
                    figures.recorded_oom = Some(oom_at(index, e, reserved));
                }
                mark(&mut workload);
                workload.push(
                    Op::Oom {
                        // Asked for again as the program asked (a replay with other settings
                        // rounds it its own way); older files have only the rounded size.
                        size: e.requested.unwrap_or(e.size),
                        stream: StreamId(e.stream),
                        device_free: e.device_free.unwrap_or(0),
                    },
                    index,
                );
            }
            // Read by `range_changes` below; the reader keeps `end` out of the events.
            Action::RangeReserve | Action::RangeRelease | Action::End => {}
            Action::DeviceMemory => device_memory = device_memory.or(Some(e.size)),
            Action::EmptyCache => {
                figures.empty_cache_calls += 1;
                mark(&mut workload);
                workload.push(Op::EmptyCache, index);
            }
            Action::Capture => capture = Some((index, e)),
            // Its `free_completed`s follow (`run_of`).
            Action::SyncBeforeGrowth => {}
            Action::DeviceSynchronize => workload.push(Op::DeviceSynchronize, index),
            Action::MemoryFraction => {
                // (The reader refuses a line without it.)
                fraction = e.fraction.unwrap_or(1.0);
                workload.push(Op::MemoryFraction { fraction }, index);
            }
            Action::DeviceReset => {
                pending.clear();
                held.clear();
                let mut ids: Vec<AllocId> = live.drain().map(|(_, id)| id).collect();
                ids.sort_unstable();
                for id in ids {
                    workload.push(Op::Free { id }, index);
                }
                workload.push(Op::DeviceReset, index);
                reserved = 0;
            }
        }
        figures.recorded_peak_reserved_bytes = figures.recorded_peak_reserved_bytes.max(reserved);
        run_of = match e.action {
            Action::SyncBeforeGrowth | Action::DeviceSynchronize => Some(e.action),
            Action::FreeCompleted => run_of,
            _ => None,
        };
        in_empty_cache = match e.action {
            // One made during a capture gave nothing back: what follows is not its own.
            Action::EmptyCache => marked.is_none(),
            Action::SegmentFree | Action::SegmentUnmap => in_empty_cache,
            _ => passes_by && in_empty_cache,
        };
    }
    figures.end_reserved_bytes = reserved;
    figures.pending_frees = pending.len();
    let capacity = match (&figures.recorded_oom, failed_level) {
        (Some(oom), _) => Some(CapacityEstimate::Exact {
            bytes: oom.reserved_bytes.saturating_add(oom.device_free),
            oom_index: oom.event_index,
        }),
        (None, Some(high)) => Some(CapacityEstimate::Bracket {
            low: figures.recorded_peak_reserved_bytes,
            high,
        }),
        (None, None) => None,
    };
    let range_changes = device
        .events
        .iter()
        .filter_map(|e| match e.action {
            Action::SegmentMap => Some(RangeChange::Map {
                addr: e.addr,
                size: e.size,
                stream: StreamId(e.stream),
            }),
            Action::SegmentUnmap => Some(RangeChange::Unmap {
                addr: e.addr,
                size: e.size,
            }),
            Action::RangeReserve => Some(RangeChange::Reserve {
                addr: e.addr,
                size: e.size,
                page: e.page.unwrap_or(e.size),
            }),
            Action::RangeRelease => Some(RangeChange::Release { addr: e.addr }),
            Action::DeviceReset => Some(RangeChange::DeviceReset),
            _ => None,
        })
        .collect();
    RecordedDevice {
        workload,
        figures,
        segment_addresses,
        range_changes,
        capacity,
        device_memory,
    }
}

/// Whether `e` is the line that ends the request (or `empty_cache`) that `capture` marked: its
/// `alloc` (of the size that rounds to the marked one under the recorded `settings`), `oom` or
/// `empty_cache`, on the same stream.
fn ends_captured(capture: &Event, e: &Event, settings: &Settings) -> bool {
    let marked = match e.action {
        Action::Alloc => round_size(settings, e.size),
        Action::Oom => e.size,
        Action::EmptyCache => 0,
        _ => return false,
    };
    capture.size == marked && capture.stream == e.stream
}

/// Whether a line of `action` may come between a `capture` line and the end of its request:
/// the new memory the request took.
fn takes_new_memory(action: Action) -> bool {
    matches!(
        action,
        Action::SegmentAlloc | Action::RangeReserve | Action::SegmentMap
    )
}

/// Whether a pool holding `level` bytes is past the limit `fraction` sets on a device of
/// `device_memory` bytes: a segment refused there was refused by the limit (PyTorch's
/// `alloc_block` asks no device then), which says nothing of the device's capacity.
fn past_limit(level: u64, fraction: f64, device_memory: Option<u64>) -> bool {
    device_memory
        .and_then(|total| allowed_maximum(fraction, total))
        .is_some_and(|allowed| level > allowed)
}

fn oom_at(index: usize, e: &Event, reserved: u64) -> RecordedOom {
    RecordedOom {
        event_index: index,
        size: e.size,
        stream: StreamId(e.stream),
        device_free: e.device_free.unwrap_or(0),
        reserved_bytes: reserved,
    }
}
