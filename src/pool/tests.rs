//! Worked examples of PyTorch's policy (reference §1–§3, §8.2), run on the simulated device
//! with the invariant walker after every step.

use super::*;
use crate::backend::sim::SimDevice;

pub(super) const MIB: u64 = 1 << 20;
pub(super) const S0: StreamId = StreamId(0);

pub(super) fn pool_with(capacity: u64, settings: Settings) -> DeviceAllocator<SimDevice> {
    DeviceAllocator::new(SimDevice::new(capacity), settings)
}

fn pool() -> DeviceAllocator<SimDevice> {
    pool_with(u64::MAX, Settings::default())
}

pub(super) fn alloc(p: &mut DeviceAllocator<SimDevice>, size: u64) -> DevicePtr {
    let ptr = p.malloc(size, S0).expect("allocation fits");
    p.validate().unwrap();
    ptr
}

pub(super) fn free(p: &mut DeviceAllocator<SimDevice>, ptr: DevicePtr) {
    p.free(ptr).unwrap();
    p.validate().unwrap();
}

/// Cache blocks of `sizes` on stream 0: allocate them all, then free them in order.
pub(super) fn cache(p: &mut DeviceAllocator<SimDevice>, sizes: &[u64]) {
    let blocks: Vec<_> = sizes.iter().map(|&size| alloc(p, size)).collect();
    for b in blocks {
        free(p, b);
    }
}

#[test]
fn segment_of_names_the_device_allocation_that_holds_an_address() {
    let mut p = pool();
    let a = alloc(&mut p, 1000);
    let b = alloc(&mut p, 1000);
    let whole = Some(SegmentSpan {
        start: a.addr(),
        size: 2 * MIB,
        expandable: false,
    });
    assert_eq!(p.segment_of(a.addr()), whole);
    assert_eq!(p.segment_of(b.addr()), whole, "b lies inside a's segment");
    assert_eq!(p.segment_of(a.addr() + 2 * MIB - 1), whole);
    assert_eq!(p.segment_of(a.addr() + 2 * MIB), None);
    assert_eq!(p.segment_of(a.addr() - 1), None);
}

/// The stream an allocation was made on, which `record_stream` compares with the stream it is
/// told of (PyTorch's `recordStream` ignores the block's own stream); a freed block has none,
/// and is named as `free` would name it (freed already).
#[test]
fn allocation_stream_names_the_stream_a_live_allocation_was_made_on() {
    let mut p = pool();
    let a = p.malloc(1000, StreamId(3)).unwrap();
    let b = alloc(&mut p, 1000);
    assert_eq!(p.allocation_stream(a), Ok(StreamId(3)));
    assert_eq!(p.allocation_stream(b), Ok(S0));
    free(&mut p, b);
    assert_eq!(
        p.allocation_stream(b),
        Err(Error::InvalidPointer {
            addr: b.addr(),
            reason: BadPointer::CachedFree,
        })
    );
}

#[test]
fn small_request_splits_a_2_mib_segment_and_merges_back() {
    let mut p = pool();
    let a = alloc(&mut p, 1000);
    let s = p.stats();
    assert_eq!(s.allocated_bytes.small_pool.current, 1024);
    assert_eq!(s.requested_bytes.all.current, 1000);
    assert_eq!(s.reserved_bytes.small_pool.current, 2 * MIB as i64);
    assert_eq!(s.inactive_split.small_pool.current, 1);
    assert_eq!(
        s.inactive_split_bytes.small_pool.current,
        (2 * MIB - 1024) as i64
    );
    let b = alloc(&mut p, 1000);
    assert_eq!(
        b.addr(),
        a.addr() + 1024,
        "the allocation takes the front of the free block"
    );
    free(&mut p, a);
    free(&mut p, b);
    let s = p.stats();
    assert_eq!(s.inactive_split.all.current, 0);
    assert_eq!(s.reserved_bytes.all.current, 2 * MIB as i64);
    assert_eq!(p.segments()[0].blocks.len(), 1, "coalesced into one block");
    p.empty_cache().unwrap();
    p.validate().unwrap();
    assert_eq!(p.stats().reserved_bytes.all.current, 0);
    assert_eq!(p.stats().counts.num_device_free, 1);
}

#[test]
fn large_remainder_of_one_mib_or_less_is_not_split() {
    let mut p = pool();
    let size = 19 * MIB + MIB / 2;
    alloc(&mut p, size);
    let s = p.stats();
    assert_eq!(s.reserved_bytes.large_pool.current, 20 * MIB as i64);
    assert_eq!(
        s.allocated_bytes.large_pool.current,
        20 * MIB as i64,
        "caller gets the whole 20 MiB"
    );
    assert_eq!(s.inactive_split.all.current, 0);
}

#[test]
fn requests_under_10_mib_share_a_20_mib_segment() {
    let mut p = pool();
    let a = alloc(&mut p, 5 * MIB);
    let b = alloc(&mut p, 5 * MIB);
    assert_eq!(b.addr(), a.addr() + 5 * MIB);
    assert_eq!(p.stats().counts.num_device_alloc, 1);
    assert_eq!(
        p.stats().inactive_split_bytes.large_pool.current,
        10 * MIB as i64
    );
}

#[test]
fn blocks_of_another_stream_are_never_reused() {
    let mut p = pool();
    let a = p.malloc(4 * MIB, StreamId(1)).unwrap();
    p.free(a).unwrap();
    let b = p.malloc(4 * MIB, StreamId(2)).unwrap();
    p.validate().unwrap();
    assert_ne!(a, b);
    assert_eq!(p.stats().counts.num_device_alloc, 2);
    let c = p.malloc(4 * MIB, StreamId(1)).unwrap();
    assert_eq!(a, c, "same stream reuses its cached block");
}

#[test]
fn best_fit_prefers_smaller_then_lower_address() {
    let mut p = pool();
    // Three 12 MiB segments (no split: remainder 0); free the top and bottom ones.
    let x = alloc(&mut p, 12 * MIB);
    let y = alloc(&mut p, 12 * MIB);
    let z = alloc(&mut p, 12 * MIB);
    let big = alloc(&mut p, 30 * MIB);
    free(&mut p, x);
    free(&mut p, z);
    free(&mut p, big);
    let lowest = x.min(z);
    assert_eq!(
        alloc(&mut p, 11 * MIB),
        lowest,
        "equal sizes: the lowest address wins"
    );
    let _ = y;
}

#[test]
fn max_split_size_keeps_oversize_blocks_for_large_requests() {
    let settings = Settings {
        max_split_size: 40 * MIB,
        ..Settings::default()
    };
    let mut p = pool_with(u64::MAX, settings);
    let a = alloc(&mut p, 100 * MIB);
    assert_eq!(p.stats().oversize_segments.current, 1);
    assert_eq!(p.stats().oversize_allocations.current, 1);
    free(&mut p, a);
    // A small request may not take (and split) the oversize block.
    let b = alloc(&mut p, 10 * MIB);
    assert_ne!(b, a);
    assert_eq!(p.stats().counts.num_device_alloc, 2);
    // A request within max_non_split_rounding (20 MiB) of it may, unsplit.
    let c = alloc(&mut p, 90 * MIB);
    assert_eq!(c, a);
    assert_eq!(p.allocation_size(c), Some(100 * MIB));
    free(&mut p, c);
    // 100 MiB >= 70 MiB + 20 MiB: too wasteful, a new segment is made.
    let d = alloc(&mut p, 70 * MIB);
    assert_ne!(d, a);
}

#[test]
fn miss_ladder_releases_cached_segments_and_counts_one_retry() {
    let mut p = pool_with(100 * MIB, Settings::default());
    let a = alloc(&mut p, 60 * MIB);
    free(&mut p, a);
    let b = alloc(&mut p, 80 * MIB);
    let s = p.stats();
    assert_eq!(s.counts.num_alloc_retries, 1);
    assert_eq!(s.counts.num_device_free, 1);
    assert_eq!(s.counts.num_ooms, 0);
    assert_eq!(p.allocation_size(b), Some(80 * MIB));
}

#[test]
fn oversize_release_frees_largest_cached_blocks_without_a_retry() {
    let settings = Settings {
        max_split_size: 20 * MIB,
        ..Settings::default()
    };
    let mut p = pool_with(100 * MIB, settings);
    let a = alloc(&mut p, 50 * MIB);
    let b = alloc(&mut p, 30 * MIB);
    free(&mut p, a);
    free(&mut p, b);
    alloc(&mut p, 60 * MIB);
    let s = p.stats();
    assert_eq!(s.counts.num_device_free, 2, "50 MiB then 30 MiB released");
    assert_eq!(s.counts.num_alloc_retries, 0);
}

#[test]
fn oversize_release_stops_once_the_released_blocks_cover_the_request() {
    let settings = Settings {
        max_split_size: 64 * MIB,
        ..Settings::default()
    };
    let mut p = pool_with(256 * MIB, settings);
    cache(&mut p, &[64 * MIB; 3]);
    // 192 MiB cached + 128 MiB does not fit: two 64 MiB blocks cover the request exactly,
    // so the third stays cached (PyTorch's loop runs while the total is below the request).
    alloc(&mut p, 128 * MIB);
    let s = p.stats();
    assert_eq!(s.counts.num_device_free, 2);
    assert_eq!(s.reserved_bytes.all.current, 192 * MIB as i64);
    assert_eq!(s.counts.num_alloc_retries, 0);
}

#[test]
fn out_of_memory_reports_and_leaves_the_pool_intact() {
    let mut p = pool_with(100 * MIB, Settings::default());
    let live = alloc(&mut p, 60 * MIB);
    let small = alloc(&mut p, 1000);
    let err = p.malloc(60 * MIB, S0).unwrap_err();
    p.validate().unwrap();
    let Error::OutOfMemory(report) = err else {
        panic!("expected OOM, got {err:?}")
    };
    assert_eq!(report.requested, 60 * MIB);
    assert_eq!(report.alloc_size, 60 * MIB);
    assert_eq!(report.device_total, 100 * MIB);
    assert_eq!(report.device_free, 100 * MIB - 60 * MIB - 2 * MIB);
    assert_eq!(report.allocated, 60 * MIB + 1024);
    assert_eq!(report.reserved, 62 * MIB);
    assert_eq!(report.largest_free_blocks, vec![2 * MIB - 1024]);
    let s = p.stats();
    assert_eq!((s.counts.num_ooms, s.counts.num_alloc_retries), (1, 1));
    free(&mut p, live);
    free(&mut p, small);
}

/// A device that cannot tell its memory as the report is built (`cudaMemGetInfo` failing): the
/// report says so instead of a capacity of 0 bytes, and its hint claims neither exhaustion nor
/// a larger GPU.
#[test]
fn out_of_memory_on_a_device_that_cannot_tell_its_memory_says_so() {
    let mut p = pool_with(100 * MIB, Settings::default());
    let _live = alloc(&mut p, 60 * MIB);
    p.backend_mut().inject_mem_info_failures(1);
    let Err(Error::OutOfMemory(report)) = p.malloc(60 * MIB, S0) else {
        panic!("60 MiB more fit on 100 MiB");
    };
    p.validate().unwrap();
    assert!(report.device_memory_unknown);
    assert_eq!(report.hint(), crate::pool::OomHint::DeviceMemoryUnknown);
    let text = report.to_string();
    assert!(
        text.contains("GPU 0 did not tell its memory (cudaMemGetInfo failed)."),
        "{text}"
    );
    assert!(text.contains("other allocators): unknown."), "{text}");
    assert!(
        !text.contains("capacity of 0 bytes") && !text.contains("larger GPU"),
        "{text}"
    );
    // The next failure, with the device answering, is classified as before.
    let Err(Error::OutOfMemory(report)) = p.malloc(60 * MIB, S0) else {
        panic!("60 MiB more fit on 100 MiB");
    };
    assert!(!report.device_memory_unknown);
    assert!(matches!(
        report.hint(),
        crate::pool::OomHint::Exhausted { .. }
    ));
}

/// The report lists the largest free blocks and counts all the others, beyond the 16 it keeps.
#[test]
fn out_of_memory_report_counts_every_free_block() {
    let mut p = pool_with(64 * MIB, Settings::default());
    // One 20 MiB segment cut into ten pieces of just over 1 MiB and its tail; every second
    // piece freed: five free blocks between live ones.
    let pieces: Vec<DevicePtr> = (0..10).map(|_| alloc(&mut p, MIB + 512)).collect();
    for ptr in pieces.iter().step_by(2) {
        free(&mut p, *ptr);
    }
    // Small blocks in a 2 MiB segment, every second one freed: 64 more free blocks.
    let small: Vec<DevicePtr> = (0..128).map(|_| alloc(&mut p, 8192)).collect();
    for ptr in small.iter().step_by(2) {
        free(&mut p, *ptr);
    }
    let free_blocks = p.small.entries().len() + p.large.entries().len();
    assert!(free_blocks > 16, "{free_blocks}");
    let Error::OutOfMemory(report) = p.malloc(50 * MIB, S0).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert_eq!(report.free_blocks, free_blocks);
    assert_eq!(report.largest_free_blocks.len(), 16);
    let text = report.to_string();
    assert!(
        text.contains(&format!("(and {} more)", free_blocks - 4)),
        "{text}"
    );
}

/// A free block large enough for the request, cached for another stream, is named as the cause
/// (not fragmentation), with what the other streams hold.
#[test]
fn out_of_memory_names_a_block_cached_for_another_stream() {
    let mut p = pool_with(30 * MIB, Settings::default());
    // Stream 1: an 8 MiB allocation in a 20 MiB segment leaves a 12 MiB free block that cannot
    // be released (its segment is split and partly live).
    let live = p.malloc(8 * MIB, StreamId(1)).unwrap();
    // 512 bytes more than that block: it would not have served the request on any stream.
    let Error::OutOfMemory(report) = p.malloc(12 * MIB + 1, StreamId(2)).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert_eq!(report.other_stream_fit, None);
    assert!(
        matches!(report.hint(), OomHint::Fragmentation { .. }),
        "{:?}",
        report.hint()
    );
    let Error::OutOfMemory(report) = p.malloc(12 * MIB, StreamId(2)).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    p.validate().unwrap();
    assert_eq!(report.other_stream_fit, Some((StreamId(1), 12 * MIB)));
    assert_eq!(report.other_streams_free, 12 * MIB);
    assert_eq!(report.other_streams_largest_free_block, 12 * MIB);
    assert!(
        matches!(report.hint(), OomHint::OtherStream { other_stream_block, other_stream, .. }
            if other_stream_block == 12 * MIB && other_stream == StreamId(1)),
        "{:?}",
        report.hint()
    );
    assert_eq!(report.suggested_max_split_size_mb(), None);
    let text = report.to_string();
    assert!(
        text.contains(
            "Cached in this pool for other streams (this request cannot use it): 12.00 MiB"
        ),
        "{text}"
    );
    assert!(text.contains("it belongs to stream 0x1"), "{text}");
    // On the stream that cached it, the same request is served from that block.
    let served = p.malloc(12 * MIB, StreamId(1)).unwrap();
    assert_eq!(served.addr(), live.addr() + 8 * MIB);
}

/// A block of another stream that `max_split_size` forbids to the request (a request below it
/// takes no block at or above it) is not named as the cause: it would not have served the
/// request on its own stream either.
#[test]
fn out_of_memory_names_no_other_stream_block_that_max_split_size_forbids() {
    let settings = Settings {
        max_split_size: 10 * MIB,
        ..Settings::default()
    };
    let mut p = pool_with(30 * MIB, settings);
    // Stream 1: 8 MiB (below max_split_size) is split from a 20 MiB segment: a free 12 MiB
    // block, at or above max_split_size.
    let _live = p.malloc(8 * MIB, StreamId(1)).unwrap();
    let Error::OutOfMemory(report) = p.malloc(9 * MIB, StreamId(2)).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert_eq!(report.other_streams_free, 12 * MIB);
    assert_eq!(report.other_stream_fit, None);
    assert!(
        !matches!(report.hint(), OomHint::OtherStream { .. }),
        "{:?}",
        report.hint()
    );
}

/// A small-pool block on another stream could not serve a large-pool request on any stream:
/// it is not named as the cause.
#[test]
fn out_of_memory_ignores_other_streams_blocks_of_the_other_pool() {
    let mut p = pool_with(21 * MIB, Settings::default());
    // Stream 1: 512 bytes from a 2 MiB small segment leave a free block of 2 MiB - 512.
    let _live = p.malloc(512, StreamId(1)).unwrap();
    // Stream 2: 1.5 MiB is a large-pool request (its 20 MiB segment does not fit in the
    // 19 MiB left, though it would fit on the device).
    let Error::OutOfMemory(report) = p.malloc(3 * MIB / 2, StreamId(2)).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert_eq!(report.largest_free_blocks, vec![2 * MIB - 512]);
    assert_eq!(report.other_streams_free, 0);
    // The hint speaks of the large pool only, where nothing is free: with nothing fragmented
    // there, the 20 MiB segment is what does not fit in the 19 MiB left.
    assert_eq!(
        report.hint(),
        OomHint::SegmentTooLarge {
            request: 3 * MIB / 2,
            segment: 20 * MIB,
            limit: 21 * MIB,
            by_fraction_limit: false,
            left: Some(MemoryLeft {
                device_free: 19 * MIB,
                fraction_capped: false,
                unallocated: 0,
            }),
        }
    );
    let text = report.to_string();
    assert!(
        text.contains(
            "Hint: Not fragmentation: no free block can hold this 1.50 MiB block, and a new \
             segment for it takes 20.00 MiB (requests of 1-10 MiB get 20 MiB segments), more \
             than the memory left: 19.00 MiB free on the device plus 0 bytes reserved but \
             unallocated in its pool."
        ),
        "{text}"
    );
}

/// On a device smaller than the 20 MiB segment a 1-10 MiB request needs, the request can be
/// served only from a cached block: with none of its stream, the hint says no setting helps —
/// unless another stream caches a block that would serve it, which is then named instead.
#[test]
fn a_segment_larger_than_the_device_is_named_after_a_block_of_another_stream() {
    let mut p = pool_with(16 * MIB, Settings::default());
    // Stream 1 takes a 14 MiB segment, frees it, then takes 3 MiB of it: 11 MiB stay free,
    // cached for stream 1.
    let big = p.malloc(14 * MIB, StreamId(1)).unwrap();
    p.free(big).unwrap();
    let _kept = p.malloc(3 * MIB, StreamId(1)).unwrap();
    let Error::OutOfMemory(report) = p.malloc(8 * MIB, StreamId(2)).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert!(
        matches!(
            report.hint(),
            OomHint::OtherStream {
                other_stream: StreamId(1),
                ..
            }
        ),
        "{:?}",
        report.hint()
    );
    // Without that block, nothing on this device can serve it.
    let mut q = pool_with(16 * MIB, Settings::default());
    let _small = q.malloc(MIB / 2, StreamId(1)).unwrap();
    let Error::OutOfMemory(report) = q.malloc(8 * MIB, StreamId(2)).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert!(
        matches!(report.hint(), OomHint::SegmentTooLarge { segment, .. } if segment == 20 * MIB),
        "{:?}",
        report.hint()
    );
}

#[test]
fn per_process_memory_fraction_limits_without_asking_the_device() {
    let settings = Settings {
        per_process_memory_fraction: 0.5,
        ..Settings::default()
    };
    let mut p = pool_with(100 * MIB, settings);
    assert!(matches!(p.malloc(60 * MIB, S0), Err(Error::OutOfMemory(_))));
    assert_eq!(p.backend().counters().failed_allocs, 0);
    alloc(&mut p, 40 * MIB);
}

#[test]
fn garbage_collection_releases_aged_cached_blocks() {
    let settings = Settings {
        per_process_memory_fraction: 0.5,
        garbage_collection_threshold: 0.5,
        ..Settings::default()
    };
    let mut p = pool_with(1000 * MIB, settings);
    cache(&mut p, &[100 * MIB; 3]);
    // Reserved 300 MiB > 0.5 × 500 MiB: the next miss collects every block of mean age or more.
    alloc(&mut p, 150 * MIB);
    let s = p.stats();
    assert_eq!(s.counts.num_device_free, 3);
    assert_eq!(s.reserved_bytes.all.current, 150 * MIB as i64);
}

#[test]
fn roundup_power2_divisions_change_block_sizes() {
    let settings = Settings {
        roundup_power2_divisions: [4; 16],
        ..Settings::default()
    };
    let mut p = pool_with(u64::MAX, settings);
    alloc(&mut p, 1_500_000);
    assert_eq!(p.stats().allocated_bytes.all.current, 1_572_864);
}

#[test]
fn bad_frees_are_refused_and_foreign_pointers_named() {
    let mut p = pool();
    let a = alloc(&mut p, 4096);
    free(&mut p, a);
    let twice = p.free(a);
    assert_eq!(
        twice,
        Err(Error::InvalidPointer {
            addr: a.addr(),
            reason: BadPointer::CachedFree
        })
    );
    assert!(
        twice
            .unwrap_err()
            .to_string()
            .ends_with("the memory there is free in cachealloc's cache (already freed: a double free; or never allocated)"),
    );
    let b = alloc(&mut p, 8000);
    let interior = b.offset(512);
    let inside = p.free(interior);
    assert_eq!(
        inside,
        Err(Error::InvalidPointer {
            addr: interior.addr(),
            reason: BadPointer::Interior {
                start: b.addr(),
                requested: 8000
            }
        })
    );
    assert_eq!(
        inside.unwrap_err().to_string(),
        format!(
            "invalid device pointer {:#x}: 512 bytes inside the live allocation at {:#x} of 8000 \
             bytes (an interior pointer: free the pointer the allocation returned)",
            interior.addr(),
            b.addr()
        )
    );
    // Past what was asked for, in the block's rounding (8000 bytes take an 8192-byte block).
    let padding = b.offset(8100);
    assert_eq!(
        p.free(padding).unwrap_err().to_string(),
        format!(
            "invalid device pointer {:#x}: 8100 bytes past the start of the live allocation at \
             {:#x} of 8000 bytes, beyond its end in the padding of its block (free the pointer \
             the allocation returned)",
            padding.addr(),
            b.addr()
        )
    );
    // Freed, then merged with its free neighbours: the address lies inside a larger free block.
    let (c, d) = (alloc(&mut p, 4096), alloc(&mut p, 4096));
    free(&mut p, c);
    free(&mut p, d);
    assert_eq!(
        p.free(d),
        Err(Error::InvalidPointer {
            addr: d.addr(),
            reason: BadPointer::CachedFree
        })
    );
    let foreign = DevicePtr::new(0x1000).unwrap();
    assert_eq!(p.free(foreign), Err(Error::NotOwned { addr: 0x1000 }));
    // The highest addresses are the block table's own markers: never taken for a block.
    for addr in [u64::MAX, u64::MAX - 1] {
        let ptr = DevicePtr::new(addr).unwrap();
        assert_eq!(p.free(ptr), Err(Error::NotOwned { addr }));
        assert_eq!(p.allocation_size(ptr), None);
    }
    p.validate().unwrap();
    assert_eq!(p.allocation_size(b), Some(8192));
}

#[test]
fn pending_frees_are_not_reused_until_their_fence_completes() {
    let sim = SimDevice::new(u64::MAX).with_pending_work();
    let mut p = DeviceAllocator::new(sim, Settings::default());
    // 10 MiB requests get exact 10 MiB segments: no spare room in the cache.
    let a = p.malloc(10 * MIB, S0).unwrap();
    let keep = p.malloc(10 * MIB, S0).unwrap();
    p.free_deferred(a).unwrap();
    p.validate().unwrap();
    let twice = p.free_deferred(a);
    assert_eq!(
        twice,
        Err(Error::InvalidPointer {
            addr: a.addr(),
            reason: BadPointer::AlreadyFreed
        })
    );
    assert_eq!(
        twice.unwrap_err().to_string(),
        format!(
            "invalid device pointer {:#x}: already freed, its free still pending (a double free)",
            a.addr()
        )
    );
    let inside = p.free_deferred(a.offset(4096));
    assert_eq!(
        inside,
        Err(Error::InvalidPointer {
            addr: a.addr() + 4096,
            reason: BadPointer::InsidePending { start: a.addr() }
        })
    );
    assert_eq!(
        inside.unwrap_err().to_string(),
        format!(
            "invalid device pointer {:#x}: 4096 bytes inside the allocation at {:#x}, which was \
             already freed (its free is pending)",
            a.addr() + 4096,
            a.addr()
        )
    );
    assert_eq!(
        p.stats().active.all.current,
        2,
        "a pending block stays active"
    );
    // The cache cannot serve this without the pending block: synchronize first, then reuse.
    let b = p.malloc(10 * MIB, S0).unwrap();
    p.validate().unwrap();
    assert_eq!(b, a);
    assert_eq!(p.backend().counters().synchronizes, 1);
    assert_eq!(
        p.stats().counts.num_device_alloc,
        2,
        "no growth while a block was only pending"
    );
    // Work completing on its own makes a deferred block reusable without a sync.
    p.free_deferred(keep).unwrap();
    p.backend_mut().complete_work();
    assert_eq!(p.malloc(10 * MIB, S0).unwrap(), keep);
    p.validate().unwrap();
    assert_eq!(p.backend().counters().synchronizes, 1);
    assert_eq!(p.pending_frees(), 0);
}

/// A free requested now and completed later (a replay of a recording's `free_requested` and
/// `free_completed`): as in PyTorch's `free()`, the allocation statistics drop it at the
/// request, `active` and `requested_bytes` at the completion; until then its block is not
/// reused (a synchronization of the pool's would complete it: `replayed_frees`).
#[test]
fn a_free_requested_leaves_the_allocation_statistics_before_it_completes() {
    let mut p = pool_with(u64::MAX, Settings::default());
    let a = alloc(&mut p, 1000);
    p.free_requested(a).unwrap();
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(s.allocation.all.current, 0);
    assert_eq!(s.allocated_bytes.all.current, 0);
    assert_eq!(s.active.all.current, 1, "still active");
    assert_eq!(s.active_bytes.all.current, 1024);
    assert_eq!(s.requested_bytes.all.current, 1000);
    // Another block of the small segment serves the next request; `a` stays out of reach.
    let b = alloc(&mut p, 1000);
    assert_ne!(b, a);
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(s.allocation.all.peak, 1, "never two allocations at once");
    assert_eq!(s.allocated_bytes.all.peak, 1024);
    assert_eq!(s.active.all.peak, 2);
    assert_eq!(s.requested_bytes.all.peak, 2000);
    assert_eq!(
        p.free(a),
        Err(Error::InvalidPointer {
            addr: a.addr(),
            reason: BadPointer::AlreadyFreed
        })
    );
    let not_requested = p.free_completed(b);
    assert_eq!(
        not_requested,
        Err(Error::InvalidPointer {
            addr: b.addr(),
            reason: BadPointer::FreeNotRequested
        }),
        "b's free was not requested"
    );
    assert_eq!(
        not_requested.unwrap_err().to_string(),
        format!(
            "invalid device pointer {:#x}: a live allocation whose free was not requested",
            b.addr()
        )
    );
    p.free_completed(a).unwrap();
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(s.active.all.current, 1);
    assert_eq!(s.requested_bytes.all.current, 1000);
    assert_eq!(alloc(&mut p, 1000), a, "reusable once completed");
}

/// A free recorded on other streams is polled like PyTorch's events: the pool grows rather than
/// synchronize for it; it is reused once its fence completes, or after an out-of-memory retry's
/// synchronization.
#[test]
fn frees_after_streams_are_polled_never_synchronized_for_growth() {
    let sim = SimDevice::new(60 * MIB).with_pending_work();
    let mut p = DeviceAllocator::new(sim, Settings::default());
    let side = [StreamId(7), StreamId(8)];
    let a = p.malloc(10 * MIB, S0).unwrap();
    let keep = p.malloc(10 * MIB, S0).unwrap();
    assert_eq!(p.free_after_streams(a, &side), Ok(vec![]));
    p.validate().unwrap();
    assert_eq!(p.pending_frees(), 1);
    assert_eq!(
        p.stats().active.all.current,
        2,
        "a pending block stays active"
    );
    let grown = p.malloc(10 * MIB, S0).unwrap();
    assert_ne!(grown, a);
    assert_eq!(p.backend().counters().synchronizes, 0, "grew instead");
    assert_eq!(p.stats().counts.num_device_alloc, 3);
    p.backend_mut().complete_work();
    assert_eq!(
        p.malloc(10 * MIB, S0).unwrap(),
        a,
        "reused once its fence is done"
    );
    p.validate().unwrap();
    // 30 of the device's 60 MiB reserved and in use: a 40 MiB request fails, and the miss
    // ladder's synchronization completes the recorded free that is still pending, whose
    // segment is then released to make room.
    p.free_after_streams(keep, &side).unwrap();
    p.malloc(40 * MIB, S0).unwrap();
    assert_eq!(p.backend().counters().synchronizes, 1);
    assert_eq!(p.pending_frees(), 0);
    assert_eq!(p.stats().counts.num_device_free, 1);
    p.validate().unwrap();
}

#[test]
fn a_poll_completes_only_the_recorded_frees_still_waiting() {
    let sim = SimDevice::new(u64::MAX).with_pending_work();
    let mut p = DeviceAllocator::new(sim, Settings::default());
    let side = [StreamId(7)];
    let early: Vec<_> = (0..2).map(|_| p.malloc(4096, S0).unwrap()).collect();
    for &ptr in &early {
        p.free_after_streams(ptr, &side).unwrap();
    }
    // empty_cache synchronizes: both come back without a poll, whose next answer still names
    // their fences.
    p.empty_cache().unwrap();
    assert_eq!(p.pending_frees(), 0);
    let late = p.malloc(4096, S0).unwrap();
    let keep = p.malloc(4096, S0).unwrap();
    p.free_after_streams(late, &side).unwrap();
    assert_eq!(p.malloc(4096, S0).unwrap().addr(), keep.addr() + 4096);
    p.backend_mut().complete_work();
    let reused = p.malloc(4096, S0).unwrap();
    assert_eq!(reused, late, "its fence polled done");
    assert_eq!(p.pending_frees(), 0);
    p.free(reused).unwrap();
    assert_eq!(p.stats().active.all.current, 2, "keep and the third");
    p.validate().unwrap();
}

#[test]
fn a_deferred_free_after_streams_stays_pending_through_table_rebuilds() {
    let sim = SimDevice::new(u64::MAX).with_pending_work();
    let mut p = DeviceAllocator::new(sim, Settings::default());
    let first = p.malloc(512, S0).unwrap();
    assert_eq!(
        p.free_deferred_after_streams(first, &[StreamId(7)]),
        Ok(vec![])
    );
    // Carved from the same segment: no growth (so no synchronization), and the block table is
    // rebuilt several times while the free waits.
    let rest: Vec<_> = (0..2000).map(|_| p.malloc(512, S0).unwrap()).collect();
    assert!(!rest.contains(&first));
    assert_eq!(p.pending_frees(), 1);
    assert_eq!(p.backend().counters().synchronizes, 0);
    p.validate().unwrap();
    p.backend_mut().complete_work();
    assert_eq!(p.malloc(512, S0).unwrap(), first, "both fences done");
    assert_eq!(p.pending_frees(), 0);
    p.validate().unwrap();
}

#[test]
fn the_synchronization_before_growing_also_completes_recorded_frees_it_covered() {
    let sim = SimDevice::new(u64::MAX).with_pending_work();
    let mut p = DeviceAllocator::new(sim, Settings::default());
    // Three blocks fill one 20 MiB segment.
    let a = p.malloc(8 * MIB, S0).unwrap();
    let b = p.malloc(8 * MIB, S0).unwrap();
    let _c = p.malloc(4 * MIB, S0).unwrap();
    p.free_after_streams(a, &[StreamId(7)]).unwrap();
    p.free_deferred(b).unwrap();
    // Both pending, b's deferred free makes the pool synchronize before growing; the simulated
    // device's synchronization covers a's stream too, so a comes back, merged with b.
    assert_eq!(p.malloc(8 * MIB, S0).unwrap(), a);
    assert_eq!(p.backend().counters().synchronizes, 1);
    assert_eq!(p.stats().counts.num_device_alloc, 1);
    assert_eq!(p.pending_frees(), 0);
    p.validate().unwrap();
}

#[test]
fn seeds_whose_blocks_run_past_their_segment_are_refused() {
    let mut p = pool();
    let block = |addr: u64, size: u64| BlockSeed {
        addr,
        size,
        requested: 0,
        allocated: true,
    };
    // The second block's end wraps around the address space to the segment's end.
    let wrapping = SegmentSeed {
        addr: 1 << 62,
        size: 1 << 62,
        stream: S0,
        pool: PoolKind::Large,
        blocks: vec![block(1 << 62, 3 << 62), block(0, 1 << 63)],
    };
    let past_end = SegmentSeed {
        addr: u64::MAX - (4 << 20) + 1,
        size: 8 << 20,
        blocks: vec![block(u64::MAX - (4 << 20) + 1, 8 << 20)],
        ..wrapping.clone()
    };
    for seed in [wrapping, past_end] {
        let refused = p.adopt_segment(&seed);
        assert!(
            matches!(&refused, Err(Error::InvalidSeed(why)) if why.contains("past")),
            "{refused:?}"
        );
    }
    p.validate().unwrap();
    assert_eq!(p.stats().segment.all.current, 0);
}

#[test]
fn adopted_segments_behave_like_their_own() {
    let mut p = pool();
    assert!(p.backend_mut().claim(0x7f00_0000_0000, 20 * MIB));
    let seed = SegmentSeed {
        addr: 0x7f00_0000_0000,
        size: 20 * MIB,
        stream: S0,
        pool: PoolKind::Large,
        blocks: vec![
            BlockSeed {
                addr: 0x7f00_0000_0000,
                size: 6 * MIB,
                requested: 6 * MIB - 5,
                allocated: true,
            },
            BlockSeed {
                addr: 0x7f00_0060_0000,
                size: 14 * MIB,
                requested: 0,
                allocated: false,
            },
        ],
    };
    let live = p.adopt_segment(&seed).unwrap();
    p.validate().unwrap();
    assert_eq!(p.stats().counts.num_device_alloc, 0);
    assert_eq!(p.stats().inactive_split_bytes.all.current, 14 * MIB as i64);
    assert_eq!(alloc(&mut p, 14 * MIB).addr(), 0x7f00_0060_0000);
    free(&mut p, live[0]);
    assert!(
        matches!(p.adopt_segment(&seed), Err(Error::InvalidSeed(_))),
        "overlap refused"
    );
}

/// `view` as a seed: its blocks as they stand, a pending one taken as allocated.
fn seed_of(view: &SegmentView) -> SegmentSeed {
    SegmentSeed {
        addr: view.addr,
        size: view.size,
        stream: view.stream,
        pool: view.pool,
        blocks: view
            .blocks
            .iter()
            .map(|b| BlockSeed {
                addr: b.addr,
                size: b.size,
                requested: b.requested,
                allocated: b.state != BlockState::Free,
            })
            .collect(),
    }
}

/// Install `seed` in a fresh pool under `settings`, the device told of it first.
fn adopt_fresh(settings: &Settings, seed: &SegmentSeed) -> Result<Vec<DevicePtr>, Error> {
    let mut p = pool_with(u64::MAX, settings.clone());
    assert!(p.backend_mut().claim(seed.addr, seed.size));
    let adopted = p.adopt_segment(seed);
    p.validate().unwrap();
    adopted
}

/// A large-pool segment at 0x7f00_0000_0000 of `(size, allocated)` blocks in address order,
/// each allocated one requesting its whole size.
fn large_segment_seed(blocks: &[(u64, bool)]) -> SegmentSeed {
    const SEG: u64 = 0x7f00_0000_0000;
    let mut addr = SEG;
    let blocks: Vec<BlockSeed> = blocks
        .iter()
        .map(|&(size, allocated)| {
            addr += size;
            BlockSeed {
                addr: addr - size,
                size,
                requested: if allocated { size } else { 0 },
                allocated,
            }
        })
        .collect();
    SegmentSeed {
        addr: SEG,
        size: addr - SEG,
        stream: S0,
        pool: PoolKind::Large,
        blocks,
    }
}

/// Under max_split_size, a split segment holds no block of that size or more, free ones
/// included: a block is split only for a request below it, and only when the block is below it
/// or a new segment at most 1 MiB past it. A seed with one is refused, naming the block.
#[test]
fn seeds_with_a_free_block_of_max_split_size_in_a_split_segment_are_refused() {
    let settings = Settings {
        max_split_size: 512 * MIB,
        ..Settings::default()
    };
    let seed = large_segment_seed;
    // The reviewer's state: 1 GiB, 300 MiB allocated at its start and 724 MiB free after it.
    let refused = adopt_fresh(&settings, &seed(&[(300 * MIB, true), (724 * MIB, false)]));
    let Err(Error::SeedForbiddenBySettings(why)) = &refused else {
        panic!("{refused:?}");
    };
    assert_eq!(
        why,
        "segment 0x7f0000000000: holds a free block of 759169024 bytes (724.00 MiB) at \
         0x7f0012c00000 beside other blocks, but under max_split_size_mb:512 no split leaves a \
         free block that large (a block is split only for a request below it, and only when the \
         block is below it or a new segment at most 1 MiB past it, so the rest is below it \
         too): this start state cannot exist under these settings"
    );
    // Exactly max_split_size is refused too, before the segment's allocated block as after.
    for blocks in [
        [(2 * MIB, true), (512 * MIB, false)],
        [(512 * MIB, false), (2 * MIB, true)],
    ] {
        let refused = adopt_fresh(&settings, &seed(&blocks));
        assert!(
            matches!(&refused, Err(Error::SeedForbiddenBySettings(why))
                if why.contains("free block of 536870912 bytes (512.00 MiB)")),
            "{refused:?}"
        );
    }
    // An allocated block that large is named as split off.
    let refused = adopt_fresh(&settings, &seed(&[(2 * MIB, false), (512 * MIB, true)]));
    assert!(
        matches!(&refused, Err(Error::SeedForbiddenBySettings(why))
            if why.contains("split-off block of 536870912 bytes (512.00 MiB) at 0x7f0000200000, \
                             but max_split_size_mb:512 forbids")),
        "{refused:?}"
    );
    // Below max_split_size (the largest free block a split leaves in the largest split
    // segment), in a segment that is not split, or without the setting: installed.
    let below = seed(&[(MIB + 512, true), (511 * MIB - 512, false)]);
    assert!(adopt_fresh(&settings, &below).is_ok());
    assert!(adopt_fresh(&settings, &seed(&[(1024 * MIB, false)])).is_ok());
    let reviewers = seed(&[(300 * MIB, true), (724 * MIB, false)]);
    assert!(adopt_fresh(&Settings::default(), &reviewers).is_ok());
}

/// A split segment larger than any segment made for a request below max_split_size is refused
/// even when each of its blocks is below it: the segment of the largest block size below the
/// setting (512 MiB under 512; 22 MiB under an odd 21, rounded up to 2 MiB; 20 MiB under 10).
#[test]
fn seeds_of_a_split_segment_larger_than_max_split_size_allows_are_refused() {
    let seed = large_segment_seed;
    let with = |mb: u64| Settings {
        max_split_size: mb * MIB,
        ..Settings::default()
    };
    // 1 GiB in three blocks, each below 512 MiB.
    let thirds = seed(&[(300 * MIB, true), (300 * MIB, true), (424 * MIB, false)]);
    let refused = adopt_fresh(&with(512), &thirds);
    let Err(Error::SeedForbiddenBySettings(why)) = &refused else {
        panic!("{refused:?}");
    };
    assert_eq!(
        why,
        "segment 0x7f0000000000: is a split segment of 1073741824 bytes (1024.00 MiB), but under \
         max_split_size_mb:512 only a segment made for a request below it is split, and none is \
         larger than 536870912 bytes (512.00 MiB): this start state cannot exist under these \
         settings"
    );
    assert!(adopt_fresh(&Settings::default(), &thirds).is_ok());
    assert!(adopt_fresh(&with(1024), &thirds).is_ok());
    // At the largest size, installed; one step past it, refused (2 MiB blocks, the last free).
    let blocks_of_2mib = |size: u64| {
        let mut blocks = vec![(2 * MIB, true); (size / (2 * MIB)) as usize];
        blocks.last_mut().unwrap().1 = false;
        seed(&blocks)
    };
    for (mb, largest) in [(512, 512 * MIB), (21, 22 * MIB), (10, 20 * MIB)] {
        let at = blocks_of_2mib(largest);
        assert!(adopt_fresh(&with(mb), &at).is_ok(), "{mb}");
        let past = blocks_of_2mib(largest + 2 * MIB);
        let refused = adopt_fresh(&with(mb), &past);
        assert!(
            matches!(&refused, Err(Error::SeedForbiddenBySettings(why))
                if why.contains("is a split segment of")),
            "{mb}: {refused:?}"
        );
    }
    // A segment that large in one block is not split: installed.
    assert!(adopt_fresh(&with(512), &seed(&[(1024 * MIB, true)])).is_ok());
}

/// The layouts the pool itself reaches under max_split_size seed another pool with the same
/// settings: the largest free block a split leaves (a 510 MiB request's segment, the largest
/// below 512 MiB, split by a request just over 1 MiB), segments rounded up to 2 MiB past an odd
/// max_split_size, and many random steps; and a max_split_size below 20 MiB (which PyTorch
/// refuses), where a 20 MiB segment's rest may reach it.
#[test]
fn split_segments_the_pool_makes_under_max_split_size_seed_another_pool() {
    let seeds_another = |p: &DeviceAllocator<SimDevice>, settings: &Settings| {
        for view in p.segments() {
            let seed = seed_of(&view);
            if let Err(e) = adopt_fresh(settings, &seed) {
                panic!("{e}: {seed:?}");
            }
        }
    };
    let with = |mb: u64| Settings {
        max_split_size: mb * MIB,
        ..Settings::default()
    };

    let settings = with(512);
    let mut p = pool_with(u64::MAX, settings.clone());
    let whole = alloc(&mut p, 510 * MIB);
    free(&mut p, whole);
    let _front = alloc(&mut p, MIB + 512);
    assert_eq!(p.segments().len(), 1);
    assert_eq!(p.segments()[0].blocks[1].size, 509 * MIB - 512);
    seeds_another(&p, &settings);

    let settings = with(21);
    let mut p = pool_with(u64::MAX, settings.clone());
    let _a = alloc(&mut p, 21 * MIB - 512);
    assert_eq!(
        p.segments()[0].size,
        22 * MIB,
        "split, 1 MiB and 512 bytes left"
    );
    seeds_another(&p, &settings);

    let settings = with(10);
    let mut p = pool_with(u64::MAX, settings.clone());
    let _b = alloc(&mut p, 2 * MIB);
    assert_eq!(
        p.segments()[0].blocks[1].size,
        18 * MIB,
        "free, over max_split_size"
    );
    seeds_another(&p, &settings);

    // Random requests of 512 bytes to 1 GiB, with frees, under each setting.
    for mb in [20, 21, 64, 512] {
        let settings = with(mb);
        let mut p = pool_with(u64::MAX, settings.clone());
        let mut live = Vec::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ mb;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..600 {
            if !live.is_empty() && next() % 3 == 0 {
                let i = (next() % live.len() as u64) as usize;
                free(&mut p, live.swap_remove(i));
            } else {
                let size = 512u64 << (next() % 22);
                live.push(alloc(&mut p, size + next() % size));
            }
            if step % 50 == 49 {
                seeds_another(&p, &settings);
            }
        }
    }
}

#[test]
fn a_pool_emptied_by_empty_cache_starts_over_like_a_fresh_one() {
    let sizes = [1000, 3 * MIB, 700, 25 * MIB, 5000, 2 * MIB + 1];
    let run = |p: &mut DeviceAllocator<SimDevice>| -> Vec<u64> {
        let ptrs: Vec<DevicePtr> = sizes.iter().map(|&s| alloc(p, s)).collect();
        let placed = ptrs.iter().map(|ptr| ptr.addr()).collect();
        for (i, ptr) in ptrs.into_iter().enumerate() {
            if i % 2 == 0 {
                free(p, ptr);
            }
        }
        placed
    };
    let mut fresh = pool();
    let first = run(&mut fresh);
    let mut reused = pool();
    let mut live = Vec::new();
    for &s in &sizes {
        live.push(alloc(&mut reused, s));
    }
    for ptr in live {
        free(&mut reused, ptr);
    }
    reused.empty_cache().unwrap();
    assert_eq!(reused.stats().segment.all.current, 0);
    assert_eq!(run(&mut reused), first, "same addresses as a fresh pool");
    reused.validate().unwrap();
}

/// Hundreds of free blocks of one size, none of them adjacent (a live spacer between each):
/// the size class grows long and moves to its ordered map; the pool still hands out
/// the lowest address first, as PyTorch's (size, address)-ordered set does, including blocks
/// freed after the class moved.
#[test]
fn many_equal_free_blocks_are_reused_lowest_address_first() {
    let mut p = pool();
    // Two (data, spacer) pairs fill a 20 MiB segment exactly: every data block is 4 MiB.
    let size = 4 * MIB;
    let data: Vec<DevicePtr> = (0..300)
        .map(|_| {
            let d = alloc(&mut p, size);
            alloc(&mut p, 6 * MIB); // spacer, never freed
            d
        })
        .collect();
    let segments = p.stats().counts.num_device_alloc;
    // Free 200 of them in a scattered order (7 and 300 are coprime: no block twice).
    let mut freed: Vec<u64> = Vec::new();
    for i in 0..200 {
        let d = data[(i * 7) % 300];
        free(&mut p, d);
        freed.push(d.addr());
    }
    freed.sort_unstable();
    for (i, &expect) in freed.iter().enumerate().take(50) {
        let got = alloc(&mut p, size);
        assert_eq!(
            got.addr(),
            expect,
            "allocation {i} reuses the lowest free address"
        );
    }
    // Blocks freed now (addresses among the others') are found in order with them.
    let late: Vec<DevicePtr> = (data.iter().copied())
        .filter(|d| !freed.contains(&d.addr()))
        .step_by(9)
        .collect();
    assert!(late.len() > 5);
    for &d in &late {
        free(&mut p, d);
    }
    let mut rest: Vec<u64> = (freed[50..].iter().copied())
        .chain(late.iter().map(|d| d.addr()))
        .collect();
    rest.sort_unstable();
    for &expect in &rest {
        assert_eq!(alloc(&mut p, size).addr(), expect);
    }
    assert_eq!(
        p.stats().counts.num_device_alloc,
        segments,
        "no segment added while blocks were free"
    );
}

/// A small request that fails while the large pool's free memory lies in a segment still in use
/// is pointed to a max_split_size_mb at or below that memory, and the value works: the 500 MiB
/// request then takes a segment of its own, the 1000 MiB cached one is returned to the device,
/// and the small request gets its 2 MiB segment.
#[test]
fn a_small_request_is_pointed_to_the_large_pools_split_free_memory() {
    let run = |settings: Settings| {
        let mut p = pool_with(1001 * MIB, settings);
        let big = alloc(&mut p, 1000 * MIB);
        free(&mut p, big);
        let _half = alloc(&mut p, 500 * MIB);
        let small = p.malloc(500 * 1024, S0);
        p.validate().unwrap();
        small
    };
    let Error::OutOfMemory(report) = run(Settings::default()).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert_eq!(report.large_pool_largest_free_block, 500 * MIB);
    assert_eq!(report.suggested_max_split_size_mb(), Some(256));
    let settings = Settings {
        max_split_size: 256 * MIB,
        ..Settings::default()
    };
    assert!(run(settings).is_ok(), "the suggested value serves it");
}
