//! Reading the pool's layout (segments and their blocks, as a snapshot shows them) and
//! installing a layout that existed before a replay started.

use super::allocator::DeviceAllocator;
use super::block::{Block, BlockId, BlockState, NIL};
use super::error::Error;
use super::format::format_size;
use super::rounding::{LARGE_BUFFER, MIN_BLOCK_SIZE, segment_size};
use super::settings::Settings;
use super::types::{DevicePtr, PoolKind, StreamId};
use crate::backend::Backend;

/// One block of a segment, as a snapshot shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockView {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub state: BlockState,
}

/// One segment with its blocks in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentView {
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    /// A mapped run of an expandable segment.
    pub expandable: bool,
    pub blocks: Vec<BlockView>,
}

/// The segment obtained from the device that holds an address: what the device sees as one
/// allocation (for an expandable segment, its whole reserved range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSpan {
    pub start: u64,
    pub size: u64,
    pub expandable: bool,
}

/// A block of a segment to install (see `adopt_segment`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSeed {
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub allocated: bool,
}

/// A segment that exists before the pool starts (e.g. rebuilt from a recorded snapshot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSeed {
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    /// Blocks tiling the segment exactly, in address order.
    pub blocks: Vec<BlockSeed>,
}

/// Check that `blocks` tile `[start, end)` exactly, in address order, in sizes of whole
/// 512-byte units, with no two free blocks side by side. Returns what is wrong.
pub(super) fn check_tiling(start: u64, end: u64, blocks: &[BlockSeed]) -> Result<(), String> {
    let mut cursor = start;
    let mut prev_free = false;
    for b in blocks {
        if b.addr != cursor {
            return Err(format!(
                "block at {:#x} does not follow the previous one ({cursor:#x})",
                b.addr
            ));
        }
        if b.size == 0 || b.size % MIN_BLOCK_SIZE != 0 {
            return Err(format!(
                "block at {:#x} has size {} (not a multiple of 512)",
                b.addr, b.size
            ));
        }
        if !b.allocated && prev_free {
            return Err(format!("two adjacent free blocks at {:#x}", b.addr));
        }
        prev_free = !b.allocated;
        match cursor.checked_add(b.size) {
            Some(next) if next <= end => cursor = next,
            _ => {
                return Err(format!(
                    "block at {:#x} of {} bytes runs past the end ({end:#x})",
                    b.addr, b.size
                ));
            }
        }
    }
    if cursor != end {
        return Err(format!(
            "blocks add up to {} bytes, not {}",
            cursor - start,
            end - start
        ));
    }
    Ok(())
}

impl<B: Backend> DeviceAllocator<B> {
    /// The segment that holds `addr`, if this pool has one there.
    pub fn segment_of(&self, addr: u64) -> Option<SegmentSpan> {
        let (start, size) = self.segments.containing(addr)?;
        // A segment's first block starts at the segment's start.
        let expandable = self
            .blocks
            .find(start)
            .is_some_and(|id| self.blocks.get(id).expandable);
        Some(SegmentSpan {
            start,
            size,
            expandable,
        })
    }

    /// Every segment with its blocks, in address order, as PyTorch's snapshot shows them: an
    /// expandable segment as one segment per run of mapped pages.
    pub fn segments(&self) -> Vec<SegmentView> {
        let mut out = Vec::new();
        for seg in self.whole_segments() {
            if !seg.expandable {
                out.push(seg);
                continue;
            }
            let mut run: Vec<BlockView> = Vec::new();
            for b in seg.blocks.into_iter().map(Some).chain([None]) {
                match b {
                    Some(b) if b.state != BlockState::Unmapped => run.push(b),
                    _ if run.is_empty() => {}
                    _ => {
                        let blocks = std::mem::take(&mut run);
                        out.push(SegmentView {
                            addr: blocks[0].addr,
                            size: blocks.iter().map(|v| v.size).sum(),
                            blocks,
                            ..seg
                        });
                    }
                }
            }
        }
        out
    }

    /// Every segment with its blocks, in address order; an expandable segment as its whole
    /// reserved range, unmapped blocks included.
    pub(super) fn whole_segments(&self) -> Vec<SegmentView> {
        let mut out: Vec<SegmentView> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.prev == NIL)
            .map(|(head, b)| {
                let mut blocks = Vec::new();
                let mut cursor = head;
                while cursor != NIL {
                    let block = self.blocks.get(cursor);
                    blocks.push(BlockView {
                        addr: block.addr,
                        size: block.size,
                        requested: block.requested,
                        state: block.state,
                    });
                    cursor = block.next;
                }
                SegmentView {
                    addr: b.addr,
                    size: blocks.iter().map(|v| v.size).sum(),
                    stream: b.stream,
                    pool: b.pool,
                    expandable: b.expandable,
                    blocks,
                }
            })
            .collect();
        out.sort_by_key(|s| s.addr);
        out
    }

    /// Bytes cached in free blocks (reserved, neither allocated nor pending).
    pub fn cached_free_bytes(&self) -> u64 {
        self.small
            .streams
            .iter()
            .chain(&self.large.streams)
            .flat_map(|(_, index)| index.iter())
            .map(|e| e.size)
            .sum()
    }

    /// Install a segment that already exists on the device, with its blocks, without calling
    /// the backend (the caller has made the backend aware of it). Returns the addresses of its
    /// allocated blocks. Refuses a layout that cannot exist under the current settings.
    ///
    /// A pool holding segments has had its memory fraction's limit since it grew (PyTorch
    /// sets it at start): it is resolved now, so that garbage collection's clock counts the
    /// searches from here on — a pool whose first request is served from an adopted segment
    /// would otherwise count none until it next grows, and collect blocks of different ages
    /// as if all were as old as the adopted ones.
    pub fn adopt_segment(&mut self, seed: &SegmentSeed) -> Result<Vec<DevicePtr>, Error> {
        self.check_seed(seed)?;
        self.resolve_allowed_maximum();
        let split = seed.blocks.len() > 1;
        self.reserve_blocks(seed.blocks.len());
        let mut ids: Vec<BlockId> = Vec::with_capacity(seed.blocks.len());
        let mut allocated = Vec::new();
        for b in &seed.blocks {
            let id = self.blocks.insert(Block {
                addr: b.addr,
                size: b.size,
                requested: 0,
                stream: seed.stream,
                pool: seed.pool,
                prev: ids.last().copied().unwrap_or(NIL),
                next: NIL,
                state: BlockState::Free,
                gc_count_base: 0,
                expandable: false,
            });
            if let Some(&prev) = ids.last() {
                self.blocks.get_mut(prev).next = id;
            }
            ids.push(id);
        }
        self.segments.insert(seed.addr, seed.size);
        self.total_reserved += seed.size;
        let pool = seed.pool;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, seed.size);
        if seed.size >= self.settings.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        for (b, &id) in seed.blocks.iter().zip(&ids) {
            if b.allocated {
                let block = self.blocks.get_mut(id);
                block.state = BlockState::Allocated;
                block.requested = b.requested;
                let oversize = b.size >= self.settings.max_split_size;
                self.stats
                    .allocation_made(pool, b.size, b.requested, oversize);
                allocated.push(DevicePtr::new(b.addr).expect("checked nonzero"));
            } else {
                self.cache_block(id);
                if split {
                    self.stats.inactive_split.increase(pool, 1);
                    self.stats.inactive_split_bytes.increase(pool, b.size);
                }
            }
        }
        Ok(allocated)
    }

    fn check_seed(&self, seed: &SegmentSeed) -> Result<(), Error> {
        let bad = |why: String| {
            Err(Error::InvalidSeed(format!(
                "segment {:#x}: {why}",
                seed.addr
            )))
        };
        if seed.addr == 0 || seed.size == 0 || seed.blocks.is_empty() {
            return bad("empty segment or address 0".into());
        }
        let Some(end) = seed.addr.checked_add(seed.size) else {
            return bad("runs past the end of the address space".into());
        };
        if self.segments.overlaps(seed.addr, seed.size) {
            return bad("overlaps an existing segment".into());
        }
        if let Err(why) = check_tiling(seed.addr, end, &seed.blocks) {
            return bad(why);
        }
        // Note: a split segment holds no block of max_split_size or more, allocated or free.
        // Only a request below it splits a block (`should_split`), and only a block below it
        // (`get_free_block` passes a larger one over) or a new segment made for the request: 20
        // MiB, or the request rounded up to 2 MiB (at most 1 MiB past max_split_size, a whole
        // number of MiB). A large-pool block left allocated holds more than 1 MiB, so the free
        // rest, merged with free neighbours, stays below max_split_size, or below 20 MiB where
        // max_split_size is less (PyTorch refuses such a setting; the pool takes it). Expandable
        // segments split by other rules and are not seeded here.
        let mss = self.settings.max_split_size;
        let free_limit = mss.max(LARGE_BUFFER);
        if seed.pool == PoolKind::Large
            && seed.blocks.len() > 1
            && let Some(b) = seed
                .blocks
                .iter()
                .find(|b| b.size >= if b.allocated { mss } else { free_limit })
        {
            let (setting, size) = (max_split_setting(mss), format_size(b.size));
            let why = if b.allocated {
                format!(
                    "holds a split-off block of {} bytes ({size}) at {:#x}, but {setting} \
                     forbids splitting blocks that large",
                    b.size, b.addr
                )
            } else {
                format!(
                    "holds a free block of {} bytes ({size}) at {:#x} beside other blocks, but \
                     under {setting} no split leaves a free block that large (a block is split \
                     only for a request below it, and only when the block is below it or a new \
                     segment at most 1 MiB past it, so the rest is below it too)",
                    b.size, b.addr
                )
            };
            return Err(Error::SeedForbiddenBySettings(format!(
                "segment {:#x}: {why}: this start state cannot exist under these settings",
                seed.addr
            )));
        }
        // A segment made for a request of max_split_size or more is never split (the request
        // takes it whole, and once free it serves only such requests), so a split segment was
        // made for a request below it, and is no larger than the largest such segment.
        let largest = largest_split_segment(&self.settings);
        if seed.pool == PoolKind::Large && seed.blocks.len() > 1 && seed.size > largest {
            return Err(Error::SeedForbiddenBySettings(format!(
                "segment {:#x}: is a split segment of {} bytes ({}), but under {} only a segment \
                 made for a request below it is split, and none is larger than {} bytes ({}): \
                 this start state cannot exist under these settings",
                seed.addr,
                seed.size,
                format_size(seed.size),
                max_split_setting(mss),
                largest,
                format_size(largest)
            )));
        }
        Ok(())
    }
}

/// The largest segment the pool makes for a request below `max_split_size`: the segment of the
/// largest block size below it (at least the 20 MiB a request below 10 MiB gets). Without the
/// setting, any size.
fn largest_split_segment(settings: &Settings) -> u64 {
    if !settings.has_max_split_size() {
        return u64::MAX;
    }
    let largest_below = settings.max_split_size.saturating_sub(1) / MIN_BLOCK_SIZE * MIN_BLOCK_SIZE;
    segment_size(largest_below).max(LARGE_BUFFER)
}

/// `max_split_size` as the setting that gives it: `max_split_size_mb:N` for a whole number of
/// MiB (as the setting always is), else its bytes.
fn max_split_setting(mss: u64) -> String {
    const MIB: u64 = 1 << 20; // 1 MiB
    if mss.is_multiple_of(MIB) {
        format!("max_split_size_mb:{}", mss / MIB)
    } else {
        format!("max_split_size of {mss} bytes")
    }
}
