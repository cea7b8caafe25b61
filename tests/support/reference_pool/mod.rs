//! A second implementation of PyTorch's caching-allocator policy, written from
//! ../shared/reference/pytorch-caching-allocator.md (§1–§3, §5, §8.2) and PyTorch's
//! `c10/cuda/CUDACachingAllocator.cpp` as literally as they read:
//! an ordered set of free blocks per pool keyed by (stream, size, address), blocks in a map by
//! address, statistics moved by PyTorch's own `update_stat` rule, and no performance work.
//! `tests/policy_oracle.rs` runs the same random sequences through it and through
//! `DeviceAllocator`, each on its own simulated device, and requires the same addresses, the
//! same out-of-memory answers, the same device calls and the same statistics after every step.
//!
//! Native segments, and expandable segments (`expandable.rs`). A free recorded on other
//! streams (`Tensor.record_stream`) waits for its events as §2.9 says: the device's work
//! completes when the test says so, and the next malloc's `process_events` (or a
//! `release_cached_blocks`, which synchronizes) frees it.
//!
//! One rule is cachealloc's own, with no PyTorch counterpart: a free deferred until the device
//! has finished the work issued before it (`free_sync:device`, design.md). Such a block waits
//! like a recorded free; the next malloc frees the completed ones first, before
//! `process_events`, and a malloc that finds no cached block while one still waits
//! synchronizes the device once — which completes the recorded frees' events too, the
//! simulated device having one queue of work — and searches again before it climbs the miss
//! ladder.

use cachealloc::backend::sim::SimDevice;
use cachealloc::backend::{Backend, BackendError};
use cachealloc::pool::{DevicePtr, DeviceStats, Settings, Stat, StatArray};
use std::collections::{BTreeMap, BTreeSet};

mod expandable;

const MIB: u64 = 1 << 20;
/// kSmallSize: the largest request of the small pool.
const SMALL_SIZE: u64 = MIB;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Small,
    Large,
}

impl Pool {
    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Debug)]
struct Block {
    size: u64,
    requested: u64,
    stream: u64,
    pool: Pool,
    allocated: bool,
    /// Freed, waiting for events on the streams that used it (`event_count > 0`), or for the
    /// device's work (a deferred free).
    event_pending: bool,
    /// Memory is mapped behind it (always, outside expandable segments).
    mapped: bool,
    /// Part of an expandable segment.
    expandable: bool,
    prev: Option<u64>,
    next: Option<u64>,
    gc_count_base: u64,
}

impl Block {
    fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }

    /// `try_merge_blocks`' test of the neighbour `self` of a block whose `mapped` is given.
    fn mergeable_with(&self, mapped: bool) -> bool {
        !self.allocated && !self.event_pending && self.mapped == mapped
    }
}

/// PyTorch's `update_stat`, on the aggregate row and the pool's row.
fn update(array: &mut StatArray, pool: Pool, amount: i64) {
    let row = match pool {
        Pool::Small => &mut array.small_pool,
        Pool::Large => &mut array.large_pool,
    };
    update_stat(&mut array.all, amount);
    update_stat(row, amount);
}

fn update_stat(stat: &mut Stat, amount: i64) {
    stat.current += amount;
    stat.peak = stat.peak.max(stat.current);
    if amount > 0 {
        stat.allocated += amount;
    } else {
        stat.freed -= amount;
    }
}

/// §1.1 `round_size`.
pub fn round_size(settings: &Settings, size: u64) -> u64 {
    if size < 512 {
        return 512;
    }
    let log_size = 63 - u64::from(size.leading_zeros());
    let index = log_size.saturating_sub(20).min(15) as usize;
    let divisions = settings.roundup_power2_divisions[index];
    if divisions > 1 && size > 512 * divisions {
        return next_division(size, divisions);
    }
    size.div_ceil(512) * 512
}

/// §1.1 `roundup_power2_next_division`.
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let power2_floor = 1u64 << (63 - size.leading_zeros());
    // floor(log2(divisions)), as PyTorch writes it (divisions are powers of two).
    let power2_division = power2_floor >> (63 - divisions.leading_zeros());
    if power2_division == 0 {
        return power2_floor << 1;
    }
    let round_size_floor = size & !(power2_division - 1);
    if round_size_floor == size {
        size
    } else {
        round_size_floor + power2_division
    }
}

/// §1.3 `get_allocation_size`.
fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        2 * MIB
    } else if size < 10 * MIB {
        20 * MIB
    } else {
        size.div_ceil(2 * MIB) * 2 * MIB
    }
}

/// The figures of an out-of-memory report that describe the cache and the device.
#[derive(Debug, PartialEq, Eq)]
pub struct CacheView {
    pub free_blocks: usize,
    /// The largest free blocks, largest first (at most 16).
    pub largest_free_blocks: Vec<u64>,
    pub pool_largest_free_block: u64,
    pub other_streams_free: u64,
    pub other_streams_largest_free_block: u64,
    pub reserved: u64,
    pub device_free: u64,
    pub alloc_size: u64,
}

/// PyTorch's `DeviceCachingAllocator` for native segments.
pub struct ReferencePool {
    pub device: SimDevice,
    settings: Settings,
    /// Every block, free or allocated, by address.
    blocks: BTreeMap<u64, Block>,
    /// Free blocks per pool, ordered as `BlockPool.blocks`: (stream, size, address).
    free: [BTreeSet<(u64, u64, u64)>; 2],
    /// Unmapped blocks of expandable segments per pool, as `BlockPool.unmapped`: (stream,
    /// address).
    unmapped: [BTreeSet<(u64, u64)>; 2],
    /// Reserved address ranges of expandable segments: start → size.
    ranges: BTreeMap<u64, u64>,
    /// `get_free_blocks_call_count` per pool.
    free_block_calls: [u64; 2],
    total_allocated_memory: u64,
    allowed_memory_maximum: Option<u64>,
    /// Freed blocks whose events have not completed, and those whose events have.
    events_pending: Vec<u64>,
    events_completed: Vec<u64>,
    /// Deferred frees (cachealloc's `free_sync:device`) waiting for the device's work, and
    /// those whose work has completed, in order of freeing.
    deferred_pending: Vec<u64>,
    deferred_completed: Vec<u64>,
    pub stats: DeviceStats,
}

impl ReferencePool {
    pub fn new(device: SimDevice, settings: Settings) -> Self {
        let fraction = settings.per_process_memory_fraction;
        let stats = DeviceStats {
            max_split_size: if settings.has_max_split_size() {
                settings.max_split_size as i64
            } else {
                -1
            },
            ..DeviceStats::default()
        };
        let mut pool = Self {
            device,
            settings,
            blocks: BTreeMap::new(),
            free: [BTreeSet::new(), BTreeSet::new()],
            unmapped: [BTreeSet::new(), BTreeSet::new()],
            ranges: BTreeMap::new(),
            free_block_calls: [0; 2],
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            events_pending: Vec::new(),
            events_completed: Vec::new(),
            deferred_pending: Vec::new(),
            deferred_completed: Vec::new(),
            stats,
        };
        pool.set_memory_fraction(fraction);
        pool
    }

    /// §6.5 `setMemoryFraction`: the limit is fraction × the device's total memory, set only
    /// for a fraction below 1 (`allowed_memory_maximum` is reset first).
    pub fn set_memory_fraction(&mut self, fraction: f64) {
        self.allowed_memory_maximum = None;
        if fraction < 1.0 {
            let total = self
                .device
                .mem_info()
                .expect("the simulated device answers")
                .total;
            self.allowed_memory_maximum = Some((fraction * total as f64) as u64);
        }
    }

    fn gc_enabled(&self) -> bool {
        self.allowed_memory_maximum.is_some() && self.settings.garbage_collection_threshold > 0.0
    }

    fn mss(&self) -> u64 {
        self.settings.max_split_size
    }

    /// §2 malloc: the address handed out, or `None` for out of memory.
    pub fn malloc(&mut self, orig_size: u64, stream: u64) -> Option<u64> {
        self.process_deferred();
        self.process_events();
        let size = round_size(&self.settings, orig_size);
        let pool = if size <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        };
        let mut found = self.get_free_block(pool, stream, size);
        if found.is_none() && !self.deferred_pending.is_empty() {
            // cachealloc's rule: wait for the device once rather than grow while frees wait.
            self.synchronize_and_free_events();
            found = self.get_free_block(pool, stream, size);
        }
        if found.is_none() {
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks();
            }
            found = self.alloc_block(pool, stream, size, false);
            if found.is_none() && self.release_available_cached_blocks(pool, stream, size) {
                found = self.alloc_block(pool, stream, size, false);
            }
            if found.is_none() {
                self.release_cached_blocks();
                found = self.alloc_block(pool, stream, size, true);
            }
        }
        let Some(addr) = found else {
            self.stats.counts.num_ooms += 1;
            return None;
        };
        Some(self.alloc_found_block(addr, size, orig_size))
    }

    /// §2.1: the smallest fitting free block of this stream, if the oversize rules allow it.
    fn get_free_block(&mut self, pool: Pool, stream: u64, size: u64) -> Option<u64> {
        if self.gc_enabled() {
            self.free_block_calls[pool.index()] += 1;
        }
        let set = &self.free[pool.index()];
        let mut found = *set.range((stream, size, 0)..).next()?;
        if found.0 != stream {
            return None;
        }
        // With expandable segments a block counts as the size it could grow to (itself and
        // the unmapped block after it): move on while the next block could grow less.
        while self.blocks[&found.2].expandable {
            let after = (std::ops::Bound::Excluded(found), std::ops::Bound::Unbounded);
            match set.range(after).next() {
                Some(&next)
                    if next.0 == stream
                        && self.expandable_size(next.2) < self.expandable_size(found.2) =>
                {
                    found = next;
                }
                _ => break,
            }
        }
        let (s, found_size, addr) = found;
        let mss = self.mss();
        if size < mss && found_size >= mss {
            return None;
        }
        if size >= mss && found_size >= size.saturating_add(self.settings.max_non_split_rounding) {
            return None;
        }
        self.free[pool.index()].remove(&(s, found_size, addr));
        Some(addr)
    }

    /// §2.4: a new segment (or with expandable segments, a block of `rounded` bytes grown by
    /// mapping pages), taken out of its pool; `None` when the device is full.
    fn alloc_block(
        &mut self,
        pool: Pool,
        stream: u64,
        rounded: u64,
        is_retry: bool,
    ) -> Option<u64> {
        if is_retry {
            self.stats.counts.num_alloc_retries += 1;
        }
        let size = allocation_size(rounded);
        if let Some(max) = self.allowed_memory_maximum
            && self.total_allocated_memory + size > max
        {
            return None;
        }
        if self.settings.expandable_segments {
            return self.try_allocate_expandable_block(pool, stream, rounded);
        }
        let ptr = match self.device.allocate(size) {
            Ok(ptr) => ptr,
            Err(BackendError::OutOfMemory) => return None,
            Err(e) => panic!("simulated device failed: {e:?}"),
        };
        self.total_allocated_memory += size;
        self.blocks.insert(
            ptr.addr(),
            Block {
                size,
                requested: 0,
                stream,
                pool,
                allocated: false,
                event_pending: false,
                mapped: true,
                expandable: false,
                prev: None,
                next: None,
                gc_count_base: 0,
            },
        );
        update(&mut self.stats.segment, pool, 1);
        update(&mut self.stats.reserved_bytes, pool, size as i64);
        if size >= self.mss() {
            update_stat(&mut self.stats.oversize_segments, 1);
        }
        self.stats.counts.num_device_alloc += 1;
        Some(ptr.addr())
    }

    /// §2.8 `should_split`.
    fn should_split(&self, block: &Block, size: u64) -> bool {
        let remaining = block.size - size;
        if block.pool == Pool::Small || self.settings.expandable_segments {
            remaining >= 512
        } else {
            size < self.mss() && remaining > SMALL_SIZE
        }
    }

    /// `BlockPool::insert_into_blocks`: file a free block, resetting its GC age.
    fn insert_into_blocks(&mut self, addr: u64) {
        let calls = self.free_block_calls;
        let b = self.blocks.get_mut(&addr).expect("block exists");
        b.gc_count_base = calls[b.pool.index()];
        self.free[b.pool.index()].insert((b.stream, b.size, addr));
    }

    /// §2.8 and §8.2 `alloc_found_block`: split off the front if the rules say so, then hand out.
    fn alloc_found_block(&mut self, addr: u64, size: u64, orig_size: u64) -> u64 {
        let block = self.blocks[&addr].clone();
        let pool = block.pool;
        let already_split = block.is_split();
        let mut final_size = block.size;
        if self.should_split(&block, size) {
            let rest_addr = addr + size;
            let rest = Block {
                size: block.size - size,
                prev: Some(addr),
                allocated: false,
                ..block.clone()
            };
            if let Some(next) = block.next {
                self.blocks.get_mut(&next).expect("next exists").prev = Some(rest_addr);
            }
            let rest_size = rest.size;
            self.blocks.insert(rest_addr, rest);
            let b = self.blocks.get_mut(&addr).expect("block exists");
            b.size = size;
            b.next = Some(rest_addr);
            final_size = size;
            self.insert_into_blocks(rest_addr);
            if already_split && !block.expandable {
                update(&mut self.stats.inactive_split_bytes, pool, -(size as i64));
            } else if !block.expandable {
                update(&mut self.stats.inactive_split_bytes, pool, rest_size as i64);
                update(&mut self.stats.inactive_split, pool, 1);
            }
        } else if already_split && !block.expandable {
            update(
                &mut self.stats.inactive_split_bytes,
                pool,
                -(block.size as i64),
            );
            update(&mut self.stats.inactive_split, pool, -1);
        }
        let b = self.blocks.get_mut(&addr).expect("block exists");
        b.allocated = true;
        b.requested = orig_size;
        update(&mut self.stats.allocation, pool, 1);
        update(&mut self.stats.allocated_bytes, pool, final_size as i64);
        update(&mut self.stats.active, pool, 1);
        update(&mut self.stats.active_bytes, pool, final_size as i64);
        update(&mut self.stats.requested_bytes, pool, orig_size as i64);
        if final_size >= self.mss() {
            update_stat(&mut self.stats.oversize_allocations, 1);
        }
        addr
    }

    /// §3 free of a block no other stream used: `free_block` at once.
    pub fn free(&mut self, addr: u64) {
        self.release_allocation(addr);
        self.free_block(addr);
    }

    /// §3 free of a block recorded on other streams: events are recorded, and the block waits
    /// for them (§2.9).
    pub fn free_after_streams(&mut self, addr: u64) {
        self.release_to_wait(addr);
        self.events_pending.push(addr);
    }

    /// cachealloc's deferred free (`free_sync:device`): the block waits, as a recorded free
    /// does, until the device has finished the work issued so far.
    pub fn free_deferred(&mut self, addr: u64) {
        self.release_to_wait(addr);
        self.deferred_pending.push(addr);
    }

    /// The block stops being an allocation but is not free yet: it merges with nothing.
    fn release_to_wait(&mut self, addr: u64) {
        self.release_allocation(addr);
        self.blocks
            .get_mut(&addr)
            .expect("block exists")
            .event_pending = true;
    }

    /// The device finished all work issued so far: every recorded event completes, and so
    /// does the work each deferred free waits for.
    pub fn complete_work(&mut self) {
        self.events_completed.append(&mut self.events_pending);
        self.deferred_completed.append(&mut self.deferred_pending);
    }

    /// Free the deferred blocks whose work completed, in order of freeing.
    fn process_deferred(&mut self) {
        for addr in std::mem::take(&mut self.deferred_completed) {
            self.free_block(addr);
        }
    }

    /// `process_events`: free the blocks whose events completed.
    fn process_events(&mut self) {
        for addr in std::mem::take(&mut self.events_completed) {
            self.free_block(addr);
        }
    }

    /// `synchronize_and_free_events`: wait for every event and free its block (the deferred
    /// frees first, as cachealloc does).
    fn synchronize_and_free_events(&mut self) {
        self.stats.counts.num_sync_all_streams += 1;
        self.complete_work();
        self.process_deferred();
        self.process_events();
    }

    /// §3 steps 1–2: the block stops being an allocation.
    fn release_allocation(&mut self, addr: u64) {
        let block = self
            .blocks
            .get_mut(&addr)
            .expect("freeing a live allocation");
        assert!(block.allocated, "freeing a block that is not allocated");
        block.allocated = false;
        let (pool, size) = (block.pool, block.size);
        update(&mut self.stats.allocation, pool, -1);
        update(&mut self.stats.allocated_bytes, pool, -(size as i64));
        if size >= self.mss() {
            update_stat(&mut self.stats.oversize_allocations, -1);
        }
    }

    /// `free_block`: merge with free neighbours and file the result.
    fn free_block(&mut self, addr: u64) {
        let block = self.blocks.get_mut(&addr).expect("block exists");
        block.event_pending = false;
        let (pool, original_size, requested) = (block.pool, block.size, block.requested);
        let (addr, subsumed_blocks, subsumed_bytes) = self.merge_neighbours(addr);
        let mut net_blocks = -(subsumed_blocks as i64);
        let mut net_bytes = -(subsumed_bytes as i64);
        self.insert_into_blocks(addr);
        let merged = &self.blocks[&addr];
        if merged.is_split() {
            net_blocks += 1;
            net_bytes += merged.size as i64;
        }
        if !merged.expandable {
            update(&mut self.stats.inactive_split, pool, net_blocks);
            update(&mut self.stats.inactive_split_bytes, pool, net_bytes);
        }
        update(&mut self.stats.active, pool, -1);
        update(&mut self.stats.active_bytes, pool, -(original_size as i64));
        update(&mut self.stats.requested_bytes, pool, -(requested as i64));
    }

    /// `try_merge_blocks` with the previous, then the next neighbour of the block at `addr`:
    /// a neighbour merges when it is neither allocated nor waiting for events and is mapped as
    /// this block is; it leaves its pool (free or unmapped). Returns the merged block's address
    /// (the lowest) and how many blocks and bytes it took in.
    fn merge_neighbours(&mut self, addr: u64) -> (u64, u64, u64) {
        let mapped = self.blocks[&addr].mapped;
        let (mut low, mut blocks, mut bytes) = (addr, 0, 0);
        let prev = self.blocks[&addr].prev;
        let next = self.blocks[&addr].next;
        for neighbour in [prev, next].into_iter().flatten() {
            let n = self.blocks[&neighbour].clone();
            if !n.mergeable_with(mapped) {
                continue;
            }
            if n.mapped {
                self.free[n.pool.index()].remove(&(n.stream, n.size, neighbour));
            } else {
                self.unmapped[n.pool.index()].remove(&(n.stream, neighbour));
            }
            let high = low.max(neighbour);
            low = low.min(neighbour);
            let h = self.blocks.remove(&high).expect("high exists");
            if let Some(after) = h.next {
                self.blocks.get_mut(&after).expect("next exists").prev = Some(low);
            }
            let l = self.blocks.get_mut(&low).expect("low exists");
            l.size += h.size;
            l.next = h.next;
            blocks += 1;
            bytes += n.size;
        }
        (low, blocks, bytes)
    }

    /// §2.3 `garbage_collect_cached_blocks`.
    fn garbage_collect_cached_blocks(&mut self) {
        let max = self
            .allowed_memory_maximum
            .expect("GC runs only under a limit");
        let threshold = (self.settings.garbage_collection_threshold * max as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return;
        }
        let target = self.total_allocated_memory - threshold;
        let clock = self.free_block_calls[Pool::Large.index()];
        let age = |b: &Block| clock - b.gc_count_base;
        let candidates = |me: &Self| -> Vec<(u64, u64)> {
            me.free[Pool::Large.index()]
                .iter()
                .map(|&(_, _, addr)| (addr, &me.blocks[&addr]))
                .filter(|(_, b)| !b.is_split() && !b.expandable)
                .map(|(addr, b)| (addr, age(b)))
                .collect()
        };
        let first = candidates(self);
        let mut total_age: u64 = first.iter().map(|(_, a)| a).sum();
        let mut count = first.len() as u64;
        if count == 0 {
            return;
        }
        let mut reclaimed = 0;
        let mut freed_something = true;
        while reclaimed < target && freed_something && count > 0 {
            let age_threshold = total_age as f64 / count as f64;
            freed_something = false;
            for (addr, block_age) in candidates(self) {
                if (block_age as f64) < age_threshold {
                    continue;
                }
                freed_something = true;
                reclaimed += self.blocks[&addr].size;
                total_age -= block_age;
                count -= 1;
                self.release_block(addr);
            }
        }
    }

    /// §2.5 `release_available_cached_blocks`.
    fn release_available_cached_blocks(&mut self, pool: Pool, stream: u64, size: u64) -> bool {
        if !self.settings.has_max_split_size() {
            return false;
        }
        let mss = self.mss();
        let key = size.max(mss);
        let set = &self.free[pool.index()];
        let found = set.range((stream, key, 0)..).next().copied();
        if let Some((s, _, addr)) = found
            && s == stream
            && !self.blocks[&addr].expandable
        {
            self.release_block(addr);
            return true;
        }
        // From the block before the one found (or before the end), downwards, releasing the
        // blocks not in expandable segments.
        let below = found.unwrap_or((stream, key, 0));
        let mut victims = Vec::new();
        let mut total = 0;
        for &(s, block_size, addr) in set.range(..below).rev() {
            if total >= key || block_size < mss || s != stream {
                break;
            }
            if !self.blocks[&addr].expandable {
                victims.push(addr);
                total += block_size;
            }
        }
        for addr in victims {
            self.release_block(addr);
        }
        total >= key
    }

    /// §2.6 `release_cached_blocks` (also `empty_cache`).
    pub fn release_cached_blocks(&mut self) {
        self.synchronize_and_free_events();
        for pool in [Pool::Large, Pool::Small] {
            self.release_blocks(pool);
        }
    }

    /// §2.6 `release_blocks`: whole free segments go back; free expandable blocks give back
    /// their whole pages, and a range left with nothing mapped goes back too.
    fn release_blocks(&mut self, pool: Pool) {
        let mut to_unmap = Vec::new();
        let free: Vec<u64> = self.free[pool.index()].iter().map(|e| e.2).collect();
        for addr in free {
            let b = &self.blocks[&addr];
            if b.expandable {
                to_unmap.push(addr);
            } else if !b.is_split() {
                self.release_block(addr);
            }
        }
        for addr in to_unmap {
            if let Some(unmapped) = self.unmap_block(addr)
                && !self.blocks[&unmapped].is_split()
            {
                self.release_expandable_segment(unmapped);
            }
        }
    }

    /// §2.5 `release_block`: the whole-segment free block goes back to the device.
    fn release_block(&mut self, addr: u64) {
        let b = self.blocks.remove(&addr).expect("released block exists");
        assert!(!b.allocated && !b.is_split(), "released a block in use");
        self.free[b.pool.index()].remove(&(b.stream, b.size, addr));
        let ptr = DevicePtr::new(addr).expect("blocks never start at 0");
        self.device
            .release(ptr, b.size)
            .expect("the segment was the device's");
        self.total_allocated_memory -= b.size;
        update(&mut self.stats.segment, b.pool, -1);
        update(&mut self.stats.reserved_bytes, b.pool, -(b.size as i64));
        if b.size >= self.mss() {
            update_stat(&mut self.stats.oversize_segments, -1);
        }
        self.stats.counts.num_device_free += 1;
    }

    /// What an out-of-memory report says of the cache for a request of `rounded` bytes on
    /// `stream`, read from this allocator's state.
    pub fn cache_view(&mut self, rounded: u64, stream: u64) -> CacheView {
        let all = self.free.iter().flatten();
        let mut largest: Vec<u64> = all.clone().map(|&(_, size, _)| size).collect();
        largest.sort_unstable_by(|a, b| b.cmp(a));
        largest.truncate(16);
        let pool = if rounded <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        };
        let in_pool = &self.free[pool.index()];
        let others = in_pool.iter().filter(|e| e.0 != stream).map(|e| e.1);
        CacheView {
            free_blocks: all.count(),
            largest_free_blocks: largest,
            pool_largest_free_block: in_pool.iter().map(|e| e.1).max().unwrap_or(0),
            other_streams_free: others.clone().sum(),
            other_streams_largest_free_block: others.max().unwrap_or(0),
            reserved: self.total_allocated_memory,
            device_free: self
                .device
                .mem_info()
                .expect("the simulated device answers")
                .free,
            alloc_size: allocation_size(rounded),
        }
    }

    /// `resetPeakStats`.
    pub fn reset_peak_stats(&mut self) {
        for_each_stat(&mut self.stats, |s| s.peak = s.current);
    }

    /// `resetAccumulatedStats`.
    pub fn reset_accumulated_stats(&mut self) {
        for_each_stat(&mut self.stats, |s| {
            s.allocated = 0;
            s.freed = 0;
        });
        self.stats.counts = Default::default();
    }
}

fn for_each_stat(stats: &mut DeviceStats, mut f: impl FnMut(&mut Stat)) {
    for array in [
        &mut stats.allocation,
        &mut stats.segment,
        &mut stats.active,
        &mut stats.inactive_split,
        &mut stats.allocated_bytes,
        &mut stats.reserved_bytes,
        &mut stats.active_bytes,
        &mut stats.inactive_split_bytes,
        &mut stats.requested_bytes,
    ] {
        f(&mut array.all);
        f(&mut array.small_pool);
        f(&mut array.large_pool);
    }
    f(&mut stats.oversize_allocations);
    f(&mut stats.oversize_segments);
}
