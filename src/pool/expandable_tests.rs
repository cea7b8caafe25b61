//! Worked examples of expandable segments (PyTorch's reference §5) on the simulated device,
//! with the invariant walker after every step.

use super::*;
use crate::backend::sim::SimDevice;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

fn expandable_pool(capacity: u64) -> DeviceAllocator<SimDevice> {
    let settings = Settings {
        expandable_segments: true,
        ..Settings::default()
    };
    DeviceAllocator::new(SimDevice::new(capacity), settings)
}

/// Expandable segments with `max_split_size_mb:40`.
fn expandable_split_at_40_mib() -> Settings {
    Settings {
        expandable_segments: true,
        max_split_size: 40 * MIB,
        ..Settings::default()
    }
}

fn alloc_on(p: &mut DeviceAllocator<SimDevice>, size: u64, stream: StreamId) -> DevicePtr {
    let ptr = p.malloc(size, stream).expect("allocation fits");
    p.validate().unwrap();
    ptr
}

fn alloc(p: &mut DeviceAllocator<SimDevice>, size: u64) -> DevicePtr {
    alloc_on(p, size, S0)
}

fn free(p: &mut DeviceAllocator<SimDevice>, ptr: DevicePtr) {
    p.free(ptr).unwrap();
    p.validate().unwrap();
}

/// The one reserved range of the pool's large pool, as (address, size).
fn ranges(p: &DeviceAllocator<SimDevice>) -> Vec<(u64, u64)> {
    p.segments.iter().collect()
}

#[test]
fn requests_map_pages_of_one_range_of_nine_eighths_of_the_device() {
    let mut p = expandable_pool(8 * GIB);
    let a = alloc(&mut p, 30 * MIB);
    // 9 GiB rounded up to whole 20 MiB pages, reserved once; two pages mapped for 30 MiB.
    let range = (9 * GIB).div_ceil(20 * MIB) * 20 * MIB;
    assert_eq!(ranges(&p), [(a.addr(), range)]);
    let s = p.stats();
    assert_eq!(s.reserved_bytes.large_pool.current, 40 * MIB as i64);
    assert_eq!(
        s.segment.all.current, 0,
        "PyTorch counts no segment for a range"
    );
    assert_eq!(s.counts.num_device_alloc, 1);
    assert_eq!(p.backend().used(), 40 * MIB);
    // The next request grows the mapped end: the 10 MiB free tail and one more page.
    let b = alloc(&mut p, 25 * MIB);
    assert_eq!(b.addr(), a.addr() + 30 * MIB);
    let s = p.stats();
    assert_eq!(s.reserved_bytes.large_pool.current, 60 * MIB as i64);
    assert_eq!(s.counts.num_device_alloc, 2);
    assert_eq!(
        s.inactive_split.all.current, 0,
        "not counted for expandable blocks"
    );
    // Small requests map 2 MiB pages of a range of their own.
    let c = alloc(&mut p, 1000);
    assert_eq!(ranges(&p).len(), 2);
    assert!(c.addr() < a.addr() || c.addr() >= a.addr() + range);
    assert_eq!(p.stats().reserved_bytes.small_pool.current, 2 * MIB as i64);
}

/// Large blocks split whenever 512 bytes or more would remain (the small pool's rule), where
/// native segments keep a remainder of 1 MiB or less on the block.
#[test]
fn large_blocks_split_by_the_small_pools_rule() {
    let mut p = expandable_pool(8 * GIB);
    let a = alloc(&mut p, 19 * MIB + 512 * 1024);
    assert_eq!(p.allocation_size(a), Some(19 * MIB + 512 * 1024));
    let blocks: Vec<u64> = p.segments()[0].blocks.iter().map(|b| b.size).collect();
    assert_eq!(blocks, [19 * MIB + 512 * 1024, 512 * 1024]);
}

/// A free block followed by unmapped space counts as the size it could grow to, so the search
/// takes a larger block that cannot grow instead (PyTorch's `expandable_size` walk).
#[test]
fn a_block_that_could_grow_is_passed_over_for_one_that_could_not() {
    let mut p = expandable_pool(8 * GIB);
    let a = alloc(&mut p, 12 * MIB); // one page: a, then 8 MiB free
    let _b = alloc(&mut p, 8 * MIB); // the 8 MiB: the page is full
    let _c = alloc(&mut p, 30 * MIB); // two more pages: c, then 10 MiB free at the mapped end
    free(&mut p, a); // 12 MiB free between the range's start and b
    let d = alloc(&mut p, 9 * MIB);
    assert_eq!(
        d.addr(),
        a.addr(),
        "the 12 MiB block, not the 10 MiB one at the mapped end"
    );
    assert_eq!(
        p.stats().counts.num_device_alloc,
        2,
        "no page mapped for it"
    );
}

/// Small-pool blocks of expandable segments split by the small pool's rule, like the large
/// pool's: a 1 MiB request leaves the other 1 MiB of its 2 MiB page free for the next one.
#[test]
fn small_blocks_split_by_the_small_pools_rule() {
    let mut p = expandable_pool(8 * GIB);
    let a = alloc(&mut p, MIB);
    let b = alloc(&mut p, MIB);
    assert_eq!(b.addr(), a.addr() + MIB);
    assert_eq!(p.stats().counts.num_device_alloc, 1, "one page mapped");
}

/// The sizes compared are sums, what each block could grow to: a 10 MiB block before 40 MiB
/// of unmapped space (50 MiB) is passed over for a 25 MiB one before a 20 MiB unmapped page
/// (45 MiB), both in the six 20 MiB pages of the range of a 100 MiB device.
#[test]
fn the_block_that_could_grow_least_is_taken_when_both_could_grow() {
    let mut p = expandable_pool(100 * MIB);
    let _a = alloc(&mut p, 15 * MIB); // page 0: a [0, 15), free [15, 20)
    let n = alloc(&mut p, 25 * MIB); // page 1 too: n [15, 40)
    let u = alloc(&mut p, 20 * MIB); // page 2: u [40, 60)
    let y = alloc(&mut p, 10 * MIB); // page 3: y [60, 70), free [70, 80), unmapped [80, 120)
    assert_eq!(ranges(&p), [(_a.addr(), 120 * MIB)]);
    free(&mut p, u);
    p.empty_cache().unwrap(); // page 2 unmapped: [40, 60)
    p.validate().unwrap();
    free(&mut p, n); // 25 MiB free before the unmapped page
    let d = alloc(&mut p, 10 * MIB);
    assert_eq!(
        d,
        n,
        "the 25 MiB block (45 MiB grown), not the one at {:#x} (50 MiB grown)",
        y.addr() + 10 * MIB
    );
    assert_eq!(
        p.stats().counts.num_device_alloc,
        4,
        "no page mapped for it"
    );
}

#[test]
fn empty_cache_unmaps_whole_free_pages_and_gives_back_an_empty_range() {
    let mut p = expandable_pool(8 * GIB);
    let a = alloc(&mut p, 30 * MIB); // pages 0-1: a [0, 30)
    let b = alloc(&mut p, 25 * MIB); // page 2 too: b [30, 55), free [55, 60)
    free(&mut p, a);
    p.empty_cache().unwrap();
    p.validate().unwrap();
    // Page 0 lay wholly in the free [0, 30); page 1 holds b's start, so [20, 30) stays mapped.
    let s = p.stats();
    assert_eq!(s.reserved_bytes.all.current, 40 * MIB as i64);
    assert_eq!(s.counts.num_device_free, 1);
    assert_eq!(p.backend().used(), 40 * MIB);
    let mapped: Vec<(u64, u64)> = p.segments().iter().map(|s| (s.addr, s.size)).collect();
    assert_eq!(mapped, [(a.addr() + 20 * MIB, 40 * MIB)]);
    // The freed address now lies in unmapped space: not an allocation.
    let twice = p.free(a);
    assert_eq!(
        twice,
        Err(Error::InvalidPointer {
            addr: a.addr(),
            reason: BadPointer::Unmapped,
        })
    );
    assert_eq!(
        twice.unwrap_err().to_string(),
        format!(
            "invalid device pointer {:#x}: inside a cachealloc expandable segment, in pages given \
             back to the device (already freed: a double free; or never allocated)",
            a.addr()
        )
    );
    free(&mut p, b);
    p.empty_cache().unwrap();
    p.validate().unwrap();
    assert!(
        ranges(&p).is_empty(),
        "nothing mapped: the range is given back"
    );
    assert_eq!(p.backend().segments().count(), 0);
    let s = p.stats();
    assert_eq!(s.reserved_bytes.all.current, 0);
    assert_eq!(s.counts.num_device_free, 2);
}

/// When pages cannot be mapped, the miss ladder unmaps cached pages (here another stream's)
/// and retries; past that, the request is out of memory.
#[test]
fn a_full_device_unmaps_cached_pages_and_retries() {
    let mut p = expandable_pool(100 * MIB);
    let other = alloc_on(&mut p, 60 * MIB, S1);
    free(&mut p, other);
    let a = alloc(&mut p, 60 * MIB);
    let s = p.stats();
    assert_eq!(s.counts.num_alloc_retries, 1);
    assert_eq!(s.counts.num_device_free, 1);
    assert_eq!(s.reserved_bytes.all.current, 60 * MIB as i64);
    assert_eq!(
        ranges(&p).len(),
        1,
        "stream 1's emptied range was given back"
    );
    assert!(matches!(p.malloc(50 * MIB, S0), Err(Error::OutOfMemory(_))));
    p.validate().unwrap();
    assert_eq!(p.stats().counts.num_ooms, 1);
    free(&mut p, a);
}

/// `max_split_size` still keeps small requests off large cached blocks, but the oversize
/// release of the miss ladder leaves expandable blocks alone: only the full release (a counted
/// retry) unmaps them.
#[test]
fn the_oversize_release_leaves_expandable_blocks_alone() {
    let mut p = DeviceAllocator::new(SimDevice::new(140 * MIB), expandable_split_at_40_mib());
    let x = alloc(&mut p, 100 * MIB);
    let _y = alloc(&mut p, 20 * MIB);
    free(&mut p, x);
    // x's 100 MiB is oversize for this request, and two more pages do not fit beside it.
    let a = alloc(&mut p, 30 * MIB + 1);
    let s = p.stats();
    assert_eq!(s.counts.num_alloc_retries, 1);
    assert_eq!(
        s.counts.num_device_free, 1,
        "x's pages, unmapped by the full release"
    );
    assert_eq!(s.reserved_bytes.all.current, 60 * MIB as i64);
    assert_eq!(a, x, "mapped again at the start of the range");
}

/// The oversize rule keeps a small request off a large cached block only in the search: an
/// oversize free block right before the unmapped end of its range is room that
/// `find_expandable_block` offers to the request that the search turned away, so PyTorch's
/// `alloc_block` hands it out and splits it (by the small pool's rule), mapping nothing.
#[test]
fn an_oversize_block_at_the_growing_end_serves_a_request_the_search_refused() {
    let mut p = DeviceAllocator::new(SimDevice::new(GIB), expandable_split_at_40_mib());
    let x = alloc(&mut p, 100 * MIB);
    free(&mut p, x); // 100 MiB free, oversize, followed by the unmapped rest of the range
    let a = alloc(&mut p, 30 * MIB);
    assert_eq!(a, x, "the front of the oversize block");
    assert_eq!(
        p.allocation_size(a),
        Some(30 * MIB),
        "split off, not taken whole"
    );
    let s = p.stats();
    assert_eq!(s.counts.num_device_alloc, 1, "no page mapped for it");
    assert_eq!(s.counts.num_alloc_retries, 0);
    assert_eq!(s.reserved_bytes.all.current, 100 * MIB as i64);
    assert_eq!(s.oversize_allocations.current, 0);
}

/// A request larger than the range the device's reported memory calls for still gets a range
/// that holds it (a simulated device may report less memory than it lets be mapped); and an
/// unlimited device has address space for the ranges of many streams.
#[test]
fn ranges_hold_their_request_and_many_streams_fit_an_unlimited_device() {
    let mut sim = SimDevice::new(100 * GIB);
    sim.set_total(Some(8 * GIB));
    let settings = Settings {
        expandable_segments: true,
        ..Settings::default()
    };
    let mut p = DeviceAllocator::new(sim, settings.clone());
    let big = alloc(&mut p, 10 * GIB);
    assert_eq!(p.allocation_size(big), Some(10 * GIB));
    assert_eq!(ranges(&p).len(), 1);
    free(&mut p, big);

    let mut p = DeviceAllocator::new(SimDevice::new(u64::MAX), settings);
    for stream in 0..32 {
        alloc_on(&mut p, 30 * MIB, StreamId(stream));
        alloc_on(&mut p, 1000, StreamId(stream));
    }
    assert_eq!(ranges(&p).len(), 64);
}

/// With native segments beside expandable ones (a start state rebuilt from a recording, replayed
/// with the setting on), the oversize release skips the expandable block it finds and backs up
/// from there, as PyTorch does: a larger native block above it is not released; the full
/// release (a counted retry) gives it back.
#[test]
fn the_oversize_release_backs_up_from_an_expandable_block() {
    let settings = expandable_split_at_40_mib();
    let mut sim = SimDevice::new(200 * MIB);
    let native = 0x7000_0000_0000;
    assert!(sim.claim(native, 100 * MIB));
    let mut p = DeviceAllocator::new(sim, settings);
    p.adopt_segment(&SegmentSeed {
        addr: native,
        size: 100 * MIB,
        stream: S0,
        pool: PoolKind::Large,
        blocks: vec![BlockSeed {
            addr: native,
            size: 100 * MIB,
            requested: 0,
            allocated: false,
        }],
    })
    .unwrap();
    let e = alloc(&mut p, 60 * MIB);
    let _y = alloc(&mut p, 20 * MIB);
    free(&mut p, e); // 60 MiB free, expandable, oversize for the next request
    let a = alloc(&mut p, 30 * MIB);
    let s = p.stats();
    assert_eq!(
        s.counts.num_alloc_retries, 1,
        "only the full release made room"
    );
    assert_eq!(
        s.counts.num_device_free, 2,
        "the native segment and e's pages"
    );
    assert_eq!(a, e, "mapped again where e was");
}

#[test]
fn segment_of_an_expandable_block_is_its_whole_reserved_range() {
    let mut p = expandable_pool(8 * GIB);
    let a = alloc(&mut p, 30 * MIB);
    let span = p.segment_of(a.addr() + MIB).expect("inside the range");
    assert!(span.expandable);
    assert_eq!(span.start, a.addr());
    assert!(span.size >= 9 * GIB, "1⅛ of the device: {}", span.size);
    let unmapped = a.addr() + 100 * MIB;
    assert_eq!(
        p.segment_of(unmapped),
        Some(span),
        "unmapped pages of the range"
    );
}

/// A request refused because the pages it needs do not fit is reported with the pages the
/// device refused: a 1010 MiB block mapped 51 pages of a 1 GiB device (1020 MiB), and a 12 MiB
/// request needs one more, with 4 MiB free.
#[test]
fn an_out_of_memory_report_names_the_pages_the_device_refused() {
    let mut p = expandable_pool(GIB);
    let _big = alloc(&mut p, 1010 * MIB);
    let Error::OutOfMemory(report) = p.malloc(12 * MIB, S0).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert_eq!(report.refused_map, Some(20 * MIB));
    assert_eq!(report.device_free, 4 * MIB);
    assert!(
        report
            .to_string()
            .contains("the 20.00 MiB of pages it needed next are more than the device has free"),
        "{report}"
    );
    // A request that maps what it needs reports no refused pages.
    let mut p = expandable_pool(GIB);
    let _big = alloc(&mut p, 1000 * MIB);
    assert!(p.malloc(12 * MIB, S0).is_ok());
    let Error::OutOfMemory(report) = p.malloc(100 * MIB, S0).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert_eq!(report.refused_map, Some(100 * MIB));
}
