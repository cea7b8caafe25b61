//! The out-of-memory report: built from a stats snapshot at the moment the miss ladder gave
//! up, so that an OOM explains itself (true exhaustion or fragmentation, and what to change).
//!
//! The report's data and the kinds of hint live here; `classify` tells which kind a report is
//! (and holds the note on how), `hint` words each kind, `message` renders the whole report.
//! This module does no I/O.

mod classify;
mod hint;
mod message;

use super::types::{DeviceId, StreamId};

/// The standard `max_split_size_mb` values, largest first, down to PyTorch's minimum (20): what
/// a fragmentation hint suggests and what `cachealloc replay` tries after an OOM.
pub const MAX_SPLIT_LADDER_MB: [u64; 8] = [1024, 512, 256, 128, 64, 48, 32, 20];

/// The smallest standard `max_split_size_mb`, which the parser of PyTorch 2.9 and older
/// refuses (it wants more than 20; newer PyTorch and cachealloc take 20 or more).
pub const OLDER_PYTORCH_REFUSES_MB: u64 = 20;
/// One mebibyte (`max_split_size_mb` counts these).
const MIB: u64 = 1 << 20; // bytes

/// Everything known about one failed allocation. Filled by the pool; explained by `hint()` and
/// rendered by `Display`.
#[derive(Clone, Debug, PartialEq)]
pub struct OomReport {
    pub device: DeviceId,
    pub stream: StreamId,
    /// Bytes the program asked for.
    pub requested: u64,
    /// The block size after rounding.
    pub rounded: u64,
    /// The segment size the pool tried to obtain from the device.
    pub alloc_size: u64,
    /// Device capacity and free bytes (`cudaMemGetInfo`) after every cache flush; both 0 when
    /// `device_memory_unknown`.
    pub device_total: u64,
    pub device_free: u64,
    /// `cudaMemGetInfo` failed as the report was built: the device's memory is unknown.
    pub device_memory_unknown: bool,
    /// `allocated_bytes.all.current`.
    pub allocated: u64,
    /// What the live allocations (and frees waiting for their fence) asked for, each request
    /// rounded up to 512 bytes as under any settings: their blocks without the rounding that
    /// settings add, whole-block handouts and unsplit remainders.
    pub live_requested: u64,
    /// Of `live_requested`, what the frees still waiting for their fence asked for.
    pub pending_requested: u64,
    /// The smallest block that those frees would leave once complete (merged with their free
    /// neighbours) that serves the request on its stream, if any: what waiting for them would
    /// have found. Looked for only during a CUDA graph capture (`capture_underway`), when the
    /// pool could not wait for them.
    pub pending_fit: Option<u64>,
    /// What `roundup_power2_divisions` add to the live blocks and the request beyond rounding
    /// to 512 bytes.
    pub divisions_padding: u64,
    /// What the live blocks hold beyond their rounded requests: blocks taken whole (a request
    /// of `max_split_size` or more), remainders of 1 MiB or less left unsplit.
    pub block_padding: u64,
    /// `reserved_bytes.all.current`.
    pub reserved: u64,
    /// Limit from `per_process_memory_fraction`, when set.
    pub allowed_maximum: Option<u64>,
    /// Sizes of the free cached blocks on this device, largest first (at most 16).
    pub largest_free_blocks: Vec<u64>,
    /// How many free cached blocks the device has (all of them, listed or not).
    pub free_blocks: usize,
    /// The largest free cached block of the request's pool (any stream; 0 when none): blocks
    /// of the other pool can serve no request of this one, whatever the settings.
    pub pool_largest_free_block: u64,
    /// Reserved but unallocated bytes of the request's pool (its free cached blocks, any
    /// stream): of `reserved - allocated`, what a block of this pool could be cut from.
    pub pool_unallocated: u64,
    /// Free cached bytes of the other pool (any stream), which no request of this pool can
    /// use. Not what is reserved but unallocated beyond `pool_unallocated`: that also holds the
    /// blocks whose frees are still pending.
    pub other_pool_free: u64,
    /// Free cached bytes of the request's pool held for streams other than the request's (a
    /// block is reused only on the stream it was allocated on), and the largest such block (0
    /// when none).
    pub other_streams_free: u64,
    pub other_streams_largest_free_block: u64,
    /// The block of another stream that would have served the request, had it been cached for
    /// the request's stream: its stream and size.
    pub other_stream_fit: Option<(StreamId, u64)>,
    /// A free block of the request's own stream and pool that serves it now (its size), when
    /// frees pending on other streams' work completed while the request failed (the pool
    /// synchronizes before returning memory), after the search PyTorch does not repeat.
    pub own_stream_fit: Option<u64>,
    /// The largest free cached block of the large pool (any stream; 0 when none). For a request
    /// of the small pool: memory that goes back to the device only as whole segments.
    pub large_pool_largest_free_block: u64,
    /// The `max_split_size` in force (`u64::MAX` = unlimited).
    pub max_split_size: u64,
    /// Expandable segments were on: blocks of any size are split, and memory grows by pages.
    pub expandable_segments: bool,
    /// With expandable segments: the pages the pool last tried to map for the request, which
    /// the device refused (whole pages); `None` when no map was refused.
    pub refused_map: Option<u64>,
    /// A CUDA graph capture was underway: the pool neither waited for pending frees nor gave
    /// cached memory back before failing (either would have ended the capture).
    pub capture_underway: bool,
    /// During a CUDA graph capture: free cached bytes in whole fixed segments (any pool or
    /// stream), which the pool gives back to the device only outside a capture (0 otherwise).
    pub capture_held: u64,
}

/// What an OOM was caused by, with the numbers that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OomHint {
    /// Live memory alone (what the live allocations and the request asked for) exceeds what
    /// the device offers this process: not fragmentation, and no block layout could hold it.
    /// `missing` bytes would have to be freed by the program.
    Exhausted {
        /// Live requested bytes plus the request's.
        needed: u64,
        /// Reserved + device free, capped by the capacity or fraction limit.
        available: u64,
        missing: u64,
        /// The `per_process_memory_fraction` limit is what binds: the device would have room.
        by_fraction_limit: bool,
    },
    /// The device did not tell its memory (`cudaMemGetInfo` failed as the report was built):
    /// neither exhaustion nor fragmentation can be told without it.
    DeviceMemoryUnknown,
    /// During a CUDA graph capture: frees still pending would leave, once complete, a block
    /// that serves the request, but the pool could not wait for them (a device synchronization
    /// would end the capture).
    PendingDuringCapture {
        /// What the pending frees asked for.
        pending: u64,
        /// The block they would leave that serves the request.
        block: u64,
    },
    /// During a CUDA graph capture: free cached memory in whole segments, which the pool gives
    /// back to the device only outside a capture, would make room for the segment the request
    /// needs, beside the device's free memory.
    HeldDuringCapture {
        /// Free cached bytes in whole segments.
        held: u64,
        /// What the device has free, as far as the fraction limit lets this process use it.
        device_free: u64,
        /// The segment the request needs.
        segment: u64,
    },
    /// What the live allocations and the request asked for fits, but not the blocks that hold
    /// them: blocks are larger than their requests (rounded up, handed out whole, remainders
    /// left unsplit), and with this one they exceed what this process can use.
    Padding {
        /// Live requested bytes plus the request's.
        requested: u64,
        /// Allocated bytes (and the blocks of frees still pending) plus the rounded request.
        needed: u64,
        available: u64,
        /// `needed - available`.
        missing: u64,
        /// Memory outside cachealloc, when the requests fit in what this process may use only
        /// without it (0 when they fit in `available`).
        held_outside: u64,
        /// What this process may use (the device, or the fraction limit).
        limit: u64,
        /// As in `OomReport`: the padding of the divisions, and of blocks beyond their requests.
        divisions_padding: u64,
        block_padding: u64,
        /// The rounded request, and the segment a new block for it takes.
        request: u64,
        segment: u64,
        /// The settings in force: the `max_split_size_mb` (when set), expandable segments.
        max_split_size_mb: Option<u64>,
        expandable_segments: bool,
    },
    /// The segment a new block for the request needs is larger than all the memory this
    /// process may use (the device, or the fraction limit), or than the memory left to it
    /// (`left`): not fragmentation.
    SegmentTooLarge {
        /// Rounded size of the request.
        request: u64,
        /// The segment it needs (`rounding::segment_size`).
        segment: u64,
        /// What this process may use at most.
        limit: u64,
        by_fraction_limit: bool,
        /// When the segment fits in `limit`: the memory left, which it does not fit in.
        left: Option<MemoryLeft>,
    },
    /// The request would fit in the capacity, but memory not tracked by cachealloc (other
    /// processes or contexts on the device) holds what is missing; `fraction_limit`, when the
    /// `per_process_memory_fraction` limit would also have to be raised for it to fit.
    Untracked {
        untracked: u64,
        missing: u64,
        fraction_limit: Option<u64>,
    },
    /// Enough bytes are reserved-but-unallocated plus free on the device, but no free block is
    /// big enough for the request.
    Fragmentation {
        /// Rounded size of the request.
        request: u64,
        /// Reserved but unallocated bytes (in split segments).
        unallocated: u64,
        /// Free bytes on the device that this process may still use (capped by the fraction
        /// limit).
        device_free: u64,
        /// `device_free` is less than the device has: the fraction limit caps it.
        fraction_capped: bool,
        /// The segment a new block for the request takes (`rounding::segment_size`).
        segment: u64,
        /// The largest free cached block of the request's pool (0 when none).
        largest_free_block: u64,
        /// For a request of the small pool, the large pool's largest free cached block (0 when
        /// none, and for a large request): it lies in a segment still in use.
        large_pool_free_block: u64,
        /// The `max_split_size_mb` to try (the largest standard value at or below the largest
        /// free block; for a small request, the large pool's), or `None` when one at or below
        /// it is already set or every such block is smaller than the smallest value.
        suggested_max_split_size_mb: Option<u64>,
        /// The `max_split_size_mb` in force, when set.
        current_max_split_size_mb: Option<u64>,
        /// Expandable segments were on (`max_split_size` then splits nothing whole).
        expandable_segments: bool,
        /// As in `OomReport`: the pages the device refused to map for it.
        refused_map: Option<u64>,
        /// As in `OomReport`: what `roundup_power2_divisions` add to the blocks.
        divisions_padding: u64,
        /// For a request of the large pool, the small pool's reserved but unallocated bytes
        /// (left out of `unallocated`: they serve only requests of 1 MiB or less); 0 for a
        /// small request, whose `unallocated` counts both pools.
        other_pool_unallocated: u64,
    },
    /// A large request would fit only in the small pool's reserved but unallocated memory as
    /// well: that serves only requests of 1 MiB or less, and lies in 2 MiB segments (pages,
    /// under expandable segments) that each still hold a live block. No setting gives it to
    /// the request.
    SmallPoolHeld {
        /// Rounded size of the request.
        request: u64,
        /// The large pool's reserved but unallocated bytes.
        unallocated: u64,
        /// As in `Fragmentation`.
        device_free: u64,
        fraction_capped: bool,
        /// The small pool's reserved but unallocated bytes.
        small_pool_unallocated: u64,
    },
    /// A free block of the request's stream would serve it now: it became free only while the
    /// request failed (pending frees completed when the pool synchronized), and PyTorch does
    /// not search its cache again after that (pytorch#189504). The same request made again is
    /// served.
    FreedDuringRequest {
        /// Rounded size of the request, and the block.
        request: u64,
        block: u64,
    },
    /// As fragmentation, but a free block large enough is cached for another stream: PyTorch's
    /// pools reuse a block only on the stream it was allocated on.
    OtherStream {
        /// Rounded size of the request.
        request: u64,
        unallocated: u64,
        /// As in `Fragmentation`.
        device_free: u64,
        fraction_capped: bool,
        /// The block of another stream that would have served it, and that stream.
        other_stream_block: u64,
        other_stream: StreamId,
        /// Expandable segments were on (then only `max_split_size_mb` is named to try).
        expandable_segments: bool,
    },
}

/// The memory left to a request whose new segment does not fit in it: what the device has free
/// (as far as the fraction limit lets this process use it), and what is reserved but
/// unallocated where a block of the request's pool could be cut from (for a small request,
/// both pools: the large pool's free memory may go back to the device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLeft {
    pub device_free: u64,
    pub fraction_capped: bool,
    pub unallocated: u64,
}

impl OomReport {
    /// The `max_split_size_mb` value the hint suggests, if it suggests one.
    pub fn suggested_max_split_size_mb(&self) -> Option<u64> {
        self.hint().suggested_max_split_size_mb()
    }

    /// Bytes reserved by cachealloc but not allocated.
    pub fn unallocated(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }

    /// Device memory in use that cachealloc did not reserve (other processes, CUDA contexts,
    /// other allocators in this process).
    pub fn untracked(&self) -> u64 {
        self.device_total
            .saturating_sub(self.device_free)
            .saturating_sub(self.reserved)
    }
}

#[cfg(test)]
mod tests;
