//! `CacheallocStats`: the statistics of one device as a versioned C struct.
//!
//! The struct can grow: the caller sets `size` to `sizeof(CacheallocStats)` as its header knows
//! it; the library fills only the fields that fit in that size and writes back the size it
//! filled and its `version`. New fields are only ever appended.

use crate::pool::DeviceStats;

/// Version of the layout below; bumped when fields are appended.
pub const CACHEALLOC_STATS_VERSION: u32 = 1;

/// Statistics of one device (byte counts in bytes, counts in blocks/segments/calls).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheallocStats {
    /// In: the size of the caller's struct in bytes. Out: the bytes filled.
    pub size: u32,
    /// Out: the layout version the library filled (`CACHEALLOC_STATS_VERSION`).
    pub version: u32,
    /// Bytes in live allocations (rounded block sizes), now and at peak.
    pub allocated_bytes: u64,
    pub allocated_bytes_peak: u64,
    /// Bytes obtained from the device (segments), now and at peak.
    pub reserved_bytes: u64,
    pub reserved_bytes_peak: u64,
    /// Bytes in allocated blocks plus blocks whose free is still pending, now and at peak.
    pub active_bytes: u64,
    pub active_bytes_peak: u64,
    /// Bytes the program asked for (before rounding), now and at peak.
    pub requested_bytes: u64,
    pub requested_bytes_peak: u64,
    /// Bytes in free blocks inside split segments (cannot be released).
    pub inactive_split_bytes: u64,
    /// Bytes in free cached blocks (reusable without asking the device).
    pub cached_free_bytes: u64,
    /// Live allocations and segments.
    pub allocations: u64,
    pub segments: u64,
    /// Device allocations that needed the cache flushed first; allocations that failed.
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    /// Segments obtained from and returned to the device.
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    /// Device-wide synchronizations made by the pool.
    pub num_sync_all_streams: u64,
}

fn count(v: i64) -> u64 {
    v.max(0) as u64
}

impl CacheallocStats {
    /// The full struct for `stats`.
    pub fn from_stats(stats: &DeviceStats, cached_free_bytes: u64) -> Self {
        Self {
            size: std::mem::size_of::<Self>() as u32,
            version: CACHEALLOC_STATS_VERSION,
            allocated_bytes: count(stats.allocated_bytes.all.current),
            allocated_bytes_peak: count(stats.allocated_bytes.all.peak),
            reserved_bytes: count(stats.reserved_bytes.all.current),
            reserved_bytes_peak: count(stats.reserved_bytes.all.peak),
            active_bytes: count(stats.active_bytes.all.current),
            active_bytes_peak: count(stats.active_bytes.all.peak),
            requested_bytes: count(stats.requested_bytes.all.current),
            requested_bytes_peak: count(stats.requested_bytes.all.peak),
            inactive_split_bytes: count(stats.inactive_split_bytes.all.current),
            cached_free_bytes,
            allocations: count(stats.allocation.all.current),
            segments: count(stats.segment.all.current),
            num_alloc_retries: stats.counts.num_alloc_retries,
            num_ooms: stats.counts.num_ooms,
            num_device_alloc: stats.counts.num_device_alloc,
            num_device_free: stats.counts.num_device_free,
            num_sync_all_streams: stats.counts.num_sync_all_streams,
        }
    }

    /// How many bytes of `self` go into a caller struct of `caller_size` bytes: whole 8-byte
    /// fields after the 8-byte header, never more than this layout has. `None` when the
    /// caller's struct cannot even hold the header.
    pub fn fill_len(caller_size: u32) -> Option<usize> {
        let caller = caller_size as usize;
        if caller < 8 {
            return None;
        }
        Some((caller - caller % 8).min(std::mem::size_of::<Self>()))
    }
}
