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
    /// Bytes obtained from the device (segments; with expandable segments, their mapped pages),
    /// now and at peak.
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
    /// Live allocations, and segments (expandable segments are not counted, as in PyTorch's
    /// `segment` statistic).
    pub allocations: u64,
    pub segments: u64,
    /// Device allocations retried after every fully free cached segment was released (counted
    /// whether the retry succeeded or not); allocations that failed.
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    /// Segments obtained from and returned to the device (cudaMalloc and cudaFree calls; with
    /// expandable segments, page maps and unmaps).
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    /// Waits for every pending free (PyTorch's `synchronize_and_free_events`: each
    /// `empty_cache` and out-of-memory retry outside a capture, counted even with no free
    /// pending), and the device synchronizations before growing while frees of `cudaFree` are
    /// pending (`free_sync` other than `none`).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::stats::{Counts, Stat};

    fn stat(current: i64, peak: i64) -> Stat {
        Stat {
            current,
            peak,
            ..Stat::default()
        }
    }

    /// Each field carries its own statistic (every figure below is distinct), the whole
    /// device's, not a pool's.
    #[test]
    fn each_field_carries_its_own_statistic() {
        let mut stats = DeviceStats::default();
        stats.allocated_bytes.all = stat(1, 2);
        stats.reserved_bytes.all = stat(3, 4);
        stats.active_bytes.all = stat(5, 6);
        stats.requested_bytes.all = stat(7, 8);
        stats.inactive_split_bytes.all = stat(9, 10);
        stats.allocation.all = stat(11, 12);
        stats.segment.all = stat(13, 14);
        stats.allocated_bytes.large_pool = stat(100, 101);
        stats.counts = Counts {
            num_alloc_retries: 15,
            num_ooms: 16,
            num_sync_all_streams: 17,
            num_device_alloc: 18,
            num_device_free: 19,
        };
        assert_eq!(
            CacheallocStats::from_stats(&stats, 20),
            CacheallocStats {
                size: std::mem::size_of::<CacheallocStats>() as u32,
                version: CACHEALLOC_STATS_VERSION,
                allocated_bytes: 1,
                allocated_bytes_peak: 2,
                reserved_bytes: 3,
                reserved_bytes_peak: 4,
                active_bytes: 5,
                active_bytes_peak: 6,
                requested_bytes: 7,
                requested_bytes_peak: 8,
                inactive_split_bytes: 9,
                cached_free_bytes: 20,
                allocations: 11,
                segments: 13,
                num_alloc_retries: 15,
                num_ooms: 16,
                num_device_alloc: 18,
                num_device_free: 19,
                num_sync_all_streams: 17,
            }
        );
        // A figure below zero (never expected) reads 0, not a count near 2^64.
        stats.allocation.all = stat(-1, 0);
        assert_eq!(CacheallocStats::from_stats(&stats, 0).allocations, 0);
    }

    /// A caller's `size` gets the whole fields it holds after the 8-byte header (size and
    /// version alone for 8), never part of one, and never more than this layout has (a caller
    /// built with a newer, longer header learns the size filled); below the header, nothing.
    #[test]
    fn a_caller_gets_the_whole_fields_its_size_holds() {
        let ours = std::mem::size_of::<CacheallocStats>();
        assert_eq!(CacheallocStats::fill_len(0), None);
        assert_eq!(CacheallocStats::fill_len(7), None);
        assert_eq!(CacheallocStats::fill_len(8), Some(8));
        assert_eq!(CacheallocStats::fill_len(15), Some(8));
        assert_eq!(CacheallocStats::fill_len(20), Some(16));
        assert_eq!(CacheallocStats::fill_len(ours as u32), Some(ours));
        assert_eq!(CacheallocStats::fill_len(ours as u32 + 64), Some(ours));
        assert_eq!(CacheallocStats::fill_len(u32::MAX), Some(ours));
    }
}
