//! Worked examples at the edges of the expandable-segments policy (reference §5) that the
//! worked examples of `expandable_tests.rs` pass over and random sequences reach only by
//! chance: which neighbour counts toward a free block's "expandable size" and how far the
//! best-fit walk over such blocks goes, what counts as room beside unmapped space, the
//! memory-fraction check made with the segment size, the search again after a
//! synchronization, and the blocks that `empty_cache` and the oversize release must leave
//! alone. Each pins one rule on the simulated device, so that a change to it fails here
//! whatever the seed. Found by mutating each rule and seeing which tests noticed.

use super::tests::{MIB, S0, alloc, free, pool_with};
use super::*;
use crate::backend::sim::SimDevice;
use std::sync::{Arc, Mutex};

const GIB: u64 = 1 << 30;
const PAGE: u64 = 20 * MIB;

fn expandable() -> Settings {
    Settings {
        expandable_segments: true,
        ..Settings::default()
    }
}

/// A pool with expandable segments on a device whose frees wait for their fences.
fn pool_with_pending_work() -> DeviceAllocator<SimDevice> {
    DeviceAllocator::new(SimDevice::new(8 * GIB).with_pending_work(), expandable())
}

/// Only unmapped space after a free block adds to its "expandable size": a pending block after
/// it (freed, waiting for its fence) does not. A 9 MiB request takes the 10 MiB block followed
/// by a pending one, not the 12 MiB block followed by an allocated one.
#[test]
fn a_pending_neighbour_does_not_make_a_block_growable() {
    let mut p = pool_with_pending_work();
    let x = alloc(&mut p, 10 * MIB); // page 0: x [0, 10), q [10, 20)
    let q = alloc(&mut p, 10 * MIB);
    let y = alloc(&mut p, 12 * MIB); // page 1: y [20, 32), _z [32, 40), then unmapped
    let _z = alloc(&mut p, 8 * MIB);
    free(&mut p, x);
    free(&mut p, y);
    p.free_deferred(q).unwrap();
    p.validate().unwrap();
    let a = alloc(&mut p, 9 * MIB);
    assert_eq!(a, x, "10 MiB block before the pending one: the best fit");
    assert_eq!(p.pending_frees(), 1, "served without waiting");
}

/// A block still pending is not room for `find_expandable_block`: a request that needs more
/// than the mapped end offers maps the pages after a pending block in one call, instead of
/// starting from the pending block and mapping page runs one by one after it.
#[test]
fn a_pending_block_before_unmapped_space_is_not_room() {
    let mut p = pool_with_pending_work();
    let a = alloc(&mut p, 2 * PAGE); // pages 0-1, exactly
    let side = [StreamId(7)];
    p.free_after_streams(a, &side).unwrap(); // pending: polled, not synchronized for growth
    let b = alloc(&mut p, 50 * MIB);
    assert_eq!(b.addr(), a.addr() + 2 * PAGE);
    let s = p.stats();
    assert_eq!(s.counts.num_device_alloc, 2, "pages 2-4 mapped in one call");
    assert_eq!(s.reserved_bytes.all.current, 5 * PAGE as i64);
    assert_eq!(p.pending_frees(), 1);
}

/// The memory-fraction check before growing uses the segment size a request would get without
/// expandable segments (`alloc_size`: 20 MiB for a 2 MiB request), not the rounded size that is
/// then mapped: with 40 of the 50 MiB allowed reserved and in use, a 2 MiB request is out of
/// memory, though the page it needs would fit.
#[test]
fn the_fraction_check_uses_the_segment_size() {
    let settings = Settings {
        per_process_memory_fraction: 0.5,
        ..expandable()
    };
    let mut p = pool_with(100 * MIB, settings);
    let _a = alloc(&mut p, 2 * PAGE);
    assert!(matches!(p.malloc(2 * MIB, S0), Err(Error::OutOfMemory(_))));
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(s.reserved_bytes.all.current, 2 * PAGE as i64);
    assert_eq!(s.counts.num_device_alloc, 1);
    // A small request's segment is 2 MiB: 42 MiB of 50 fit.
    alloc(&mut p, 1000);
    assert_eq!(p.stats().reserved_bytes.all.current, 42 * MIB as i64);
}

/// After the miss ladder synchronizes for pending frees, the pool is searched again with the
/// expandable rule: of the two blocks the synchronization freed, the 10 MiB one at the mapped
/// end (which could grow) is passed over for the 12 MiB one that could not.
#[test]
fn the_search_after_a_synchronization_uses_the_expandable_rule() {
    let mut p = pool_with_pending_work();
    let a = alloc(&mut p, 12 * MIB); // page 0: a [0, 12), _b [12, 20)
    let _b = alloc(&mut p, 8 * MIB);
    let _c = alloc(&mut p, 30 * MIB); // pages 1-2: _c [20, 50), d [50, 60)
    let d = alloc(&mut p, 10 * MIB);
    p.free_deferred(a).unwrap();
    p.free_deferred(d).unwrap();
    p.validate().unwrap();
    let e = alloc(&mut p, 9 * MIB);
    assert_eq!(p.backend().counters().synchronizes, 1);
    assert_eq!(e, a, "the 12 MiB block, not the growable 10 MiB one");
    assert_eq!(p.stats().counts.num_device_alloc, 2, "no page mapped");
}

/// `empty_cache` unmaps the pages of expandable blocks only: with expandable segments on, a
/// native segment (rebuilt from a recording) with a free block holding whole pages keeps it.
#[test]
fn empty_cache_leaves_the_free_blocks_of_native_segments_mapped() {
    let mut sim = SimDevice::new(GIB);
    let native = 0x7000_0000_0000;
    assert!(sim.claim(native, 3 * PAGE));
    let mut p = DeviceAllocator::new(sim, expandable());
    let live = p
        .adopt_segment(&SegmentSeed {
            addr: native,
            size: 3 * PAGE,
            stream: S0,
            pool: PoolKind::Large,
            blocks: vec![
                BlockSeed {
                    addr: native,
                    size: 10 * MIB,
                    requested: 10 * MIB,
                    allocated: true,
                },
                BlockSeed {
                    addr: native + 10 * MIB,
                    size: 50 * MIB,
                    requested: 0,
                    allocated: false,
                },
            ],
        })
        .unwrap();
    p.empty_cache().unwrap();
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(s.reserved_bytes.all.current, 3 * PAGE as i64);
    assert_eq!(s.counts.num_device_free, 0);
    free(&mut p, live[0]);
    p.empty_cache().unwrap();
    assert_eq!(p.stats().reserved_bytes.all.current, 0);
}

/// A free expandable block that is its whole range (every page mapped: here a range of one
/// page, on a device reporting 8 MiB) is not a segment to release: `empty_cache` unmaps its
/// page and gives the range back; no segment is counted either way.
#[test]
fn a_wholly_mapped_free_range_is_unmapped_not_released() {
    let mut sim = SimDevice::new(GIB);
    sim.set_total(Some(8 * MIB));
    let mut p = DeviceAllocator::new(sim, expandable());
    let a = alloc(&mut p, PAGE);
    assert_eq!(p.segments().len(), 1);
    free(&mut p, a);
    p.empty_cache().unwrap();
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(s.reserved_bytes.all.current, 0);
    assert_eq!(s.segment.all.current, 0);
    assert_eq!(s.counts.num_device_free, 1, "one unmap");
    assert_eq!(p.backend().counters().frees, 0, "no segment released");
    assert!(p.segments().is_empty(), "the range was given back");
}

/// Pages are mapped for the rounded request, not for the segment size it would get without
/// expandable segments (`alloc_size`): a request of 20 MiB + 512 (a 22 MiB segment) after a
/// 1 MiB free tail maps one page, for 21 MiB, not two.
#[test]
fn pages_are_mapped_for_the_rounded_size_not_the_segment_size() {
    let mut p = pool_with(8 * GIB, expandable());
    let a = alloc(&mut p, 19 * MIB); // page 0: a [0, 19), a 1 MiB free tail
    let b = alloc(&mut p, PAGE + 512);
    assert_eq!(b.addr(), a.addr() + 19 * MIB, "grown from the free tail");
    let s = p.stats();
    assert_eq!(s.reserved_bytes.all.current, 2 * PAGE as i64);
    assert_eq!(s.counts.num_device_alloc, 2);
}

/// The best-fit walk over expandable blocks goes on while each next larger block could grow to
/// less than the one before it, not one step only: of three free blocks of 5, 7 and 18 MiB
/// that could grow to 45, 27 and 18 MiB (unmapped pages after the first two), a 4 MiB request
/// takes the 18 MiB block.
#[test]
fn the_walk_over_growable_blocks_goes_on_past_the_first_step() {
    let mut p = pool_with(8 * GIB, expandable());
    let k1 = alloc(&mut p, 15 * MIB); // page 0: k1 [0, 15), x [15, 60)
    let x = alloc(&mut p, 45 * MIB);
    let _k2 = alloc(&mut p, 13 * MIB); // page 3: k2 [60, 73), y [73, 118), k3 [118, 120)
    let y = alloc(&mut p, 45 * MIB);
    let _k3 = alloc(&mut p, 2 * MIB);
    free(&mut p, x);
    free(&mut p, y);
    // Pages 1-2 and 4 unmapped: free 5 MiB at 15, 7 MiB at 73 and 18 MiB at 100 are left.
    p.empty_cache().unwrap();
    p.validate().unwrap();
    assert_eq!(p.stats().reserved_bytes.all.current, 3 * PAGE as i64);
    let a = alloc(&mut p, 4 * MIB);
    assert_eq!(a.addr(), k1.addr() + 100 * MIB, "the 18 MiB block");
    assert_eq!(p.stats().counts.num_device_alloc, 4, "no page mapped");
}

/// The walk moves on only to a block that could grow to strictly less: of two free 10 MiB
/// blocks that could each grow to 30 MiB (an unmapped page after each), a 10 MiB request takes
/// the lower one, as the best fit by (size, address) would.
#[test]
fn the_walk_stops_at_a_tie() {
    let mut p = pool_with(8 * GIB, expandable());
    // Pages 0-4: k1 [0, 10), x [10, 20), y [20, 40), k2 [40, 50), z [50, 60), w [60, 80),
    // k3 [80, 100).
    let sizes = [10, 10, 20, 10, 10, 20, 20];
    let blocks: Vec<_> = sizes.iter().map(|&m| alloc(&mut p, m * MIB)).collect();
    let base = blocks[0].addr();
    let mut at = 0;
    for (b, m) in blocks.iter().zip(sizes) {
        assert_eq!(b.addr(), base + at * MIB);
        at += m;
    }
    for &i in &[1, 2, 4, 5] {
        free(&mut p, blocks[i]);
    }
    // Pages 1 and 3 unmapped: free 10 MiB at 10 and at 50, each before an unmapped page.
    p.empty_cache().unwrap();
    p.validate().unwrap();
    assert_eq!(p.stats().reserved_bytes.all.current, 3 * PAGE as i64);
    let a = alloc(&mut p, 10 * MIB);
    assert_eq!(a.addr(), base + 10 * MIB, "the lower of the two");
    assert_eq!(p.stats().counts.num_device_alloc, 5, "no page mapped");
}

/// Room for a request beside unmapped space counts the free block after the unmapped stretch,
/// and an exact fit is room: with an unmapped 40 MiB stretch between an allocated block and a
/// free 5 MiB one, a 45 MiB request maps just the stretch (its two pages) and takes it with the
/// free block, instead of mapping past the free block or at the end of the range.
#[test]
fn an_unmapped_stretch_and_the_free_block_after_it_are_room_to_the_byte() {
    let mut p = pool_with(8 * GIB, expandable());
    let a = alloc(&mut p, PAGE); // page 0: a; pages 1-3: x [20, 65), b [65, 80)
    let x = alloc(&mut p, 45 * MIB);
    let _b = alloc(&mut p, 15 * MIB);
    free(&mut p, x);
    // Pages 1-2 unmapped, [60, 65) left free.
    p.empty_cache().unwrap();
    p.validate().unwrap();
    assert_eq!(p.stats().reserved_bytes.all.current, 2 * PAGE as i64);
    let c = alloc(&mut p, 45 * MIB);
    assert_eq!(c.addr(), a.addr() + PAGE);
    let s = p.stats();
    assert_eq!(s.reserved_bytes.all.current, 4 * PAGE as i64);
    assert_eq!(s.counts.num_device_alloc, 3, "pages 1-2 mapped in one call");
}

/// `empty_cache` unmaps the free blocks of expandable segments in the order of the free index
/// (PyTorch's `release_blocks`: stream, size, address), which a recorded trace shows as the
/// order of its `segment_unmap` entries: of a free 60 MiB block at the range's start and a free
/// 30 MiB one at 70 MiB, the smaller one's page goes first.
#[test]
fn empty_cache_unmaps_smaller_free_blocks_first() {
    let mut p = pool_with(8 * GIB, expandable());
    let unmapped = Arc::new(Mutex::new(Vec::new()));
    let sink = unmapped.clone();
    p.set_event_sink(Some(Box::new(move |e: &PoolEvent| {
        if let PoolEvent::SegmentUnmap { ptr, size, .. } = e {
            sink.lock().unwrap().push((ptr.addr(), *size / MIB));
        }
    })));
    let x = alloc(&mut p, 3 * PAGE); // pages 0-2: x [0, 60)
    let _k1 = alloc(&mut p, 10 * MIB); // page 3: k1 [60, 70)
    let y = alloc(&mut p, 30 * MIB); // pages 3-4: y [70, 100)
    let _k2 = alloc(&mut p, 10 * MIB); // page 5: k2 [100, 110), free [110, 120)
    free(&mut p, x);
    free(&mut p, y);
    p.empty_cache().unwrap();
    p.validate().unwrap();
    let base = x.addr();
    assert_eq!(
        *unmapped.lock().unwrap(),
        vec![(base + 4 * PAGE, 20), (base, 60)],
        "the 30 MiB block's page, then the 60 MiB block's three"
    );
}

/// An out-of-memory report names the pages the device refused to this request only: after a
/// 12 MiB request was refused its page, a 2 GiB request that maps nothing (over the 1.8 GiB
/// `per_process_memory_fraction:0.9` allows of a device reporting 2 GiB) reports no refused
/// pages, and its hint says nothing of pages.
#[test]
fn a_report_does_not_name_pages_refused_to_an_earlier_request() {
    let mut sim = SimDevice::new(GIB);
    sim.set_total(Some(2 * GIB));
    let settings = Settings {
        per_process_memory_fraction: 0.9,
        ..expandable()
    };
    let mut p = DeviceAllocator::new(sim, settings);
    let _big = alloc(&mut p, 1010 * MIB);
    let Err(Error::OutOfMemory(refused)) = p.malloc(12 * MIB, S0) else {
        panic!("12 MiB fit in the 4 MiB left")
    };
    assert_eq!(refused.refused_map, Some(PAGE));
    let Err(Error::OutOfMemory(report)) = p.malloc(2 * GIB, S0) else {
        panic!("2 GiB fit")
    };
    assert_eq!(report.refused_map, None);
    let text = report.to_string();
    assert!(!text.contains("whole pages"), "{text}");
}

/// `validate()` finds an unmapped block its set does not list, a set listing more blocks
/// than are unmapped, an expandable block linked to a native one, and an unmapped stretch off
/// its range's pages.
#[test]
fn validate_finds_broken_expandable_bookkeeping() {
    // Page 0: a [0, 10), free [10, 20); then the unmapped rest of the range.
    let broken = |corrupt: &dyn Fn(&mut DeviceAllocator<SimDevice>, u64)| {
        let mut p = pool_with(8 * GIB, expandable());
        let a = alloc(&mut p, 10 * MIB);
        corrupt(&mut p, a.addr());
        p.validate().unwrap_err()
    };
    let err = broken(&|p, base| {
        let id = p.blocks.find(base + PAGE).unwrap();
        p.blocks.get_mut(id).stream = StreamId(1);
    });
    assert!(err.contains("is not in its set"), "{err}");
    let err = broken(&|p, base| {
        let a = *p.blocks.get(p.blocks.find(base).unwrap());
        p.unmapped.insert(&a);
    });
    assert!(
        err.contains("1 unmapped blocks but 2 in the unmapped sets"),
        "{err}"
    );
    let err = broken(&|p, base| {
        let id = p.blocks.find(base + 10 * MIB).unwrap();
        p.blocks.get_mut(id).expandable = false;
    });
    assert!(err.contains("next link is not symmetric"), "{err}");
    let err = broken(&|p, base| {
        let id = p.blocks.find(base + 10 * MIB).unwrap();
        let f = *p.blocks.get(id);
        p.pools_mut(f.pool).get_mut(f.stream).remove(f.size, f.addr);
        p.blocks.get_mut(id).state = BlockState::Unmapped;
        let f = *p.blocks.get(id);
        p.unmapped.insert(&f);
    });
    assert!(err.contains("is not on page boundaries"), "{err}");
}
