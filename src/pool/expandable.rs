//! Expandable segments (`expandable_segments:True`, PyTorch's reference §5): instead of one
//! cudaMalloc per segment, each (pool, stream) reserves an address range of 1⅛ the device's
//! memory and maps pages into it as requests need them — 2 MiB pages for the small pool,
//! 20 MiB for the large — so that a request can grow the mapped end of its range (taking the
//! free block there with it) instead of needing a fresh segment of its own, and memory is given
//! back page by page.
//!
//! The unmapped stretches of a range are blocks of their own (`BlockState::Unmapped`), linked
//! to their neighbours like any block and listed in their pool's unmapped set; they always
//! start and end on page boundaries of their range. Mapping turns the front of one into a free
//! block, merged with its free neighbours; giving memory back (the out-of-memory retry,
//! `empty_cache`) unmaps the whole pages inside each free block. As in PyTorch: no inactive
//! splits are counted, and neither the oversize release of the miss ladder nor garbage
//! collection touches these blocks.
//!
//! The paths here are cold (a malloc reaches them only when no cached block fits, or to choose
//! between cached blocks), so they hold addresses across calls that add blocks, and look the
//! blocks up again after making room in the table.

use super::allocator::{DeviceAllocator, may_serve};
use super::block::{Block, BlockId, BlockState, NIL};
use super::error::Error;
use super::event::PoolEvent;
use super::free_index::FreeEntry;
use super::rounding::{LARGE_BUFFER, SMALL_BUFFER};
use super::types::{DevicePtr, PoolKind, StreamId};
use crate::backend::{Backend, BackendError};
use std::collections::BTreeSet;

/// The most address space one expandable segment reserves for requests smaller than this.
/// PyTorch reserves 1⅛ of the device's memory; this bound (1 TiB, far above any device's 1⅛)
/// only matters for a simulated device of unlimited memory, whose address space then holds
/// 127 ranges.
const MAX_RANGE: u64 = 1 << 40;

/// The address range an expandable segment of `pool` reserves on a device of `total` bytes:
/// 1⅛ of it (at most `MAX_RANGE`), in whole pages of the pool. (A request larger than that gets
/// a range of its own size.)
pub fn range_size(total: u64, pool: PoolKind) -> u64 {
    let page = page_size(pool);
    total
        .saturating_add(total / 8)
        .min(MAX_RANGE)
        .div_ceil(page)
        * page
}

/// The page size of a pool's expandable segments.
pub fn page_size(pool: PoolKind) -> u64 {
    match pool {
        PoolKind::Small => SMALL_BUFFER,
        PoolKind::Large => LARGE_BUFFER,
    }
}

/// The pool whose expandable segments map pages of `page` bytes (`None`: no pool's).
pub fn pool_with_page(page: u64) -> Option<PoolKind> {
    [PoolKind::Small, PoolKind::Large]
        .into_iter()
        .find(|&pool| page_size(pool) == page)
}

/// The unmapped blocks of each pool, in (stream, address) order (PyTorch's `BlockPool.unmapped`).
/// Named by address: the blocks are found in the table when needed.
#[derive(Debug, Default)]
pub(super) struct UnmappedSets {
    small: BTreeSet<(StreamId, u64)>,
    large: BTreeSet<(StreamId, u64)>,
}

impl UnmappedSets {
    pub(super) fn of(&self, pool: PoolKind) -> &BTreeSet<(StreamId, u64)> {
        match pool {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    fn of_mut(&mut self, pool: PoolKind) -> &mut BTreeSet<(StreamId, u64)> {
        match pool {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    pub(super) fn insert(&mut self, b: &Block) {
        self.of_mut(b.pool).insert((b.stream, b.addr));
    }

    fn remove(&mut self, b: &Block) {
        self.of_mut(b.pool).remove(&(b.stream, b.addr));
    }

    pub(super) fn len(&self) -> usize {
        self.small.len() + self.large.len()
    }
}

impl<B: Backend> DeviceAllocator<B> {
    /// PyTorch's `get_free_block` with expandable segments on: the best fit, except that a
    /// block followed by unmapped space counts as the size it could grow to, so the search moves
    /// on to the next larger blocks while they could grow less; then the `max_split_size` rules.
    #[cold]
    #[inline(never)]
    pub(super) fn get_free_block_expandable(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Option<FreeEntry> {
        let index = self.pools(pool).get(stream)?;
        let mut found = index.lower_bound(size)?;
        while self.blocks.get(found.id).expandable {
            match index.successor(&found) {
                Some(next) if self.growable_size(next.id) < self.growable_size(found.id) => {
                    found = next;
                }
                _ => break,
            }
        }
        let (mss, rounding) = (
            self.settings.max_split_size,
            self.settings.max_non_split_rounding,
        );
        if !may_serve(size, found.size, mss, rounding) {
            return None;
        }
        self.pools_mut(pool)
            .get_mut(stream)
            .remove(found.size, found.addr);
        Some(found)
    }

    /// A free block's size with the unmapped space right after it.
    fn growable_size(&self, id: BlockId) -> u64 {
        let b = self.blocks.get(id);
        let next = self.blocks.get(b.next);
        b.size
            + if next.state == BlockState::Unmapped {
                next.size
            } else {
                0
            }
    }

    /// PyTorch's `try_allocate_expandable_block`: map pages of this stream's expandable segment
    /// (reserving one when none has room) until a free block of at least `size` bytes exists,
    /// and take it out of its free index. `None` when the device cannot map the pages (what was
    /// mapped before stays mapped, as free memory).
    pub(super) fn allocate_expandable(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<Option<BlockId>, Error> {
        let Some(mut candidate) = self.find_expandable_block(pool, stream, size)? else {
            return Ok(None);
        };
        if self.block_at(candidate).state == BlockState::Unmapped {
            let len = self.block_at(candidate).size.min(size);
            match self.map_block(candidate, len)? {
                Some(mapped) => candidate = mapped,
                None => return Ok(None),
            }
        }
        // Now a free block, followed by unmapped space if it is still too small.
        loop {
            let b = *self.block_at(candidate);
            if b.size >= size {
                break;
            }
            let next = *self.blocks.get(b.next);
            if next.state != BlockState::Unmapped {
                debug_assert!(
                    false,
                    "the room found for {size} bytes at {candidate:#x} ended"
                );
                return Ok(None);
            }
            match self.map_block(next.addr, (size - b.size).min(next.size))? {
                Some(mapped) => candidate = mapped,
                None => return Ok(None),
            }
        }
        // Room for the remainder of the split that follows.
        self.reserve_blocks(1);
        let id = self.id_at(candidate);
        let b = *self.blocks.get(id);
        self.pools_mut(pool).get_mut(stream).remove(b.size, b.addr);
        Ok(Some(id))
    }

    /// PyTorch's `find_expandable_block`: the lowest unmapped block of this pool and stream
    /// that, with the free block before it and what follows, offers `size` bytes not in use;
    /// else the unmapped range of a newly reserved segment. Returns its address (the free
    /// block's when the room starts there); `None` when no address space can be reserved.
    fn find_expandable_block(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<Option<u64>, Error> {
        let unmapped = self.unmapped.of(pool);
        for &(_, addr) in unmapped
            .range((stream, 0)..)
            .take_while(|(s, _)| *s == stream)
        {
            let mut c = self.id_at(addr);
            let prev = self.blocks.get(c).prev;
            if self.not_in_use(prev) {
                c = prev;
            }
            if self.room_from(c) >= size {
                return Ok(Some(self.blocks.get(c).addr));
            }
        }
        let page = page_size(pool);
        let total = self.backend.mem_info()?.total;
        // At least the request's pages: a device that reports less memory than it lets be
        // mapped (a simulated one), or a request beyond `MAX_RANGE`, still gets a range that can
        // hold it (PyTorch would fail here; the request then maps, or fails to).
        let range = range_size(total, pool).max(size.div_ceil(page) * page);
        let ptr = match self.backend.reserve_address_range(range, page) {
            Ok(ptr) => ptr,
            Err(BackendError::OutOfMemory) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        self.reserve_blocks(1);
        let block = Block {
            addr: ptr.addr(),
            size: range,
            requested: 0,
            stream,
            pool,
            prev: NIL,
            next: NIL,
            state: BlockState::Unmapped,
            gc_count_base: 0,
            expandable: true,
        };
        self.blocks.insert(block);
        self.segments.insert(ptr.addr(), range);
        self.unmapped.insert(&block);
        self.emit(|| PoolEvent::RangeReserve {
            ptr,
            size: range,
            page,
            stream,
        });
        Ok(Some(ptr.addr()))
    }

    /// Whether block `id` is neither allocated nor pending (free, or unmapped).
    fn not_in_use(&self, id: BlockId) -> bool {
        id != NIL
            && matches!(
                self.blocks.get(id).state,
                BlockState::Free | BlockState::Unmapped
            )
    }

    /// Bytes not in use from block `id` on, counted up to the first block in use.
    fn room_from(&self, mut id: BlockId) -> u64 {
        let mut bytes = 0u64;
        while self.not_in_use(id) {
            let b = self.blocks.get(id);
            bytes += b.size;
            id = b.next;
        }
        bytes
    }

    /// PyTorch's `map_block`: map the whole pages that hold the first `size` bytes of the
    /// unmapped block at `addr`; they become a free block, merged with its free neighbours and
    /// cached. Returns the merged block's address, `None` when the device is full.
    fn map_block(&mut self, addr: u64, size: u64) -> Result<Option<u64>, Error> {
        // Room for the unmapped rest.
        self.reserve_blocks(1);
        let id = self.id_at(addr);
        let b = *self.blocks.get(id);
        debug_assert!(b.state == BlockState::Unmapped && size <= b.size);
        let (base, page) = self.pages_of(&b);
        let len = (b.addr + size - base).div_ceil(page) * page - (b.addr - base);
        let ptr = DevicePtr::new(b.addr).expect("blocks never start at address 0");
        match self.backend.map_pages(ptr, len) {
            Ok(()) => {}
            Err(BackendError::OutOfMemory) => {
                self.refused_map = Some(len);
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
        self.unmapped.remove(&b);
        if len < b.size {
            let rest = Block {
                addr: b.addr + len,
                size: b.size - len,
                prev: id,
                ..b
            };
            let rest_id = self.blocks.insert(rest);
            // (When there is no next block, this writes the sentinel's link.)
            self.blocks.get_mut(b.next).prev = rest_id;
            let mapped = self.blocks.get_mut(id);
            mapped.next = rest_id;
            mapped.size = len;
            self.unmapped.insert(&rest);
        }
        let merged = self.merge_neighbours(id, BlockState::Free);
        self.cache_block(merged);
        self.total_reserved += len;
        self.stats.reserved_bytes.increase(b.pool, len);
        self.stats.counts.num_device_alloc += 1;
        self.emit(|| PoolEvent::SegmentMap {
            ptr,
            size: len,
            stream: b.stream,
        });
        Ok(Some(self.blocks.get(merged).addr))
    }

    /// PyTorch's `unmap_block`: unmap the whole pages inside the free block at `addr`; the
    /// parts of pages before and after them stay free blocks. The unmapped stretch is merged
    /// with unmapped neighbours; when it is then the whole range, the range is given back.
    fn unmap_block(&mut self, addr: u64) -> Result<(), Error> {
        // Room for the free parts before and after.
        self.reserve_blocks(2);
        let id = self.id_at(addr);
        let b = *self.blocks.get(id);
        debug_assert!(b.state == BlockState::Free && b.expandable);
        let (base, page) = self.pages_of(&b);
        let start = base + (b.addr - base).div_ceil(page) * page;
        let end = base + (b.end() - base) / page * page;
        if start >= end {
            return Ok(());
        }
        let ptr = DevicePtr::new(start).expect("inside a segment, so not 0");
        self.backend.unmap_pages(ptr, end - start, b.stream)?;
        self.pools_mut(b.pool)
            .get_mut(b.stream)
            .remove(b.size, b.addr);
        // The block keeps its slot (its address) for its first part: free, or unmapped.
        let mut unmapped_id = id;
        if start > b.addr {
            let front = self.blocks.get_mut(id);
            front.size = start - b.addr;
            unmapped_id = self.splice_after(
                id,
                Block {
                    addr: start,
                    size: end - start,
                    ..b
                },
            );
            self.cache_block(id);
        } else {
            self.blocks.get_mut(id).size = end - start;
        }
        if end < b.end() {
            let after = self.splice_after(
                unmapped_id,
                Block {
                    addr: end,
                    size: b.end() - end,
                    ..b
                },
            );
            self.cache_block(after);
        }
        let stretch = self.blocks.get_mut(unmapped_id);
        stretch.state = BlockState::Unmapped;
        stretch.requested = 0;
        let merged = self.merge_neighbours(unmapped_id, BlockState::Unmapped);
        self.total_reserved -= end - start;
        self.stats.reserved_bytes.decrease(b.pool, end - start);
        self.stats.counts.num_device_free += 1;
        self.emit(|| PoolEvent::SegmentUnmap {
            ptr,
            size: end - start,
            stream: b.stream,
        });
        let whole = *self.blocks.get(merged);
        self.unmapped.insert(&whole);
        if whole.is_split() {
            return Ok(());
        }
        // Nothing mapped in the range any more: give it back (PyTorch's
        // `release_expandable_segment`); on an error it stays, unmapped.
        let ptr = DevicePtr::new(whole.addr).expect("blocks never start at address 0");
        self.backend.release_address_range(ptr, whole.size)?;
        self.unmapped.remove(&whole);
        self.blocks.remove(merged);
        self.segments.remove(whole.addr);
        self.emit(|| PoolEvent::RangeRelease {
            ptr,
            size: whole.size,
            stream: whole.stream,
        });
        Ok(())
    }

    /// The start of `b`'s range and its page size: pages are counted from the range's start.
    fn pages_of(&self, b: &Block) -> (u64, u64) {
        let (base, _) = self
            .segments
            .at_or_below(b.addr)
            .expect("a block lies in its segment");
        (base, page_size(b.pool))
    }

    /// Insert `block` into the table after block `prev` in its segment; returns its id. The
    /// table has room (the caller made it).
    fn splice_after(&mut self, prev: BlockId, block: Block) -> BlockId {
        let next = self.blocks.get(prev).next;
        let id = self.blocks.insert(Block {
            prev,
            next,
            ..block
        });
        // (When there is no next block, this writes the sentinel's link.)
        self.blocks.get_mut(next).prev = id;
        self.blocks.get_mut(prev).next = id;
        id
    }

    /// Merge block `id` with its neighbours in `state`: free ones (taken out of their index)
    /// for a newly mapped block, unmapped ones (out of the unmapped set) for a newly unmapped
    /// one. Returns the merged block: the lowest of them, which keeps its slot.
    fn merge_neighbours(&mut self, id: BlockId, state: BlockState) -> BlockId {
        let mut merged = id;
        for neighbour in [self.blocks.get(id).prev, self.blocks.get(id).next] {
            let n = *self.blocks.get(neighbour);
            if neighbour == NIL || n.state != state {
                continue;
            }
            if state == BlockState::Free {
                self.pools_mut(n.pool)
                    .get_mut(n.stream)
                    .remove(n.size, n.addr);
            } else {
                self.unmapped.remove(&n);
            }
            merged = self.absorb_neighbour(merged, neighbour);
        }
        merged
    }

    /// Merge two adjacent blocks of one segment into the lower one, which keeps its slot (the
    /// table finds blocks by their start); the upper leaves the table. Returns the lower.
    fn absorb_neighbour(&mut self, a: BlockId, b: BlockId) -> BlockId {
        let (lower, upper) = if self.blocks.get(a).addr < self.blocks.get(b).addr {
            (a, b)
        } else {
            (b, a)
        };
        let u = *self.blocks.get(upper);
        let l = self.blocks.get_mut(lower);
        l.size += u.size;
        l.next = u.next;
        // (When there is no next block, this writes the sentinel's link.)
        self.blocks.get_mut(u.next).prev = lower;
        self.blocks.remove(upper);
        lower
    }

    /// The block starting at `addr`, which exists.
    fn id_at(&self, addr: u64) -> BlockId {
        self.blocks
            .find(addr)
            .expect("the block at a held address exists")
    }

    fn block_at(&self, addr: u64) -> &Block {
        self.blocks.get(self.id_at(addr))
    }

    /// PyTorch's `release_blocks` for the expandable blocks of `pool`: unmap the whole pages
    /// inside each free block, in (stream, size, address) order, giving back ranges left with
    /// nothing mapped.
    pub(super) fn unmap_free_blocks(&mut self, pool: PoolKind) -> Result<(), Error> {
        let free: Vec<u64> = self
            .pools(pool)
            .entries()
            .into_iter()
            .filter(|e| self.blocks.get(e.id).expandable)
            .map(|e| e.addr)
            .collect();
        for addr in free {
            self.unmap_block(addr)?;
        }
        Ok(())
    }
}
