//! Worked examples of the statistics (PyTorch's reference §8.2): each statistic's current value,
//! peak and running totals after a sequence PyTorch distinguishes, worked out by hand from
//! `c10/cuda/CUDACachingAllocator.cpp` (`alloc_found_block`, `free`, `free_block`,
//! `alloc_block`, `release_block`, `map_block`, `unmap_block`, `synchronize_and_free_events`).
//! The invariant walker checks current values after every step; these pin the peaks and the
//! totals, which it cannot recount, and the counts of device calls, synchronizations, retries
//! and out-of-memory failures. The last renders a pool's statistics as `memory_summary` does.

use super::tests::{MIB, S0, alloc, free, pool_with};
use super::*;
use crate::backend::sim::SimDevice;

fn stat(current: u64, peak: u64, allocated: u64, freed: u64) -> Stat {
    Stat {
        current: current as i64,
        peak: peak as i64,
        allocated: allocated as i64,
        freed: freed as i64,
    }
}

/// One pool's stat, with the other pool's row untouched: the `all` row equals it.
fn only(pool: PoolKind, s: Stat) -> StatArray {
    let (small, large) = match pool {
        PoolKind::Small => (s, Stat::default()),
        PoolKind::Large => (Stat::default(), s),
    };
    StatArray {
        all: s,
        small_pool: small,
        large_pool: large,
    }
}

/// A split of a 2 MiB small segment, a re-split, and the frees that merge it back: PyTorch
/// counts a new split (+1 block, +remainder), a re-split of a split block (−the bytes taken),
/// and the net change of each free (−1 and −size per merged neighbour, +1 and +size when still
/// split).
#[test]
fn splits_and_merges_move_inactive_split_by_pytorchs_net_changes() {
    let mut p = pool_with(u64::MAX, Settings::default());
    let a = alloc(&mut p, 1000); // 1024 of a new 2 MiB segment: +1, +(2 MiB - 1024)
    let b = alloc(&mut p, 3000); // 3072 of the split remainder: -3072
    free(&mut p, a); // neighbours: none, b allocated; still split: +1, +1024
    free(&mut p, b); // merges a and the tail: -2, -(1024 + 2 MiB - 4096); whole again
    let s = p.stats();
    let small = PoolKind::Small;
    assert_eq!(s.inactive_split, only(small, stat(0, 2, 2, 2)));
    assert_eq!(
        s.inactive_split_bytes,
        only(small, stat(0, 2 * MIB - 1024, 2 * MIB, 2 * MIB))
    );
    assert_eq!(s.allocation, only(small, stat(0, 2, 2, 2)));
    assert_eq!(s.allocated_bytes, only(small, stat(0, 4096, 4096, 4096)));
    assert_eq!(s.active, s.allocation);
    assert_eq!(s.active_bytes, s.allocated_bytes);
    assert_eq!(s.requested_bytes, only(small, stat(0, 4000, 4000, 4000)));
    assert_eq!(s.segment, only(small, stat(1, 1, 1, 0)));
    assert_eq!(
        s.reserved_bytes,
        only(small, stat(2 * MIB, 2 * MIB, 2 * MIB, 0))
    );
    p.empty_cache().unwrap();
    let s = p.stats();
    assert_eq!(s.segment, only(small, stat(0, 1, 1, 1)));
    assert_eq!(
        s.reserved_bytes,
        only(small, stat(0, 2 * MIB, 2 * MIB, 2 * MIB))
    );
    assert_eq!(
        (
            s.counts.num_device_alloc,
            s.counts.num_device_free,
            s.counts.num_sync_all_streams
        ),
        (1, 1, 1)
    );
}

/// A free recorded on another stream (`record_stream`): PyTorch's `free()` drops `allocation`
/// and `allocated_bytes` at once; `active`, `active_bytes` and `requested_bytes` wait for
/// `free_block`, when the stream's event completes.
#[test]
fn a_free_pending_on_another_stream_stays_active_until_its_event_completes() {
    let sim = SimDevice::new(u64::MAX).with_pending_work();
    let mut p = DeviceAllocator::new(sim, Settings::default());
    let large = PoolKind::Large;
    let a = alloc(&mut p, 4 * MIB); // splits a 20 MiB segment: +1, +16 MiB inactive
    p.free_after_streams(a, &[StreamId(7)]).unwrap();
    let s = p.stats();
    assert_eq!(s.allocation, only(large, stat(0, 1, 1, 1)));
    assert_eq!(
        s.allocated_bytes,
        only(large, stat(0, 4 * MIB, 4 * MIB, 4 * MIB))
    );
    assert_eq!(s.active, only(large, stat(1, 1, 1, 0)));
    assert_eq!(
        s.active_bytes,
        only(large, stat(4 * MIB, 4 * MIB, 4 * MIB, 0))
    );
    assert_eq!(
        s.requested_bytes,
        only(large, stat(4 * MIB, 4 * MIB, 4 * MIB, 0))
    );
    let b = alloc(&mut p, 4 * MIB); // from the 16 MiB remainder (a still pending): -4 MiB
    p.backend_mut().complete_work();
    p.process_pending().unwrap(); // a's free_block: b allocated after it, still split: +1, +4 MiB
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(s.allocation, only(large, stat(1, 1, 2, 1)));
    assert_eq!(s.active, only(large, stat(1, 2, 2, 1)));
    assert_eq!(
        s.active_bytes,
        only(large, stat(4 * MIB, 8 * MIB, 8 * MIB, 4 * MIB))
    );
    assert_eq!(
        s.requested_bytes,
        only(large, stat(4 * MIB, 8 * MIB, 8 * MIB, 4 * MIB))
    );
    assert_eq!(s.inactive_split, only(large, stat(2, 2, 2, 0)));
    assert_eq!(
        s.inactive_split_bytes,
        only(large, stat(16 * MIB, 16 * MIB, 20 * MIB, 4 * MIB))
    );
    p.reset_peak_stats();
    free(&mut p, b); // merges both neighbours: -2, -16 MiB
    let s = p.stats();
    assert_eq!(s.active, only(large, stat(0, 1, 2, 2)));
    assert_eq!(
        s.active_bytes,
        only(large, stat(0, 4 * MIB, 8 * MIB, 8 * MIB))
    );
    assert_eq!(s.inactive_split, only(large, stat(0, 2, 2, 2)));
    assert_eq!(
        s.inactive_split_bytes,
        only(large, stat(0, 16 * MIB, 20 * MIB, 20 * MIB))
    );
}

/// Expandable segments: PyTorch counts no segment and no inactive split for them; each page map
/// is one `num_device_alloc` and adds its bytes to `reserved_bytes`, each unmap one
/// `num_device_free`, and giving a range back counts nothing more.
#[test]
fn expandable_segments_count_page_maps_and_unmaps_not_segments() {
    let settings = Settings {
        expandable_segments: true,
        ..Settings::default()
    };
    let mut p = pool_with(u64::MAX, settings);
    let small = alloc(&mut p, 1000); // maps one 2 MiB page of a small range
    let a = alloc(&mut p, 5 * MIB); // maps one 20 MiB page of a large range
    let b = alloc(&mut p, 30 * MIB); // 15 MiB free + one more page, merged: one map
    let s = p.stats();
    assert_eq!(s.counts.num_device_alloc, 3);
    assert_eq!(
        s.reserved_bytes.small_pool,
        stat(2 * MIB, 2 * MIB, 2 * MIB, 0)
    );
    assert_eq!(
        s.reserved_bytes.large_pool,
        stat(40 * MIB, 40 * MIB, 40 * MIB, 0)
    );
    assert_eq!(s.segment.all, Stat::default());
    assert_eq!(s.inactive_split.all, Stat::default());
    assert_eq!(s.inactive_split_bytes.all, Stat::default());
    for ptr in [small, a, b] {
        free(&mut p, ptr);
    }
    assert_eq!(p.stats().inactive_split_bytes.all, Stat::default());
    p.empty_cache().unwrap(); // one unmap per free block: the small page, the two large ones
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(
        (s.counts.num_device_alloc, s.counts.num_device_free),
        (3, 2)
    );
    assert_eq!(s.reserved_bytes.all, stat(0, 42 * MIB, 42 * MIB, 42 * MIB));
    assert_eq!(s.segment.all, Stat::default());
    assert_eq!(s.counts.num_sync_all_streams, 1);
}

/// Oversize blocks under `max_split_size_mb:40`: a segment of 40 MiB or more is an oversize
/// segment, and a block handed out whole at that size an oversize allocation, also when the
/// request was below it (39.5 MiB gets a whole 40 MiB segment: its 0.5 MiB rest is not split).
#[test]
fn oversize_stats_count_blocks_and_segments_at_max_split_size() {
    let settings = Settings {
        max_split_size: 40 * MIB,
        ..Settings::default()
    };
    let mut p = pool_with(u64::MAX, settings);
    let a = alloc(&mut p, 50 * MIB);
    free(&mut p, a);
    let b = alloc(&mut p, 45 * MIB); // the cached 50 MiB block, within 20 MiB of it
    assert_eq!(b, a);
    let c = alloc(&mut p, 39 * MIB + MIB / 2);
    let d = alloc(&mut p, 5 * MIB); // a 20 MiB segment, split: neither
    let s = p.stats();
    assert_eq!(s.oversize_allocations, stat(2, 2, 3, 1));
    assert_eq!(s.oversize_segments, stat(2, 2, 2, 0));
    assert_eq!(s.max_split_size, 40 * MIB as i64);
    for ptr in [b, c, d] {
        free(&mut p, ptr);
    }
    p.empty_cache().unwrap();
    let s = p.stats();
    assert_eq!(s.oversize_allocations, stat(0, 2, 3, 3));
    assert_eq!(s.oversize_segments, stat(0, 2, 2, 2));
}

/// The miss ladder's counts: `release_cached_blocks` synchronizes (`num_sync_all_streams`) each
/// time it runs, even with nothing to wait for; the retry after it is `num_alloc_retries`,
/// counted whether or not it succeeds; a request that still fails is one `num_ooms`.
#[test]
fn the_miss_ladder_counts_each_sync_retry_and_oom() {
    let mut p = pool_with(100 * MIB, Settings::default());
    let a = alloc(&mut p, 60 * MIB);
    free(&mut p, a);
    let b = alloc(&mut p, 80 * MIB); // releases the cached 60 MiB, then a retry that succeeds
    let c = p.malloc(80 * MIB, S0);
    assert!(matches!(c, Err(Error::OutOfMemory(_))), "{c:?}");
    let s = p.stats();
    assert_eq!(s.counts.num_sync_all_streams, 2);
    assert_eq!(s.counts.num_alloc_retries, 2);
    assert_eq!(s.counts.num_ooms, 1);
    assert_eq!(
        (s.counts.num_device_alloc, s.counts.num_device_free),
        (2, 1)
    );
    // Under max_split_size, releasing a cached oversize block that covers the request is
    // enough: no sync, no retry. (90 MiB is too wasteful for 60 MiB: 20 MiB or more larger.)
    free(&mut p, b);
    let settings = Settings {
        max_split_size: 40 * MIB,
        ..Settings::default()
    };
    let mut q = pool_with(100 * MIB, settings);
    let a = alloc(&mut q, 90 * MIB);
    free(&mut q, a);
    alloc(&mut q, 60 * MIB);
    let s = q.stats();
    assert_eq!(
        (
            s.counts.num_sync_all_streams,
            s.counts.num_alloc_retries,
            s.counts.num_device_free
        ),
        (0, 0, 1)
    );
}

/// `reset_accumulated_memory_stats` zeroes the totals and the five counts, keeps current values
/// and peaks; `reset_peak_memory_stats` brings the peaks down to current values.
#[test]
fn resets_follow_pytorch() {
    let mut p = pool_with(100 * MIB, Settings::default());
    let a = alloc(&mut p, 60 * MIB);
    let b = alloc(&mut p, 10 * MIB);
    free(&mut p, a);
    assert!(p.malloc(95 * MIB, S0).is_err());
    p.reset_accumulated_stats();
    let s = p.stats();
    assert_eq!(s.counts, Counts::default());
    assert_eq!(
        s.allocated_bytes.all,
        stat(10 * MIB, 70 * MIB, 0, 0),
        "current and peak kept"
    );
    assert_eq!(s.reserved_bytes.all, stat(10 * MIB, 70 * MIB, 0, 0));
    p.reset_peak_stats();
    free(&mut p, b);
    let s = p.stats();
    assert_eq!(s.allocated_bytes.all, stat(0, 10 * MIB, 0, 10 * MIB));
    assert_eq!(s.active_bytes.all, stat(0, 10 * MIB, 0, 10 * MIB));
    assert_eq!(s.reserved_bytes.all, stat(10 * MIB, 10 * MIB, 0, 0));
}

/// Garbage collection (`garbage_collect_cached_blocks`) releases cached segments with
/// `release_block` alone: each is a `num_device_free`, with no synchronization and no retry.
#[test]
fn garbage_collection_counts_its_releases_only() {
    let settings = Settings {
        per_process_memory_fraction: 0.5,
        garbage_collection_threshold: 0.5,
        ..Settings::default()
    };
    let mut p = pool_with(1024 * MIB, settings);
    let a = alloc(&mut p, 200 * MIB);
    let b = alloc(&mut p, 100 * MIB);
    free(&mut p, a);
    free(&mut p, b);
    // 300 MiB reserved, above 256: both blocks are as old as each other, both collected.
    alloc(&mut p, 250 * MIB);
    let s = p.stats();
    assert_eq!(
        (
            s.counts.num_device_alloc,
            s.counts.num_device_free,
            s.counts.num_sync_all_streams,
            s.counts.num_alloc_retries
        ),
        (3, 2, 0, 0)
    );
    assert_eq!(s.segment.large_pool, stat(1, 2, 3, 2));
    assert_eq!(
        s.reserved_bytes.large_pool,
        stat(250 * MIB, 300 * MIB, 550 * MIB, 300 * MIB)
    );
}

/// The text table of a pool's statistics, as `torch.cuda.memory_summary()` prints the same
/// figures: one 1000-byte allocation (a 1024-byte block of a 2 MiB small segment). Sizes are in
/// the unit of the `all` row of their column (KiB from 768 KiB on), counts plain.
#[test]
fn the_summary_of_a_pool_reads_as_pytorchs() {
    let mut p = pool_with(u64::MAX, Settings::default());
    alloc(&mut p, 1000);
    let text = crate::report::memory_summary(&p.stats(), DeviceId(0), false);
    let lines: Vec<&str> = text.lines().collect();
    for expected in [
        "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |",
        "| Allocated memory      |   1024 B   |   1024 B   |   1024 B   |      0 B   |",
        "|       from small pool |   1024 B   |   1024 B   |   1024 B   |      0 B   |",
        "| Requested memory      |   1000 B   |   1000 B   |   1000 B   |      0 B   |",
        "| GPU reserved memory   |   2048 KiB |   2048 KiB |   2048 KiB |      0 B   |",
        "|       from large pool |      0 KiB |      0 KiB |      0 KiB |      0 B   |",
        "| Non-releasable memory |   2047 KiB |   2047 KiB |   2047 KiB |      0 B   |",
        "| Allocations           |       1    |       1    |       1    |       0    |",
        "| GPU reserved segments |       1    |       1    |       1    |       0    |",
        "| Non-releasable allocs |       1    |       1    |       1    |       0    |",
        "| Oversize allocations  |       0    |       0    |       0    |       0    |",
    ] {
        assert!(lines.contains(&expected), "{expected}\nnot in\n{text}");
    }
}
