//! The memory state a snapshot records, for the snapshots that hold no allocation trace to
//! replay (`torch.cuda.memory._snapshot()` taken in an out-of-memory handler, without
//! `_record_memory_history`): what each pool reserves, holds and has free, and the largest free
//! cached blocks (`MemoryState`). Whether a request of a given size would be served in that
//! state is `request_trial`'s.
//!
//! The state alone cannot say which settings would have avoided it (that depends on the
//! requests that led there, which only a recorded trace holds); it can say whether the memory
//! was exhausted or cut into pieces, and how.

use super::recording::{BlockState, DeviceRecording, RecordedSegment};
use crate::pool::{PoolKind, StreamId};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::fixtures::{BASE as SEG, MIB, segment, split_state};

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
    fn pending_frees_count_as_allocated() {
        let mut rec = split_state();
        rec.segments[1].blocks[0].state = BlockState::PendingFree;
        let state = MemoryState::of(&rec);
        assert_eq!(state.large.allocated, 120 * MIB);
        assert_eq!(state.large.pending_free, 60 * MIB);
    }

    /// Each stream's largest free block is the largest of its blocks, wherever it lies (here a
    /// smaller one lies above it).
    #[test]
    fn a_streams_largest_free_block_is_its_largest_anywhere() {
        let mut rec = split_state();
        rec.segments.push(segment(
            SEG + 0x3000_0000,
            20 * MIB,
            &[
                (0, 10 * MIB, 10 * MIB, true),
                (10 * MIB, 10 * MIB, 0, false),
            ],
        ));
        let state = MemoryState::of(&rec);
        assert_eq!(state.streams[0].largest_free_block, 40 * MIB);
    }

    /// The list of the largest free blocks holds `LISTED_FREE_BLOCKS` of them, no fewer, when
    /// there are more.
    #[test]
    fn the_largest_free_blocks_are_listed_up_to_the_limit() {
        let segments: Vec<_> = (0..LISTED_FREE_BLOCKS as u64 + 2)
            .map(|i| {
                segment(
                    SEG + i * 0x1000_0000,
                    40 * MIB,
                    &[
                        (0, 10 * MIB, 10 * MIB, true),
                        (10 * MIB, (20 + i) * MIB, 0, false),
                        ((30 + i) * MIB, (10 - i) * MIB, (10 - i) * MIB, true),
                    ],
                )
            })
            .collect();
        let state = MemoryState::of(&crate::trace::fixtures::recording(vec![], segments));
        let sizes: Vec<u64> = state
            .largest_free_blocks
            .iter()
            .map(|b| b.size / MIB)
            .collect();
        assert_eq!(sizes, [29, 28, 27, 26, 25, 24, 23, 22]);
    }
}
