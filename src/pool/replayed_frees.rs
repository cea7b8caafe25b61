//! Frees a replay holds: a recording's frees that completed later than the program requested
//! them (a free that waited for device work: PyTorch's `record_stream`, the library's
//! `free_sync:device`), replayed from the recording's `free_requested` and `free_completed`
//! rather than from fences. Each completes at its `free_completed`, or at the pool's first
//! synchronization before it: a synchronization waits for all the device's work, as the
//! recorded allocator's did (PyTorch's `synchronize_and_free_events` completes every free
//! still waiting; so does the library's). Where the replay makes the synchronizations the
//! recording made, the recording's completions come first; a replay on another device or
//! under other settings may synchronize where the recording did not (an out-of-memory retry
//! it did not need), and completes them there, as the program would have
//! (`take_frees_completed_early` names them, for the replay to pass over their
//! `free_completed`). A free that waits for a device synchronization (the library's
//! interposed `cudaFree`, `free_requested_until_device_sync`) also makes the pool synchronize
//! before it grows, as the library's pool does for its pending frees. A free that waits for a
//! stream of another device (`free_outlasts_device_sync`: the recording shows it waiting past
//! the pool's synchronization before growing) is not completed by the pool's synchronization
//! before growing, which does not cover that stream. A free whose recorded
//! completion was the recorded pool's own synchronization before growing stays held until the
//! replay's pool synchronizes, or the program's synchronization comes (the replay's
//! `Op::DeviceSynchronize` completes it with `free_completed`).

use super::allocator::DeviceAllocator;
use super::block::BlockId;
use super::error::{BadPointer, Error};
use super::event::FreeWaits;
use super::release::StreamWait;
use super::rounding::{round_size, segment_size};
use super::types::{DevicePtr, PoolKind};
use crate::backend::Backend;
use std::collections::BTreeSet;

impl<B: Backend> DeviceAllocator<B> {
    /// The program freed the allocation at `ptr`, but its block is not reusable before
    /// `free_completed` says so: a replay of a recording's `free_requested` whose
    /// `free_completed` comes later (a free that waited for device work). As PyTorch's `free()`
    /// does, the allocation leaves `allocation`, `allocated_bytes` and `oversize_allocations`
    /// now and stays active (and requested) until it completes.
    pub fn free_requested(&mut self, ptr: DevicePtr) -> Result<(), Error> {
        self.hold(ptr, FreeWaits::Streams).map(drop)
    }

    /// `free_requested` of a free that waits for a device synchronization (the library's
    /// `cudaFree` under `free_sync:device` or `event`): while it waits, a request that no free
    /// block serves makes the pool synchronize (completing it) and search again before it
    /// grows.
    pub fn free_requested_until_device_sync(&mut self, ptr: DevicePtr) -> Result<(), Error> {
        let id = self.hold(ptr, FreeWaits::Device)?;
        self.held_until_device_sync.insert(id);
        Ok(())
    }

    /// Hold the allocation at `ptr`, whose free waits for `waits` (what its `FreeRequested`
    /// says: a saved replay writes it as the recording did).
    fn hold(&mut self, ptr: DevicePtr, waits: FreeWaits) -> Result<BlockId, Error> {
        let id = self.lookup_allocation(ptr)?;
        self.pend(id, waits);
        self.held.insert(id);
        Ok(id)
    }

    /// The free of `ptr` that `free_requested` began waits for a stream of another device,
    /// which a synchronization of this device does not cover (the recording shows it pending
    /// past the pool's synchronization before growing): the pool's own synchronization before
    /// growing does not complete it (it completes only its wait for the device, which made the
    /// pool synchronize); its `free_completed`, an out-of-memory retry or `empty_cache` does.
    pub fn free_outlasts_device_sync(&mut self, ptr: DevicePtr) -> Result<(), Error> {
        let id = self.held_block(ptr)?;
        self.held_past_device_sync.insert(id);
        Ok(())
    }

    /// The free of `ptr` that `free_outlasts_device_sync` marked no longer waits for another
    /// device's stream (the recording shows a later synchronization before growing completing
    /// it): the pool's next synchronization completes it.
    pub fn free_covered_by_device_sync(&mut self, ptr: DevicePtr) -> Result<(), Error> {
        let id = self.held_block(ptr)?;
        self.held_past_device_sync.remove(&id);
        Ok(())
    }

    /// The free of `ptr` that `free_requested` began completed: its block returns to the pool.
    /// (Not for one a synchronization completed before: `take_frees_completed_early`.)
    pub fn free_completed(&mut self, ptr: DevicePtr) -> Result<(), Error> {
        let id = self.held_block(ptr)?;
        self.held.remove(&id);
        self.held_until_sync.remove(&id);
        self.held_until_device_sync.remove(&id);
        self.held_past_device_sync.remove(&id);
        self.complete_pending(id);
        Ok(())
    }

    /// The allocations whose free `free_requested` began and a synchronization of the pool
    /// completed before their `free_completed` or `free_completes_at_sync` (the recording's
    /// completion is still to come, and is not to be replayed); taken, so named once.
    pub fn take_frees_completed_early(&mut self) -> Vec<DevicePtr> {
        std::mem::take(&mut self.completed_early)
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
    fn complete_held_until_sync(&mut self) {
        while let Some(id) = self.held_until_sync.pop_first() {
            self.held.remove(&id);
            self.held_until_device_sync.remove(&id);
            self.held_past_device_sync.remove(&id);
            self.complete_pending(id);
        }
    }

    /// A synchronization that waits for `wait`: complete every free held, but for those
    /// waiting for another device's streams (`free_outlasts_device_sync`) where it covers only
    /// this device. Those whose recorded completion is still to come (not held until this
    /// synchronization) are named by `take_frees_completed_early`.
    #[cold]
    #[inline(never)]
    pub(super) fn complete_held(&mut self, wait: StreamWait) {
        self.complete_held_until_sync();
        self.held_until_device_sync.clear();
        if wait == StreamWait::Every {
            self.held_past_device_sync.clear();
        }
        let outlasting = &self.held_past_device_sync;
        let (kept, completed): (BTreeSet<BlockId>, BTreeSet<BlockId>) =
            std::mem::take(&mut self.held)
                .into_iter()
                .partition(|id| outlasting.contains(id));
        self.held = kept;
        for id in completed {
            let addr = self.blocks.get(id).addr;
            self.completed_early
                .push(DevicePtr::new(addr).expect("blocks never start at address 0"));
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
        self.total_reserved > threshold && !self.whole_free_segments(PoolKind::Large).is_empty()
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

    /// A free held until its recorded completion completes at an out-of-memory retry's
    /// synchronization, which the recording did not make (PyTorch's `synchronize_and_free_events`
    /// completes every free still waiting): its segment is released and the request served.
    /// It is named once as completed early; its recorded completion is then refused, not
    /// applied to what its address holds now.
    #[test]
    fn a_retry_s_synchronization_completes_a_free_held_for_its_recorded_completion() {
        let mut pool = pool_with(800 * MIB, Settings::default());
        let held = alloc(&mut pool, 500 * MIB);
        let _rest = alloc(&mut pool, 100 * MIB);
        pool.free_requested(held).unwrap();
        let served = pool
            .malloc(400 * MIB, S0)
            .expect("the retry releases the held block");
        pool.validate().unwrap();
        let c = pool.stats().counts;
        assert_eq!((c.num_alloc_retries, c.num_device_free), (1, 1));
        assert_eq!(pool.take_frees_completed_early(), [held]);
        assert_eq!(pool.take_frees_completed_early(), []);
        assert!(pool.free_completed(held).is_err());
        pool.free(served).unwrap();
        pool.validate().unwrap();
    }

    /// A free held until a device synchronization (the library's `cudaFree` under
    /// `free_sync:device`) makes the pool synchronize before it grows, as the library's pool
    /// does: the request is served from its block, with no new segment. A free held for other
    /// streams (`record_stream`) does not: the pool grows.
    #[test]
    fn a_free_held_until_a_device_synchronization_is_completed_before_growing() {
        for until_device_sync in [true, false] {
            let mut pool = pool_with(1024 * MIB, Settings::default());
            let held = alloc(&mut pool, 400 * MIB);
            if until_device_sync {
                pool.free_requested_until_device_sync(held).unwrap();
            } else {
                pool.free_requested(held).unwrap();
            }
            pool.validate().unwrap();
            let served = alloc(&mut pool, 250 * MIB);
            let c = pool.stats().counts;
            let early = pool.take_frees_completed_early();
            if until_device_sync {
                assert_eq!(served, held, "served from the completed block");
                assert_eq!((c.num_device_alloc, c.num_sync_all_streams), (1, 1));
                assert_eq!(early, [held]);
            } else {
                assert_ne!(served, held);
                assert_eq!((c.num_device_alloc, c.num_sync_all_streams), (2, 0));
                assert_eq!(early, []);
                pool.free_completed(held).unwrap();
            }
            pool.validate().unwrap();
        }
    }

    /// A free held past the device's synchronization (`free_outlasts_device_sync`: it waits
    /// for another device's stream) makes the pool synchronize before growing where it waits
    /// for the device too, once; that synchronization does not complete it, and the pool grows.
    /// An out-of-memory retry, which waits for every stream, does.
    #[test]
    fn a_free_held_past_the_device_s_synchronization_completes_at_a_retry() {
        let mut pool = pool_with(1024 * MIB, Settings::default());
        let held = alloc(&mut pool, 400 * MIB);
        pool.free_requested_until_device_sync(held).unwrap();
        pool.free_outlasts_device_sync(held).unwrap();
        pool.validate().unwrap();
        let grown = alloc(&mut pool, 300 * MIB);
        assert_ne!(grown, held);
        let c = pool.stats().counts;
        assert_eq!((c.num_device_alloc, c.num_sync_all_streams), (2, 1));
        assert_eq!(pool.take_frees_completed_early(), []);
        pool.validate().unwrap();
        alloc(&mut pool, 200 * MIB);
        let c = pool.stats().counts;
        assert_eq!(
            (c.num_device_alloc, c.num_sync_all_streams),
            (3, 1),
            "no sync again"
        );
        // 400 + 300 + 200 + 400 MiB do not fit in 1 GiB: the retry completes the free and
        // gives its segment back.
        alloc(&mut pool, 400 * MIB);
        let c = pool.stats().counts;
        assert_eq!((c.num_alloc_retries, c.num_device_free), (1, 1));
        assert_eq!(pool.take_frees_completed_early(), [held]);
        pool.validate().unwrap();
    }

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
