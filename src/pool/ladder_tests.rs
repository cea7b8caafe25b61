//! Worked examples of the miss ladder's details (reference §2, §2.3, §2.5) that only the
//! random policy oracle checked before: which cached blocks the oversize release frees and
//! when it reports success, what garbage collection ages and collects, and that the pool is not
//! searched again after releasing everything. Each pins one rule on the simulated device, so
//! that a change to it fails here whatever the seed; the statistics tell the paths apart
//! (`num_alloc_retries` counts only the last rung).

use super::tests::{MIB, S0, alloc, cache, free, pool_with};
use super::*;
use crate::backend::sim::SimDevice;
use std::sync::{Arc, Mutex};

fn max_split(mib: u64) -> Settings {
    Settings {
        max_split_size: mib * MIB,
        ..Settings::default()
    }
}

/// Garbage collection with 512 MiB allowed, collected above 256 MiB.
fn collected_above_256_mib() -> DeviceAllocator<SimDevice> {
    let settings = Settings {
        per_process_memory_fraction: 0.5,
        garbage_collection_threshold: 0.5,
        ..Settings::default()
    };
    pool_with(1024 * MIB, settings)
}

/// The sizes of the segments released, in order.
fn record_releases(p: &mut DeviceAllocator<SimDevice>) -> Arc<Mutex<Vec<u64>>> {
    let freed = Arc::new(Mutex::new(Vec::new()));
    let sink = freed.clone();
    p.set_event_sink(Some(Box::new(move |e: &PoolEvent| {
        if let PoolEvent::SegmentFree { size, .. } = e {
            sink.lock().unwrap().push(*size / MIB);
        }
    })));
    freed
}

fn reserved_mib(p: &DeviceAllocator<SimDevice>) -> i64 {
    p.stats().reserved_bytes.all.current / MIB as i64
}

/// When cached oversize blocks at least as large as the request exist, the oversize release
/// frees the smallest of them and nothing else: of 100, 200 and 300 MiB cached, a 150 MiB
/// request (within 20 MiB of none, so served by none) frees the 200 MiB block.
#[test]
fn the_oversize_release_frees_the_smallest_block_that_covers_the_request() {
    let mut p = pool_with(700 * MIB, max_split(50));
    let _live = alloc(&mut p, 80 * MIB);
    cache(&mut p, &[100 * MIB, 200 * MIB, 300 * MIB]);
    let released = record_releases(&mut p);
    alloc(&mut p, 150 * MIB);
    assert_eq!(*released.lock().unwrap(), vec![200]);
    assert_eq!(p.stats().counts.num_alloc_retries, 0);
    assert_eq!(reserved_mib(&p), 80 + 100 + 300 + 150);
}

/// Released oversize blocks that do not add up to the request make the step fail though the
/// device now has room: the request is served only by the last rung, counted as a retry.
#[test]
fn an_oversize_release_short_of_the_request_counts_a_retry() {
    let mut p = pool_with(150 * MIB, max_split(50));
    let _live = alloc(&mut p, 10 * MIB);
    cache(&mut p, &[60 * MIB, 70 * MIB]);
    let released = record_releases(&mut p);
    // 140 MiB: 70 + 60 released fall short of it, yet leave 140 MiB of the device free.
    alloc(&mut p, 140 * MIB);
    assert_eq!(*released.lock().unwrap(), vec![70, 60]);
    assert_eq!(p.stats().counts.num_alloc_retries, 1);
}

/// The oversize release walks down from the largest cached block and stops at the first below
/// `max_split_size`: the 44 MiB block is left to the release of everything, after a retry.
#[test]
fn the_oversize_release_stops_at_a_block_below_max_split_size() {
    let mut p = pool_with(160 * MIB, max_split(50));
    let _live = alloc(&mut p, 10 * MIB);
    cache(&mut p, &[44 * MIB, 100 * MIB]);
    let released = record_releases(&mut p);
    // 140 MiB: 100 + 44 would cover it, but 44 MiB is not oversize.
    alloc(&mut p, 140 * MIB);
    assert_eq!(*released.lock().unwrap(), vec![100, 44]);
    assert_eq!(p.stats().counts.num_alloc_retries, 1);
}

/// The oversize release looks only at the request's own stream: a block cached for another
/// stream is left to the release of everything, after a retry.
#[test]
fn the_oversize_release_keeps_to_the_requests_stream() {
    let mut p = pool_with(160 * MIB, max_split(50));
    let other = p.malloc(100 * MIB, StreamId(1)).unwrap();
    p.free(other).unwrap();
    alloc(&mut p, 100 * MIB);
    let s = p.stats();
    assert_eq!(s.counts.num_device_free, 1);
    assert_eq!(s.counts.num_alloc_retries, 1);
}

/// Garbage collection does not stop in the middle of a pass once it has reclaimed its target:
/// the 20 MiB block alone is enough, but the 40 MiB one, as old, goes in the same pass.
#[test]
fn garbage_collection_finishes_its_pass() {
    let mut p = collected_above_256_mib();
    let _live = alloc(&mut p, 216 * MIB);
    cache(&mut p, &[40 * MIB, 20 * MIB]);
    let released = record_releases(&mut p);
    // 276 MiB reserved: the target is 20 MiB.
    alloc(&mut p, 100 * MIB);
    assert_eq!(*released.lock().unwrap(), vec![20, 40]);
    assert_eq!(reserved_mib(&p), 216 + 100);
}

/// Serve `times` requests of the cached 20 MiB block `block`'s size from it, freeing each
/// again: every one is a search of the large pool, which ages its other cached blocks.
fn reuse(p: &mut DeviceAllocator<SimDevice>, block: DevicePtr, times: usize) {
    for _ in 0..times {
        let again = alloc(p, 20 * MIB);
        assert_eq!(again, block);
        free(p, again);
    }
}

/// A block's age counts every search of the large pool since it was cached, those that found
/// a block too: the 40 MiB block, passed by while the 20 MiB one served five requests, is older
/// and goes alone.
#[test]
fn garbage_collection_ages_blocks_by_every_search_of_their_pool() {
    let mut p = collected_above_256_mib();
    let _live = alloc(&mut p, 216 * MIB);
    let [older, younger] = [40, 20].map(|mib| alloc(&mut p, mib * MIB));
    free(&mut p, older);
    free(&mut p, younger);
    reuse(&mut p, younger, 5);
    let released = record_releases(&mut p);
    alloc(&mut p, 100 * MIB);
    assert_eq!(*released.lock().unwrap(), vec![40]);
    assert_eq!(reserved_mib(&p), 216 + 20 + 100);
}

/// Garbage collection goes on with another pass while it is short of its target: with 300 MiB
/// reserved the target is 44 MiB, the first pass frees only the older 40 MiB block (the one of
/// mean age or more), and a second pass, its mean now the 20 MiB block's age, frees that too.
#[test]
fn garbage_collection_passes_again_until_it_reaches_its_target() {
    let mut p = collected_above_256_mib();
    let _live = alloc(&mut p, 240 * MIB);
    let [older, younger] = [40, 20].map(|mib| alloc(&mut p, mib * MIB));
    free(&mut p, older);
    free(&mut p, younger);
    reuse(&mut p, younger, 5);
    let released = record_releases(&mut p);
    alloc(&mut p, 100 * MIB);
    assert_eq!(*released.lock().unwrap(), vec![40, 20]);
    assert_eq!(reserved_mib(&p), 240 + 100);
}

/// Each pass takes the mean age of the blocks still cached: of 60, 40 and 20 MiB blocks aged
/// 5, 2 and 1 searches, the first pass (mean 8/3) frees the 60 MiB block, the second (mean 3/2,
/// of the two left) the 40 MiB one, which reaches the 80 MiB target; the 20 MiB block stays.
#[test]
fn garbage_collection_takes_each_mean_age_over_the_blocks_left() {
    let mut p = collected_above_256_mib();
    let _live = alloc(&mut p, 216 * MIB);
    let [a, b, c] = [60, 40, 20].map(|mib| alloc(&mut p, mib * MIB));
    free(&mut p, a);
    free(&mut p, c);
    reuse(&mut p, c, 3);
    free(&mut p, b);
    reuse(&mut p, c, 1);
    let released = record_releases(&mut p);
    // 336 MiB reserved: the target is 80 MiB. The miss is one more search: ages 5, 2 and 1.
    alloc(&mut p, 100 * MIB);
    assert_eq!(*released.lock().unwrap(), vec![60, 40]);
    assert_eq!(reserved_mib(&p), 216 + 20 + 100);
}

/// Searches of the small pool do not age the large pool's blocks: the 40 MiB block cached
/// before five small requests is as old as the 20 MiB one cached after them, and both go.
/// The small pool's cached segment is never collected.
#[test]
fn garbage_collection_leaves_the_small_pool_alone() {
    let mut p = collected_above_256_mib();
    let _live = alloc(&mut p, 216 * MIB);
    let small = alloc(&mut p, 512);
    free(&mut p, small);
    let [first, second] = [40, 20].map(|mib| alloc(&mut p, mib * MIB));
    free(&mut p, first);
    for _ in 0..5 {
        let again = alloc(&mut p, 512);
        assert_eq!(again, small, "served by the small pool's cached segment");
        free(&mut p, again);
    }
    free(&mut p, second);
    let released = record_releases(&mut p);
    // 278 MiB reserved: the target is 22 MiB.
    alloc(&mut p, 100 * MIB);
    assert_eq!(*released.lock().unwrap(), vec![20, 40]);
    let s = p.stats();
    assert_eq!(s.reserved_bytes.small_pool.current, 2 * MIB as i64);
    assert_eq!(reserved_mib(&p), 216 + 2 + 100);
}

/// Garbage collection passes over a free block whose segment is still in use: the 15 MiB rest
/// of a 20 MiB segment stays, and so does the segment.
#[test]
fn garbage_collection_leaves_split_segments() {
    let mut p = collected_above_256_mib();
    let _live = alloc(&mut p, 216 * MIB);
    let _part = alloc(&mut p, 5 * MIB);
    let cached = alloc(&mut p, 40 * MIB);
    free(&mut p, cached);
    let released = record_releases(&mut p);
    // 276 MiB reserved: the 40 MiB block goes, the 15 MiB rest cannot.
    alloc(&mut p, 100 * MIB);
    assert_eq!(*released.lock().unwrap(), vec![40]);
    assert_eq!(reserved_mib(&p), 216 + 20 + 100);
}

/// After releasing everything, the ladder asks the device once more and does not search the
/// pool again (pytorch#189504): a block that the release's synchronization returned to the
/// pool, beside a block still in use, fits the request, yet it fails; the report says that
/// the same request made again is served, as it is.
#[test]
fn the_pool_is_not_searched_again_after_releasing_everything() {
    let sim = SimDevice::new(20 * MIB).with_pending_work();
    let mut p = DeviceAllocator::new(sim, Settings::default());
    let pending = p.malloc(8 * MIB, S0).unwrap();
    let _keep = p.malloc(8 * MIB, S0).unwrap();
    assert_eq!(p.free_after_streams(pending, &[StreamId(7)]), Ok(vec![]));
    let Err(Error::OutOfMemory(report)) = p.malloc(8 * MIB, S0) else {
        panic!("served by a second search");
    };
    assert!(
        matches!(report.hint(), OomHint::FreedDuringRequest { block, .. } if block == 8 * MIB),
        "{}",
        report.hint()
    );
    assert_eq!(p.pending_frees(), 0);
    assert_eq!(p.malloc(8 * MIB, S0).unwrap(), pending);
    p.validate().unwrap();
}

/// `roundup_power2_divisions` of 1 round nothing beyond 512 bytes (PyTorch applies the divisions
/// only above 1), and divisions apply only to sizes above 512 bytes times their number: 600
/// bytes under 8 divisions take 1 KiB, not the 640 the steps of 64 would give.
#[test]
fn divisions_of_one_round_nothing_and_small_sizes_round_by_512_bytes() {
    let settings = |divisions: u64| Settings {
        roundup_power2_divisions: [divisions; 16],
        ..Settings::default()
    };
    let one = settings(1);
    assert_eq!(rounding::round_size(&one, MIB + 1), MIB + 512);
    assert_eq!(rounding::round_size(&one, 3 * MIB), 3 * MIB);
    let eight = settings(8);
    assert_eq!(rounding::round_size(&eight, 600), 1024);
    assert_eq!(rounding::round_size(&eight, 4096), 4096);
}
