//! The out-of-memory report: built from a stats snapshot at the moment the miss ladder gave
//! up, so that an OOM explains itself (true exhaustion or fragmentation, and what to change).
//!
//! Note: how a report is classified (`OomReport::hint`). The request needs its rounded block
//! next to everything already allocated. What this process can use is what it reserved plus what
//! the device still has free, capped by `per_process_memory_fraction`.
//! - Exhausted: what the live allocations and the request asked for (`requested_bytes`, not
//!   the blocks that hold them) exceeds even the device capacity, or the fraction limit while
//!   the device has room (then raising the limit helps). No block layout can help: live memory
//!   must shrink. When the limit and memory outside cachealloc both stand in the way, it is
//!   reported as untracked memory, naming the limit too.
//! - Other stream: it fits in reserved-but-unallocated + free, and a free cached block is large
//!   enough, but it belongs to another stream. PyTorch's pools reuse a block only on the stream
//!   it was allocated on, and a split segment cannot be released while part of it is live. The
//!   remedy is to allocate on one stream, and settings may help too: under `max_split_size_mb`
//!   a block that large is never split, so it stays a whole segment that the pool returns to
//!   the device when it needs a new one, and expandable segments return free pages (1100 MiB
//!   freed on one stream, 100 MiB then taken there and 1000 MiB asked for on another fit under
//!   every standard value and under expandable segments). The hint names both.
//! - Freed during the request: a free block of the request's own stream serves it now. It
//!   became free only while the request failed (frees waiting for other streams' work complete
//!   when the pool synchronizes before returning memory), after the search, which PyTorch does
//!   not repeat (pytorch#189504): the same request made again is served.
//! - Segment too large: the request fits next to what is allocated, but no free block of any
//!   stream can hold it and the segment a new block needs (20 MiB for a 1–10 MiB request) is
//!   larger than all the memory this process may use, or than the memory left (free plus the
//!   request's pool's unallocated) when nothing fragmented stands in the way: the pages
//!   expandable segments would map past all that unallocated memory do not fit either (21
//!   requests of 5 MiB on 115 MiB: the 21st needs a sixth 20 MiB segment with 15 MiB free). No
//!   setting changes segment sizes.
//! - Untracked: it would fit in the capacity, but not in reserved + free, because memory outside
//!   cachealloc (other processes, CUDA contexts, other allocators) holds the difference.
//! - Fragmentation: it fits in reserved-but-unallocated + free, yet no free block (and no new
//!   segment) is large enough. By the time the report is built the ladder has released every
//!   fully free segment, so the unallocated reserved bytes sit in split segments next to live
//!   blocks. PyTorch's remedy is `max_split_size_mb`: blocks at or above it are never split, a
//!   request at or above it only takes a cached block that is at most `max_non_split_rounding`
//!   larger, and when no new segment can be obtained `release_available_cached_blocks` returns
//!   such blocks to the device before the pool tries again. The value to try is the largest of
//!   the standard values (`MAX_SPLIT_LADDER_MB`, the ones `cachealloc replay` tries) at or
//!   below the largest free cached block: under it, no free piece that large could have been
//!   cut from a bigger segment, and the request (larger than every free block) is served from a
//!   whole block or a fresh segment. When every free block is smaller than the smallest value
//!   (20 MiB, PyTorch's minimum), no value is named. The request's own size, the earlier rule,
//!   keeps only blocks larger than the request whole, while the pieces are cut from segments
//!   smaller than it. Replaying every fragmentation OOM of the real traces and of synthetic
//!   runs at several device sizes (`scripts/oom-hint-study.py`): of the 69 cases where some
//!   standard value avoids the OOM (30 distinct OOMs; in 37 cases every value does), this
//!   value avoids it in 60, the request's size in 41. A constant 20 also avoids it in 60, but
//!   at 1.95× the cudaMalloc calls of the cheapest fitting value, against 1.05× for this one.
//!   PyTorch's other remedy, `expandable_segments:True`, is named after it, as PyTorch's own
//!   message names it; `cachealloc replay` replays the workload with it after an OOM and says
//!   whether it fits (`trace::fit::try_expandable_segments`). A request of 1 MiB or less is
//!   served only from the small pool: free memory of the large pool cannot serve it, but goes
//!   back to the device when it is a whole segment, so the value to try is the one at or below
//!   the large pool's largest free block (which lies in a segment still in use), and with it
//!   expandable segments, whose free pages go back. Without such a block, the settings to try
//!   are finer `roundup_power2_divisions` or none (they pad small blocks too, so fewer fit in a
//!   segment), and under expandable segments native ones (whose large segments are rounded to
//!   2 MiB, not to 20 MiB pages); else expandable segments, under which the small pool's free
//!   blocks merge across its 2 MiB pages (a run of 512-byte to 1 MiB requests on 1100 MiB that
//!   fails natively fits so). A large request counts only its own pool's unallocated memory:
//!   the small pool's lies in 2 MiB segments (pages) that each hold a live block, so when only
//!   it makes the request fit, the hint says so and names no setting.
//!   With expandable segments memory grows by whole pages (20 MiB in the large pool): when the
//!   device refused the pages a request needed (`OomReport::refused_map`), the hint says so,
//!   and names native segments (the request rounded to 2 MiB) when one might fit.
//! - Padding: what the live allocations and the request asked for fits (in what this process
//!   may use; when memory outside cachealloc also stands in the way, the hint names it), but the
//!   blocks that hold them do not: blocks are larger than their requests (under
//!   `roundup_power2_divisions`; a cached block up to `max_non_split_rounding_mb` larger taken
//!   whole by a request of `max_split_size_mb` or more; a large block's remainder of 1 MiB or
//!   less left unsplit). The pool counts both kinds of padding (`divisions_padding`,
//!   `block_padding`); the hint gives them and names the settings that change that padding, to
//!   try. No rule here tells whether one lets the run fit: a setting changes the whole run's
//!   layout (segments rounded, pages mapped, blocks freed earlier), not only the live blocks'
//!   padding; two reviews found cases either way for every threshold tried. The replay of a
//!   recording tells, and it is not called exhaustion.
//!
//! The text follows PyTorch's newest message (its first sentence is the same shape with
//! "cachealloc" for "PyTorch") and adds lines of its own. This module does no I/O.

use super::format::format_size;
use super::rounding::{LARGE_BUFFER, MIN_BLOCK_SIZE, SMALL_BUFFER, pool_for};
use super::types::{DeviceId, PoolKind, StreamId};
use std::fmt;

/// The standard `max_split_size_mb` values, largest first, down to PyTorch's minimum (20): what
/// a fragmentation hint suggests and what `cachealloc replay` tries after an OOM.
pub const MAX_SPLIT_LADDER_MB: [u64; 8] = [1024, 512, 256, 128, 64, 48, 32, 20];
/// One mebibyte (`max_split_size_mb` counts these).
const MIB: u64 = 1 << 20; // bytes
/// How many of the largest free blocks the text lists.
const LISTED_FREE_BLOCKS: usize = 4;

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
    /// Device capacity and free bytes (`cudaMemGetInfo`) after every cache flush.
    pub device_total: u64,
    pub device_free: u64,
    /// `allocated_bytes.all.current`.
    pub allocated: u64,
    /// What the live allocations (and frees waiting for their fence) asked for, each request
    /// rounded up to 512 bytes as under any settings: their blocks without the rounding that
    /// settings add, whole-block handouts and unsplit remainders.
    pub live_requested: u64,
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
    /// What the live allocations and the request asked for fits, but not the blocks that hold
    /// them: blocks are larger than their requests (rounded up, handed out whole, remainders
    /// left unsplit), and with this one they exceed what this process can use.
    Padding {
        /// Live requested bytes plus the request's.
        requested: u64,
        /// Allocated bytes plus the rounded request.
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

    /// Classify the failure; see the module note for the reasoning.
    pub fn hint(&self) -> OomHint {
        // What any block layout needs (the requests, in 512-byte units), and what this one needs.
        // (`rounding::round_to_block`, saturating: a report's figures need not be consistent.)
        let request = self.requested.max(1).div_ceil(MIN_BLOCK_SIZE);
        let requested = self
            .live_requested
            .saturating_add(request.saturating_mul(MIN_BLOCK_SIZE));
        let needed = self.allocated.saturating_add(self.rounded);
        let limit = self
            .allowed_maximum
            .map_or(self.device_total, |allowed| allowed.min(self.device_total));
        let fraction_limited = limit < self.device_total;
        let obtainable = self.reserved.saturating_add(self.device_free);
        let available = obtainable.min(limit);
        if requested > limit {
            if requested > self.device_total || requested <= obtainable {
                return OomHint::Exhausted {
                    needed: requested,
                    available,
                    missing: requested - available,
                    // The device would have room without the limit.
                    by_fraction_limit: requested <= self.device_total,
                };
            }
            // The limit and memory outside cachealloc both stand in the way.
            return OomHint::Untracked {
                untracked: self.untracked(),
                missing: requested - obtainable,
                fraction_limit: Some(limit),
            };
        }
        if needed > limit {
            return self.padding(requested, needed, available, limit);
        }
        // What the device has free, as far as the fraction limit lets this process use it.
        let usable_free = self.device_free.min(limit.saturating_sub(self.reserved));
        let fraction_capped = usable_free < self.device_free;
        if let Some(block) = self.own_stream_fit {
            return OomHint::FreedDuringRequest {
                request: self.rounded,
                block,
            };
        }
        if let Some((other_stream, block)) = self.other_stream_fit {
            return OomHint::OtherStream {
                request: self.rounded,
                unallocated: self.unallocated(),
                device_free: usable_free,
                fraction_capped,
                other_stream_block: block,
                other_stream,
                expandable_segments: self.expandable_segments,
            };
        }
        // (A block cached for another stream is reserved memory at least the request's size, so
        // a request with one always fits in what is obtainable: no order between the two.)
        if self.alloc_size > limit {
            return OomHint::SegmentTooLarge {
                request: self.rounded,
                segment: self.alloc_size,
                limit,
                by_fraction_limit: fraction_limited && self.alloc_size <= self.device_total,
                left: None,
            };
        }
        if needed > obtainable {
            // Memory outside cachealloc holds part of what the blocks need; when the requests
            // alone fit, their blocks' padding is what settings can take away.
            if requested <= obtainable {
                return self.padding(requested, needed, available, limit);
            }
            return OomHint::Untracked {
                untracked: self.untracked(),
                missing: needed - obtainable,
                fraction_limit: None,
            };
        }
        // A small request cannot use the large pool's free memory, but that memory goes back
        // to the device when it is a whole segment, which max_split_size_mb keeps it. A large
        // request can use none of the small pool's: its 2 MiB segments (pages, under expandable
        // segments) still hold live blocks, or the ladder would have released them.
        let small_pool = pool_for(self.rounded) == PoolKind::Small;
        let unallocated = if small_pool {
            self.unallocated()
        } else {
            self.pool_unallocated.min(self.unallocated())
        };
        let other_pool_unallocated = self.unallocated() - unallocated;
        let room = unallocated.saturating_add(usable_free);
        // The segment is the cause when neither it nor the pages expandable segments would map
        // (whole pages past what is unallocated, were all of it at the range's end) fit in
        // what is left: nothing fragmented stands in the way.
        let page = if small_pool {
            SMALL_BUFFER
        } else {
            LARGE_BUFFER
        };
        let pages = self
            .rounded
            .saturating_sub(unallocated)
            .div_ceil(page)
            .saturating_mul(page);
        if !self.expandable_segments
            && self.rounded <= room
            && self.alloc_size > room
            && pages > usable_free
        {
            return OomHint::SegmentTooLarge {
                request: self.rounded,
                segment: self.alloc_size,
                limit,
                by_fraction_limit: false,
                left: Some(MemoryLeft {
                    device_free: usable_free,
                    fraction_capped,
                    unallocated,
                }),
            };
        }
        let current_mb = self.max_split_size_mb();
        let largest_free_block = self.pool_largest_free_block;
        let large_pool_free_block = if small_pool {
            self.large_pool_largest_free_block
        } else {
            0
        };
        let basis = match (small_pool, self.expandable_segments) {
            (false, _) => largest_free_block,
            (true, false) => large_pool_free_block,
            // The ladder has unmapped every free page already.
            (true, true) => 0,
        };
        // None when every such block is below the smallest value: no setting keeps such
        // pieces whole.
        let suggested = MAX_SPLIT_LADDER_MB
            .into_iter()
            .find(|&mb| mb * MIB <= basis);
        OomHint::Fragmentation {
            request: self.rounded,
            unallocated,
            device_free: usable_free,
            fraction_capped,
            segment: self.alloc_size,
            largest_free_block,
            large_pool_free_block,
            suggested_max_split_size_mb: suggested
                .filter(|&mb| current_mb.is_none_or(|current| current > mb)),
            current_max_split_size_mb: current_mb,
            expandable_segments: self.expandable_segments,
            refused_map: self.refused_map,
            divisions_padding: self.divisions_padding,
            other_pool_unallocated,
        }
    }

    /// The `max_split_size_mb` in force, when set.
    fn max_split_size_mb(&self) -> Option<u64> {
        (self.max_split_size != u64::MAX).then_some(self.max_split_size / MIB)
    }

    /// The padding hint: the requests fit in `limit` (and in `available` unless memory outside
    /// cachealloc stands in the way too), their blocks (`needed`) do not.
    fn padding(&self, requested: u64, needed: u64, available: u64, limit: u64) -> OomHint {
        OomHint::Padding {
            requested,
            needed,
            available,
            missing: needed - available,
            held_outside: if requested > available {
                self.untracked()
            } else {
                0
            },
            limit,
            divisions_padding: self.divisions_padding,
            block_padding: self.block_padding,
            request: self.rounded,
            segment: self.alloc_size,
            max_split_size_mb: self.max_split_size_mb(),
            expandable_segments: self.expandable_segments,
        }
    }
}

/// The end of a hint that names a `max_split_size_mb` value to try.
const FINDS_VALUES: &str = " `cachealloc replay` of a recorded trace finds the values that fit.";
/// The end of a hint after which a setting may help, none named.
const SHOWS_SETTINGS: &str =
    "; `cachealloc replay` of a recorded trace shows whether any setting helps";

/// Qualifies "free on the device" when the fraction limit caps what this process may use.
fn within_limit(fraction_capped: bool) -> &'static str {
    if fraction_capped {
        " within the per_process_memory_fraction limit"
    } else {
        ""
    }
}

/// Why a new segment is larger than the block it is obtained for: the rule of
/// `rounding::segment_size` that gave it.
fn segment_rule(segment: u64) -> &'static str {
    match segment {
        SMALL_BUFFER => "requests up to 1 MiB share 2 MiB segments",
        LARGE_BUFFER => "requests of 1-10 MiB get 20 MiB segments",
        _ => "larger requests get segments rounded up to 2 MiB",
    }
}

impl OomHint {
    /// The `max_split_size_mb` value this hint suggests, if it suggests one.
    pub fn suggested_max_split_size_mb(&self) -> Option<u64> {
        match *self {
            OomHint::Fragmentation {
                suggested_max_split_size_mb,
                ..
            } => suggested_max_split_size_mb,
            _ => None,
        }
    }

    /// Whether an allocator setting may avoid this out-of-memory (the hints that point to a
    /// replay of a recording to find one). The others name what no setting changes: live
    /// memory, a segment's size, memory held outside the allocator, or the fraction limit,
    /// which the hint itself names.
    pub fn settings_may_help(&self) -> bool {
        match self {
            OomHint::OtherStream { .. } => true,
            OomHint::Padding { .. } => !self.padding_settings().is_empty(),
            // Each names a setting to try, but when the room lies in the small pool, which no
            // setting gives to a large request.
            OomHint::Fragmentation { .. } => !self.small_pool_holds_the_room(),
            _ => false,
        }
    }

    /// For a fragmentation hint of a large request: the room it counted on is the small pool's
    /// unallocated memory, without which the large pool's and the device's is too little.
    fn small_pool_holds_the_room(&self) -> bool {
        match *self {
            OomHint::Fragmentation {
                request,
                unallocated,
                device_free,
                other_pool_unallocated,
                ..
            } => other_pool_unallocated > 0 && request > unallocated.saturating_add(device_free),
            _ => false,
        }
    }

    /// For a padding hint, the settings that change the padding it found (empty for the other
    /// hints). Whether one of them lets the run fit, no rule here can tell (a setting changes
    /// the whole run's layout, not only the live blocks' padding): a replay of the recording
    /// does.
    fn padding_settings(&self) -> Vec<&'static str> {
        let OomHint::Padding {
            divisions_padding,
            block_padding,
            max_split_size_mb,
            expandable_segments,
            ..
        } = *self
        else {
            return Vec::new();
        };
        let mut settings = Vec::new();
        if divisions_padding > 0 {
            settings.push("roundup_power2_divisions with more divisions (finer steps), or none");
        }
        if block_padding > 0 && !expandable_segments {
            if max_split_size_mb.is_some() {
                settings.push(
                    "max_split_size_mb above the cached blocks taken whole, or none (blocks are \
                     then split, which may leave other pieces)",
                );
            }
            settings.push(
                "expandable_segments:True (any rest of 512 bytes or more is split off, but \
                 memory is mapped in whole 20 MiB pages)",
            );
        }
        settings
    }
}

/// What the `max_split_size_mb` a hint suggests does to the settings in force.
fn suggested_in(current: Option<u64>) -> String {
    match current {
        Some(mb) => format!("in place of max_split_size_mb:{mb}"),
        None => "added to the other settings in force".to_string(),
    }
}

/// `cachealloc replay` as the way to find a setting that helps, where the hint's text ends
/// with it; left out in the alternate form (`{:#}`), for a reader who is already shown that
/// replay's answer or the advice that leads to it.
fn replay_pointer(f: &fmt::Formatter<'_>, text: &'static str) -> &'static str {
    if f.alternate() { "" } else { text }
}

impl fmt::Display for OomHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            OomHint::Exhausted {
                needed,
                available,
                missing,
                by_fraction_limit,
            } => {
                write!(
                    f,
                    "Not fragmentation: live allocations plus this request asked for {} but this \
                     process can use at most {}, {} short. ",
                    format_size(needed),
                    format_size(available),
                    format_size(missing)
                )?;
                if by_fraction_limit {
                    f.write_str(
                        "The per_process_memory_fraction limit binds (the device has room): \
                         raise it, or keep less memory alive (smaller batch, release tensors \
                         earlier).",
                    )
                } else {
                    f.write_str(
                        "No allocator setting helps: keep less memory alive (smaller batch, \
                         release tensors earlier) or use a larger GPU.",
                    )
                }
            }
            OomHint::SegmentTooLarge {
                request,
                segment,
                limit,
                by_fraction_limit,
                left,
            } => {
                write!(
                    f,
                    "Not fragmentation: no free block can hold this {} block, and a new segment \
                     for it takes {} ({}), ",
                    format_size(request),
                    format_size(segment),
                    segment_rule(segment),
                )?;
                if let Some(left) = left {
                    let page = if segment == SMALL_BUFFER {
                        SMALL_BUFFER
                    } else {
                        LARGE_BUFFER
                    };
                    return write!(
                        f,
                        "more than the memory left: {} free on the device{} plus {} reserved but \
                         unallocated {}. No allocator setting changes segment sizes, and \
                         expandable segments map whole pages of {}: keep less memory alive or \
                         use a larger GPU.",
                        format_size(left.device_free),
                        within_limit(left.fraction_capped),
                        format_size(left.unallocated),
                        if segment == SMALL_BUFFER {
                            "(in either pool)"
                        } else {
                            "in its pool"
                        },
                        format_size(page)
                    );
                }
                write!(
                    f,
                    "more than this process can use at all ({}). ",
                    format_size(limit)
                )?;
                f.write_str(if by_fraction_limit {
                    "No allocator setting changes segment sizes: raise \
                     per_process_memory_fraction or use a larger GPU."
                } else {
                    "No allocator setting changes segment sizes: use a larger GPU."
                })
            }
            OomHint::FreedDuringRequest { request, block } => write!(
                f,
                "Freed too late: a free cached block of {} now holds this {} block, but it \
                 became free only while this request failed (frees waiting for other streams' \
                 work, record_stream, completed when the pool synchronized before returning \
                 memory), and PyTorch does not search its cache again after that \
                 (pytorch#189504). The same request made again is served; no allocator setting \
                 is needed.",
                format_size(block),
                format_size(request)
            ),
            OomHint::Padding {
                requested,
                available,
                missing,
                held_outside,
                limit,
                divisions_padding,
                block_padding,
                request,
                segment,
                max_split_size_mb,
                expandable_segments,
                ..
            } => {
                if held_outside == 0 {
                    write!(
                        f,
                        "Not fragmentation, but blocks larger than their requests: live \
                         allocations plus this request asked for {}, which fits in the {} this \
                         process can use, but the blocks that hold them take {} more than that. ",
                        format_size(requested),
                        format_size(available),
                        format_size(missing),
                    )?;
                } else {
                    write!(
                        f,
                        "Not fragmentation, but blocks larger than their requests, and memory \
                         outside cachealloc: live allocations plus this request asked for {}, \
                         which fits in the {} this process may use only without the {} held \
                         outside cachealloc (free that memory too), and the blocks that hold \
                         them take {} more than this process can use. ",
                        format_size(requested),
                        format_size(limit),
                        format_size(held_outside),
                        format_size(missing),
                    )?;
                }
                if segment > request {
                    write!(
                        f,
                        "A new segment for this {} block takes {}. ",
                        format_size(request),
                        format_size(segment)
                    )?;
                }
                // What pads the blocks, of what the settings in force allow.
                let mut parts = Vec::new();
                if divisions_padding > 0 {
                    parts.push(format!(
                        "roundup_power2_divisions round the blocks up by {}",
                        format_size(divisions_padding)
                    ));
                }
                if block_padding > 0 {
                    let whole = match max_split_size_mb.filter(|_| !expandable_segments) {
                        Some(mb) => format!(
                            "taken whole (a request of {mb} MiB or more, max_split_size_mb, takes \
                             a cached block up to max_non_split_rounding_mb larger) or "
                        ),
                        None => String::new(),
                    };
                    parts.push(format!(
                        "blocks {whole}left with a rest of 1 MiB or less unsplit hold {} more",
                        format_size(block_padding)
                    ));
                }
                if !parts.is_empty() {
                    write!(f, "Of the padding, {}. ", parts.join(", and "))?;
                }
                let settings = self.padding_settings();
                if settings.is_empty() {
                    f.write_str("No setting changes this padding: keep less memory alive.")
                } else {
                    write!(
                        f,
                        "Settings that change it, to try: {}{}.",
                        settings.join("; "),
                        replay_pointer(f, SHOWS_SETTINGS)
                    )
                }
            }
            OomHint::Untracked {
                untracked,
                missing,
                fraction_limit,
            } => {
                write!(
                    f,
                    "Memory outside cachealloc: {} of this GPU is used by other processes, CUDA \
                     contexts or other allocators; the request is {} short, and would fit \
                     without it",
                    format_size(untracked),
                    format_size(missing)
                )?;
                if let Some(limit) = fraction_limit {
                    write!(
                        f,
                        " and with per_process_memory_fraction raised (it allows {})",
                        format_size(limit)
                    )?;
                }
                f.write_str(". Free that memory or run on a less busy GPU.")
            }
            OomHint::OtherStream {
                request,
                unallocated,
                device_free,
                fraction_capped,
                other_stream_block,
                other_stream,
                expandable_segments,
            } => write!(
                f,
                "Cached for another stream: {} reserved but unallocated plus {} free on the \
                 device{} would hold this {} block, and a free cached block of {} would too, but \
                 it belongs to stream {:#x}: a block is reused only on the stream it was \
                 allocated on. Allocating these tensors on the stream that freed that memory, \
                 or all of them on one stream, lets it be reused. Settings to try too: \
                 max_split_size_mb (blocks at or above it are never split, so free memory that \
                 large stays in whole segments, which the pool returns to the device when it \
                 needs a new one){}{}.",
                format_size(unallocated),
                format_size(device_free),
                within_limit(fraction_capped),
                format_size(request),
                format_size(other_stream_block),
                other_stream.0,
                if expandable_segments {
                    ""
                } else {
                    ", and expandable_segments:True (free pages go back to the device)"
                },
                replay_pointer(f, SHOWS_SETTINGS)
            ),
            OomHint::Fragmentation {
                request,
                unallocated,
                device_free,
                fraction_capped,
                segment,
                largest_free_block,
                large_pool_free_block,
                suggested_max_split_size_mb,
                current_max_split_size_mb,
                expandable_segments,
                refused_map,
                divisions_padding,
                other_pool_unallocated,
            } => {
                if self.small_pool_holds_the_room() {
                    return write!(
                        f,
                        "Fragmentation of the small pool: {} reserved but unallocated in the \
                         large pool plus {} free on the device{} would not hold this {} block, \
                         and the {} reserved but unallocated in the small pool serves only \
                         requests of 1 MiB or less: it lies in 2 MiB segments (pages, under \
                         expandable segments) that each still hold a live block, and goes back \
                         to the device only when they are wholly free. No allocator setting \
                         gives it to this request: keep fewer small tensors alive here.",
                        format_size(unallocated),
                        format_size(device_free),
                        within_limit(fraction_capped),
                        format_size(request),
                        format_size(other_pool_unallocated),
                    );
                }
                write!(
                    f,
                    "Fragmentation: {} reserved but unallocated ",
                    format_size(unallocated)
                )?;
                if other_pool_unallocated > 0 {
                    write!(
                        f,
                        "in the large pool (the {} of the small pool serves only requests of 1 \
                         MiB or less) ",
                        format_size(other_pool_unallocated)
                    )?;
                }
                write!(
                    f,
                    "plus {} free on the device{} would hold this {} block, but ",
                    format_size(device_free),
                    within_limit(fraction_capped),
                    format_size(request),
                )?;
                if largest_free_block == 0 {
                    f.write_str("no block of its pool is cached free. ")?;
                } else {
                    write!(
                        f,
                        "the largest free cached block of its pool is {}. ",
                        format_size(largest_free_block)
                    )?;
                }
                match refused_map {
                    Some(map) => write!(
                        f,
                        "Expandable segments grow by whole pages: the {} of pages it needed next \
                         are more than the device has free. ",
                        format_size(map)
                    )?,
                    None if !expandable_segments
                        && device_free >= request
                        && device_free < segment =>
                    {
                        write!(
                            f,
                            "The device's free memory would hold the block itself, but a new \
                             segment for it takes {} ({}). ",
                            format_size(segment),
                            segment_rule(segment)
                        )?
                    }
                    None => {}
                }
                let smallest = MAX_SPLIT_LADDER_MB[MAX_SPLIT_LADDER_MB.len() - 1];
                let small_pool = segment == SMALL_BUFFER;
                // A large request refused its pages might fit in a native segment: reserved but
                // unallocated plus free is what native segments might have left. (The small
                // pool's pages are its segments' size anyway.)
                let native_may_fit = refused_map.is_some()
                    && !small_pool
                    && segment <= unallocated.saturating_add(device_free);
                let instead = suggested_in(current_max_split_size_mb);
                match (suggested_max_split_size_mb, current_max_split_size_mb) {
                    // The large pool's free memory lies in segments still in use.
                    (Some(mb), _) if small_pool => write!(
                        f,
                        "Requests of 1 MiB or less are served only from the small pool's 2 MiB \
                         segments. The large pool's free memory cannot serve them, and goes back \
                         to the device only as whole segments: its largest free block, {}, lies \
                         in a segment still in use. A value to try: max_split_size_mb:{mb} \
                         ({instead}): blocks of {mb} MiB or more are then never split, so free \
                         memory that large stays in whole segments, which the pool returns to \
                         the device when it needs a new one.{}",
                        format_size(large_pool_free_block),
                        replay_pointer(f, FINDS_VALUES)
                    ),
                    (None, _) if small_pool => {
                        f.write_str(
                            "Requests of 1 MiB or less are served only from the small pool's 2 \
                             MiB segments",
                        )?;
                        if expandable_segments {
                            // The large pool's whole pages may be what leaves no room.
                            write!(
                                f,
                                ". A setting to try: expandable_segments:False (the default), \
                                 under which larger requests take segments rounded to 2 MiB, not \
                                 whole 20 MiB pages{}.",
                                replay_pointer(f, SHOWS_SETTINGS)
                            )
                        } else if divisions_padding > 0 {
                            write!(
                                f,
                                ", and roundup_power2_divisions round the blocks up by {} in \
                                 all, so fewer fit in each. A setting to try: \
                                 roundup_power2_divisions with more divisions (finer steps), or \
                                 none{}.",
                                format_size(divisions_padding),
                                replay_pointer(f, SHOWS_SETTINGS)
                            )
                        } else {
                            write!(
                                f,
                                "{}. A setting to try: expandable_segments:True, under which the \
                                 small pool's blocks lie in one address range and free blocks \
                                 merge across its 2 MiB pages{}. Else keep less memory alive.",
                                if large_pool_free_block > 0 {
                                    "; memory reserved in the large pool serves only larger \
                                     requests"
                                } else {
                                    ""
                                },
                                replay_pointer(f, SHOWS_SETTINGS)
                            )
                        }
                    }
                    (Some(mb), _) if expandable_segments => write!(
                        f,
                        "A value to try: max_split_size_mb:{mb} ({instead}): with expandable \
                         segments it splits nothing whole, but requests smaller than {mb} MiB no \
                         longer take cached blocks of {mb} MiB or more, which keeps such blocks \
                         for the large requests.{}",
                        replay_pointer(f, FINDS_VALUES)
                    ),
                    (Some(mb), _) => write!(
                        f,
                        "A value to try: max_split_size_mb:{mb} ({instead}): blocks of {mb} MiB \
                         or more are then never split, so free memory is no longer left in \
                         pieces that large cut from bigger segments, and when the device cannot \
                         supply a new segment, cached blocks of {mb} MiB or more that the \
                         request cannot use are released first.{}",
                        replay_pointer(f, FINDS_VALUES)
                    ),
                    (None, Some(current)) if largest_free_block >= smallest * MIB => write!(
                        f,
                        "max_split_size_mb is already {current}; keep less memory alive or \
                         allocate the large tensors first, before small ones split the segments."
                    ),
                    (None, _) => {
                        if largest_free_block == 0 {
                            f.write_str(
                                "Nothing of its pool is cached free, so no max_split_size_mb \
                                 value applies.",
                            )?;
                        } else {
                            write!(
                                f,
                                "Every free cached block is smaller than {smallest} MiB, the \
                                 smallest max_split_size_mb, so no value keeps pieces this small \
                                 whole."
                            )?;
                        }
                        // Pages, not the order of allocation, stood in the way under expandable
                        // segments; native ones are named below when they may fit.
                        if native_may_fit {
                            Ok(())
                        } else if refused_map.is_some() || largest_free_block == 0 {
                            f.write_str(" Keep less memory alive.")
                        } else {
                            write!(
                                f,
                                " Keep less memory alive or allocate the large tensors first, \
                                 before small ones split the segments{}.",
                                replay_pointer(
                                    f,
                                    "; `cachealloc replay` of a recorded trace shows whether any \
                                     max_split_size_mb value helps"
                                )
                            )
                        }
                    }
                }?;
                // "Another" only after a value named above.
                let setting = if suggested_max_split_size_mb.is_some() {
                    " Another setting to try:"
                } else {
                    " A setting to try:"
                };
                if !expandable_segments && !small_pool {
                    f.write_str(setting)?;
                    f.write_str(if unallocated > 0 {
                        " expandable_segments:True, PyTorch's advice when memory reserved but \
                         unallocated is large."
                    } else {
                        " expandable_segments:True."
                    })?;
                }
                if !expandable_segments && small_pool && suggested_max_split_size_mb.is_some() {
                    f.write_str(
                        " Another setting to try: expandable_segments:True, under which the \
                         free pages of any segment go back to the device.",
                    )?;
                }
                if native_may_fit {
                    write!(
                        f,
                        "{setting} expandable_segments:False (the default), under which a new \
                         segment for this block takes {}, not whole pages.",
                        format_size(segment)
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for OomReport {
    /// PyTorch's sentence first, then one line each: the request's sizes, memory not tracked by
    /// cachealloc, the largest free cached blocks, and the hint (in the alternate form `{:#}`,
    /// without its pointer to `cachealloc replay`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which \
             {} is free. ",
            format_size(self.alloc_size),
            self.device.0,
            format_size(self.device_total),
            format_size(self.device_free)
        )?;
        if let Some(allowed) = self.allowed_maximum {
            write!(f, "{} allowed; ", format_size(allowed))?;
        }
        writeln!(
            f,
            "Of the allocated memory {} is allocated by cachealloc, and {} is reserved by \
             cachealloc but unallocated.",
            format_size(self.allocated),
            format_size(self.unallocated())
        )?;
        write!(
            f,
            "Request: {} ({} bytes) on stream {:#x}, rounded to a {} block, ",
            format_size(self.requested),
            self.requested,
            self.stream.0,
            format_size(self.rounded),
        )?;
        if self.expandable_segments {
            writeln!(f, "in pages mapped into an expandable segment.")?;
        } else {
            writeln!(f, "needing a {} segment.", format_size(self.alloc_size))?;
        }
        writeln!(
            f,
            "Memory not tracked by cachealloc (other processes, CUDA contexts, other \
             allocators): {}.",
            format_size(self.untracked())
        )?;
        if self.largest_free_blocks.is_empty() {
            writeln!(f, "Largest free cached blocks: none.")?;
        } else {
            let listed: Vec<String> = self
                .largest_free_blocks
                .iter()
                .take(LISTED_FREE_BLOCKS)
                .map(|&size| format_size(size))
                .collect();
            let more = self.free_blocks.saturating_sub(listed.len());
            write!(f, "Largest free cached blocks: {}", listed.join(", "))?;
            if more > 0 {
                write!(f, " (and {more} more)")?;
            }
            writeln!(f, ".")?;
        }
        if self.other_streams_free > 0 {
            writeln!(
                f,
                "Cached in this pool for other streams (this request cannot use it): {}, the \
                 largest block {}.",
                format_size(self.other_streams_free),
                format_size(self.other_streams_largest_free_block)
            )?;
        }
        if f.alternate() {
            write!(f, "Hint: {:#}", self.hint())
        } else {
            write!(f, "Hint: {}", self.hint())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// An 80 GiB device on which a 1000 MiB request failed with 18 GiB reserved but unallocated.
    fn fragmented() -> OomReport {
        OomReport {
            expandable_segments: false,
            device: DeviceId(0),
            stream: StreamId(0),
            requested: 1_048_575_900,
            rounded: 1000 * MIB,
            alloc_size: 1000 * MIB,
            device_total: 80 * GIB,
            device_free: 512 * MIB,
            allocated: 60 * GIB,
            live_requested: 60 * GIB,
            reserved: 78 * GIB,
            allowed_maximum: None,
            largest_free_blocks: vec![600 * MIB, 300 * MIB, 20 * MIB, 2 * MIB, MIB],
            free_blocks: 5,
            pool_largest_free_block: 600 * MIB,
            pool_unallocated: 18 * GIB,
            other_streams_free: 0,
            other_streams_largest_free_block: 0,
            other_stream_fit: None,
            own_stream_fit: None,
            divisions_padding: 0,
            block_padding: 0,
            large_pool_largest_free_block: 600 * MIB,
            max_split_size: u64::MAX,
            refused_map: None,
        }
    }

    /// A 1-10 MiB request needs a 20 MiB segment: on a device (or under a fraction limit)
    /// smaller than that, with no free block to take it, no setting helps, whatever is
    /// reserved but unallocated elsewhere.
    #[test]
    fn a_segment_larger_than_the_device_is_not_fragmentation() {
        let report = OomReport {
            requested: 8 * MIB,
            rounded: 8 * MIB,
            alloc_size: 20 * MIB,
            device_total: 10 * MIB,
            device_free: 7 * MIB,
            allocated: MIB,
            live_requested: MIB,
            reserved: 2 * MIB,
            largest_free_blocks: vec![MIB],
            free_blocks: 1,
            pool_largest_free_block: 0,
            ..fragmented()
        };
        assert_eq!(
            report.hint(),
            OomHint::SegmentTooLarge {
                request: 8 * MIB,
                segment: 20 * MIB,
                limit: 10 * MIB,
                by_fraction_limit: false,
                left: None,
            }
        );
        assert!(
            report.to_string().contains(
                "Hint: Not fragmentation: no free block can hold this 8.00 MiB block, and a new \
                 segment for it takes 20.00 MiB (requests of 1-10 MiB get 20 MiB segments), more \
                 than this process can use at all (10.00 MiB). No allocator setting changes \
                 segment sizes: use a larger GPU."
            ),
            "{report}"
        );
    }

    /// Under a fraction limit, the fragmentation hint counts only the free device memory the
    /// limit still allows, and says so.
    #[test]
    fn fragmentation_under_a_fraction_limit_counts_what_the_limit_allows() {
        let report = OomReport {
            allowed_maximum: Some(78 * GIB + 256 * MIB),
            ..fragmented()
        };
        match report.hint() {
            OomHint::Fragmentation {
                device_free,
                fraction_capped,
                ..
            } => assert_eq!((device_free, fraction_capped), (256 * MIB, true)),
            other => panic!("expected fragmentation: {other:?}"),
        }
        assert!(
            report.to_string().contains(
                "Fragmentation: 18.00 GiB reserved but unallocated plus 256.00 MiB free on the \
                 device within the per_process_memory_fraction limit would hold"
            ),
            "{report}"
        );
    }

    #[test]
    fn live_memory_over_capacity_is_exhaustion() {
        let report = OomReport {
            allocated: 79 * GIB,
            live_requested: 79 * GIB,
            reserved: 79 * GIB + 512 * MIB,
            device_free: 256 * MIB,
            requested: 2 * GIB,
            rounded: 2 * GIB,
            alloc_size: 2 * GIB,
            ..fragmented()
        };
        let hint = report.hint();
        assert_eq!(
            hint,
            OomHint::Exhausted {
                needed: 81 * GIB,
                available: 79 * GIB + 768 * MIB,
                missing: 1280 * MIB,
                by_fraction_limit: false,
            }
        );
        let text = hint.to_string();
        assert!(text.starts_with("Not fragmentation"), "{text}");
        assert!(text.contains("1.25 GiB short"), "{text}");
        assert!(!text.contains("max_split_size_mb"), "{text}");
    }

    /// Blocks larger than their requests (rounding, whole handouts) are not live memory: when
    /// the requests fit, the report says so and points to settings, not to a larger GPU.
    #[test]
    fn blocks_over_capacity_with_requests_that_fit_are_padding() {
        let report = OomReport {
            allocated: 79 * GIB,
            live_requested: 78 * GIB,
            reserved: 79 * GIB + 512 * MIB,
            device_free: 256 * MIB,
            requested: GIB + 1,
            rounded: 2 * GIB,
            alloc_size: 2 * GIB,
            // Divisions round the live blocks up by 1 GiB, and this request by 1 GiB - 511.
            divisions_padding: 2 * GIB - 511,
            ..fragmented()
        };
        let hint = report.hint();
        assert_eq!(
            hint,
            OomHint::Padding {
                requested: 79 * GIB + 512,
                needed: 81 * GIB,
                available: 79 * GIB + 768 * MIB,
                missing: 1280 * MIB,
                held_outside: 0,
                limit: 80 * GIB,
                divisions_padding: 2 * GIB - 511,
                block_padding: 0,
                request: 2 * GIB,
                segment: 2 * GIB,
                max_split_size_mb: None,
                expandable_segments: false,
            }
        );
        assert!(hint.settings_may_help());
        let text = report.to_string();
        assert!(
            text.contains(
                "Hint: Not fragmentation, but blocks larger than their requests: live allocations \
                 plus this request asked for 79.00 GiB, which fits in the 79.75 GiB this process \
                 can use, but the blocks that hold them take 1.25 GiB more than that. Of the \
                 padding, roundup_power2_divisions round the blocks up by 2.00 GiB. Settings \
                 that change it, to try: roundup_power2_divisions with more divisions (finer \
                 steps), or none; `cachealloc replay` of a recorded trace shows whether any \
                 setting helps."
            ),
            "{text}"
        );
        assert!(!text.contains("larger GPU"), "{text}");
    }

    /// The fraction limit is named as what binds only when the device would have had room.
    #[test]
    fn a_fraction_limit_below_a_need_the_device_cannot_meet_is_not_what_binds() {
        // More than the whole device: raising the limit cannot help.
        let over_device = OomReport {
            allowed_maximum: Some(79 * GIB),
            allocated: 79 * GIB,
            live_requested: 79 * GIB,
            reserved: 79 * GIB,
            device_free: GIB,
            requested: 2 * GIB,
            rounded: 2 * GIB,
            alloc_size: 2 * GIB,
            ..fragmented()
        };
        assert!(matches!(
            over_device.hint(),
            OomHint::Exhausted {
                by_fraction_limit: false,
                ..
            }
        ));
        assert!(over_device.to_string().contains("use a larger GPU"));
        // Within the device, but memory outside cachealloc holds what the limit would allow.
        let held_outside = OomReport {
            allowed_maximum: Some(60 * GIB),
            allocated: 59 * GIB,
            live_requested: 59 * GIB,
            reserved: 59 * GIB,
            device_free: GIB,
            requested: 2 * GIB,
            rounded: 2 * GIB,
            alloc_size: 2 * GIB,
            ..fragmented()
        };
        assert_eq!(
            held_outside.hint(),
            OomHint::Untracked {
                untracked: 20 * GIB,
                missing: GIB,
                fraction_limit: Some(60 * GIB),
            }
        );
        assert!(
            held_outside.to_string().contains(
                "would fit without it and with per_process_memory_fraction raised (it allows \
                 60.00 GiB)"
            ),
            "{held_outside}"
        );
    }

    /// With expandable segments, memory grows by whole pages: a request refused because its
    /// pages do not fit is told so, whatever its size, and told that a native segment would fit
    /// when it would (a 1010 MiB block mapped 51 pages of a 1 GiB device, and a 12 MiB request
    /// needs a page more than the 10 MiB free at the range's end).
    #[test]
    fn an_expandable_segment_growing_by_more_than_is_free_is_named() {
        let report = OomReport {
            allocated: 1010 * MIB,
            live_requested: 1010 * MIB,
            reserved: 1020 * MIB,
            device_total: GIB,
            device_free: 4 * MIB,
            requested: 12 * MIB,
            rounded: 12 * MIB,
            alloc_size: 12 * MIB,
            largest_free_blocks: vec![10 * MIB],
            free_blocks: 1,
            pool_largest_free_block: 10 * MIB,
            large_pool_largest_free_block: 10 * MIB,
            expandable_segments: true,
            refused_map: Some(20 * MIB),
            ..fragmented()
        };
        let text = report.to_string();
        assert!(
            text.contains(
                "rounded to a 12.00 MiB block, in pages mapped into an expandable segment."
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "Expandable segments grow by whole pages: the 20.00 MiB of pages it needed next \
                 are more than the device has free."
            ),
            "{text}"
        );
        // Pages, not the order of allocation, stood in the way; a native segment of the
        // request's size (12 MiB) might fit in the 14 MiB reserved but unallocated plus free.
        assert!(!text.contains("allocate the large tensors first"), "{text}");
        assert!(!text.contains("expandable_segments:True"), "{text}");
        assert!(
            text.ends_with(
                "A setting to try: expandable_segments:False (the default), under which a \
                 new segment for this block takes 12.00 MiB, not whole pages."
            ),
            "{text}"
        );
        // Not when even that is too little.
        let larger = OomReport {
            requested: 16 * MIB,
            rounded: 16 * MIB,
            alloc_size: 16 * MIB,
            ..report.clone()
        };
        assert!(!larger.to_string().contains("expandable_segments:False"));
        // Nor is the order of allocation named when a native segment would not fit either: a
        // 1.5 MiB request (a 20 MiB segment) refused the page after a 1 MiB free block.
        let tail = OomReport {
            allocated: 1019 * MIB,
            live_requested: 1019 * MIB,
            requested: 3 * MIB / 2,
            rounded: 3 * MIB / 2,
            alloc_size: 20 * MIB,
            largest_free_blocks: vec![MIB],
            pool_largest_free_block: MIB,
            large_pool_largest_free_block: MIB,
            ..report.clone()
        };
        let text = tail.to_string();
        assert!(
            text.ends_with(
                "Every free cached block is smaller than 20 MiB, the smallest \
                 max_split_size_mb, so no value keeps pieces this small whole. Keep less memory \
                 alive."
            ),
            "{text}"
        );
        // Without a refused map there is nothing to say of pages.
        let mapped = OomReport {
            refused_map: None,
            ..report
        };
        assert!(!mapped.to_string().contains("whole pages"));
    }

    /// A request of the small pool cannot use the large pool's free memory, whatever the
    /// settings: the hint says so rather than advising on allocation order.
    #[test]
    fn a_small_request_is_told_the_large_pools_memory_cannot_serve_it() {
        let report = OomReport {
            requested: 512 * 1024,
            rounded: 512 * 1024,
            alloc_size: SMALL_BUFFER,
            device_free: MIB,
            pool_largest_free_block: 0,
            // Too small a piece for any max_split_size_mb to keep whole.
            large_pool_largest_free_block: 16 * MIB,
            ..fragmented()
        };
        // Expandable segments are the setting to try: the small pool's blocks then lie in one
        // address range, and free blocks merge across its 2 MiB pages (a run of requests of
        // 512 bytes to 1 MiB on 1100 MiB that fails natively fits so).
        assert!(report.hint().settings_may_help());
        let text = report.to_string();
        assert!(
            text.contains("no block of its pool is cached free."),
            "{text}"
        );
        assert!(
            text.ends_with(
                "Requests of 1 MiB or less are served only from the small pool's 2 MiB \
                 segments; memory reserved in the large pool serves only larger requests. A \
                 setting to try: expandable_segments:True, under which the small pool's blocks \
                 lie in one address range and free blocks merge across its 2 MiB pages; \
                 `cachealloc replay` of a recorded trace shows whether any setting helps. Else \
                 keep less memory alive."
            ),
            "{text}"
        );
        assert!(!text.contains("no setting changes that"), "{text}");
        assert!(!text.contains("allocate the large tensors first"), "{text}");
        // Under roundup_power2_divisions, which pad small blocks too, they are the setting to
        // try (680 KiB requests take 704 KiB blocks under 8 divisions: two to a segment, not
        // three).
        let divided = OomReport {
            divisions_padding: 7 * MIB,
            ..report.clone()
        };
        let hint = divided.hint();
        assert!(hint.settings_may_help());
        assert!(
            hint.to_string().contains(
                "and roundup_power2_divisions round the blocks up by 7.00 MiB in all, so fewer \
                 fit in each. A setting to try: roundup_power2_divisions with more divisions \
                 (finer steps), or none"
            ),
            "{hint}"
        );
        // Under expandable segments, the large pool's whole pages may be what leaves no room.
        let expandable = OomReport {
            expandable_segments: true,
            ..report
        };
        let hint = expandable.hint();
        assert!(hint.settings_may_help());
        assert!(
            hint.to_string().contains(
                "A setting to try: expandable_segments:False (the default), under which larger \
                 requests take segments rounded to 2 MiB, not whole 20 MiB pages"
            ),
            "{hint}"
        );
    }

    /// Under expandable segments a small request refused its page gets no max_split_size_mb
    /// value, however large the large pool's free block: the ladder has unmapped its whole
    /// pages, and what is left (here 36 MiB across the ends of two pages) no value gives back.
    /// Nor is a native segment named twice: the small pool's pages are its segments' size.
    #[test]
    fn a_small_request_refused_its_page_gets_no_max_split_size_value() {
        let report = OomReport {
            requested: 512 * 1024,
            rounded: 512 * 1024,
            alloc_size: SMALL_BUFFER,
            device_free: MIB,
            pool_largest_free_block: 0,
            large_pool_largest_free_block: 36 * MIB,
            expandable_segments: true,
            refused_map: Some(SMALL_BUFFER),
            ..fragmented()
        };
        let text = report.to_string();
        assert!(!text.contains("max_split_size_mb:"), "{text}");
        assert!(
            text.contains(
                "A setting to try: expandable_segments:False (the default), under which larger \
                 requests take segments rounded to 2 MiB, not whole 20 MiB pages"
            ),
            "{text}"
        );
        assert_eq!(
            text.matches("expandable_segments:False").count(),
            1,
            "{text}"
        );
    }

    /// A small request fails while the large pool's free memory lies in a segment still in use
    /// (a 1000 MiB segment split by a 500 MiB request): a max_split_size_mb keeps such memory in
    /// whole segments, which the pool returns to the device, so it is the value to try.
    #[test]
    fn a_small_request_gets_a_value_that_keeps_the_large_pools_free_memory_whole() {
        let report = OomReport {
            requested: 500 * 1024,
            rounded: 500 * 1024,
            alloc_size: SMALL_BUFFER,
            device_total: GIB,
            device_free: MIB,
            allocated: 500 * MIB,
            live_requested: 500 * MIB,
            reserved: 1000 * MIB,
            largest_free_blocks: vec![500 * MIB],
            free_blocks: 1,
            pool_largest_free_block: 0,
            large_pool_largest_free_block: 500 * MIB,
            ..fragmented()
        };
        let hint = report.hint();
        assert_eq!(report.suggested_max_split_size_mb(), Some(256));
        assert!(hint.settings_may_help());
        let text = hint.to_string();
        assert!(
            text.contains(
                "The large pool's free memory cannot serve them, and goes back to the device only \
                 as whole segments: its largest free block, 500.00 MiB, lies in a segment still \
                 in use. A value to try: max_split_size_mb:256 (added to the other settings in \
                 force)"
            ),
            "{text}"
        );
        assert!(!text.contains("no setting changes that"), "{text}");
        assert!(
            text.ends_with(
                "Another setting to try: expandable_segments:True, under which the free pages of \
                 any segment go back to the device."
            ),
            "{text}"
        );
        // A value already in force is replaced, not added to.
        let set = OomReport {
            max_split_size: 1024 * MIB,
            ..report
        };
        assert!(
            set.to_string()
                .contains("max_split_size_mb:256 (in place of max_split_size_mb:1024)"),
            "{set}"
        );
    }

    /// Memory outside cachealloc does not hide padding: when the requests fit in what this
    /// process can obtain and their blocks do not, the blocks are what settings can change.
    #[test]
    fn padding_is_named_when_memory_outside_cachealloc_also_stands_in_the_way() {
        // A 1 GiB device with 200 MiB held outside; 300 + 300 + 200 MiB asked for, in blocks
        // of 384 + 384 + 256 MiB under roundup_power2_divisions:2.
        let report = OomReport {
            device_total: GIB,
            device_free: 56 * MIB,
            allocated: 768 * MIB,
            live_requested: 600 * MIB,
            reserved: 768 * MIB,
            requested: 200 * MIB,
            rounded: 256 * MIB,
            alloc_size: 256 * MIB,
            divisions_padding: 224 * MIB,
            largest_free_blocks: vec![],
            free_blocks: 0,
            pool_largest_free_block: 0,
            large_pool_largest_free_block: 0,
            ..fragmented()
        };
        assert_eq!(report.untracked(), 200 * MIB);
        let hint = report.hint();
        assert_eq!(
            hint,
            OomHint::Padding {
                requested: 800 * MIB,
                needed: GIB,
                available: 824 * MIB,
                missing: 200 * MIB,
                held_outside: 0,
                limit: GIB,
                divisions_padding: 224 * MIB,
                block_padding: 0,
                request: 256 * MIB,
                segment: 256 * MIB,
                max_split_size_mb: None,
                expandable_segments: false,
            }
        );
        let text = hint.to_string();
        assert!(
            text.contains(
                "Of the padding, roundup_power2_divisions round the blocks up by 224.00 MiB. \
                 Settings that change it, to try: roundup_power2_divisions with more divisions \
                 (finer steps), or none;"
            ),
            "{text}"
        );
        // No unsplit rest to take away: expandable segments are not named.
        assert!(!text.contains("expandable_segments"), "{text}");
        // Requests that fit only without the memory held outside: both causes are named.
        let more = OomReport {
            requested: 300 * MIB,
            rounded: 384 * MIB,
            alloc_size: 384 * MIB,
            ..report
        };
        let text = more.hint().to_string();
        assert!(
            text.contains(
                "asked for 900.00 MiB, which fits in the 1024.00 MiB this process may use only \
                 without the 200.00 MiB held outside cachealloc (free that memory too), and the \
                 blocks that hold them take 328.00 MiB more than this process can use."
            ),
            "{text}"
        );
    }

    /// A padding hint names what pads the blocks and the settings that change that padding,
    /// to try (whether one fits, a replay shows): here blocks left with an unsplit rest hold
    /// 512 MiB more than asked for.
    #[test]
    fn a_padding_hint_names_the_settings_that_change_its_padding() {
        let report = OomReport {
            allocated: 79 * GIB + 512 * MIB,
            live_requested: 79 * GIB,
            reserved: 79 * GIB + 512 * MIB,
            device_free: 512 * MIB,
            requested: 800 * MIB - 512,
            rounded: 800 * MIB,
            alloc_size: 800 * MIB,
            block_padding: 512 * MIB,
            ..fragmented()
        };
        let hint = report.hint();
        let text = hint.to_string();
        assert!(matches!(hint, OomHint::Padding { .. }), "{text}");
        assert!(hint.settings_may_help());
        assert!(!text.contains("roundup_power2_divisions"), "{text}");
        assert!(!text.contains("max_split_size_mb"), "{text}");
        assert!(
            text.contains(
                "but the blocks that hold them take 288.00 MiB more than that. Of the padding, \
                 blocks left with a rest of 1 MiB or less unsplit hold 512.00 MiB more. Settings \
                 that change it, to try: expandable_segments:True (any rest of 512 bytes or more \
                 is split off, but memory is mapped in whole 20 MiB pages)"
            ),
            "{text}"
        );
        // A max_split_size_mb in force hands blocks out whole to requests at or above it.
        let split_limited = OomReport {
            max_split_size: 512 * MIB,
            ..report.clone()
        };
        let text = split_limited.hint().to_string();
        assert!(
            text.contains(
                "blocks taken whole (a request of 512 MiB or more, max_split_size_mb, takes a \
                 cached block up to max_non_split_rounding_mb larger) or left with a rest of 1 \
                 MiB or less unsplit hold 512.00 MiB more. Settings that change it, to try: \
                 max_split_size_mb above the cached blocks taken whole, or none"
            ),
            "{text}"
        );
        // Blocks adopted from a recording made without expandable segments may still be
        // padded under them: expandable_segments:True is on already, and max_split_size_mb
        // takes no block whole there, so no setting is named.
        let adopted = OomReport {
            expandable_segments: true,
            max_split_size: 512 * MIB,
            ..report.clone()
        };
        let text = adopted.hint().to_string();
        assert!(
            text.contains(
                "Of the padding, blocks left with a rest of 1 MiB or less unsplit hold 512.00 MiB \
                 more. No setting changes this padding"
            ),
            "{text}"
        );
        assert!(!adopted.hint().settings_may_help(), "{text}");
        // With expandable segments every rest is split: nothing the settings change is left.
        let expandable = OomReport {
            expandable_segments: true,
            block_padding: 0,
            ..report
        };
        let hint = expandable.hint();
        assert!(!hint.settings_may_help(), "{hint}");
        assert!(
            hint.to_string()
                .ends_with("No setting changes this padding: keep less memory alive."),
            "{hint}"
        );
    }

    /// The padding figures the pool gives: what the divisions add, and what blocks hold beyond
    /// that. Blocks of 384 MiB for 300 MiB requests under roundup_power2_divisions:2, and a
    /// 99.5 MiB request served whole from a 100 MiB cached block.
    #[test]
    fn the_pool_counts_what_pads_its_blocks() {
        use crate::backend::sim::SimDevice;
        use crate::pool::{DeviceAllocator, Error, Settings};
        let divided = Settings {
            roundup_power2_divisions: [2; super::super::rounding::ROUNDUP_INTERVALS],
            ..Settings::default()
        };
        let mut p = DeviceAllocator::new(SimDevice::new(GIB), divided);
        p.malloc(300 * MIB, StreamId(0)).unwrap();
        p.malloc(300 * MIB, StreamId(0)).unwrap();
        let Error::OutOfMemory(report) = p.malloc(400 * MIB, StreamId(0)).unwrap_err() else {
            panic!("expected an out-of-memory error")
        };
        assert_eq!(report.divisions_padding, (84 + 84 + 112) * MIB);
        assert_eq!(report.block_padding, 0);
        let mut p = DeviceAllocator::new(SimDevice::new(GIB), Settings::default());
        let first = p.malloc(100 * MIB, StreamId(0)).unwrap();
        p.free(first).unwrap();
        p.malloc(100 * MIB - MIB / 2, StreamId(0)).unwrap();
        let Error::OutOfMemory(report) = p.malloc(1000 * MIB, StreamId(0)).unwrap_err() else {
            panic!("expected an out-of-memory error")
        };
        assert_eq!(
            (report.divisions_padding, report.block_padding),
            (0, MIB / 2)
        );
    }

    #[test]
    fn fraction_limit_is_named_when_it_binds() {
        let report = OomReport {
            allowed_maximum: Some(40 * GIB),
            allocated: 39 * GIB,
            live_requested: 39 * GIB,
            reserved: 39 * GIB + 512 * MIB,
            device_free: 40 * GIB,
            requested: 2 * GIB,
            rounded: 2 * GIB,
            alloc_size: 2 * GIB,
            ..fragmented()
        };
        assert_eq!(
            report.hint(),
            OomHint::Exhausted {
                needed: 41 * GIB,
                available: 40 * GIB,
                missing: GIB,
                by_fraction_limit: true,
            }
        );
        let text = report.to_string();
        assert!(
            text.contains("is free. 40.00 GiB allowed; Of the allocated"),
            "{text}"
        );
        assert!(text.contains("per_process_memory_fraction"), "{text}");
    }

    /// A request whose block would fit in the device's free memory but whose new segment would
    /// not says so, with the segment rule that applies.
    #[test]
    fn a_segment_larger_than_the_free_memory_is_named() {
        let small = OomReport {
            requested: 4096,
            rounded: 4096,
            alloc_size: 2 * MIB,
            device_free: MIB,
            ..fragmented()
        };
        let text = small.hint().to_string();
        assert!(
            text.contains(
                "a new segment for it takes 2.00 MiB (requests up to 1 MiB share 2 MiB segments)"
            ),
            "{text}"
        );
        let large = OomReport {
            rounded: 21 * MIB + 512,
            alloc_size: 22 * MIB,
            device_free: 21 * MIB + 512,
            ..fragmented()
        };
        let text = large.hint().to_string();
        assert!(
            text.contains("(larger requests get segments rounded up to 2 MiB)"),
            "{text}"
        );
        // The usual case, the free memory below the block itself: no such sentence.
        assert!(
            !fragmented()
                .hint()
                .to_string()
                .contains("would hold the block itself")
        );
    }

    #[test]
    fn memory_held_by_others_is_untracked() {
        // 30 GiB used outside cachealloc; without it the 12 GiB request would fit.
        let report = OomReport {
            allocated: 39 * GIB,
            live_requested: 39 * GIB,
            reserved: 40 * GIB,
            device_free: 10 * GIB,
            requested: 12 * GIB,
            rounded: 12 * GIB,
            alloc_size: 12 * GIB,
            largest_free_blocks: vec![],
            free_blocks: 0,
            pool_largest_free_block: 0,
            ..fragmented()
        };
        assert_eq!(report.untracked(), 30 * GIB);
        assert_eq!(
            report.hint(),
            OomHint::Untracked {
                untracked: 30 * GIB,
                missing: GIB,
                fraction_limit: None,
            }
        );
        let text = report.to_string();
        assert!(text.contains("Largest free cached blocks: none."), "{text}");
        assert!(
            text.contains("Hint: Memory outside cachealloc: 30.00 GiB"),
            "{text}"
        );
    }

    /// With expandable segments the suggestion says what `max_split_size_mb` still does there
    /// (it keeps large cached blocks from small requests), not that it stops splitting, and
    /// no segment size is named.
    #[test]
    fn an_expandable_fragmentation_hint_says_what_max_split_size_does_there() {
        let native = OomReport {
            device_free: 1010 * MIB,
            alloc_size: 1020 * MIB,
            ..fragmented()
        };
        assert!(native.to_string().contains("a new segment for it takes"));
        assert!(native.to_string().contains("are then never split"));
        let report = OomReport {
            expandable_segments: true,
            ..native
        };
        let text = report.to_string();
        assert!(
            text.contains(
                "with expandable segments it splits nothing whole, but requests smaller than \
                 512 MiB no longer take cached blocks of 512 MiB or more"
            ),
            "{text}"
        );
        assert!(!text.contains("are then never split"), "{text}");
        assert!(!text.contains("a new segment for it takes"), "{text}");
    }

    #[test]
    fn fragmentation_suggests_the_largest_standard_value_within_the_largest_free_block() {
        let report = fragmented();
        assert_eq!(
            report.hint(),
            OomHint::Fragmentation {
                request: 1000 * MIB,
                unallocated: 18 * GIB,
                device_free: 512 * MIB,
                fraction_capped: false,
                segment: 1000 * MIB,
                largest_free_block: 600 * MIB,
                large_pool_free_block: 0,
                suggested_max_split_size_mb: Some(512),
                current_max_split_size_mb: None,
                expandable_segments: false,
                refused_map: None,
                divisions_padding: 0,
                other_pool_unallocated: 0,
            }
        );
        let expected = [
            "CUDA out of memory. Tried to allocate 1000.00 MiB. GPU 0 has a total capacity of \
             80.00 GiB of which 512.00 MiB is free. Of the allocated memory 60.00 GiB is \
             allocated by cachealloc, and 18.00 GiB is reserved by cachealloc but unallocated.",
            "Request: 1000.00 MiB (1048575900 bytes) on stream 0x0, rounded to a 1000.00 MiB \
             block, needing a 1000.00 MiB segment.",
            "Memory not tracked by cachealloc (other processes, CUDA contexts, other \
             allocators): 1.50 GiB.",
            "Largest free cached blocks: 600.00 MiB, 300.00 MiB, 20.00 MiB, 2.00 MiB \
             (and 1 more).",
            "Hint: Fragmentation: 18.00 GiB reserved but unallocated plus 512.00 MiB free on \
             the device would hold this 1000.00 MiB block, but the largest free cached block \
             of its pool is 600.00 MiB. A value to try: max_split_size_mb:512 (added to the \
             other settings in force): blocks of 512 MiB or more are then never split, so free memory is no longer left \
             in pieces that large cut from bigger segments, and when the device cannot supply a \
             new segment, cached blocks of 512 MiB or more that the request cannot use are \
             released first. `cachealloc replay` of a recorded trace finds the values that fit. \
             Another setting to try: expandable_segments:True, PyTorch's advice when memory \
             reserved but unallocated is large.",
        ]
        .join("\n");
        assert_eq!(report.to_string(), expected);
    }

    /// The suggestion for a report whose largest free cached block is `largest` bytes.
    fn suggestion_with_largest_free_block(largest: u64) -> Option<u64> {
        let report = OomReport {
            largest_free_blocks: vec![largest, largest / 2],
            pool_largest_free_block: largest,
            free_blocks: 2,
            ..fragmented()
        };
        match report.hint() {
            OomHint::Fragmentation {
                suggested_max_split_size_mb,
                ..
            } => suggested_max_split_size_mb,
            other => panic!("expected fragmentation: {other:?}"),
        }
    }

    #[test]
    fn suggestion_is_a_standard_value_at_or_below_the_largest_free_block() {
        assert_eq!(suggestion_with_largest_free_block(128 * MIB), Some(128));
        assert_eq!(
            suggestion_with_largest_free_block(128 * MIB - 512),
            Some(64)
        );
        assert_eq!(suggestion_with_largest_free_block(138 * MIB), Some(128));
        assert_eq!(suggestion_with_largest_free_block(40 * MIB), Some(32));
        assert_eq!(suggestion_with_largest_free_block(20 * MIB), Some(20));
        // Never above the largest standard value.
        assert_eq!(suggestion_with_largest_free_block(3 * GIB), Some(1024));
    }

    #[test]
    fn no_value_is_named_when_every_free_block_is_below_the_smallest() {
        assert_eq!(suggestion_with_largest_free_block(20 * MIB - 512), None);
        for current in [None, Some(4096)] {
            let report = OomReport {
                largest_free_blocks: vec![8 * MIB, 2 * MIB],
                pool_largest_free_block: 8 * MIB,
                free_blocks: 2,
                max_split_size: current.map_or(u64::MAX, |mb| mb * MIB),
                ..fragmented()
            };
            assert!(matches!(report.hint(), OomHint::Fragmentation { .. }));
            assert_eq!(report.suggested_max_split_size_mb(), None);
            let text = report.hint().to_string();
            assert!(
                text.contains("Every free cached block is smaller than 20 MiB"),
                "{text}"
            );
            assert!(!text.contains("already"), "{text}");
        }
        let none_free = OomReport {
            largest_free_blocks: vec![],
            free_blocks: 0,
            pool_largest_free_block: 0,
            ..fragmented()
        };
        assert_eq!(none_free.suggested_max_split_size_mb(), None);
    }

    #[test]
    fn suggestion_depends_on_the_current_setting() {
        let with_setting = |mb: u64| {
            let report = OomReport {
                max_split_size: mb * MIB,
                ..fragmented()
            };
            match report.hint() {
                OomHint::Fragmentation {
                    suggested_max_split_size_mb,
                    current_max_split_size_mb,
                    ..
                } => (suggested_max_split_size_mb, current_max_split_size_mb),
                other => panic!("expected fragmentation: {other:?}"),
            }
        };
        // A larger setting still lets blocks as large as the free pieces be split: lower it.
        assert_eq!(with_setting(4096), (Some(512), Some(4096)));
        assert_eq!(with_setting(600), (Some(512), Some(600)));
        // A setting at or below the suggestion already keeps such blocks whole.
        assert_eq!(with_setting(512), (None, Some(512)));
        assert_eq!(with_setting(256), (None, Some(256)));
        let report = OomReport {
            max_split_size: 512 * MIB,
            ..fragmented()
        };
        assert!(
            report
                .to_string()
                .contains("max_split_size_mb is already 512")
        );
    }

    /// 21 requests of 5 MiB on a 115 MiB device: five 20 MiB segments hold 20 of them, and the
    /// 21st needs a sixth while 15 MiB is free. Nothing is fragmented (expandable segments map
    /// 20 MiB pages and fail there too): the segment is larger than the memory left. So also
    /// with a little reserved but unallocated, when that and the free memory are still less.
    #[test]
    fn a_segment_larger_than_the_memory_left_is_not_fragmentation() {
        let report = OomReport {
            requested: 5 * MIB,
            rounded: 5 * MIB,
            alloc_size: 20 * MIB,
            device_total: 115 * MIB,
            device_free: 15 * MIB,
            allocated: 100 * MIB,
            live_requested: 100 * MIB,
            reserved: 100 * MIB,
            largest_free_blocks: vec![],
            free_blocks: 0,
            pool_largest_free_block: 0,
            pool_unallocated: 0,
            large_pool_largest_free_block: 0,
            ..fragmented()
        };
        assert_eq!(
            report.hint(),
            OomHint::SegmentTooLarge {
                request: 5 * MIB,
                segment: 20 * MIB,
                limit: 115 * MIB,
                by_fraction_limit: false,
                left: Some(MemoryLeft {
                    device_free: 15 * MIB,
                    fraction_capped: false,
                    unallocated: 0,
                }),
            }
        );
        assert!(!report.hint().settings_may_help());
        let text = report.to_string();
        assert!(
            text.ends_with(
                "Hint: Not fragmentation: no free block can hold this 5.00 MiB block, and a new \
                 segment for it takes 20.00 MiB (requests of 1-10 MiB get 20 MiB segments), \
                 more than the memory left: 15.00 MiB free on the device plus 0 bytes reserved \
                 but unallocated in its pool. No allocator setting changes segment sizes, and \
                 expandable segments map whole pages of 20.00 MiB: keep less memory alive or \
                 use a larger GPU."
            ),
            "{text}"
        );
        // 3.25 MiB in pieces plus 15 MiB free is still less than the segment.
        let pieces = OomReport {
            allocated: 100 * MIB - 13 * MIB / 4,
            live_requested: 100 * MIB - 13 * MIB / 4,
            largest_free_blocks: vec![2 * MIB, 5 * MIB / 4],
            free_blocks: 2,
            pool_largest_free_block: 2 * MIB,
            pool_unallocated: 13 * MIB / 4,
            large_pool_largest_free_block: 2 * MIB,
            ..report.clone()
        };
        assert!(
            pieces.to_string().contains(
                "more than the memory left: 15.00 MiB free on the device plus 3.25 MiB reserved \
                 but unallocated in its pool."
            ),
            "{pieces}"
        );
        // With enough in pieces for a page past them, it is fragmentation again.
        let more = OomReport {
            allocated: 90 * MIB,
            live_requested: 90 * MIB,
            pool_unallocated: 10 * MIB,
            ..pieces
        };
        assert!(
            matches!(more.hint(), OomHint::Fragmentation { .. }),
            "{more}"
        );
    }

    /// 2000 requests of 512 KiB, every fourth kept, leave 750 MiB of the small pool unallocated
    /// in segments that each hold a live block; a 1 GiB request then fails with 536 MiB free.
    /// That memory is no room for it, under any setting: the hint says so, and names none.
    #[test]
    fn the_small_pools_unallocated_memory_is_no_room_for_a_large_request() {
        let report = OomReport {
            requested: GIB,
            rounded: GIB,
            alloc_size: GIB,
            device_total: 1536 * MIB,
            device_free: 536 * MIB,
            allocated: 250 * MIB,
            live_requested: 250 * MIB,
            reserved: 1000 * MIB,
            largest_free_blocks: vec![3 * MIB / 2; 16],
            free_blocks: 500,
            pool_largest_free_block: 0,
            pool_unallocated: 0,
            large_pool_largest_free_block: 0,
            ..fragmented()
        };
        let hint = report.hint();
        assert!(
            matches!(
                hint,
                OomHint::Fragmentation {
                    unallocated: 0,
                    other_pool_unallocated,
                    ..
                } if other_pool_unallocated == 750 * MIB
            ),
            "{hint:?}"
        );
        assert!(!hint.settings_may_help());
        let text = report.to_string();
        assert!(
            text.ends_with(
                "Hint: Fragmentation of the small pool: 0 bytes reserved but unallocated in the \
                 large pool plus 536.00 MiB free on the device would not hold this 1024.00 MiB \
                 block, and the 750.00 MiB reserved but unallocated in the small pool serves \
                 only requests of 1 MiB or less: it lies in 2 MiB segments (pages, under \
                 expandable segments) that each still hold a live block, and goes back to the \
                 device only when they are wholly free. No allocator setting gives it to this \
                 request: keep fewer small tensors alive here."
            ),
            "{text}"
        );
        assert!(!text.contains("expandable_segments:True"), "{text}");
        // When the large pool's memory and the free memory would hold it, the small pool's is
        // named apart, not counted.
        let large_room = OomReport {
            device_total: 2 * GIB,
            reserved: 1900 * MIB,
            device_free: 136 * MIB,
            largest_free_blocks: vec![450 * MIB, 450 * MIB],
            free_blocks: 502,
            pool_largest_free_block: 450 * MIB,
            pool_unallocated: 900 * MIB,
            large_pool_largest_free_block: 450 * MIB,
            ..report
        };
        assert!(large_room.hint().settings_may_help());
        assert!(
            large_room.to_string().contains(
                "Hint: Fragmentation: 900.00 MiB reserved but unallocated in the large pool (the \
                 750.00 MiB of the small pool serves only requests of 1 MiB or less) plus \
                 136.00 MiB free on the device would hold this 1024.00 MiB block"
            ),
            "{large_room}"
        );
    }

    /// A block cached for another stream goes back to the device when it is a whole segment:
    /// max_split_size_mb keeps it whole and expandable segments return its pages, so both are
    /// named to try (1100 MiB freed on stream 1, 100 MiB taken there, 1000 MiB asked for on
    /// stream 0 on 1.5 GiB fit under either).
    #[test]
    fn a_block_of_another_stream_names_the_settings_that_return_it() {
        let report = OomReport {
            requested: 1000 * MIB,
            rounded: 1000 * MIB,
            alloc_size: 1000 * MIB,
            device_total: 1536 * MIB,
            device_free: 436 * MIB,
            allocated: 100 * MIB,
            live_requested: 100 * MIB,
            reserved: 1100 * MIB,
            largest_free_blocks: vec![1000 * MIB],
            free_blocks: 1,
            pool_largest_free_block: 1000 * MIB,
            pool_unallocated: 1000 * MIB,
            other_stream_fit: Some((StreamId(1), 1000 * MIB)),
            ..fragmented()
        };
        let text = format!("{report:#}");
        assert!(
            text.ends_with(
                "or all of them on one stream, lets it be reused. Settings to try too: \
                 max_split_size_mb (blocks at or above it are never split, so free memory that \
                 large stays in whole segments, which the pool returns to the device when it \
                 needs a new one), and expandable_segments:True (free pages go back to the \
                 device)."
            ),
            "{text}"
        );
        let expandable = OomReport {
            expandable_segments: true,
            ..report
        };
        assert!(!expandable.to_string().contains("expandable_segments:True"));
    }

    #[test]
    fn inconsistent_snapshots_do_not_panic() {
        let report = OomReport {
            allocated: 10 * GIB,
            live_requested: 10 * GIB,
            reserved: 5 * GIB,
            device_free: 100 * GIB,
            requested: u64::MAX,
            rounded: u64::MAX,
            ..fragmented()
        };
        assert_eq!(report.unallocated(), 0);
        assert_eq!(report.untracked(), 0);
        assert!(matches!(report.hint(), OomHint::Exhausted { .. }));
        assert!(!report.to_string().is_empty());
    }

    /// The hints that name a value to try point to a replay of a recording, except in the
    /// alternate form, which a replay's own output and the shim's log (which give that replay's
    /// answer or the command) use; the hints that name what no setting changes do not.
    #[test]
    fn only_hints_a_setting_may_help_point_to_a_replay() {
        let report = fragmented();
        assert!(report.hint().settings_may_help());
        assert!(
            report
                .to_string()
                .contains("`cachealloc replay` of a recorded trace")
        );
        let alternate = format!("{report:#}");
        assert!(!alternate.contains("cachealloc replay"), "{alternate}");
        assert!(
            alternate.ends_with(
                "cannot use are released first. Another setting to try: \
                 expandable_segments:True, PyTorch's advice when memory reserved but unallocated \
                 is large."
            ),
            "{alternate}"
        );
        let exhausted = OomReport {
            allocated: 79 * GIB + 512 * MIB,
            live_requested: 79 * GIB + 512 * MIB,
            reserved: 79 * GIB + 512 * MIB,
            ..fragmented()
        };
        assert!(matches!(exhausted.hint(), OomHint::Exhausted { .. }));
        assert!(!exhausted.hint().settings_may_help());
        assert_eq!(exhausted.to_string(), format!("{exhausted:#}"));
    }
}
