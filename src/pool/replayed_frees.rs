//! Frees a replay holds: a recording's frees that completed later than the program requested
//! them (a free that waited for device work, PyTorch's `record_stream`), replayed from the
//! recording's `free_requested` and `free_completed` rather than from fences. No
//! synchronization completes them, except those the recording's synchronization did
//! (`free_completes_at_sync`).

use super::allocator::DeviceAllocator;
use super::block::BlockId;
use super::error::{BadPointer, Error};
use super::rounding::{round_size, segment_size};
use super::types::DevicePtr;
use crate::backend::Backend;

impl<B: Backend> DeviceAllocator<B> {
    /// The program freed the allocation at `ptr`, but its block is not reusable before
    /// `free_completed` says so: a replay of a recording's `free_requested` whose
    /// `free_completed` comes later (a free that waited for device work). As PyTorch's `free()`
    /// does, the allocation leaves `allocation`, `allocated_bytes` and `oversize_allocations`
    /// now and stays active (and requested) until it completes.
    pub fn free_requested(&mut self, ptr: DevicePtr) -> Result<(), Error> {
        let id = self.lookup_allocation(ptr)?;
        self.pend(id);
        self.held.insert(id);
        Ok(())
    }

    /// The free of `ptr` that `free_requested` began completed: its block returns to the pool.
    pub fn free_completed(&mut self, ptr: DevicePtr) -> Result<(), Error> {
        let id = self.held_block(ptr)?;
        self.held.remove(&id);
        self.held_until_sync.remove(&id);
        self.complete_pending(id);
        Ok(())
    }

    /// The free of `ptr` that `free_requested` began completes at the pool's next
    /// synchronization (an out-of-memory retry's `release_cached_blocks`, or `empty_cache`):
    /// a replay of a `free_completed` that such a synchronization made, after the search of the
    /// request that ran out of memory. Should none come, `complete_frees_held_until_sync`
    /// completes it.
    pub fn free_completes_at_sync(&mut self, ptr: DevicePtr) -> Result<(), Error> {
        let id = self.held_block(ptr)?;
        self.held_until_sync.insert(id);
        Ok(())
    }

    /// The frees `free_completes_at_sync` holds until the next synchronization.
    pub fn frees_held_until_sync(&self) -> usize {
        self.held_until_sync.len()
    }

    /// Complete now the frees that `free_completes_at_sync` left waiting for a
    /// synchronization that did not come.
    pub fn complete_frees_held_until_sync(&mut self) {
        if !self.held_until_sync.is_empty() {
            self.complete_held_until_sync();
        }
    }

    /// Complete the frees waiting for a synchronization (`free_completes_at_sync`).
    #[cold]
    #[inline(never)]
    pub(super) fn complete_held_until_sync(&mut self) {
        while let Some(id) = self.held_until_sync.pop_first() {
            self.held.remove(&id);
            self.complete_pending(id);
        }
    }

    /// The block of `ptr`, whose free `free_requested` began; else why there is none.
    fn held_block(&self, ptr: DevicePtr) -> Result<BlockId, Error> {
        let addr = ptr.addr();
        self.blocks
            .find(addr)
            .filter(|id| self.held.contains(id))
            .ok_or_else(|| match self.lookup_allocation(ptr) {
                // A live allocation whose free was not requested, or no allocation at all.
                Ok(_) => Error::InvalidPointer {
                    addr,
                    reason: BadPointer::FreeNotRequested,
                },
                Err(e) => e,
            })
    }

    /// Whether a request of `size` bytes that no cached block serves would get a new segment
    /// now without giving any cached memory back: within the limit of the memory fraction and
    /// what the device reports free. A request that would has no out-of-memory retry, so no
    /// synchronization: frees a replay holds for one (`free_completes_at_sync`) completed
    /// before it. (Segments of fixed size; the limit is read, not resolved.)
    pub fn new_segment_fits(&mut self, size: u64) -> bool {
        let alloc_size = segment_size(round_size(&self.settings, size));
        let limit = self.limit_read();
        let within_limit =
            limit.is_none_or(|max| self.total_reserved.saturating_add(alloc_size) <= max);
        within_limit
            && self
                .backend
                .mem_info()
                .is_ok_and(|info| alloc_size <= info.free)
    }

    /// Whether a request that no cached block serves would make the pool collect garbage
    /// (PyTorch's `garbage_collect_cached_blocks`) and release a cached segment, were it made
    /// now: collection is on, reserved memory is above its threshold and an unsplit free block
    /// of the large pool is cached (the first round releases at least one). Blocks a replay
    /// holds are not free. (The limit is read, not resolved.)
    pub fn collection_would_release(&mut self) -> bool {
        if !self.settings.collects_garbage() {
            return false;
        }
        let Some(max) = self.limit_read() else {
            return false;
        };
        let threshold = (self.settings.garbage_collection_threshold * max as f64) as u64;
        self.total_reserved > threshold
            && self
                .large
                .entries()
                .into_iter()
                .any(|e| self.releasable(e.id))
    }

    /// The limit of the memory fraction, read from the device where the pool has not yet
    /// resolved it.
    fn limit_read(&mut self) -> Option<u64> {
        if self.allowed_maximum_resolved {
            self.allowed_maximum
        } else {
            let total = self.backend.mem_info().map(|info| info.total);
            total.ok().and_then(|t| self.settings.allowed_maximum(t))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::pool::OomHint;
    use crate::pool::Settings;
    use crate::pool::error::Error;
    use crate::pool::tests::{MIB, S0, alloc, cache, pool_with};

    /// A free a replay holds until the retry's synchronization (`free_completes_at_sync`)
    /// completes while the request fails, as a pending free does: its block, which would
    /// serve the request, is reported as freed during it, not as fragmentation (the README's
    /// "Freed too late", pytorch#189504).
    #[test]
    fn a_free_completed_at_the_retry_is_freed_during_the_request() {
        let mut pool = pool_with(800 * MIB, Settings::default());
        cache(&mut pool, &[600 * MIB]);
        let held = alloc(&mut pool, 500 * MIB);
        let _rest = alloc(&mut pool, 100 * MIB);
        pool.free_requested(held).unwrap();
        pool.free_completes_at_sync(held).unwrap();
        let Err(Error::OutOfMemory(report)) = pool.malloc(500 * MIB, S0) else {
            panic!("PyTorch does not search the cache again after the retry");
        };
        assert_eq!(pool.frees_held_until_sync(), 0, "completed at the retry");
        assert_eq!(
            report.hint(),
            OomHint::FreedDuringRequest {
                request: 500 * MIB,
                block: 500 * MIB
            },
            "{report}"
        );
        pool.validate().unwrap();
    }
}
