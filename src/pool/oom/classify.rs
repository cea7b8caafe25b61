//! Which kind of hint a report gets.
//!
//! Note: how a report is classified (`OomReport::hint`). The request needs its rounded block
//! next to everything already allocated. What this process can use is what it reserved plus what
//! the device still has free, capped by `per_process_memory_fraction`. Blocks whose frees are
//! still pending (during a capture, or held by a replay until its trace completes them) count
//! with the allocated ones, as their requests count with the live requests: they are reserved
//! but unallocated, yet no room for the request (a request of 42 MiB does not fit in 30 MiB
//! cached free plus 10 MiB free on the device, whatever 30 MiB more is pending).
//! - Device memory unknown: first, when `cudaMemGetInfo` failed as the report was built. Every
//!   kind below compares with the device's memory; without it, none can be told.
//! - Pending during a capture: first of the others, when a CUDA graph capture kept the pool
//!   from waiting for frees still pending and those frees, once complete, would leave a block
//!   that serves the request (`pending_fit`: merged with its free neighbours, on the request's
//!   stream, in its pool). During a capture no cached memory goes back to the device, so only
//!   such a block helps; bytes pending elsewhere (another pool or stream, separate segments)
//!   would not, and the report is classified as it would be without the capture.
//! - Held during a capture: the requests and their blocks fit in what the process may use, and
//!   the free cached blocks that are whole fixed segments (`capture_held`), which the ladder
//!   gives back to the device outside a capture but may not during one, would make room for
//!   the request's segment beside the device's free memory (capped by the fraction limit).
//!   Outside the capture the same request succeeds; no setting is named. Otherwise the report
//!   is classified as without the capture, though what it says of whole free segments (that
//!   the ladder gave them back) then does not hold.
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
//!   it makes the request fit, that is a kind of its own (small pool held), naming no setting.
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

use super::{MAX_SPLIT_LADDER_MB, MIB, MemoryLeft, OomHint, OomReport};
use crate::pool::expandable;
use crate::pool::rounding::{MIN_BLOCK_SIZE, pool_for};
use crate::pool::types::PoolKind;

impl OomReport {
    /// Classify the failure; see the module note for the reasoning.
    pub fn hint(&self) -> OomHint {
        if self.device_memory_unknown {
            return OomHint::DeviceMemoryUnknown;
        }
        // What any block layout needs (the requests, in 512-byte units), and what this one needs.
        // (`rounding::round_to_block`, saturating: a report's figures need not be consistent.)
        let request = self.requested.max(1).div_ceil(MIN_BLOCK_SIZE);
        let requested = self
            .live_requested
            .saturating_add(request.saturating_mul(MIN_BLOCK_SIZE));
        // Reserved but unallocated memory is free cached blocks and blocks whose frees are still
        // pending (during a capture, or held by a replay until the trace completes them). The
        // pending ones serve nothing yet: like their requests in `live_requested`, they count
        // as held, not as room.
        let free_cached = self
            .pool_unallocated
            .saturating_add(self.other_pool_free)
            .min(self.unallocated());
        let pending_blocks = self.unallocated() - free_cached;
        let needed = self
            .allocated
            .saturating_add(pending_blocks)
            .saturating_add(self.rounded);
        let limit = self
            .allowed_maximum
            .map_or(self.device_total, |allowed| allowed.min(self.device_total));
        let fraction_limited = limit < self.device_total;
        let obtainable = self.reserved.saturating_add(self.device_free);
        let available = obtainable.min(limit);
        // Pending frees the capture kept the pool from waiting for, whose block would serve it.
        if self.capture_underway
            && let Some(block) = self.pending_fit
        {
            return OomHint::PendingDuringCapture {
                pending: self.pending_requested,
                block,
            };
        }
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
        // Whole free segments a capture kept cached: given back, as outside a capture, they
        // make room for the request's segment.
        if self.capture_underway
            && self.capture_held > 0
            && self.alloc_size <= usable_free.saturating_add(self.capture_held)
        {
            return OomHint::HeldDuringCapture {
                held: self.capture_held,
                device_free: usable_free,
                segment: self.alloc_size,
            };
        }
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
        let pool = pool_for(self.rounded);
        let small_pool = pool == PoolKind::Small;
        let unallocated = if small_pool {
            free_cached
        } else {
            self.pool_unallocated.min(free_cached)
        };
        // For a large request, the other pool's free cached memory.
        let other_pool_unallocated = free_cached - unallocated;
        let room = unallocated.saturating_add(usable_free);
        if other_pool_unallocated > 0 && self.rounded > room {
            return OomHint::SmallPoolHeld {
                request: self.rounded,
                unallocated,
                device_free: usable_free,
                fraction_capped,
                small_pool_unallocated: other_pool_unallocated,
            };
        }
        // The segment is the cause when neither it nor the pages expandable segments would map
        // (whole pages past what is unallocated, were all of it at the range's end) fit in
        // what is left: nothing fragmented stands in the way.
        let page = expandable::page_size(pool);
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
