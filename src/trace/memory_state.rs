//! The memory state a snapshot records, for the snapshots that hold no allocation trace to
//! replay (`torch.cuda.memory._snapshot()` taken in an out-of-memory handler, without
//! `_record_memory_history`): what each pool reserves, holds and has free, and the largest free
//! cached blocks (`MemoryState`); and whether a request of a given size would be served in that
//! state, with the out-of-memory report when it would not (`try_request`).
//!
//! The state alone cannot say which settings would have avoided it (that depends on the
//! requests that led there, which only a recorded trace holds); it can say whether the memory
//! was exhausted or cut into pieces, and how.

use super::error::TraceError;
use super::expandable_state::SeedRange;
use super::recording::{DeviceRecording, RecordedSegment};
use super::replay::{ReplayConfig, seeded_pool};
use super::start_state::{SeedBlock, StartState, end_state};
use crate::backend::sim::SimDevice;
use crate::pool::rounding::{pool_for, round_size};
use crate::pool::{DeviceAllocator, DevicePtr, Error, OomReport, PoolKind, StreamId};
use crate::trace::recording::BlockState;

/// How many of the largest free cached blocks a `MemoryState` keeps.
pub const LISTED_FREE_BLOCKS: usize = 8;

/// What one pool (or both together) holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolMemory {
    pub segments: usize,
    pub reserved: u64,
    /// Bytes of blocks allocated or pending their free (block sizes, as the pool counts them).
    pub allocated: u64,
    /// What their allocations asked for.
    pub requested: u64,
    /// Bytes of blocks whose free waits for work on other streams (`active_pending_free`).
    pub pending_free: u64,
    /// Reserved but unallocated: the free cached blocks.
    pub free: u64,
    pub free_blocks: usize,
    pub largest_free_block: u64,
    /// Segments wholly free, and their bytes: what the allocator returns to the device when a
    /// request finds no room (and `empty_cache()` does). The rest of `free` lies in segments
    /// that also hold allocations, and stays reserved until they are freed.
    pub free_segments: usize,
    pub free_segment_bytes: u64,
}

impl PoolMemory {
    /// Count `seg` and its blocks in.
    fn add_segment(&mut self, seg: &RecordedSegment) {
        self.segments = self.segments.saturating_add(1);
        self.reserved = self.reserved.saturating_add(seg.total_size);
        if seg.blocks.iter().all(|b| b.state == BlockState::Inactive) {
            self.free_segments = self.free_segments.saturating_add(1);
            self.free_segment_bytes = self.free_segment_bytes.saturating_add(seg.total_size);
        }
        for b in &seg.blocks {
            match b.state {
                BlockState::Inactive => {
                    self.free = self.free.saturating_add(b.size);
                    self.free_blocks = self.free_blocks.saturating_add(1);
                    self.largest_free_block = self.largest_free_block.max(b.size);
                }
                BlockState::Allocated | BlockState::PendingFree => {
                    self.allocated = self.allocated.saturating_add(b.size);
                    self.requested = self.requested.saturating_add(b.requested_size);
                    if b.state == BlockState::PendingFree {
                        self.pending_free = self.pending_free.saturating_add(b.size);
                    }
                }
            }
        }
    }

    fn add(&mut self, other: &PoolMemory) {
        self.segments = self.segments.saturating_add(other.segments);
        self.reserved = self.reserved.saturating_add(other.reserved);
        self.allocated = self.allocated.saturating_add(other.allocated);
        self.requested = self.requested.saturating_add(other.requested);
        self.pending_free = self.pending_free.saturating_add(other.pending_free);
        self.free = self.free.saturating_add(other.free);
        self.free_blocks = self.free_blocks.saturating_add(other.free_blocks);
        self.largest_free_block = self.largest_free_block.max(other.largest_free_block);
        self.free_segments = self.free_segments.saturating_add(other.free_segments);
        self.free_segment_bytes = self
            .free_segment_bytes
            .saturating_add(other.free_segment_bytes);
    }
}

/// What the segments of one stream hold (a block is reused only on its segment's stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamMemory {
    pub stream: StreamId,
    pub reserved: u64,
    pub free: u64,
    pub largest_free_block: u64,
}

/// One free cached block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeBlock {
    pub addr: u64,
    pub size: u64,
    pub pool: PoolKind,
    pub stream: StreamId,
}

/// A device's memory state as its snapshot records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryState {
    /// The default pools, which serve a program's requests outside CUDA graph captures and
    /// `torch.cuda.MemPool` contexts.
    pub small: PoolMemory,
    pub large: PoolMemory,
    /// The private pools (CUDA graphs', `torch.cuda.MemPool`s'), small and large together: a
    /// request to the default pools never uses their blocks, and the allocator returns their
    /// segments to the device only once their graph or pool is gone.
    pub private: PoolMemory,
    /// The private pools' ids (`segment_pool_id`), in order.
    pub private_pools: Vec<(u64, u64)>,
    /// The default pools' memory by stream, in the order of their ids.
    pub streams: Vec<StreamMemory>,
    /// The default pools' largest free cached blocks, largest first (at most
    /// `LISTED_FREE_BLOCKS`).
    pub largest_free_blocks: Vec<FreeBlock>,
}

impl MemoryState {
    /// The state of `rec`'s end-state segments.
    pub fn of(rec: &DeviceRecording) -> Self {
        let mut state = MemoryState {
            small: PoolMemory::default(),
            large: PoolMemory::default(),
            private: PoolMemory::default(),
            private_pools: Vec::new(),
            streams: Vec::new(),
            largest_free_blocks: Vec::new(),
        };
        let mut free_blocks = Vec::new();
        for seg in &rec.segments {
            if let Some(id) = seg.private_pool {
                state.private.add_segment(seg);
                state.private_pools.push(id);
                continue;
            }
            match seg.pool {
                PoolKind::Small => state.small.add_segment(seg),
                PoolKind::Large => state.large.add_segment(seg),
            }
            let stream = match state.streams.iter_mut().find(|s| s.stream == seg.stream) {
                Some(stream) => stream,
                None => {
                    state.streams.push(StreamMemory {
                        stream: seg.stream,
                        reserved: 0,
                        free: 0,
                        largest_free_block: 0,
                    });
                    state.streams.last_mut().expect("just pushed")
                }
            };
            stream.reserved = stream.reserved.saturating_add(seg.total_size);
            for b in seg
                .blocks
                .iter()
                .filter(|b| b.state == BlockState::Inactive)
            {
                stream.free = stream.free.saturating_add(b.size);
                stream.largest_free_block = stream.largest_free_block.max(b.size);
                free_blocks.push(FreeBlock {
                    addr: b.address,
                    size: b.size,
                    pool: seg.pool,
                    stream: seg.stream,
                });
            }
        }
        state.private_pools.sort_unstable();
        state.private_pools.dedup();
        state.streams.sort_by_key(|s| s.stream.0);
        free_blocks.sort_by(|a, b| b.size.cmp(&a.size).then(a.addr.cmp(&b.addr)));
        free_blocks.truncate(LISTED_FREE_BLOCKS);
        state.largest_free_blocks = free_blocks;
        state
    }

    /// The default pools together.
    pub fn default_pools(&self) -> PoolMemory {
        let mut both = self.small;
        both.add(&self.large);
        both
    }

    /// Every pool: what the device's memory statistics count (`reserved_bytes.all`, …).
    pub fn total(&self) -> PoolMemory {
        let mut total = self.default_pools();
        total.add(&self.private);
        total
    }
}

/// What became of a request tried in a recorded state.
#[derive(Clone, Debug, PartialEq)]
pub enum RequestOutcome {
    /// Served from the free cached block of `block_size` bytes at `block_addr`.
    Cached { block_addr: u64, block_size: u64 },
    /// Served from a new segment of `segment` bytes obtained from the device, after returning
    /// `released_segments` cached segments to it (a retry, when more than none).
    NewSegment {
        segment: u64,
        released_segments: u64,
    },
    /// Served at `addr` by mapping `mapped` bytes of pages into an expandable segment: into
    /// the range at `range` of `range_size` bytes, reserved for it when `new_range`. First
    /// `unmapped` bytes of free pages were unmapped (a retry, when more than none).
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

/// A request tried in a recorded state.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestTrial {
    pub requested: u64,
    /// The block size after rounding, and the pool that serves it.
    pub rounded: u64,
    pub pool: PoolKind,
    pub stream: StreamId,
    pub outcome: RequestOutcome,
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
/// PyTorch's does before it returns cached segments to the device when a request finds no room
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
    let before = pool.stats();
    let outcome = match pool.malloc(size, stream) {
        Ok(ptr) => {
            let after = pool.stats();
            let (counts, reserved) = (after.counts, after.reserved_bytes.all);
            let span = pool
                .segment_of(ptr.addr())
                .ok_or_else(|| served_from_nowhere(ptr))?;
            if span.expandable && counts.num_device_alloc > before.counts.num_device_alloc {
                let mapped = reserved.allocated - before.reserved_bytes.all.allocated;
                let unmapped = reserved.freed - before.reserved_bytes.all.freed;
                RequestOutcome::Mapped {
                    addr: ptr.addr(),
                    range: span.start,
                    range_size: span.size,
                    new_range: !state.ranges.iter().any(|r| r.addr == span.start),
                    mapped: mapped.unsigned_abs(),
                    unmapped: unmapped.unsigned_abs(),
                }
            } else if counts.num_device_alloc > before.counts.num_device_alloc {
                RequestOutcome::NewSegment {
                    segment: span.size,
                    released_segments: counts.num_device_free - before.counts.num_device_free,
                }
            } else {
                let block = state
                    .blocks()
                    .find(|b| !b.allocated && b.addr <= ptr.addr() && ptr.addr() < b.addr + b.size);
                // Without a new segment or pages, only a block free in the state can have
                // served it.
                let block = block.ok_or_else(|| served_from_nowhere(ptr))?;
                RequestOutcome::Cached {
                    block_addr: block.addr,
                    block_size: block.size,
                }
            }
        }
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
    })
}

/// A request served where no segment, free block or mapped page of the trial lies: a bug,
/// reported.
fn served_from_nowhere(ptr: DevicePtr) -> Error {
    Error::Invariant(format!(
        "a request was served at {:#x}, in no new segment and no free block of the state",
        ptr.addr()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{OomHint, Settings};
    use crate::trace::fixtures::{recording, segment};
    use crate::trace::start_state::end_state;

    const MIB: u64 = 1 << 20;
    const SEG: u64 = 0x7f00_0000_0000;

    /// Two 100 MiB segments, each with 60 MiB allocated at its front and 40 MiB free behind,
    /// and a small segment with 1 KiB allocated.
    fn split_state() -> DeviceRecording {
        recording(
            vec![],
            vec![
                segment(
                    SEG,
                    2 * MIB,
                    &[(0, 1024, 1000, true), (1024, 2 * MIB - 1024, 0, false)],
                ),
                segment(
                    SEG + 0x1000_0000,
                    100 * MIB,
                    &[
                        (0, 60 * MIB, 60 * MIB, true),
                        (60 * MIB, 40 * MIB, 0, false),
                    ],
                ),
                segment(
                    SEG + 0x2000_0000,
                    100 * MIB,
                    &[
                        (0, 60 * MIB, 60 * MIB - 5, true),
                        (60 * MIB, 40 * MIB, 0, false),
                    ],
                ),
            ],
        )
    }

    fn device(state: &StartState, free: u64) -> ReplayConfig {
        ReplayConfig {
            capacity: Some(state.reserved_bytes() + free),
            settings: Settings::default(),
            ..ReplayConfig::default()
        }
    }

    #[test]
    fn counts_each_pool_and_lists_the_largest_free_blocks() {
        let state = MemoryState::of(&split_state());
        assert_eq!(state.small.segments, 1);
        assert_eq!((state.small.allocated, state.small.requested), (1024, 1000));
        assert_eq!(state.small.largest_free_block, 2 * MIB - 1024);
        assert_eq!(state.large.reserved, 200 * MIB);
        assert_eq!(state.large.allocated, 120 * MIB);
        assert_eq!(state.large.requested, 120 * MIB - 5);
        assert_eq!((state.large.free, state.large.free_blocks), (80 * MIB, 2));
        let total = state.total();
        assert_eq!(total.reserved, 202 * MIB);
        assert_eq!(total.free_blocks, 3);
        assert_eq!(total.largest_free_block, 40 * MIB);
        let sizes: Vec<u64> = state.largest_free_blocks.iter().map(|b| b.size).collect();
        assert_eq!(sizes, [40 * MIB, 40 * MIB, 2 * MIB - 1024]);
        // Equal sizes in address order.
        assert_eq!(
            state.largest_free_blocks[0].addr,
            SEG + 0x1000_0000 + 60 * MIB
        );
        assert_eq!(state.streams.len(), 1);
        assert_eq!(state.streams[0].free, 80 * MIB + 2 * MIB - 1024);
        assert_eq!(total.free_segments, 0, "every segment holds an allocation");
    }

    #[test]
    fn wholly_free_segments_are_counted_apart() {
        let mut rec = split_state();
        rec.segments.push(segment(
            SEG + 0x3000_0000,
            20 * MIB,
            &[(0, 20 * MIB, 0, false)],
        ));
        let state = MemoryState::of(&rec);
        assert_eq!(
            (state.large.free_segments, state.large.free_segment_bytes),
            (1, 20 * MIB)
        );
        assert_eq!(state.large.free, 100 * MIB);
        assert_eq!(state.small.free_segments, 0);
    }

    #[test]
    fn a_request_a_free_block_holds_is_served_from_it() {
        let state = end_state(&split_state(), u64::MAX).unwrap();
        let trial = try_request(&state, &[], &device(&state, 0), 30 * MIB, StreamId(0)).unwrap();
        assert_eq!(trial.pool, PoolKind::Large);
        assert_eq!(
            trial.outcome,
            RequestOutcome::Cached {
                block_addr: SEG + 0x1000_0000 + 60 * MIB,
                block_size: 40 * MIB
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
                largest_free_block,
                suggested_max_split_size_mb,
                ..
            } => {
                assert_eq!(unallocated, 80 * MIB + 2 * MIB - 1024);
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
        assert_eq!(
            trial.unwrap().outcome,
            RequestOutcome::NewSegment {
                segment: 90 * MIB,
                released_segments: 1
            }
        );
        // Taken as in use, as the snapshot has it: the same request runs out of memory.
        let trial = try_request(&state, &[], &device(&state, 0), 90 * MIB, StreamId(0));
        assert!(matches!(
            trial.unwrap().outcome,
            RequestOutcome::OutOfMemory(_)
        ));
    }

    #[test]
    fn pending_frees_count_as_allocated() {
        let mut rec = split_state();
        rec.segments[1].blocks[0].state = BlockState::PendingFree;
        let state = MemoryState::of(&rec);
        assert_eq!(state.large.allocated, 120 * MIB);
        assert_eq!(state.large.pending_free, 60 * MIB);
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
}
