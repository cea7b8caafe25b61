//! §5 of the reference: expandable segments. Each pool and stream reserves one address range
//! of 1⅛ the device's memory; pages are mapped behind it as requests need them (2 MiB for the
//! small pool, 20 MiB for the large) and unmapped when memory is given back.

use super::{Block, MIB, Pool, ReferencePool, update};
use cachealloc::backend::Backend;
use cachealloc::pool::{DevicePtr, StreamId};

/// §5: the page size of a pool's expandable segments.
pub(super) fn page_size(pool: Pool) -> u64 {
    match pool {
        Pool::Small => 2 * MIB,
        Pool::Large => 20 * MIB,
    }
}

impl ReferencePool {
    /// `expandable_size` of `get_free_block`.
    pub(super) fn expandable_size(&self, addr: u64) -> u64 {
        let b = &self.blocks[&addr];
        let unmapped_next = b.next.map(|n| &self.blocks[&n]).filter(|n| !n.mapped);
        b.size + unmapped_next.map_or(0, |n| n.size)
    }

    /// The start of the reserved range that holds `addr` (pages count from there).
    fn range_base(&self, addr: u64) -> u64 {
        let (&base, &size) = self.ranges.range(..=addr).next_back().expect("in a range");
        assert!(addr < base + size, "address outside its range");
        base
    }

    /// `allocatable` of `find_expandable_block`: a free or unmapped block.
    fn allocatable(&self, addr: Option<u64>) -> bool {
        addr.is_some_and(|a| {
            let b = &self.blocks[&a];
            !b.allocated && !b.event_pending
        })
    }

    /// §5 `find_expandable_block`: the lowest unmapped block of this stream that, with a free
    /// block before it and what follows, has room for `size`; else a new range.
    fn find_expandable_block(&mut self, pool: Pool, stream: u64, size: u64) -> Option<u64> {
        let unmapped: Vec<u64> = self.unmapped[pool.index()]
            .range((stream, 0)..)
            .take_while(|(s, _)| *s == stream)
            .map(|(_, a)| *a)
            .collect();
        for addr in unmapped {
            let mut c = addr;
            let prev = self.blocks[&c].prev;
            if self.allocatable(prev) {
                c = prev.expect("allocatable");
            }
            let mut bytes = 0;
            let mut b = Some(c);
            while bytes < size && self.allocatable(b) {
                let block = &self.blocks[&b.expect("allocatable")];
                bytes += block.size;
                b = block.next;
            }
            if bytes >= size {
                return Some(c);
            }
        }
        let page = page_size(pool);
        let total = self
            .device
            .mem_info()
            .expect("the simulated device answers")
            .total;
        let range = (total + total / 8).div_ceil(page) * page;
        let ptr = self.device.reserve_address_range(range, page).ok()?.addr();
        self.ranges.insert(ptr, range);
        self.blocks.insert(
            ptr,
            Block {
                size: range,
                requested: 0,
                stream,
                pool,
                allocated: false,
                event_pending: false,
                mapped: false,
                expandable: true,
                prev: None,
                next: None,
                gc_count_base: 0,
            },
        );
        self.unmapped[pool.index()].insert((stream, ptr));
        Some(ptr)
    }

    /// §5 `map_block`: map the pages holding the first `size` bytes of the unmapped block at
    /// `addr`; they become a free block, merged with free neighbours and filed. Returns the
    /// merged block's address; `None` when the device is full.
    fn map_block(&mut self, addr: u64, size: u64) -> Option<u64> {
        let b = self.blocks[&addr].clone();
        assert!(!b.mapped && size <= b.size);
        let (base, page) = (self.range_base(addr), page_size(b.pool));
        let begin = (addr - base) / page;
        let end = (addr + size - base).div_ceil(page);
        let len = (end - begin) * page;
        let ptr = DevicePtr::new(addr).expect("not null");
        if self.device.map_pages(ptr, len).is_err() {
            return None;
        }
        self.unmapped[b.pool.index()].remove(&(b.stream, addr));
        if len < b.size {
            let rest_addr = addr + len;
            if let Some(next) = b.next {
                self.blocks.get_mut(&next).expect("next").prev = Some(rest_addr);
            }
            let rest = Block {
                size: b.size - len,
                prev: Some(addr),
                ..b.clone()
            };
            self.blocks.insert(rest_addr, rest);
            self.unmapped[b.pool.index()].insert((b.stream, rest_addr));
            let m = self.blocks.get_mut(&addr).expect("block");
            m.size = len;
            m.next = Some(rest_addr);
        }
        self.blocks.get_mut(&addr).expect("block").mapped = true;
        let (merged, _, _) = self.merge_neighbours(addr);
        self.insert_into_blocks(merged);
        self.total_allocated_memory += len;
        update(&mut self.stats.reserved_bytes, b.pool, len as i64);
        self.stats.counts.num_device_alloc += 1;
        Some(merged)
    }

    /// §5 `try_allocate_expandable_block`: map pages until a free block of `size` bytes
    /// exists, and take it out of its pool.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        pool: Pool,
        stream: u64,
        size: u64,
    ) -> Option<u64> {
        let mut candidate = self.find_expandable_block(pool, stream, size)?;
        if !self.blocks[&candidate].mapped {
            let len = self.blocks[&candidate].size.min(size);
            candidate = self.map_block(candidate, len)?;
        }
        while self.blocks[&candidate].size < size {
            let remaining = size - self.blocks[&candidate].size;
            let next = self.blocks[&candidate].next.expect("room follows");
            let len = remaining.min(self.blocks[&next].size);
            candidate = self.map_block(next, len)?;
        }
        let b = &self.blocks[&candidate];
        self.free[pool.index()].remove(&(b.stream, b.size, candidate));
        Some(candidate)
    }

    /// §5 `unmap_block`: unmap the whole pages inside the free block at `addr`; the parts of
    /// pages before and after stay free blocks. Returns the unmapped block (merged with
    /// unmapped neighbours), `None` when no whole page was inside.
    pub(super) fn unmap_block(&mut self, addr: u64) -> Option<u64> {
        let b = self.blocks[&addr].clone();
        let (base, page) = (self.range_base(addr), page_size(b.pool));
        let start = base + (addr - base).div_ceil(page) * page;
        let end = base + (addr + b.size - base) / page * page;
        if start >= end {
            return None;
        }
        let ptr = DevicePtr::new(start).expect("not null");
        self.device
            .unmap_pages(ptr, end - start, StreamId(b.stream))
            .expect("mapped pages unmap");
        self.free[b.pool.index()].remove(&(b.stream, b.size, addr));
        // prev -> [before] -> unmapped -> [after] -> next
        let mut pieces = Vec::new();
        if start > addr {
            pieces.push((addr, start - addr, true));
        }
        pieces.push((start, end - start, false));
        if addr + b.size > end {
            pieces.push((end, addr + b.size - end, true));
        }
        self.blocks.remove(&addr);
        for (i, &(piece, size, mapped)) in pieces.iter().enumerate() {
            let prev = if i == 0 {
                b.prev
            } else {
                Some(pieces[i - 1].0)
            };
            let next = pieces.get(i + 1).map(|p| p.0).or(b.next);
            self.blocks.insert(
                piece,
                Block {
                    size,
                    requested: 0,
                    mapped,
                    prev,
                    next,
                    ..b.clone()
                },
            );
        }
        if let Some(prev) = b.prev {
            self.blocks.get_mut(&prev).expect("prev").next = Some(pieces[0].0);
        }
        if let Some(next) = b.next {
            self.blocks.get_mut(&next).expect("next").prev = Some(pieces[pieces.len() - 1].0);
        }
        for &(piece, _, mapped) in &pieces {
            if mapped {
                self.insert_into_blocks(piece);
            }
        }
        let (merged, _, _) = self.merge_neighbours(start);
        self.unmapped[b.pool.index()].insert((b.stream, merged));
        self.total_allocated_memory -= end - start;
        update(
            &mut self.stats.reserved_bytes,
            b.pool,
            -((end - start) as i64),
        );
        self.stats.counts.num_device_free += 1;
        Some(merged)
    }

    /// §5 `release_expandable_segment`: a range with nothing mapped goes back.
    pub(super) fn release_expandable_segment(&mut self, addr: u64) {
        let b = self.blocks.remove(&addr).expect("range block");
        assert!(!b.mapped && self.ranges.remove(&addr) == Some(b.size));
        self.unmapped[b.pool.index()].remove(&(b.stream, addr));
        let ptr = DevicePtr::new(addr).expect("not null");
        self.device
            .release_address_range(ptr, b.size)
            .expect("an unmapped range goes back");
    }
}
