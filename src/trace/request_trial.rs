//! Trying a request in a recorded state (`cachealloc state --request`): the snapshot's end
//! state installed in a pool on a simulated device of the memory the user gives, and one
//! malloc through it — served from a cached block, by a new segment or pages mapped, or refused
//! with the pool's out-of-memory report — with the calls the pool made to the device on the
//! way, in order.

use super::error::TraceError;
use super::expandable_state::SeedRange;
use super::recording::{BlockState, DeviceRecording};
use super::replay::{ReplayConfig, seeded_pool};
use super::start_state::{SeedBlock, StartState, end_state};
use crate::backend::sim::SimDevice;
use crate::pool::rounding::{pool_for, round_size};
use crate::pool::{DeviceAllocator, DevicePtr, Error, OomReport, PoolEvent, PoolKind, StreamId};
use std::sync::{Arc, Mutex};

/// What became of a request tried in a recorded state.
#[derive(Clone, Debug, PartialEq)]
pub enum RequestOutcome {
    /// Served from the cached block of `block_size` bytes at `block_addr`: free in the state,
    /// or `was_pending` its free there (it completed when the pool synchronized).
    Cached {
        block_addr: u64,
        block_size: u64,
        was_pending: bool,
    },
    /// Served from a new segment of `segment` bytes obtained from the device, after returning
    /// `released_segments` cached segments to it (a retry, when more than none).
    NewSegment {
        segment: u64,
        released_segments: u64,
    },
    /// Served at `addr` in an expandable segment after pages were mapped: in the range at
    /// `range` of `range_size` bytes, reserved for it when `new_range`. `mapped` and
    /// `unmapped` are the bytes of pages mapped and unmapped on the way, in all.
    Mapped {
        addr: u64,
        range: u64,
        range_size: u64,
        new_range: bool,
        mapped: u64,
        unmapped: u64,
    },
    /// Refused: out of memory, with the report the pool gave.
    OutOfMemory(Box<OomReport>),
}

/// A call the pool made to the device for the request (consecutive calls of one kind
/// counted together).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceCall {
    /// Cached segments returned to the device (cudaFree): how many, and their bytes.
    Release { segments: u64, bytes: u64 },
    /// Free cached pages of expandable segments unmapped.
    Unmap { bytes: u64 },
    /// An address range reserved for an expandable segment.
    ReserveRange { addr: u64, size: u64 },
    /// Pages mapped into expandable segments.
    Map { bytes: u64 },
    /// A segment obtained (cudaMalloc).
    Allocate { bytes: u64 },
}

impl DeviceCall {
    /// The call of `event`, if it is one.
    fn of(event: &PoolEvent) -> Option<DeviceCall> {
        Some(match *event {
            PoolEvent::SegmentFree { size, .. } => DeviceCall::Release {
                segments: 1,
                bytes: size,
            },
            PoolEvent::SegmentUnmap { size, .. } => DeviceCall::Unmap { bytes: size },
            PoolEvent::RangeReserve { ptr, size, .. } => DeviceCall::ReserveRange {
                addr: ptr.addr(),
                size,
            },
            PoolEvent::SegmentMap { size, .. } => DeviceCall::Map { bytes: size },
            PoolEvent::SegmentAlloc { size, .. } => DeviceCall::Allocate { bytes: size },
            _ => return None,
        })
    }

    /// `next` counted into this call, when they are of one kind that adds up.
    fn absorb(&mut self, next: DeviceCall) -> bool {
        match (self, next) {
            (
                DeviceCall::Release { segments, bytes },
                DeviceCall::Release {
                    segments: more,
                    bytes: b,
                },
            ) => {
                *segments += more;
                *bytes += b;
            }
            (DeviceCall::Unmap { bytes }, DeviceCall::Unmap { bytes: b })
            | (DeviceCall::Map { bytes }, DeviceCall::Map { bytes: b }) => *bytes += b,
            _ => return false,
        }
        true
    }
}

/// A request tried in a recorded state.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestTrial {
    pub requested: u64,
    /// The block size after rounding, and the pool that serves it.
    pub rounded: u64,
    pub pool: PoolKind,
    pub stream: StreamId,
    pub outcome: RequestOutcome,
    /// The calls the pool made to the device for it, in order.
    pub calls: Vec<DeviceCall>,
    /// Whether the pool retried after returning cached memory (`num_alloc_retries`).
    pub retried: bool,
}

/// The state a request is tried in, on a device of `device_memory` bytes: `rec`'s end state,
/// with each segment of a private pool held whole, as one allocated block, since a request to
/// the default pools neither uses a private pool's free blocks nor returns its segments to the
/// device. (A private pool's expandable segment is held the same way, run by run.)
pub fn trial_state(rec: &DeviceRecording, device_memory: u64) -> Result<StartState, TraceError> {
    let mut state = end_state(rec, device_memory)?;
    let mut private: Vec<u64> = rec
        .segments
        .iter()
        .filter(|s| s.private_pool.is_some())
        .map(|s| s.address)
        .collect();
    private.sort_unstable();
    let is_private = |addr: u64| private.binary_search(&addr).is_ok();
    let (private_ranges, ranges): (Vec<SeedRange>, Vec<SeedRange>) =
        std::mem::take(&mut state.ranges)
            .into_iter()
            .partition(|r| r.runs.iter().any(|run| is_private(run.addr)));
    state.ranges = ranges;
    state
        .segments
        .extend(private_ranges.into_iter().flat_map(|r| r.runs));
    state.segments.sort_by_key(|s| s.addr);
    for seg in &mut state.segments {
        if is_private(seg.addr) {
            seg.blocks = vec![SeedBlock {
                addr: seg.addr,
                size: seg.size,
                requested: seg.size,
                allocated: true,
                id: None,
            }];
        }
    }
    Ok(state)
}

/// The addresses of the blocks of `rec`'s default pools whose free is pending
/// (`active_pending_free`: freed while other streams still use them, `record_stream`).
pub fn pending_frees(rec: &DeviceRecording) -> Vec<u64> {
    rec.segments
        .iter()
        .filter(|s| s.private_pool.is_none())
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::PendingFree)
        .map(|b| b.address)
        .collect()
}

/// Request `size` bytes on `stream` from a pool holding `state`, on the device `config`
/// describes (its capacity: what the state reserves plus what the device had free). The blocks
/// at `pending` (allocated in `state`) are freed first, pending until the other streams' work
/// completes: the trial takes that work as not done until the pool synchronizes, which
/// PyTorch's does before it returns cached memory to the device when a request finds no room
/// (`synchronize_and_free_events`).
pub fn try_request(
    state: &StartState,
    pending: &[u64],
    config: &ReplayConfig,
    size: u64,
    stream: StreamId,
) -> Result<RequestTrial, Error> {
    let mut pool: DeviceAllocator<SimDevice> = seeded_pool(config, Some(&state.layout()))?;
    pool.backend_mut().hold_work();
    for &addr in pending {
        let ptr = DevicePtr::new(addr).ok_or_else(|| {
            Error::InvalidSeed(
                "a block pending its free at address 0, which is no device address".to_string(),
            )
        })?;
        pool.free_after_streams(ptr, &[])?;
    }
    let calls = Arc::new(Mutex::new(Vec::<DeviceCall>::new()));
    let sink = Arc::clone(&calls);
    pool.set_event_sink(Some(Box::new(move |event: &PoolEvent| {
        let Some(call) = DeviceCall::of(event) else {
            return;
        };
        let mut calls = sink.lock().unwrap_or_else(|e| e.into_inner());
        if !calls.last_mut().is_some_and(|last| last.absorb(call)) {
            calls.push(call);
        }
    })));
    let retries = pool.stats().counts.num_alloc_retries;
    let result = pool.malloc(size, stream);
    pool.set_event_sink(None);
    let calls = std::mem::take(&mut *calls.lock().unwrap_or_else(|e| e.into_inner()));
    let outcome = match result {
        Ok(ptr) => served(&pool, state, pending, &calls, ptr)?,
        Err(Error::OutOfMemory(report)) => RequestOutcome::OutOfMemory(report),
        Err(e) => return Err(e),
    };
    let rounded = round_size(&config.settings, size);
    Ok(RequestTrial {
        requested: size,
        rounded,
        pool: pool_for(rounded),
        stream,
        outcome,
        retried: pool.stats().counts.num_alloc_retries > retries,
        calls,
    })
}

/// How the request served at `ptr` was served, from the pool after it and its device calls.
fn served(
    pool: &DeviceAllocator<SimDevice>,
    state: &StartState,
    pending: &[u64],
    calls: &[DeviceCall],
    ptr: DevicePtr,
) -> Result<RequestOutcome, Error> {
    let span = pool
        .segment_of(ptr.addr())
        .ok_or_else(|| served_from_nowhere(ptr))?;
    let total = |pick: fn(&DeviceCall) -> u64| calls.iter().map(pick).sum::<u64>();
    let mapped = total(|c| match c {
        DeviceCall::Map { bytes } => *bytes,
        _ => 0,
    });
    if span.expandable && mapped > 0 {
        return Ok(RequestOutcome::Mapped {
            addr: ptr.addr(),
            range: span.start,
            range_size: span.size,
            new_range: !state.ranges.iter().any(|r| r.addr == span.start),
            mapped,
            unmapped: total(|c| match c {
                DeviceCall::Unmap { bytes } => *bytes,
                _ => 0,
            }),
        });
    }
    if calls
        .iter()
        .any(|c| matches!(c, DeviceCall::Allocate { .. }))
    {
        return Ok(RequestOutcome::NewSegment {
            segment: span.size,
            released_segments: total(|c| match c {
                DeviceCall::Release { segments, .. } => *segments,
                _ => 0,
            }),
        });
    }
    // Without a new segment or pages, only a block free in the state, or freed pending there,
    // can have served it.
    let was_pending = |b: &SeedBlock| b.allocated && pending.contains(&b.addr);
    let block = state
        .blocks()
        .find(|b| {
            (!b.allocated || was_pending(b)) && b.addr <= ptr.addr() && ptr.addr() < b.addr + b.size
        })
        .ok_or_else(|| served_from_nowhere(ptr))?;
    Ok(RequestOutcome::Cached {
        block_addr: block.addr,
        block_size: block.size,
        was_pending: was_pending(block),
    })
}

/// A request served where no segment, free block or mapped page of the trial lies: a bug,
/// reported.
fn served_from_nowhere(ptr: DevicePtr) -> Error {
    Error::Invariant(format!(
        "a request was served at {:#x}, in no new segment, mapped page or block free in the \
         state",
        ptr.addr()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{OomHint, Settings};
    use crate::trace::fixtures::{BASE as SEG, MIB, recording, segment, split_state};
    use crate::trace::recording::RecordedSegment;

    fn device(state: &StartState, free: u64) -> ReplayConfig {
        ReplayConfig {
            capacity: Some(state.reserved_bytes() + free),
            settings: Settings::default(),
            ..ReplayConfig::default()
        }
    }

    #[test]
    fn a_request_a_free_block_holds_is_served_from_it() {
        let state = end_state(&split_state(), u64::MAX).unwrap();
        let trial = try_request(&state, &[], &device(&state, 0), 30 * MIB, StreamId(0)).unwrap();
        assert_eq!(trial.pool, PoolKind::Large);
        assert!(trial.calls.is_empty(), "{:?}", trial.calls);
        assert!(!trial.retried);
        assert_eq!(
            trial.outcome,
            RequestOutcome::Cached {
                block_addr: SEG + 0x1000_0000 + 60 * MIB,
                block_size: 40 * MIB,
                was_pending: false
            }
        );
    }

    #[test]
    fn a_request_larger_than_every_free_block_is_fragmentation_on_a_full_device() {
        let state = end_state(&split_state(), u64::MAX).unwrap();
        let trial = try_request(&state, &[], &device(&state, 0), 50 * MIB, StreamId(0)).unwrap();
        let RequestOutcome::OutOfMemory(report) = trial.outcome else {
            panic!("80 MiB free in two 40 MiB pieces cannot hold 50 MiB");
        };
        match report.hint() {
            OomHint::Fragmentation {
                unallocated,
                other_pool_unallocated,
                largest_free_block,
                suggested_max_split_size_mb,
                ..
            } => {
                // The small pool's free memory is counted apart: no large block comes from it.
                assert_eq!(unallocated, 80 * MIB);
                assert_eq!(other_pool_unallocated, 2 * MIB - 1024);
                assert_eq!(largest_free_block, 40 * MIB);
                assert_eq!(suggested_max_split_size_mb, Some(32));
            }
            other => panic!("expected fragmentation, got {other:?}"),
        }
    }

    #[test]
    fn free_device_memory_gives_a_new_segment() {
        let state = end_state(&split_state(), u64::MAX).unwrap();
        let trial = try_request(
            &state,
            &[],
            &device(&state, 64 * MIB),
            50 * MIB,
            StreamId(0),
        )
        .unwrap();
        assert_eq!(
            trial.outcome,
            RequestOutcome::NewSegment {
                segment: 50 * MIB,
                released_segments: 0
            }
        );
        assert_eq!(trial.calls, [DeviceCall::Allocate { bytes: 50 * MIB }]);
        assert!(
            !trial.retried,
            "a cudaMalloc that succeeds first time is no retry"
        );
    }

    #[test]
    fn more_than_reserved_and_free_together_is_exhaustion() {
        let state = end_state(&split_state(), u64::MAX).unwrap();
        let trial = try_request(&state, &[], &device(&state, 0), 100 * MIB, StreamId(0)).unwrap();
        let RequestOutcome::OutOfMemory(report) = trial.outcome else {
            panic!("121 MiB allocated + 100 MiB cannot fit in 202 MiB");
        };
        assert!(matches!(report.hint(), OomHint::Exhausted { .. }));
    }

    #[test]
    fn a_block_cached_for_another_stream_is_named() {
        let state = end_state(&split_state(), u64::MAX).unwrap();
        let trial = try_request(&state, &[], &device(&state, 0), 30 * MIB, StreamId(7)).unwrap();
        let RequestOutcome::OutOfMemory(report) = trial.outcome else {
            panic!("stream 7 has no cached block");
        };
        assert!(matches!(report.hint(), OomHint::OtherStream { .. }));
    }

    /// A block pending its free is not reused while the other streams' work may use it, and
    /// is reused once the pool synchronizes before returning segments to the device.
    #[test]
    fn pending_frees_complete_when_the_pool_synchronizes() {
        let mut rec = split_state();
        rec.segments[1].blocks[0].state = BlockState::PendingFree;
        let pending = pending_frees(&rec);
        assert_eq!(pending, [SEG + 0x1000_0000]);
        let state = end_state(&rec, u64::MAX).unwrap();
        // 90 MiB: no free block holds it; the 100 MiB segment is whole once the pending free
        // completes, and is returned for a 90 MiB one.
        let trial = try_request(&state, &pending, &device(&state, 0), 90 * MIB, StreamId(0));
        let trial = trial.unwrap();
        assert_eq!(
            trial.outcome,
            RequestOutcome::NewSegment {
                segment: 90 * MIB,
                released_segments: 1
            }
        );
        // The calls in order: the whole segment returned, then the new one obtained.
        assert_eq!(
            trial.calls,
            [
                DeviceCall::Release {
                    segments: 1,
                    bytes: 100 * MIB
                },
                DeviceCall::Allocate { bytes: 90 * MIB }
            ]
        );
        assert!(trial.retried);
        // Taken as in use, as the snapshot has it: the same request runs out of memory.
        let trial = try_request(&state, &[], &device(&state, 0), 90 * MIB, StreamId(0));
        assert!(matches!(
            trial.unwrap().outcome,
            RequestOutcome::OutOfMemory(_)
        ));
    }

    /// A private pool's expandable segment is held whole: its free block serves no request to
    /// the default pools, and its pages are not unmapped for one.
    #[test]
    fn a_private_pools_expandable_segment_is_held() {
        let page = 20 * MIB;
        let run = |addr: u64, blocks: &[(u64, u64, u64, bool)], pool: Option<(u64, u64)>| {
            RecordedSegment {
                is_expandable: true,
                private_pool: pool,
                ..segment(addr, page, blocks)
            }
        };
        let rec = recording(
            vec![],
            vec![
                run(
                    SEG,
                    &[
                        (0, 10 * MIB, 10 * MIB, true),
                        (10 * MIB, 10 * MIB, 0, false),
                    ],
                    None,
                ),
                run(SEG + 0x1_0000_0000, &[(0, page, 0, false)], Some((0, 1))),
            ],
        );
        let settings = Settings {
            expandable_segments: true,
            ..Settings::default()
        };
        let on = |free: u64| ReplayConfig {
            capacity: Some(2 * page + free),
            settings: settings.clone(),
            ..ReplayConfig::default()
        };
        let state = trial_state(&rec, 1 << 30).unwrap();
        assert_eq!(
            state.ranges.len(),
            1,
            "the private run is held as a segment"
        );
        let trial = try_request(&state, &[], &on(0), 15 * MIB, StreamId(0)).unwrap();
        assert!(
            matches!(trial.outcome, RequestOutcome::OutOfMemory(_)),
            "{:?}",
            trial.outcome
        );
        let trial = try_request(&state, &[], &on(page), 15 * MIB, StreamId(0)).unwrap();
        assert_eq!(
            trial.outcome,
            RequestOutcome::Mapped {
                addr: SEG + 10 * MIB,
                range: SEG,
                range_size: crate::pool::range_size(1 << 30, PoolKind::Large),
                new_range: false,
                mapped: page,
                unmapped: 0
            }
        );
    }

    /// A block whose free was pending becomes free while the request fails (the pool
    /// synchronizes before returning memory), after the search that PyTorch does not repeat:
    /// the out-of-memory says so, not fragmentation.
    #[test]
    fn a_block_freed_during_the_request_is_told_apart() {
        let rec = recording(
            vec![],
            vec![segment(
                SEG,
                70 * MIB,
                &[
                    (0, 20 * MIB, 20 * MIB, true),
                    (20 * MIB, 50 * MIB, 50 * MIB, true),
                ],
            )],
        );
        let pending = [SEG + 20 * MIB];
        let state = end_state(&rec, u64::MAX).unwrap();
        let trial = try_request(&state, &pending, &device(&state, 0), 30 * MIB, StreamId(0));
        let RequestOutcome::OutOfMemory(report) = trial.unwrap().outcome else {
            panic!("PyTorch does not search the cache again after the retry");
        };
        assert_eq!(
            report.hint(),
            OomHint::FreedDuringRequest {
                request: 30 * MIB,
                block: 50 * MIB
            }
        );
        assert!(!report.hint().settings_may_help());
        assert!(report.to_string().contains("Freed too late"), "{report}");
    }

    /// A private pool's block pending its free is no free of the default pools': its segment
    /// stays held whole, and a request the default pools cannot serve otherwise runs out of
    /// memory.
    #[test]
    fn a_private_pools_pending_free_frees_nothing_for_the_default_pools() {
        let mut rec = recording(
            vec![],
            vec![segment(SEG, 20 * MIB, &[(0, 20 * MIB, 20 * MIB, true)])],
        );
        rec.segments[0].private_pool = Some((0, 1));
        rec.segments[0].blocks[0].state = BlockState::PendingFree;
        assert!(pending_frees(&rec).is_empty());
        let state = trial_state(&rec, u64::MAX).unwrap();
        let trial = try_request(
            &state,
            &pending_frees(&rec),
            &device(&state, 0),
            20 * MIB,
            StreamId(0),
        );
        assert!(
            matches!(trial.unwrap().outcome, RequestOutcome::OutOfMemory(_)),
            "the private pool's segment served a request to the default pools"
        );
    }
}
