//! `DeviceAllocator`: one device's caching pool — the malloc and free paths.
//!
//! The policy is PyTorch's native `DeviceCachingAllocator` (see the reference, §2–§3):
//! round the request, look for the best-fitting cached block of the same pool and stream, else
//! climb the miss ladder (new segment → release oversize cached blocks → release every fully
//! free segment and retry), split the found block (the allocation takes the front), and on free
//! coalesce with free neighbours. Releasing memory and garbage collection live in `release.rs`;
//! inspection, seeding and the invariant walker in their own files.

use super::block::{Block, BlockId, BlockState, NIL, NextLink};
use super::block_table::BlockTable;
use super::counters::Counters;
use super::error::{BadPointer, Error};
use super::event::{EventSink, FreeWaits, PoolEvent};
use super::expandable::UnmappedSets;
use super::free_index::{FreeEntry, FreeIndex};
use super::oom::OomReport;
use super::release::StreamWait;
use super::rounding::{
    MAX_REQUEST, MIN_BLOCK_SIZE, SMALL_SIZE, pool_for, round_size, round_to_block, segment_size,
};
use super::segment_map::SegmentMap;
use super::settings::Settings;
use super::stats::DeviceStats;
use super::types::{DevicePtr, PoolKind, StreamId};
use crate::backend::{Backend, BackendError, Fence, StreamFence};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How many of the largest free blocks an OOM report lists.
const OOM_REPORT_BLOCKS: usize = 16;

/// The free indexes of one pool, one per stream (few streams: a short vector beats a map; the
/// last stream looked up is tried first, since programs mostly use one stream at a time).
#[derive(Debug, Default)]
pub(super) struct StreamPools {
    /// Boxed so that the (stream, index) pairs stay small and a lookup scans one cache line.
    pub(super) streams: Vec<(StreamId, Box<FreeIndex>)>,
    last: usize,
}

impl StreamPools {
    pub(super) fn get(&self, stream: StreamId) -> Option<&FreeIndex> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, i)| &**i)
    }

    #[inline]
    pub(super) fn get_mut(&mut self, stream: StreamId) -> &mut FreeIndex {
        let hit = self
            .streams
            .get(self.last)
            .is_some_and(|(s, _)| *s == stream);
        if !hit {
            return self.find_or_insert(stream);
        }
        // (Returned from here, the hit path keeps the test above as its bounds check.)
        &mut self.streams[self.last].1
    }

    /// `stream`'s index, created when new, which becomes the last looked up (the rare path of
    /// `get_mut`).
    #[cold]
    #[inline(never)]
    fn find_or_insert(&mut self, stream: StreamId) -> &mut FreeIndex {
        self.last = match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(pos) => pos,
            None => {
                let pos = self.streams.partition_point(|(s, _)| *s < stream);
                self.streams.insert(pos, (stream, Box::default()));
                pos
            }
        };
        &mut self.streams[self.last].1
    }

    /// Free entries in PyTorch's set order: (stream, size, address).
    pub(super) fn entries(&self) -> Vec<FreeEntry> {
        self.streams
            .iter()
            .flat_map(|(_, index)| index.iter())
            .collect()
    }
}

/// The caching pool of one device over a backend.
pub struct DeviceAllocator<B: Backend> {
    pub(super) backend: B,
    pub(super) settings: Settings,
    /// Every block, found by its start address (live allocations included).
    pub(super) blocks: BlockTable,
    pub(super) small: StreamPools,
    pub(super) large: StreamPools,
    /// Segments obtained from the device (and reserved ranges of expandable segments): start
    /// address → size.
    pub(super) segments: SegmentMap,
    /// The unmapped blocks of expandable segments.
    pub(super) unmapped: UnmappedSets,
    /// Freed blocks waiting for their fence (`free_deferred`), oldest first. While any wait,
    /// the pool synchronizes the device before it grows.
    pub(super) pending: VecDeque<(Fence, BlockId)>,
    /// Freed blocks waiting for the streams they were recorded as used on
    /// (`free_after_streams`), by fence, which is in order of freeing (their fences complete
    /// in any order). Only polled, as PyTorch polls their events: the pool grows rather than
    /// synchronize for them (the out-of-memory retry and `empty_cache` still synchronize, as
    /// PyTorch's do).
    pub(super) stream_pending: BTreeMap<Fence, BlockId>,
    /// Blocks in `pending` that, once their fence is done, still wait for the stream fence
    /// here (`free_deferred_after_streams`).
    pub(super) then_streams: BTreeMap<BlockId, Fence>,
    /// Stream fences a poll found done (kept to reuse its storage).
    fences_done: Vec<Fence>,
    /// Freed blocks that stay pending until `free_completed` names them, or a synchronization
    /// of the pool's completes them (`free_requested`: a replay of a recording whose frees
    /// completed later than they were requested).
    pub(super) held: BTreeSet<BlockId>,
    /// Blocks in `held` whose free completes at the pool's next synchronization
    /// (`free_completes_at_sync`: a replay of a `free_completed` that an out-of-memory retry's
    /// synchronization made).
    pub(super) held_until_sync: BTreeSet<BlockId>,
    /// Blocks in `held` whose free waits for a device synchronization
    /// (`free_requested_until_device_sync`): while any is held the pool synchronizes before it
    /// grows, as for `pending`.
    pub(super) held_until_device_sync: BTreeSet<BlockId>,
    /// Blocks in `held` whose free waits for a stream of another device, which a
    /// synchronization of this device does not cover (`free_outlasts_device_sync`): the pool's
    /// synchronization before growing completes only their wait for the device; a
    /// synchronization of every stream (an out-of-memory retry, `empty_cache`) or their
    /// `free_completed` completes them.
    pub(super) held_past_device_sync: BTreeSet<BlockId>,
    /// The allocations of `held` blocks that a synchronization completed before their
    /// `free_completed` (`take_frees_completed_early`).
    pub(super) completed_early: Vec<DevicePtr>,
    pub(super) stats: Counters,
    /// Bytes obtained from the device (`total_allocated_memory`).
    pub(super) total_reserved: u64,
    /// Limit from `per_process_memory_fraction`, resolved on first need.
    pub(super) allowed_maximum: Option<u64>,
    pub(super) allowed_maximum_resolved: bool,
    /// Free-block searches in the large pool (the GC clock, `get_free_blocks_call_count`).
    pub(super) large_searches: u64,
    /// 1 when the settings collect garbage (a fraction below 1 and a threshold), else 0:
    /// large-pool searches are counted (the GC clock) only then. As PyTorch counts from
    /// `setMemoryFraction` on, this does not wait for the limit to be resolved; the collection
    /// itself does.
    gc_searches_counted: u64,
    /// Whether any `roundup_power2_divisions` entry is in force (else rounding is to 512 B).
    divided_rounding: bool,
    /// With expandable segments: the bytes of pages the device last refused to map for the
    /// request being served, for its out-of-memory report.
    pub(super) refused_map: Option<u64>,
    pub(super) sink: Option<Box<dyn EventSink>>,
}

impl<B: Backend> DeviceAllocator<B> {
    /// A pool over `backend` with `settings`; `expandable_segments` is turned off when the
    /// backend cannot map pages (the caller warns about it).
    pub fn new(backend: B, mut settings: Settings) -> Self {
        settings.expandable_segments &= backend.supports_expandable_segments();
        let divided_rounding = settings.rounds_by_divisions();
        let gc_searches_counted = u64::from(settings.collects_garbage());
        let max_split_size = if settings.has_max_split_size() {
            settings.max_split_size as i64
        } else {
            -1
        };
        Self {
            backend,
            settings,
            blocks: BlockTable::default(),
            small: StreamPools::default(),
            large: StreamPools::default(),
            segments: SegmentMap::default(),
            unmapped: UnmappedSets::default(),
            pending: VecDeque::new(),
            stream_pending: BTreeMap::new(),
            then_streams: BTreeMap::new(),
            fences_done: Vec::new(),
            held: BTreeSet::new(),
            held_until_sync: BTreeSet::new(),
            held_until_device_sync: BTreeSet::new(),
            held_past_device_sync: BTreeSet::new(),
            completed_early: Vec::new(),
            stats: Counters::new(max_split_size),
            total_reserved: 0,
            allowed_maximum: None,
            allowed_maximum_resolved: false,
            large_searches: 0,
            gc_searches_counted,
            divided_rounding,
            refused_map: None,
            sink: None,
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The statistics as of now, under PyTorch's names.
    pub fn stats(&self) -> DeviceStats {
        self.stats.snapshot()
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Install a receiver for pool events (replaces any previous one).
    pub fn set_event_sink(&mut self, sink: Option<Box<dyn EventSink>>) {
        self.sink = sink;
    }

    /// PyTorch's `setMemoryFraction` (`torch.cuda.set_per_process_memory_fraction`): from now
    /// on the pool may reserve `fraction` of the device's total memory, and no more (1 = no
    /// limit); `garbage_collection_threshold` acts only while a limit is set. A fraction outside
    /// [0, 1] is refused and changes nothing. Memory already reserved past a lower limit stays
    /// reserved: the limit refuses new segments, and the next request that needs one meets it.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), Error> {
        super::check_fraction(fraction)?;
        self.settings.per_process_memory_fraction = fraction;
        self.allowed_maximum = None;
        self.gc_searches_counted = u64::from(self.settings.collects_garbage());
        self.allowed_maximum_resolved = false;
        self.emit(|| PoolEvent::MemoryFraction { fraction });
        self.resolve_allowed_maximum();
        Ok(())
    }

    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Number of freed blocks still waiting for their fence.
    pub fn pending_frees(&self) -> usize {
        self.pending.len() + self.stream_pending.len()
    }

    /// Allocate `size` bytes on `stream`. Size 0 gets a minimum-size block.
    pub fn malloc(&mut self, size: u64, stream: StreamId) -> Result<DevicePtr, Error> {
        if self.settings.expandable_segments {
            return self.malloc_expandable(size, stream);
        }
        self.malloc_in::<false>(size, stream)
    }

    /// `malloc` with expandable segments on (their search and statistics rules), kept out of
    /// the native path.
    #[cold]
    #[inline(never)]
    fn malloc_expandable(&mut self, size: u64, stream: StreamId) -> Result<DevicePtr, Error> {
        self.malloc_in::<true>(size, stream)
    }

    #[inline(always)]
    fn malloc_in<const EXPANDABLE: bool>(
        &mut self,
        size: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, Error> {
        if size >= MAX_REQUEST {
            return Err(Error::RequestTooLarge { size });
        }
        self.process_pending()?;
        // A malloc stores at most two new blocks (a segment's, and the remainder of a split).
        self.reserve_blocks(2);
        let rounded = if self.divided_rounding {
            round_size(&self.settings, size)
        } else {
            round_to_block(size)
        };
        let pool = pool_for(rounded);
        let found = match self.get_free_block::<EXPANDABLE>(pool, stream, rounded) {
            Some(found) => found,
            None => self.grow(pool, stream, size, rounded)?,
        };
        Ok(self.alloc_found_block::<EXPANDABLE>(found, (pool, stream), size, rounded))
    }

    /// Return an allocation to the pool at once (PyTorch's single-stream semantics).
    pub fn free(&mut self, ptr: DevicePtr) -> Result<(), Error> {
        let id = self.lookup_allocation(ptr)?;
        self.take_allocation(id, FreeWaits::Nothing);
        self.free_block(id);
        Ok(())
    }

    /// Make room for `n` new blocks. Called where no block id is held: when the table has to
    /// be rebuilt, the free indexes and the pending queue follow the blocks to their new ids.
    #[inline]
    pub(super) fn reserve_blocks(&mut self, n: usize) {
        if !self.blocks.has_room(n) {
            self.make_block_room(n);
        }
    }

    #[cold]
    #[inline(never)]
    fn make_block_room(&mut self, n: usize) {
        let moved = self.blocks.make_room(n);
        for (_, index) in self.small.streams.iter_mut().chain(&mut self.large.streams) {
            index.follow_moved_blocks(&moved);
        }
        let queued = self.pending.iter_mut().map(|(_, id)| id);
        for id in queued.chain(self.stream_pending.values_mut()) {
            *id = moved.id(*id);
        }
        let held_sets = [
            &mut self.held,
            &mut self.held_until_sync,
            &mut self.held_until_device_sync,
            &mut self.held_past_device_sync,
        ];
        for held in held_sets {
            *held = std::mem::take(held)
                .into_iter()
                .map(|id| moved.id(id))
                .collect();
        }
        let then_streams = std::mem::take(&mut self.then_streams);
        self.then_streams = then_streams
            .into_iter()
            .map(|(id, fence)| (moved.id(id), fence))
            .collect();
    }

    /// Free an allocation whose block may still be used by device work issued before now: the
    /// block stays pending until the backend reports the fence recorded here done.
    pub fn free_deferred(&mut self, ptr: DevicePtr) -> Result<(), Error> {
        let id = self.lookup_allocation(ptr)?;
        let fence = self.backend.record_fence()?;
        self.pend(id, FreeWaits::Device);
        self.pending.push_back((fence, id));
        Ok(())
    }

    /// Free an allocation that work on `streams` (other than its own) may still use: the block
    /// stays pending until that work, issued before now, has finished. Returns the streams the
    /// backend could not wait for, with its answer (see `StreamFence`).
    pub fn free_after_streams(
        &mut self,
        ptr: DevicePtr,
        streams: &[StreamId],
    ) -> Result<Vec<(StreamId, BackendError)>, Error> {
        let id = self.lookup_allocation(ptr)?;
        let StreamFence { fence, unfenced } = self.backend.record_stream_fence(streams)?;
        self.pend(id, FreeWaits::Streams);
        self.await_stream_fence(fence, id);
        Ok(unfenced)
    }

    /// `free_deferred` of an allocation that work on `streams` may also use, which the backend's
    /// fence may not cover (another device's stream): the block waits for that fence, then for
    /// the streams' work as in `free_after_streams`. Returns the streams the backend could not
    /// wait for.
    pub fn free_deferred_after_streams(
        &mut self,
        ptr: DevicePtr,
        streams: &[StreamId],
    ) -> Result<Vec<(StreamId, BackendError)>, Error> {
        let id = self.lookup_allocation(ptr)?;
        let fence = self.backend.record_fence()?;
        let StreamFence {
            fence: after,
            unfenced,
        } = self.backend.record_stream_fence(streams)?;
        self.pend(id, FreeWaits::DeviceThenStreams);
        self.pending.push_back((fence, id));
        self.then_streams.insert(id, after);
        Ok(unfenced)
    }

    /// Pending block `id` waits in `stream_pending` for stream fence `fence`, or is reusable at
    /// once when the fence is already done (nothing could be waited for, or it completed while
    /// the block waited for another fence).
    fn await_stream_fence(&mut self, fence: Fence, id: BlockId) {
        if self.backend.fence_done(fence) == Ok(true) {
            self.complete_pending(id);
        } else {
            self.stream_pending.insert(fence, id);
        }
    }

    /// The fence of `pending` block `id` is done: the block is reusable, unless it still waits
    /// for a stream fence (`free_deferred_after_streams`) not seen done yet, in `stream_pending`.
    #[inline]
    pub(super) fn pending_fence_done(&mut self, id: BlockId) {
        if self.then_streams.is_empty() {
            self.complete_pending(id);
        } else {
            self.then_await_streams(id);
        }
    }

    /// `pending_fence_done` for a block that may still wait for its recorded streams.
    #[cold]
    #[inline(never)]
    fn then_await_streams(&mut self, id: BlockId) {
        match self.then_streams.remove(&id) {
            Some(fence) => self.await_stream_fence(fence, id),
            None => self.complete_pending(id),
        }
    }

    /// The allocation `id` is handed back, its block not yet reusable until what `waits` names
    /// is done.
    #[inline]
    pub(super) fn pend(&mut self, id: BlockId, waits: FreeWaits) {
        self.take_allocation(id, waits);
        let b = self.blocks.get(id);
        self.stats.active.pend(b.pool, 1);
        self.stats.active_bytes.pend(b.pool, b.size);
        self.blocks.get_mut(id).state = BlockState::Pending;
    }

    /// The size of the live allocation starting at `ptr`, if there is one.
    pub fn allocation_size(&self, ptr: DevicePtr) -> Option<u64> {
        let id = self.lookup_allocation(ptr).ok()?;
        Some(self.blocks.get(id).size)
    }

    /// The stream of the live allocation starting at `ptr`; else why there is none, as `free`
    /// would say it (an interior pointer or a freed block of this pool, or not this pool's).
    pub fn allocation_stream(&self, ptr: DevicePtr) -> Result<StreamId, Error> {
        let id = self.lookup_allocation(ptr)?;
        Ok(self.blocks.get(id).stream)
    }

    /// Whether `addr` lies inside a segment of this pool.
    pub fn contains(&self, addr: u64) -> bool {
        self.segments.contains(addr)
    }

    /// Move every pending block whose fence is done back to its pool. `pending` is taken in
    /// order up to its first fence not done (the policies' fences complete in order); from
    /// `stream_pending`, the blocks whose fences one poll of the device found done, in order of
    /// freeing, so that a poll costs what completed rather than what waits.
    pub fn process_pending(&mut self) -> Result<(), Error> {
        while let Some(&(fence, id)) = self.pending.front() {
            if !self.backend.fence_done(fence)? {
                break;
            }
            self.pending.pop_front();
            self.pending_fence_done(id);
        }
        if !self.stream_pending.is_empty() {
            self.process_stream_pending()?;
        }
        Ok(())
    }

    /// The program synchronized the device (the library's interposed `cudaDeviceSynchronize`,
    /// once it succeeded): every free made before it that waited for the device's work is
    /// complete. Noted as a `DeviceSynchronize` event; then the pending blocks whose fences are
    /// done return to their pools (`process_pending`; not those waiting for a stream of
    /// another device, nor a free another thread made while the synchronization ran). The
    /// frees a replay holds are left to it (`free_completed`): the recording's completions
    /// follow the line. The program's synchronization, not one of the pool's
    /// (`num_sync_all_streams`).
    pub fn device_synchronized(&mut self) -> Result<(), Error> {
        self.emit(|| PoolEvent::DeviceSynchronize);
        self.process_pending()
    }

    #[cold]
    #[inline(never)]
    fn process_stream_pending(&mut self) -> Result<(), Error> {
        let mut done = std::mem::take(&mut self.fences_done);
        let polled = self.backend.poll_fences(&mut done);
        self.complete_stream_fences(&mut done);
        self.fences_done = done;
        Ok(polled?)
    }

    /// Move back the recorded frees of the fences in `done` (found done), in order of freeing,
    /// and empty it. A fence no longer held (completed by a synchronization) is passed over.
    pub(super) fn complete_stream_fences(&mut self, done: &mut Vec<Fence>) {
        done.sort_unstable();
        for fence in done.drain(..) {
            if let Some(id) = self.stream_pending.remove(&fence) {
                self.complete_pending(id);
            }
        }
    }

    /// Give the event to the sink, if one is installed; the event is built only then, so the
    /// hot paths pay nothing for events when nobody listens.
    #[inline]
    pub(super) fn emit(&mut self, event: impl FnOnce() -> PoolEvent) {
        if self.sink.is_some() {
            self.record(event());
        }
    }

    /// `emit`'s call of the sink, kept out of the hot paths.
    #[cold]
    #[inline(never)]
    fn record(&mut self, event: PoolEvent) {
        if let Some(sink) = self.sink.as_mut() {
            sink.record(&event);
        }
    }

    pub(super) fn pools(&self, pool: PoolKind) -> &StreamPools {
        match pool {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    pub(super) fn pools_mut(&mut self, pool: PoolKind) -> &mut StreamPools {
        match pool {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    /// Whether the settings collect garbage (a collection acts once the limit is known).
    fn gc_enabled(&self) -> bool {
        self.gc_searches_counted == 1
    }

    /// PyTorch's `get_free_block`: best fit in the same pool and stream, with the two
    /// `max_split_size` rules; only the best-fitting block is considered.
    /// (`EXPANDABLE`: the search of expandable segments, `get_free_block_expandable`.)
    #[inline]
    fn get_free_block<const EXPANDABLE: bool>(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Option<FreeEntry> {
        // Counted without a jump: the pool varies from call to call.
        self.large_searches += self.gc_searches_counted & u64::from(pool == PoolKind::Large);
        if EXPANDABLE {
            return self.get_free_block_expandable(pool, stream, size);
        }
        let mss = self.settings.max_split_size;
        let rounding = self.settings.max_non_split_rounding;
        let index = self.pools_mut(pool).get_mut(stream);
        let found =
            index.take_lower_bound(size, |found| may_serve(size, found.size, mss, rounding))?;
        Some(found)
    }

    /// The miss ladder. Returns a fresh or reclaimed block, or the OOM error.
    #[cold]
    #[inline(never)]
    fn grow(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
        rounded: u64,
    ) -> Result<FreeEntry, Error> {
        if self.backend.capture_underway() {
            return self.grow_during_capture(pool, stream, size, rounded);
        }
        // Use ready blocks first; synchronize before growing when frees are still pending (or,
        // in a replay, held until a device synchronization).
        if !self.pending.is_empty() || !self.held_until_device_sync.is_empty() {
            self.emit(|| PoolEvent::SyncBeforeGrowth {
                size: rounded,
                stream,
            });
            self.synchronize_pending(StreamWait::ThisDevice)?;
            let found = if self.settings.expandable_segments {
                self.get_free_block::<true>(pool, stream, rounded)
            } else {
                self.get_free_block::<false>(pool, stream, rounded)
            };
            if let Some(found) = found {
                return Ok(found);
            }
        }
        self.resolve_allowed_maximum();
        if self.gc_enabled() {
            self.garbage_collect()?;
        }
        let alloc_size = segment_size(rounded);
        if let Some(id) = self.alloc_block(pool, stream, rounded, false)? {
            return Ok(self.entry_of(id));
        }
        if self.release_available_cached_blocks(pool, stream, rounded)?
            && let Some(id) = self.alloc_block(pool, stream, rounded, false)?
        {
            return Ok(self.entry_of(id));
        }
        // Frees still pending complete when `release_cached_blocks` synchronizes: a block they
        // free is not searched for again (as in PyTorch), which the report tells. So do the
        // frees a replay holds (`free_requested`).
        let waiting = |pool: &Self| pool.pending_frees() + pool.held.len();
        let pending = waiting(self);
        self.release_cached_blocks()?;
        if let Some(id) = self.alloc_block(pool, stream, rounded, true)? {
            return Ok(self.entry_of(id));
        }
        let freed_during = waiting(self) < pending;
        Err(self.out_of_memory(stream, (size, rounded, alloc_size), freed_during))
    }

    /// The miss ladder while a CUDA graph capture is underway: a new segment, or out of
    /// memory. No synchronization for frees still pending, no garbage collection, no cached
    /// memory given back: on a real device each would end the capture (PyTorch, too, leaves
    /// its frees' events alone during captures). What the ladder skipped comes after the
    /// capture, at the next request that misses. The `Capture` event comes first, so that a
    /// recording's replay grows the same way.
    fn grow_during_capture(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
        rounded: u64,
    ) -> Result<FreeEntry, Error> {
        self.emit(|| PoolEvent::Capture {
            size: rounded,
            stream,
        });
        self.resolve_allowed_maximum();
        if let Some(id) = self.alloc_block(pool, stream, rounded, false)? {
            return Ok(self.entry_of(id));
        }
        let mut error = self.out_of_memory(stream, (size, rounded, segment_size(rounded)), false);
        if let Error::OutOfMemory(report) = &mut error {
            report.capture_underway = true;
            report.pending_fit = self.pending_fit(stream, rounded);
            report.capture_held = self.capture_held();
        }
        Err(error)
    }

    /// Block `id` as the free index would list it.
    fn entry_of(&self, id: BlockId) -> FreeEntry {
        let b = self.blocks.get(id);
        FreeEntry {
            size: b.size,
            addr: b.addr,
            id,
            link: NextLink::of(b),
        }
    }

    /// The limit of a fraction below 1, of the device's total memory. A device that cannot
    /// tell its memory now (`cudaMemGetInfo` failing) is asked again at the next request that
    /// needs memory: until it answers there is no limit (nor garbage collection, though
    /// searches go on ageing the cached blocks), but the fraction is not dropped.
    /// (Also when segments are adopted: a pool holding segments has grown, and had its limit.)
    pub(super) fn resolve_allowed_maximum(&mut self) {
        if self.allowed_maximum_resolved {
            return;
        }
        if self.settings.per_process_memory_fraction >= 1.0 {
            self.allowed_maximum_resolved = true;
            return;
        }
        if let Ok(info) = self.backend.mem_info() {
            self.allowed_maximum_resolved = true;
            self.allowed_maximum = self.settings.allowed_maximum(info.total);
        }
    }

    /// PyTorch's `alloc_block`: one new segment from the device for a request of `rounded`
    /// bytes — or with expandable segments, pages mapped until a free block fits it (taken
    /// out of its free index) — or `None` when the device is full.
    fn alloc_block(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        rounded: u64,
        is_retry: bool,
    ) -> Result<Option<BlockId>, Error> {
        if is_retry {
            self.stats.counts.num_alloc_retries += 1;
            self.emit(|| PoolEvent::Retry {
                size: rounded,
                stream,
            });
        }
        let alloc_size = segment_size(rounded);
        self.refused_map = None;
        if let Some(max) = self.allowed_maximum
            && self.total_reserved.saturating_add(alloc_size) > max
        {
            return Ok(None);
        }
        if self.settings.expandable_segments {
            return self.allocate_expandable(pool, stream, rounded);
        }
        let ptr = match self.backend.allocate(alloc_size) {
            Ok(ptr) => ptr,
            Err(BackendError::OutOfMemory) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        self.total_reserved += alloc_size;
        self.segments.insert(ptr.addr(), alloc_size);
        let id = self.blocks.insert(Block {
            addr: ptr.addr(),
            size: alloc_size,
            requested: 0,
            stream,
            pool,
            prev: NIL,
            next: NIL,
            state: BlockState::Free,
            gc_count_base: 0,
            expandable: false,
        });
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, alloc_size);
        if alloc_size >= self.settings.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.counts.num_device_alloc += 1;
        self.emit(|| PoolEvent::SegmentAlloc {
            ptr,
            size: alloc_size,
            stream,
        });
        Ok(Some(id))
    }

    fn should_split(&self, pool: PoolKind, size: u64, remaining: u64) -> bool {
        // Both rules evaluated and combined without a jump: the pool varies from call to call.
        let small_rule = remaining >= MIN_BLOCK_SIZE;
        let large_rule = (size < self.settings.max_split_size) & (remaining > SMALL_SIZE);
        let small = (pool == PoolKind::Small) | self.settings.expandable_segments;
        (small & small_rule) | (!small & large_rule)
    }

    /// Hand out block `id` (already out of its free index) for a request of `size` bytes
    /// rounded to `rounded`, splitting off the tail when the split rules allow. Without
    /// `EXPANDABLE` (expandable segments off), no block is expandable.
    #[inline]
    fn alloc_found_block<const EXPANDABLE: bool>(
        &mut self,
        found: FreeEntry,
        (pool, stream): (PoolKind, StreamId),
        size: u64,
        rounded: u64,
    ) -> DevicePtr {
        let (id, addr) = (found.id, found.addr);
        // The native path takes what it needs from the entry and writes the block without
        // reading it first (a read that missed the cache took a tenth of malloc's time on the
        // log-uniform benchmark).
        let (next, expandable, already_split) = if EXPANDABLE {
            let b = self.blocks.get(id);
            // PyTorch counts no inactive splits in expandable segments.
            (b.next, b.expandable, b.is_split() & !b.expandable)
        } else {
            debug_assert_eq!(
                found.link,
                NextLink::of(self.blocks.get(id)),
                "entry's link"
            );
            (found.link.next(), false, found.link.is_split())
        };
        let mut block_size = found.size;
        let remaining = block_size - rounded;
        if self.should_split(pool, rounded, remaining) {
            let rest_id = self.blocks.insert(Block {
                addr: addr + rounded,
                size: remaining,
                requested: 0,
                stream,
                pool,
                prev: id,
                next,
                state: BlockState::Free,
                gc_count_base: self.large_searches,
                expandable,
            });
            // (When there is no next block, this writes the sentinel's link.)
            self.blocks.get_mut(next).prev = rest_id;
            self.blocks.get_mut(id).next = rest_id;
            block_size = rounded;
            self.pools_mut(pool).get_mut(stream).insert(FreeEntry {
                size: remaining,
                addr: addr + rounded,
                id: rest_id,
                link: NextLink::new(next, true),
            });
            if already_split {
                self.stats.inactive_split_bytes.decrease(pool, rounded);
            } else if !expandable {
                self.stats.inactive_split.increase(pool, 1);
                self.stats.inactive_split_bytes.increase(pool, remaining);
            }
        } else if already_split {
            self.stats.inactive_split.decrease(pool, 1);
            self.stats.inactive_split_bytes.decrease(pool, block_size);
        }
        let block = self.blocks.get_mut(id);
        block.size = block_size;
        block.state = BlockState::Allocated;
        block.requested = size;
        let oversize = block_size >= self.settings.max_split_size;
        self.stats.allocation_made(pool, block_size, size, oversize);
        let ptr = DevicePtr::new(addr).expect("blocks never start at address 0");
        self.emit(|| PoolEvent::Alloc { ptr, size, stream });
        ptr
    }

    /// Put a free block into its pool's index (resets its GC age).
    pub(super) fn cache_block(&mut self, id: BlockId) {
        let base = self.large_searches;
        let block = self.blocks.get_mut(id);
        block.state = BlockState::Free;
        block.requested = 0;
        block.gc_count_base = base;
        let (pool, stream) = (block.pool, block.stream);
        let entry = self.entry_of(id);
        self.pools_mut(pool).get_mut(stream).insert(entry);
    }

    /// The allocated block starting at `ptr`, or why there is none.
    #[inline]
    pub(super) fn lookup_allocation(&self, ptr: DevicePtr) -> Result<BlockId, Error> {
        let addr = ptr.addr();
        let found = self.blocks.find(addr);
        match found.map(|id| (id, self.blocks.get(id).state)) {
            Some((id, BlockState::Allocated)) => Ok(id),
            Some((_, BlockState::Pending)) => Err(Error::InvalidPointer {
                addr,
                reason: BadPointer::AlreadyFreed,
            }),
            // A free block starting here: the allocation was freed (and maybe merged); or an
            // unmapped stretch of an expandable segment.
            Some((_, BlockState::Free | BlockState::Unmapped)) | None => {
                Err(self.not_an_allocation(addr))
            }
        }
    }

    /// The error for an address with no live allocation starting there: what the pool holds
    /// there (free memory, unmapped pages, an allocation it lies inside), or nothing (foreign).
    #[cold]
    #[inline(never)]
    fn not_an_allocation(&self, addr: u64) -> Error {
        if !self.contains(addr) {
            return Error::NotOwned { addr };
        }
        // Every byte of a segment lies in one of its blocks (`validate`); should the walk find
        // none, the address is still ours, never to be forwarded.
        let Some(id) = self.block_containing(addr) else {
            return Error::InvalidPointer {
                addr,
                reason: BadPointer::CachedFree,
            };
        };
        let b = self.blocks.get(id);
        let reason = match b.state {
            BlockState::Free => BadPointer::CachedFree,
            BlockState::Unmapped => BadPointer::Unmapped,
            BlockState::Allocated => BadPointer::Interior {
                start: b.addr,
                requested: b.requested,
            },
            BlockState::Pending => BadPointer::InsidePending { start: b.addr },
        };
        Error::InvalidPointer { addr, reason }
    }

    /// The block whose bytes hold `addr`: a walk of its segment's blocks (for error reports).
    fn block_containing(&self, addr: u64) -> Option<BlockId> {
        let (start, _) = self.segments.containing(addr)?;
        let mut id = self.blocks.find(start)?;
        loop {
            let b = self.blocks.get(id);
            if addr < b.end() {
                return (addr >= b.addr).then_some(id);
            }
            if b.next == NIL {
                return None;
            }
            id = b.next;
        }
    }

    /// A pending block's fence is done: forget the allocation and return the block to its pool.
    pub(super) fn complete_pending(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let (pool, size) = (b.pool, b.size);
        self.stats.active.complete(pool, 1);
        self.stats.active_bytes.complete(pool, size);
        self.free_block(id);
    }

    /// The allocation stats of handing block `id` back (it stays active until `free_block`),
    /// whose free waits for `waits`.
    #[inline]
    fn take_allocation(&mut self, id: BlockId, waits: FreeWaits) {
        let b = self.blocks.get(id);
        let (pool, size, requested, stream, addr) = (b.pool, b.size, b.requested, b.stream, b.addr);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        if size >= self.settings.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        self.emit(|| PoolEvent::FreeRequested {
            ptr: DevicePtr::new(addr).expect("blocks never start at address 0"),
            size: requested,
            stream,
            waits,
        });
    }

    /// PyTorch's `free_block`: coalesce with free neighbours and return to the pool. The
    /// merged block keeps the slot of the lowest of the blocks it is made of (its address is
    /// theirs), and the others leave the table.
    #[inline(always)]
    pub(super) fn free_block(&mut self, id: BlockId) {
        if self.settings.expandable_segments {
            self.free_block_expandable(id);
        } else {
            self.free_block_in::<false>(id);
        }
    }

    /// `free_block` with expandable segments on, kept out of the native path.
    #[cold]
    #[inline(never)]
    fn free_block_expandable(&mut self, id: BlockId) {
        self.free_block_in::<true>(id);
    }

    /// (Without `EXPANDABLE`, expandable segments are off and no block is expandable.)
    #[inline(always)]
    fn free_block_in<const EXPANDABLE: bool>(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        let (pool, stream, requested) = (b.pool, b.stream, b.requested);
        let (mut addr, mut size, mut prev, mut next) = (b.addr, b.size, b.prev, b.next);
        self.emit(|| PoolEvent::FreeCompleted {
            ptr: DevicePtr::new(addr).expect("blocks never start at address 0"),
            size: requested,
            stream,
        });
        // Neighbours share the block's segment, hence its pool and stream: one index for all.
        let pools = match pool {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        };
        let index = pools.get_mut(stream);
        let blocks = &mut self.blocks;
        let mut merged_id = id;
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        if let Some(p) = take_free_neighbour(blocks, index, prev) {
            // The free block below absorbs this one (its prev link stays as it is).
            blocks.remove(id);
            merged_id = prev;
            addr = p.addr;
            prev = p.prev;
            size += p.size;
            net_blocks -= 1;
            net_bytes -= p.size as i64;
        }
        if let Some(n) = take_free_neighbour(blocks, index, next) {
            blocks.remove(next);
            next = n.next;
            size += n.size;
            net_blocks -= 1;
            net_bytes -= n.size as i64;
        }
        // (When there is no next block, this writes the sentinel's link.)
        blocks.get_mut(next).prev = merged_id;
        let merged = blocks.get_mut(merged_id);
        merged.size = size;
        merged.prev = prev;
        merged.next = next;
        merged.state = BlockState::Free;
        merged.requested = 0;
        merged.gc_count_base = self.large_searches;
        let split = merged.is_split();
        let expandable = EXPANDABLE && merged.expandable;
        index.insert(FreeEntry {
            size,
            addr,
            id: merged_id,
            link: NextLink::new(next, split),
        });
        net_blocks += i64::from(split);
        net_bytes += if split { size as i64 } else { 0 };
        // PyTorch counts no inactive splits in expandable segments.
        if !expandable {
            self.stats.inactive_split.apply(pool, net_blocks);
            self.stats.inactive_split_bytes.apply(pool, net_bytes);
        }
        self.stats.requested_bytes.decrease(pool, requested);
    }

    /// The out-of-memory error of a request of `size` bytes (`rounded`, needing a segment of
    /// `alloc_size`); `freed_during`: frees pending before the last release completed in it.
    fn out_of_memory(
        &mut self,
        stream: StreamId,
        (size, rounded, alloc_size): (u64, u64, u64),
        freed_during: bool,
    ) -> Error {
        let info = self.backend.mem_info();
        let device_memory_unknown = info.is_err();
        let info = info.unwrap_or_default();
        self.stats.counts.num_ooms += 1;
        self.emit(|| PoolEvent::Oom {
            size: rounded,
            requested: size,
            stream,
            device_free: info.free,
        });
        let indexes = || self.small.streams.iter().chain(&self.large.streams);
        let free_blocks = indexes().map(|(_, index)| index.len()).sum();
        let mut free_sizes: Vec<u64> = indexes()
            .flat_map(|(_, index)| index.iter_desc().take(OOM_REPORT_BLOCKS).map(|e| e.size))
            .collect();
        free_sizes.sort_unstable_by(|a, b| b.cmp(a));
        free_sizes.truncate(OOM_REPORT_BLOCKS);
        let pool = self.pools(pool_for(rounded));
        let other_streams: Vec<(u64, StreamId)> = pool
            .streams
            .iter()
            .filter(|(s, _)| *s != stream)
            .flat_map(|(s, index)| index.iter().map(move |e| (e.size, *s)))
            .collect();
        let other_streams_largest_free_block = other_streams
            .iter()
            .map(|&(size, _)| size)
            .max()
            .unwrap_or(0);
        let own_largest = pool
            .get(stream)
            .and_then(|index| index.iter_desc().next())
            .map_or(0, |e| e.size);
        // Whether a cached block of `size` bytes would serve the request (PyTorch's
        // `max_split_size` rules).
        let (mss, rounding) = (
            self.settings.max_split_size,
            self.settings.max_non_split_rounding,
        );
        let serves = |size: u64| size >= rounded && may_serve(rounded, size, mss, rounding);
        // The block the request would take now on its own stream, when frees completed while
        // it failed (after the search, which is not repeated).
        let own_stream_fit = pool
            .get(stream)
            .filter(|_| freed_during)
            .and_then(|index| index.iter().map(|e| e.size).filter(|&s| serves(s)).min());
        // The block the request would have taken had it been cached for its stream.
        let other_stream_fit = other_streams
            .iter()
            .filter(|&&(size, _)| serves(size))
            .min()
            .map(|&(size, s)| (s, size));
        // What the live allocations asked for (each rounded to 512 bytes), and what pads their
        // blocks beyond it: the divisions' rounding, then the rest of each block (taken whole,
        // or a remainder left unsplit).
        let (mut live_requested, mut live_divisions_padding, mut block_padding) =
            (0u64, 0u64, 0u64);
        let mut pending_requested = 0u64;
        // The request's pool's free cached bytes: its share of what is reserved but unallocated.
        let (mut pool_unallocated, mut other_pool_free) = (0u64, 0u64);
        for (_, b) in self.blocks.iter() {
            if b.state == BlockState::Free {
                if b.pool == pool_for(rounded) {
                    pool_unallocated += b.size;
                } else {
                    other_pool_free += b.size;
                }
            }
            if matches!(b.state, BlockState::Allocated | BlockState::Pending) {
                let (asked, divided) = (
                    round_to_block(b.requested),
                    round_size(&self.settings, b.requested),
                );
                live_requested += asked;
                if b.state == BlockState::Pending {
                    pending_requested += asked;
                }
                live_divisions_padding += divided.saturating_sub(asked);
                block_padding += b.size.saturating_sub(divided.max(asked));
            }
        }
        Error::OutOfMemory(Box::new(OomReport {
            device: self.backend.device(),
            stream,
            requested: size,
            rounded,
            alloc_size,
            device_total: info.total,
            device_free: info.free,
            device_memory_unknown,
            allocated: self.stats.allocated_bytes.current_all().max(0) as u64,
            live_requested,
            pending_requested,
            pending_fit: None,
            divisions_padding: live_divisions_padding
                .saturating_add(rounded.saturating_sub(round_to_block(size))),
            block_padding,
            reserved: self.stats.reserved_bytes.current_all().max(0) as u64,
            allowed_maximum: self.allowed_maximum,
            largest_free_blocks: free_sizes,
            free_blocks,
            pool_largest_free_block: own_largest.max(other_streams_largest_free_block),
            pool_unallocated,
            other_pool_free,
            large_pool_largest_free_block: self
                .large
                .streams
                .iter()
                .filter_map(|(_, index)| index.iter_desc().next())
                .map(|e| e.size)
                .max()
                .unwrap_or(0),
            other_streams_free: other_streams.iter().map(|&(size, _)| size).sum(),
            other_streams_largest_free_block,
            other_stream_fit,
            own_stream_fit,
            max_split_size: self.settings.max_split_size,
            expandable_segments: self.settings.expandable_segments,
            refused_map: self.refused_map,
            capture_underway: false,
            capture_held: 0,
        }))
    }
}

/// PyTorch's `max_split_size` rules for a cached block found for a request (both rounded): a
/// request below `max_split_size` takes no block at or above it, and one at or above it takes
/// no block `max_non_split_rounding` or more larger than itself.
///
/// Note: PyTorch adds request and limit in `size_t`; where the sum reaches 2^64 (a
/// `max_non_split_rounding_mb` near 2^44, such as `-1`, which `config` reads as PyTorch does)
/// it wraps to below the request, and no cached block serves. The sum wraps here too.
#[inline]
pub(super) fn may_serve(
    request: u64,
    block: u64,
    max_split_size: u64,
    max_non_split_rounding: u64,
) -> bool {
    let oversize_for_small = request < max_split_size && block >= max_split_size;
    let too_wasteful =
        request >= max_split_size && block >= request.wrapping_add(max_non_split_rounding);
    !oversize_for_small && !too_wasteful
}

/// A free neighbour's place in its segment, as merging needs it.
struct Neighbour {
    addr: u64,
    size: u64,
    prev: BlockId,
    next: BlockId,
}

/// Take neighbour `id` out of `index` if it is a free block (the caller decides which of the
/// merged blocks leaves the table).
#[inline(always)]
fn take_free_neighbour(
    blocks: &BlockTable,
    index: &mut FreeIndex,
    id: BlockId,
) -> Option<Neighbour> {
    // A missing neighbour is the sentinel, which is never free.
    let b = blocks.get(id);
    if b.state != BlockState::Free {
        return None;
    }
    let n = Neighbour {
        addr: b.addr,
        size: b.size,
        prev: b.prev,
        next: b.next,
    };
    index.remove(n.size, n.addr);
    Some(n)
}
