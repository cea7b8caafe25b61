//! The allocator state at trace start, rebuilt from the end state (replay-parity reference §1).
//!
//! Most recordings start mid-run, with segments and live blocks already there. To replay them
//! faithfully the pool is seeded with that state: every segment at its real address, each
//! covered contiguously by its blocks (free ones included), and the blocks that the trace later
//! frees carrying the `AllocId` the workload's `Op::Free` uses.
//!
//! Method: start from the end-state `segments` of the device and walk the trace backwards,
//! undoing each entry. Between frees the allocator keeps free space coalesced, so the state is
//! the segments plus their occupied blocks; free blocks are the gaps. A block whose free waits
//! for other streams (`record_stream`) is occupied until its `free_completed`: one requested
//! before the trace and completed in it is rebuilt as allocated at the start, one still waiting
//! at the end is the state's `active_pending_free` block (tests/fixed_cuts.rs checks both).
//! - `alloc` (undo): the block at the address disappears (its space rejoins the gap).
//! - `free_completed` (undo; `free_requested` when the file has no completions, see
//!   `DeviceRecording::free_action`): a block reappears at the address. Its size is the request rounded by the recording's settings,
//!   **plus any unsplit tail**: in the large pool a block is split only when more than 1 MiB
//!   would remain, so a block may have kept a tail of up to 1 MiB that the trace never shows.
//!   Since no free large-pool block can be 1 MiB or smaller, a gap of ≤ 1 MiB between a
//!   reappearing block and the next occupied block (or the segment end) belongs to the block;
//!   when a block later reappears ≤ 1 MiB past an earlier one whose end was a guess, that
//!   earlier block is extended to it (the "first real allocation just past it" fixes its end).
//!   Under `max_split_size` (the recording's settings say so) a request of that size or more
//!   is never split off its block: a cached block less than `max_non_split_rounding` (20 MiB)
//!   larger, or a segment of its own rounded up to 2 MiB, is taken whole, so such a block
//!   keeps a gap of up to that much as its tail (`largest_tail`).
//! - `segment_alloc` (undo): the segment, which must be wholly free, disappears.
//! - `segment_free` (undo): a wholly free segment reappears (pool by size: 2 MiB = small).
//! - `oom`, `snapshot`, `annotate`: nothing.
//! - `segment_map`, `segment_unmap`, and frees in runs of mapped pages of expandable segments:
//!   see `expandable_start`, which walks the runs as segments of their own and places them in
//!   ranges at the end.

use std::collections::{BTreeMap, BTreeSet};

use super::capacity::CapacityEstimate;
use super::error::TraceError;
use super::expandable_start::{PagesSeen, start_ranges};
use super::expandable_state::{SeedRange, end_state_groups, infer_ranges};
use super::recording::{Action, DeviceRecording, RecordedSegment};
use super::workload::AllocId;
use crate::pool::rounding::{MAX_REQUEST, MIN_BLOCK_SIZE, ROUND_LARGE, SMALL_BUFFER, round_size};
use crate::pool::{BlockSeed, PoolKind, Settings, StreamId};

/// A large-pool block is split only if more than this would remain.
const LARGE_SPLIT_REMAINDER: u64 = 1 << 20; // 1 MiB

/// The largest unsplit tail a large-pool block handed out for a request of `rounded` bytes can
/// carry. The large pool splits a block only when more than 1 MiB would remain; but under
/// `max_split_size` a block of that size or more is never split: a request of at least
/// `max_split_size` takes a cached block whole when it is less than `max_non_split_rounding`
/// larger, or a segment of its own, rounded up to 2 MiB, whole. (Such a block is its whole
/// segment: a free block of `max_split_size` or more is never part of a split segment.)
fn largest_tail(settings: &Settings, rounded: u64) -> u64 {
    if rounded >= settings.max_split_size {
        settings.max_non_split_rounding.max(ROUND_LARGE) - MIN_BLOCK_SIZE
    } else {
        LARGE_SPLIT_REMAINDER
    }
}

/// One block of a seeded segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedBlock {
    pub addr: u64,
    /// Block size (rounded, including any unsplit tail).
    pub size: u64,
    /// Requested size of the live allocation (0 for a free block).
    pub requested: u64,
    pub allocated: bool,
    /// The id the workload frees this block with; `None` for free blocks and for blocks the
    /// trace never frees.
    pub id: Option<AllocId>,
}

/// One segment present at trace start, with its blocks in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedSegment {
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub blocks: Vec<SeedBlock>,
}

impl SeedSegment {
    /// Its blocks as the pool installs them.
    pub(crate) fn block_seeds(&self) -> Vec<BlockSeed> {
        self.blocks
            .iter()
            .map(|b| BlockSeed {
                addr: b.addr,
                size: b.size,
                requested: b.requested,
                allocated: b.allocated,
            })
            .collect()
    }
}

/// The allocator state at trace start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    /// Segments in address order.
    pub segments: Vec<SeedSegment>,
    /// Expandable segments, in address order.
    pub ranges: Vec<SeedRange>,
}

impl StartState {
    /// Bytes of its segments and mapped pages.
    pub fn reserved_bytes(&self) -> u64 {
        let segments: u64 = self.segments.iter().map(|s| s.size).sum();
        segments + self.ranges.iter().map(SeedRange::mapped_bytes).sum::<u64>()
    }

    /// Bytes in allocated blocks (block sizes, as the pool counts them).
    pub fn allocated_bytes(&self) -> u64 {
        self.live_blocks().map(|b| b.size).sum()
    }

    /// Requested bytes of the live allocations.
    pub fn requested_bytes(&self) -> u64 {
        self.live_blocks().map(|b| b.requested).sum()
    }

    /// Every block: the segments', then the mapped runs' of the expandable segments.
    pub fn blocks(&self) -> impl Iterator<Item = &SeedBlock> {
        let runs = self.ranges.iter().flat_map(|r| &r.runs);
        self.segments
            .iter()
            .chain(runs)
            .flat_map(|s| s.blocks.iter())
    }

    /// Allocated blocks: the segments', in address order, then the expandable segments'.
    pub fn live_blocks(&self) -> impl Iterator<Item = &SeedBlock> {
        self.blocks().filter(|b| b.allocated)
    }

    /// Number of ids handed to live blocks (they are `0..n`).
    pub fn num_ids(&self) -> u32 {
        self.live_blocks()
            .filter_map(|b| b.id)
            .map(|id| id + 1)
            .max()
            .unwrap_or(0)
    }

    /// Check the state is one the pool can hold: segments do not overlap, blocks tile each
    /// segment exactly, free blocks are coalesced, small segments are 2 MiB and no free
    /// large-pool block is 1 MiB or smaller. Returns what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let mut prev_end = 0u64;
        for seg in &self.segments {
            if seg.addr < prev_end {
                return Err(format!(
                    "segment {:#x} overlaps the one before it",
                    seg.addr
                ));
            }
            prev_end = seg.addr + seg.size;
            if seg.pool == PoolKind::Small && seg.size != SMALL_BUFFER {
                return Err(format!(
                    "small-pool segment {:#x} is {} bytes, not 2 MiB",
                    seg.addr, seg.size
                ));
            }
            let mut at = seg.addr;
            let mut prev_free = false;
            for b in &seg.blocks {
                if b.addr != at || b.size == 0 {
                    return Err(format!(
                        "segment {:#x}: block at {:#x} (size {}) does not continue at {at:#x}",
                        seg.addr, b.addr, b.size
                    ));
                }
                if !b.allocated {
                    if prev_free {
                        return Err(format!("segment {:#x}: adjacent free blocks", seg.addr));
                    }
                    if seg.pool == PoolKind::Large && b.size <= LARGE_SPLIT_REMAINDER {
                        return Err(format!(
                            "segment {:#x}: free large-pool block at {:#x} of {} bytes \
                             (PyTorch never leaves one of 1 MiB or less)",
                            seg.addr, b.addr, b.size
                        ));
                    }
                }
                prev_free = !b.allocated;
                at += b.size;
            }
            if at != seg.addr + seg.size {
                return Err(format!(
                    "segment {:#x}: blocks cover {} of {} bytes",
                    seg.addr,
                    at - seg.addr,
                    seg.size
                ));
            }
        }
        Ok(())
    }
}

/// An occupied block during the backward walk.
#[derive(Clone, Debug)]
pub(super) struct WalkBlock {
    pub(super) size: u64,
    pub(super) requested: u64,
    /// False while the end is a guess (rounded size; an unsplit tail may follow).
    pub(super) exact_end: bool,
    /// Set for blocks that reappeared by undoing a free: the trace frees them.
    pub(super) freed_in_trace: bool,
}

#[derive(Clone, Debug)]
pub(super) struct WalkSegment {
    pub(super) size: u64,
    pub(super) stream: StreamId,
    pub(super) pool: PoolKind,
    pub(super) blocks: BTreeMap<u64, WalkBlock>,
    /// A run of mapped pages of an expandable segment, not a segment of its own.
    pub(super) expandable: bool,
    /// Its pool is a guess (pages mapped again by undoing an unmap, with nothing yet to say
    /// which pool's they were).
    pub(super) pool_guessed: bool,
}

/// Whether `size` bytes at `addr` can be memory of a device: below the 1 EB that no request
/// reaches, and not past the end of the address space.
fn in_address_space(addr: u64, size: u64) -> bool {
    size < MAX_REQUEST && addr.checked_add(size).is_some()
}

fn beyond_address_space(addr: u64, size: u64) -> String {
    format!("{size} bytes at {addr:#x} reach beyond any device's address space")
}

/// Rebuild the state at trace start of one device (blocks' ids assigned in address order to
/// the live blocks the trace frees). An expandable-segments recording's runs of mapped pages
/// are placed in ranges (`expandable_start::start_ranges`), sized for a device of
/// `device_memory` bytes (`None`: the memory the recording implies).
pub fn reconstruct_start(
    rec: &DeviceRecording,
    device_memory: Option<u64>,
) -> Result<StartState, TraceError> {
    // What the recording says of its capacity bounds the guesses and sizes the ranges of
    // expandable segments, in both walks: read once, and only where there are such segments.
    let recorded = if rec.is_expandable() {
        rec.capacity()
    } else {
        None
    };
    let (start, implied) = walk_back(rec, recorded, device_memory, device_memory)?;
    // Without the device's memory, the walk's guesses of pools knew only what the recorded
    // capacity bounds: walk again under the memory the start's ranges and the recording's imply
    // (in tests/expandable_cuts.rs given the capacity alone, 13 of 48,203 cut recordings depart
    // against 26 after one walk).
    match implied {
        Some(memory) => Ok(walk_back(rec, recorded, None, Some(memory))
            .map(|(again, _)| again)
            .unwrap_or(start)),
        None => Ok(start),
    }
}

/// The start state of `rec`, and without `device_memory` the memory its ranges and the
/// recording's imply (`start_ranges`): the trace walked back from the snapshot's state, its pools
/// of pages guessed for a device of at most `walk_memory` bytes and the `recorded` capacity,
/// its ranges sized for a device of `device_memory` bytes (`None`: estimated).
fn walk_back(
    rec: &DeviceRecording,
    recorded: Option<CapacityEstimate>,
    device_memory: Option<u64>,
    walk_memory: Option<u64>,
) -> Result<(StartState, Option<u64>), TraceError> {
    let settings = rec.replay_settings();
    let mut walk = Walk::from_end_state(rec)?;
    let most_capacity = recorded.and_then(|c| c.most());
    let most_mapped = match (most_capacity, walk_memory) {
        (Some(c), Some(m)) => Some(c.min(m)),
        (c, m) => c.or(m),
    };
    walk.seen.set_most_mapped(most_mapped);
    let free_action = rec.free_action();
    for (index, entry) in rec.entries.iter().enumerate().rev() {
        let fail = |detail: String| {
            TraceError::inconsistent(
                &rec.source,
                format!("device {} entry {index}: {detail}", rec.device.0),
            )
        };
        let sized = matches!(
            entry.action,
            Action::Alloc
                | Action::SegmentAlloc
                | Action::SegmentFree
                | Action::SegmentMap
                | Action::SegmentUnmap
        ) || entry.action == free_action;
        if sized && !in_address_space(entry.addr, entry.size) {
            return Err(fail(beyond_address_space(entry.addr, entry.size)));
        }
        match entry.action {
            Action::Alloc => walk.undo_alloc(entry.addr, entry.size).map_err(fail)?,
            a if a == free_action => walk
                .undo_free(entry.addr, entry.size, &settings)
                .map_err(fail)?,
            Action::SegmentAlloc => walk
                .undo_segment_alloc(entry.addr, entry.size)
                .map_err(fail)?,
            Action::SegmentFree => walk
                .undo_segment_free(entry.addr, entry.size, entry.stream)
                .map_err(fail)?,
            Action::SegmentMap => walk
                .undo_map(entry.addr, entry.size, entry.stream)
                .map_err(fail)?,
            Action::SegmentUnmap => walk
                .undo_unmap(entry.addr, entry.size, entry.stream)
                .map_err(fail)?,
            Action::FreeRequested
            | Action::FreeCompleted
            | Action::Oom
            | Action::Snapshot
            | Action::Annotate => {}
        }
    }
    let (mut start, runs) = walk.into_parts();
    start.validate().map_err(|detail| {
        TraceError::inconsistent(
            &rec.source,
            format!(
                "device {}: rebuilt start state is invalid: {detail}",
                rec.device.0
            ),
        )
    })?;
    let implied;
    (start.ranges, implied) = start_ranges(rec, &start.segments, runs, device_memory, recorded);
    Ok((start, implied))
}

/// The state a snapshot's `segments` hold for one device, as the pool would hold it: the
/// memory state when the snapshot was taken, whatever its trace holds (nothing is undone).
/// Blocks pending their free count as allocated, as the pool counts them until their events
/// complete. Expandable segments' runs of mapped pages are placed in the ranges
/// `infer_ranges` infers for a device of `device_memory` bytes. (A `StartState`: the state a
/// pool is seeded with, here at the snapshot's end.)
pub fn end_state(rec: &DeviceRecording, device_memory: u64) -> Result<StartState, TraceError> {
    let (mut state, runs) = Walk::from_end_state(rec)?.into_parts();
    state.validate().map_err(|detail| {
        TraceError::inconsistent(
            &rec.source,
            format!(
                "device {}: the memory state is invalid: {detail}",
                rec.device.0
            ),
        )
    })?;
    state.ranges = infer_ranges(
        &end_state_groups(rec),
        runs,
        device_memory,
        &BTreeMap::new(),
    );
    Ok(state)
}

pub(super) struct Walk {
    pub(super) segments: BTreeMap<u64, WalkSegment>,
    /// Where two of the end state's runs of mapped pages meet: two ranges meet there (a
    /// snapshot shows a range's adjacent mapped pages as one run), so no run grows across it.
    pub(super) joints: BTreeSet<u64>,
    /// The pages of expandable segments seen so far, with their pool.
    pub(super) seen: PagesSeen,
}

impl Walk {
    /// The walk's state from `rec`'s end-state segments (and runs of mapped pages).
    fn from_end_state(rec: &DeviceRecording) -> Result<Self, TraceError> {
        let mut segments = BTreeMap::new();
        for seg in &rec.segments {
            // Its blocks, then the segment itself.
            let ranges = seg.blocks.iter().map(|b| (b.address, b.size));
            if let Some((addr, size)) = ranges
                .chain([(seg.address, seg.total_size)])
                .find(|&(addr, size)| !in_address_space(addr, size))
            {
                return Err(TraceError::inconsistent(
                    &rec.source,
                    format!(
                        "end-state segment {:#x}: {}",
                        seg.address,
                        beyond_address_space(addr, size)
                    ),
                ));
            }
            let mut blocks = BTreeMap::new();
            let seg_end = seg.address.saturating_add(seg.total_size);
            if let Some(b) = seg
                .blocks
                .iter()
                .find(|b| b.address < seg.address || b.address.saturating_add(b.size) > seg_end)
            {
                return Err(TraceError::inconsistent(
                    &rec.source,
                    format!(
                        "end-state segment {:#x}: its block at {:#x} of {} bytes lies outside it",
                        seg.address, b.address, b.size
                    ),
                ));
            }
            if let Some(b) = seg
                .blocks
                .iter()
                .find(|b| b.state.is_occupied() && b.requested_size > b.size)
            {
                return Err(TraceError::inconsistent(
                    &rec.source,
                    format!(
                        "end-state segment {:#x}: its block at {:#x} requests {} bytes, more than \
                         its size of {}",
                        seg.address, b.address, b.requested_size, b.size
                    ),
                ));
            }
            for b in seg.blocks.iter().filter(|b| b.state.is_occupied()) {
                blocks.insert(
                    b.address,
                    WalkBlock {
                        size: b.size,
                        requested: b.requested_size,
                        exact_end: true,
                        freed_in_trace: false,
                    },
                );
            }
            let covered = seg
                .blocks
                .iter()
                .fold(0u64, |sum, b| sum.saturating_add(b.size));
            if covered != seg.total_size {
                return Err(TraceError::inconsistent(
                    &rec.source,
                    format!(
                        "end-state segment {:#x}: blocks add up to {covered} bytes, total_size \
                         says {}",
                        seg.address, seg.total_size
                    ),
                ));
            }
            if let Some(detail) = untiled(seg) {
                return Err(TraceError::inconsistent(
                    &rec.source,
                    format!("end-state segment {:#x}: {detail}", seg.address),
                ));
            }
            let twice = segments.insert(
                seg.address,
                WalkSegment {
                    size: seg.total_size,
                    stream: seg.stream,
                    pool: seg.pool,
                    blocks,
                    expandable: seg.is_expandable,
                    pool_guessed: false,
                },
            );
            if twice.is_some() {
                return Err(TraceError::inconsistent(
                    &rec.source,
                    format!("two end-state segments at {:#x}", seg.address),
                ));
            }
        }
        let mut joints = BTreeSet::new();
        let mut runs = segments.iter().filter(|(_, s)| s.expandable).peekable();
        while let Some((&addr, run)) = runs.next() {
            if let Some(&(&next, _)) = runs.peek()
                && addr + run.size == next
            {
                joints.insert(next);
            }
        }
        let mut seen = PagesSeen::default();
        for (&addr, run) in segments.iter().filter(|(_, s)| s.expandable) {
            seen.note(run.stream, addr, addr + run.size, run.pool, false);
        }
        Ok(Self {
            segments,
            joints,
            seen,
        })
    }

    pub(super) fn segment_at(&mut self, addr: u64) -> Result<(u64, &mut WalkSegment), String> {
        match self.segments.range_mut(..=addr).next_back() {
            Some((&start, seg)) if addr < start + seg.size => Ok((start, seg)),
            _ => Err(format!("address {addr:#x} lies in no segment")),
        }
    }

    fn undo_alloc(&mut self, addr: u64, requested: u64) -> Result<(), String> {
        let (_, seg) = self.segment_at(addr)?;
        let block = seg.blocks.remove(&addr).ok_or_else(|| {
            format!(
                "alloc at {addr:#x}, but no block is live there later (is a free missing \
                 from the trace?)"
            )
        })?;
        if block.requested != requested {
            return Err(format!(
                "alloc at {addr:#x} of {requested} bytes, but the block there later holds {}",
                block.requested
            ));
        }
        Ok(())
    }

    fn undo_free(&mut self, addr: u64, requested: u64, settings: &Settings) -> Result<(), String> {
        let (seg_start, seg) = self.segment_at(addr)?;
        if seg.expandable {
            return self.undo_free_in_run(addr, requested, settings);
        }
        let seg_end = seg_start + seg.size;
        let rounded = round_size(settings, requested);
        let next_start = seg.blocks.range(addr..).next().map_or(seg_end, |(&a, _)| a);
        if next_start == addr {
            return Err(format!(
                "free at {addr:#x}, but a block is still live there"
            ));
        }
        let min_end = addr + rounded;
        if min_end > next_start {
            return Err(format!(
                "free at {addr:#x} of {requested} bytes ({rounded} rounded) overlaps the block \
                 or segment end at {next_start:#x}"
            ));
        }
        let large = seg.pool == PoolKind::Large;
        let (size, exact_end) = if large && next_start - min_end <= largest_tail(settings, rounded)
        {
            (next_start - addr, true)
        } else {
            (rounded, !large)
        };
        if let Some((&prev_addr, prev)) = seg.blocks.range_mut(..addr).next_back() {
            let prev_end = prev_addr + prev.size;
            if prev_end > addr {
                return Err(format!(
                    "free at {addr:#x}, inside the live block at {prev_addr:#x}"
                ));
            }
            let gap = addr - prev_end;
            if large && gap > 0 && gap <= LARGE_SPLIT_REMAINDER {
                if prev.exact_end {
                    return Err(format!(
                        "free at {addr:#x} leaves a free gap of {gap} bytes after the block at \
                         {prev_addr:#x}, which PyTorch's large pool never leaves"
                    ));
                }
                prev.size += gap;
                prev.exact_end = true;
            }
        } else if large && addr - seg_start > 0 && addr - seg_start <= LARGE_SPLIT_REMAINDER {
            return Err(format!(
                "free at {addr:#x} leaves a free gap of {} bytes at the segment start",
                addr - seg_start
            ));
        }
        seg.blocks.insert(
            addr,
            WalkBlock {
                size,
                requested,
                exact_end,
                freed_in_trace: true,
            },
        );
        Ok(())
    }

    fn undo_segment_alloc(&mut self, addr: u64, size: u64) -> Result<(), String> {
        match self.segments.get(&addr) {
            None => Err(format!(
                "segment_alloc at {addr:#x}, but no segment is there later"
            )),
            Some(seg) if seg.size != size => Err(format!(
                "segment_alloc at {addr:#x} of {size} bytes, but the segment there is {} bytes",
                seg.size
            )),
            Some(seg) if !seg.blocks.is_empty() => Err(format!(
                "segment_alloc at {addr:#x}, but {} blocks in it predate the cudaMalloc",
                seg.blocks.len()
            )),
            Some(_) => {
                self.segments.remove(&addr);
                Ok(())
            }
        }
    }

    fn undo_segment_free(&mut self, addr: u64, size: u64, stream: StreamId) -> Result<(), String> {
        let end = addr
            .checked_add(size)
            .ok_or_else(|| format!("segment_free at {addr:#x} of {size} bytes overflows"))?;
        let before = self.segments.range(..end).next_back();
        if let Some((&other, seg)) = before
            && other + seg.size > addr
        {
            return Err(format!(
                "segment_free at {addr:#x} of {size} bytes overlaps the segment at {other:#x}"
            ));
        }
        let pool = if size == SMALL_BUFFER {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        self.segments.insert(
            addr,
            WalkSegment {
                size,
                stream,
                pool,
                blocks: BTreeMap::new(),
                expandable: false,
                pool_guessed: false,
            },
        );
        Ok(())
    }

    /// The state the walk reached: the segments, and apart from them the runs of mapped pages
    /// of expandable segments (not yet placed in ranges).
    fn into_parts(self) -> (StartState, Vec<SeedSegment>) {
        let mut next_id: AllocId = 0;
        let (runs, segments): (Vec<_>, Vec<_>) = self
            .segments
            .into_iter()
            .map(|(addr, seg)| {
                let expandable = seg.expandable;
                let mut blocks = Vec::with_capacity(seg.blocks.len() * 2 + 1);
                let mut at = addr;
                for (baddr, b) in seg.blocks {
                    if baddr > at {
                        blocks.push(free_block(at, baddr - at));
                    }
                    let id = b.freed_in_trace.then(|| {
                        next_id += 1;
                        next_id - 1
                    });
                    blocks.push(SeedBlock {
                        addr: baddr,
                        size: b.size,
                        requested: b.requested,
                        allocated: true,
                        id,
                    });
                    at = baddr + b.size;
                }
                if at < addr + seg.size {
                    blocks.push(free_block(at, addr + seg.size - at));
                }
                let seed = SeedSegment {
                    addr,
                    size: seg.size,
                    stream: seg.stream,
                    pool: seg.pool,
                    blocks,
                };
                (expandable, seed)
            })
            .partition(|(expandable, _)| *expandable);
        let state = StartState {
            segments: segments.into_iter().map(|(_, s)| s).collect(),
            ranges: Vec::new(),
        };
        (state, runs.into_iter().map(|(_, s)| s).collect())
    }
}

/// What keeps `seg`'s blocks, in address order, from covering it one after another: two at
/// one place, one across another, or one of no bytes (`None`: they do). Blocks that add up to
/// the segment and lie in it can still do so, and the walk, which keeps one block per address
/// and takes free space as the gaps between occupied blocks, would read another state.
fn untiled(seg: &RecordedSegment) -> Option<String> {
    let mut blocks: Vec<(u64, u64)> = seg.blocks.iter().map(|b| (b.address, b.size)).collect();
    blocks.sort_unstable();
    let mut at = seg.address;
    for (addr, size) in blocks {
        if size == 0 {
            return Some(format!("its block at {addr:#x} is of 0 bytes"));
        }
        if addr < at {
            return Some(format!(
                "its block at {addr:#x} lies across the block before it, which ends at {at:#x}"
            ));
        }
        if addr > at {
            return Some(format!("no block covers {at:#x} to {addr:#x}"));
        }
        at = addr.saturating_add(size);
    }
    None
}

fn free_block(addr: u64, size: u64) -> SeedBlock {
    SeedBlock {
        addr,
        size,
        requested: 0,
        allocated: false,
        id: None,
    }
}

#[cfg(test)]
mod tests;
