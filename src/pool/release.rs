//! Giving memory back: releasing segments to the device, `empty_cache`, the oversize release of
//! the miss ladder, and garbage collection (PyTorch §2.3, §2.5, §2.6).
//!
//! Reserved memory only shrinks here. Only whole free segments (unsplit free blocks) can be
//! released; a segment with any allocated or pending block stays.

use super::allocator::DeviceAllocator;
use super::block::{BlockId, BlockState};
use super::error::Error;
use super::event::PoolEvent;
use super::free_index::FreeEntry;
use super::types::{DevicePtr, PoolKind, StreamId};
use crate::backend::Backend;

/// Which recorded frees a synchronization waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StreamWait {
    /// Every one, other devices' streams included (before memory is given back: PyTorch's
    /// `synchronize_and_free_events`).
    Every,
    /// Those the device synchronization covered (before growing).
    ThisDevice,
}

impl<B: Backend> DeviceAllocator<B> {
    /// Release every fully free segment to the device (`torch.cuda.empty_cache()`), after
    /// waiting for pending frees. The `EmptyCache` event comes after the frees completed by the
    /// wait and before the releases, so a recorded trace replays in the same order.
    ///
    /// While a CUDA graph capture is underway it does nothing, as PyTorch's
    /// `release_cached_blocks` leaves the default pools alone then (no synchronization is made
    /// or counted, nothing is released): either would end the capture. Its events are a
    /// `Capture` and the `EmptyCache`, so that a recording shows the call and its replay does
    /// nothing either.
    pub fn empty_cache(&mut self) -> Result<(), Error> {
        if self.backend.capture_underway() {
            self.emit(|| PoolEvent::Capture {
                size: 0,
                stream: StreamId(0),
            });
            self.emit(|| PoolEvent::EmptyCache);
            return Ok(());
        }
        self.synchronize_pending(StreamWait::Every)?;
        self.emit(|| PoolEvent::EmptyCache);
        self.release_whole_segments()
    }

    /// Wait for the device and move every pending block back to its pool; of the recorded frees
    /// (`free_after_streams`), those whose streams `wait` says to wait for. The frees a replay
    /// holds (`free_requested`) complete too, as the recorded program's would have.
    pub(super) fn synchronize_pending(&mut self, wait: StreamWait) -> Result<(), Error> {
        self.stats.counts.num_sync_all_streams += 1;
        if !self.held.is_empty() {
            self.complete_held(wait);
        }
        if self.pending.is_empty() && self.stream_pending.is_empty() {
            return Ok(());
        }
        self.backend.synchronize()?;
        while let Some((_, id)) = self.pending.pop_front() {
            self.pending_fence_done(id);
        }
        if self.stream_pending.is_empty() {
            return Ok(());
        }
        match wait {
            StreamWait::Every => {
                self.backend.wait_stream_fences()?;
                while let Some((_, id)) = self.stream_pending.pop_first() {
                    self.complete_pending(id);
                }
                Ok(())
            }
            StreamWait::ThisDevice => self.complete_stream_fences_done(),
        }
    }

    /// Move back the recorded frees whose fences are done (after a synchronization, which polls
    /// do not report).
    fn complete_stream_fences_done(&mut self) -> Result<(), Error> {
        let mut done = Vec::new();
        for &fence in self.stream_pending.keys() {
            if self.backend.fence_done(fence)? {
                done.push(fence);
            }
        }
        self.complete_stream_fences(&mut done);
        Ok(())
    }

    /// PyTorch's `release_cached_blocks` for the default pool.
    pub(super) fn release_cached_blocks(&mut self) -> Result<(), Error> {
        self.synchronize_pending(StreamWait::Every)?;
        self.release_whole_segments()
    }

    fn release_whole_segments(&mut self) -> Result<(), Error> {
        self.release_blocks(PoolKind::Large)?;
        self.release_blocks(PoolKind::Small)?;
        if self.blocks.is_empty() {
            // Nothing left (so no id is held anywhere): start the table over, keeping its
            // storage unless it is large.
            self.blocks.clear();
        }
        Ok(())
    }

    /// PyTorch's `release_blocks`: release every unsplit free block of `pool`, in (stream,
    /// size, address) order, then unmap the pages of free blocks of expandable segments.
    fn release_blocks(&mut self, pool: PoolKind) -> Result<(), Error> {
        for entry in self.whole_free_segments(pool) {
            self.release_block(entry.id)?;
        }
        if self.settings.expandable_segments {
            self.unmap_free_blocks(pool)?;
        }
        Ok(())
    }

    /// The free blocks of `pool` that are whole fixed segments, in (stream, size, address)
    /// order: what `release_blocks` gives back.
    pub(super) fn whole_free_segments(&self, pool: PoolKind) -> Vec<FreeEntry> {
        let mut entries = self.pools(pool).entries();
        entries.retain(|e| self.releasable(e.id));
        entries
    }

    /// Whether free block `id` is a whole segment to give back with `release_block` (the
    /// blocks of expandable segments are unmapped instead).
    pub(super) fn releasable(&self, id: BlockId) -> bool {
        let b = self.blocks.get(id);
        !b.is_split() && !b.expandable
    }

    /// PyTorch's `release_available_cached_blocks`: with `max_split_size` set, free one cached
    /// oversize block at least as large as the request, else the largest oversize blocks of this
    /// stream until their total covers it. True when enough was released.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<bool, Error> {
        let mss = self.settings.max_split_size;
        if !self.settings.has_max_split_size() {
            return Ok(false);
        }
        let key = size.max(mss);
        let Some(index) = self.pools(pool).get(stream) else {
            return Ok(false);
        };
        let found = index.lower_bound(key);
        if let Some(found) = found
            && self.releasable(found.id)
        {
            self.release_block(found.id)?;
            return Ok(true);
        }
        // Else from the largest block below the one found (an expandable one: PyTorch backs up
        // one place from it), or below the key when none was.
        let below = found.map_or((key, 0), |f| (f.size, f.addr));
        let mut victims = Vec::new();
        let mut total = 0u64;
        for entry in index.iter_desc().skip_while(|e| (e.size, e.addr) >= below) {
            if total >= key || entry.size < mss {
                break;
            }
            if self.releasable(entry.id) {
                victims.push(entry.id);
                total += entry.size;
            }
        }
        for id in victims {
            self.release_block(id)?;
        }
        Ok(total >= key)
    }

    /// PyTorch's `garbage_collect_cached_blocks`: release unsplit cached large blocks, oldest
    /// first by rounds of "age at least the mean age", until reserved memory falls below
    /// `garbage_collection_threshold × allowed maximum`.
    pub(super) fn garbage_collect(&mut self) -> Result<(), Error> {
        let Some(max) = self.allowed_maximum else {
            return Ok(());
        };
        let threshold = (self.settings.garbage_collection_threshold * max as f64) as u64;
        if self.total_reserved <= threshold {
            return Ok(());
        }
        let target = self.total_reserved - threshold;
        let clock = self.large_searches;
        let age = |b: &super::block::Block| (clock - b.gc_count_base) as f64;
        let mut total_age = 0.0;
        let mut count = 0u64;
        for entry in self.large.entries() {
            let block = self.blocks.get(entry.id);
            if self.releasable(entry.id) {
                total_age += age(block);
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed_something = true;
        while reclaimed < target && freed_something && count > 0 {
            let mean_age = total_age / count as f64;
            freed_something = false;
            for entry in self.large.entries() {
                let block = self.blocks.get(entry.id);
                if !self.releasable(entry.id) || age(block) < mean_age {
                    continue;
                }
                freed_something = true;
                reclaimed += block.size;
                total_age -= age(block);
                count -= 1;
                self.release_block(entry.id)?;
            }
        }
        Ok(())
    }

    /// Return the whole-segment free block `id` to the device.
    pub(super) fn release_block(&mut self, id: BlockId) -> Result<(), Error> {
        let block = *self.blocks.get(id);
        debug_assert!(block.state == BlockState::Free && !block.is_split());
        let ptr = DevicePtr::new(block.addr).expect("blocks never start at address 0");
        self.backend.release(ptr, block.size)?;
        self.pools_mut(block.pool)
            .get_mut(block.stream)
            .remove(block.size, block.addr);
        self.blocks.remove(id);
        self.segments.remove(block.addr);
        self.total_reserved -= block.size;
        self.stats.segment.decrease(block.pool, 1);
        self.stats.reserved_bytes.decrease(block.pool, block.size);
        if block.size >= self.settings.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.counts.num_device_free += 1;
        self.emit(|| PoolEvent::SegmentFree {
            ptr,
            size: block.size,
            stream: block.stream,
        });
        Ok(())
    }
}
