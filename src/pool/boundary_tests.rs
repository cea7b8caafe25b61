//! Worked examples at the edges of PyTorch's policy (reference §1–§3) that random operation
//! sequences reach only by chance: each pins one comparison (`>=` against `>`, the last
//! rounding interval, the order of releases) on the simulated device, so that a change to it
//! fails here whatever the seed. Found by mutating each rule and seeing which tests noticed.
//! The checks of `validate()` itself are tested here too: the rest of the suite relies on them.

use super::block::NextLink;
use super::free_index::FreeEntry;
use super::tests::{MIB, S0, alloc, free, pool_with};
use super::*;
use std::sync::{Arc, Mutex};

const GIB: u64 = 1 << 30;

/// A request at or above `max_split_size` takes a cached block only if the block is less than
/// `max_non_split_rounding` (20 MiB by default) larger: exactly that much larger is too much.
#[test]
fn a_cached_block_exactly_the_rounding_limit_larger_is_not_taken() {
    let settings = Settings {
        max_split_size: 21 * MIB,
        ..Settings::default()
    };
    let mut p = pool_with(u64::MAX, settings);
    let a = alloc(&mut p, 44 * MIB);
    free(&mut p, a);
    // 44 MiB = 24 MiB + 20 MiB: a new segment.
    let b = alloc(&mut p, 24 * MIB);
    assert_ne!(b, a);
    assert_eq!(p.stats().counts.num_device_alloc, 2);
    // 44 MiB < (24 MiB + 512) + 20 MiB: the cached block serves.
    let c = alloc(&mut p, 24 * MIB + 512);
    assert_eq!(c, a);
    assert_eq!(p.stats().counts.num_device_alloc, 2);
}

/// PyTorch adds `max_non_split_rounding` to the request in `size_t`, which wraps for the
/// largest settings: `max_non_split_rounding_mb:-1` (read as 2^64 − 1, clamped to whole MiB)
/// makes the limit a MiB below the request, so a request at or above `max_split_size` takes no
/// cached block at all. 2^63 bytes does not wrap: any cached block then serves.
#[test]
fn a_rounding_limit_that_wraps_around_2_64_refuses_every_cached_block() {
    for (rounding, reused) in [((u64::MAX / MIB) * MIB, false), (1 << 63, true)] {
        let settings = Settings {
            max_split_size: 21 * MIB,
            max_non_split_rounding: rounding,
            ..Settings::default()
        };
        let mut p = pool_with(u64::MAX, settings);
        let a = alloc(&mut p, 44 * MIB);
        free(&mut p, a);
        let b = alloc(&mut p, 24 * MIB);
        assert_eq!(b == a, reused, "rounding {rounding}");
        let segments = if reused { 1 } else { 2 };
        assert_eq!(
            p.stats().counts.num_device_alloc,
            segments,
            "rounding {rounding}"
        );
    }
}

/// `empty_cache()` returns the large pool's segments before the small pool's (PyTorch's
/// `release_cached_blocks` order), which a recorded trace shows.
#[test]
fn empty_cache_returns_the_large_pool_before_the_small() {
    let mut p = pool_with(u64::MAX, Settings::default());
    let freed = Arc::new(Mutex::new(Vec::new()));
    let sink = freed.clone();
    p.set_event_sink(Some(Box::new(move |e: &PoolEvent| {
        if let PoolEvent::SegmentFree { size, .. } = e {
            sink.lock().unwrap().push(*size);
        }
    })));
    let small = alloc(&mut p, 512);
    let large = alloc(&mut p, 2 * MIB);
    free(&mut p, small);
    free(&mut p, large);
    p.empty_cache().unwrap();
    assert_eq!(*freed.lock().unwrap(), vec![20 * MIB, 2 * MIB]);
}

/// `empty_cache()` returns a pool's whole free segments in its set's (stream, size, address)
/// order (PyTorch compares the `cudaStream_t` values), whatever order the streams first used
/// the pool in: here streams 2, 0 and 1, whose segments (20, 60 and 40 MiB) go back as stream
/// 0's, 1's, then 2's, as a recorded trace shows.
#[test]
fn empty_cache_returns_segments_in_stream_order() {
    let mut p = pool_with(u64::MAX, Settings::default());
    let freed = Arc::new(Mutex::new(Vec::new()));
    let sink = freed.clone();
    p.set_event_sink(Some(Box::new(move |e: &PoolEvent| {
        if let PoolEvent::SegmentFree { size, stream, .. } = e {
            sink.lock().unwrap().push((stream.0, *size));
        }
    })));
    let blocks: Vec<_> = [(2, 20 * MIB), (0, 60 * MIB), (1, 40 * MIB)]
        .into_iter()
        .map(|(stream, size)| p.malloc(size, StreamId(stream)).unwrap())
        .collect();
    for b in blocks {
        free(&mut p, b);
    }
    p.empty_cache().unwrap();
    assert_eq!(
        *freed.lock().unwrap(),
        vec![(0, 60 * MIB), (1, 40 * MIB), (2, 20 * MIB)]
    );
}

/// `roundup_power2_divisions`' last interval holds every size from 32 GiB up (`>:N` in the
/// list form): a 33 GiB request under 8 divisions there rounds to 36 GiB.
#[test]
fn sizes_from_32_gib_round_by_the_last_interval() {
    let mut divisions = [0u64; 16];
    divisions[15] = 8;
    let settings = Settings {
        roundup_power2_divisions: divisions,
        ..Settings::default()
    };
    assert_eq!(rounding::round_size(&settings, 33 * GIB), 36 * GIB);
    let mut p = pool_with(u64::MAX, settings);
    let a = alloc(&mut p, 33 * GIB);
    assert_eq!(p.allocation_size(a), Some(36 * GIB));
}

/// A request of 1 EiB or more is refused before the device is asked; one just below is asked
/// for (and the simulated device, of 128 TiB of addresses, runs out of memory).
#[test]
fn a_request_of_exactly_1_eib_is_refused_without_a_device_call() {
    let mut p = pool_with(u64::MAX, Settings::default());
    assert!(matches!(
        p.malloc(1 << 60, S0),
        Err(Error::RequestTooLarge { .. })
    ));
    assert_eq!(p.stats().counts.num_device_alloc, 0);
    assert!(matches!(
        p.malloc((1 << 60) - 512, S0),
        Err(Error::OutOfMemory(_))
    ));
}

/// A request of 64 PiB (below the 1 EiB refused outright) with a 20 MiB block cached: no cached
/// block is large enough, so the device is asked and runs out of memory; the cached block
/// stays cached for a request it fits. (The free index files such sizes in its topmost
/// classes, above every real block's.)
#[test]
fn a_request_of_petabytes_is_not_served_by_a_smaller_cached_block() {
    let mut p = pool_with(u64::MAX, Settings::default());
    let cached = alloc(&mut p, 20 * MIB);
    free(&mut p, cached);
    assert!(matches!(p.malloc(1 << 56, S0), Err(Error::OutOfMemory(_))));
    p.validate().unwrap();
    assert_eq!(alloc(&mut p, 20 * MIB), cached);
}

/// `malloc(0)` gets a block of 512 bytes of its own, as PyTorch's rounding gives it.
#[test]
fn a_request_of_zero_bytes_gets_its_own_512_byte_block() {
    let mut p = pool_with(u64::MAX, Settings::default());
    let a = alloc(&mut p, 0);
    let b = alloc(&mut p, 0);
    assert_ne!(a, b);
    assert_eq!(p.allocation_size(a), Some(512));
    assert_eq!(p.allocation_size(b), Some(512));
}

/// Garbage collection frees the oldest cached blocks until it has reclaimed what brings the
/// reserved memory back to the threshold, and no more: here the older 20 MiB block alone is
/// exactly enough, so the younger 40 MiB one stays cached.
#[test]
fn garbage_collection_stops_once_it_reclaimed_exactly_its_target() {
    let settings = Settings {
        per_process_memory_fraction: 0.5,
        garbage_collection_threshold: 0.5,
        ..Settings::default()
    };
    // 512 MiB allowed, collected above 256 MiB.
    let mut p = pool_with(1024 * MIB, settings);
    let _live = alloc(&mut p, 216 * MIB);
    let older = alloc(&mut p, 20 * MIB);
    free(&mut p, older);
    // Its search passes the 20 MiB block by, which ages it.
    let younger = alloc(&mut p, 40 * MIB);
    free(&mut p, younger);
    // 276 MiB reserved: the target is 20 MiB.
    let _more = alloc(&mut p, 100 * MIB);
    assert_eq!(
        p.stats().reserved_bytes.all.current,
        ((216 + 40 + 100) * MIB) as i64
    );
}

/// `validate()` finds two free neighbours left unmerged.
#[test]
fn validate_finds_free_neighbours_left_unmerged() {
    let mut p = pool_with(u64::MAX, Settings::default());
    let a = alloc(&mut p, 512);
    let b = alloc(&mut p, 512);
    let _keep = alloc(&mut p, 512);
    free(&mut p, a);
    // Mark `b` free without merging it with `a`.
    let id = p.blocks.find(b.addr()).unwrap();
    p.blocks.get_mut(id).state = BlockState::Free;
    let block = *p.blocks.get(id);
    p.small.get_mut(S0).insert(FreeEntry {
        size: block.size,
        addr: block.addr,
        id,
        link: NextLink::of(&block),
    });
    let err = p.validate().unwrap_err();
    assert!(err.contains("not merged"), "{err}");
}

/// `validate()` finds a statistic that no longer equals a recount.
#[test]
fn validate_finds_a_statistic_that_differs_from_a_recount() {
    let mut p = pool_with(u64::MAX, Settings::default());
    let _a = alloc(&mut p, 512);
    p.stats.inactive_split.increase(PoolKind::Small, 1);
    let err = p.validate().unwrap_err();
    assert!(err.contains("inactive_split"), "{err}");
}

/// `roundup_power2_divisions`' table is indexed by the power of two below the size, from 1 MiB
/// (index 0, which also holds every smaller size) up: divisions set for 2–4 MiB only round
/// sizes there, in steps of a quarter, and leave a size on a step, and sizes of 1–2 MiB, as
/// they are; divisions set for index 0 round sizes below 1 MiB too.
#[test]
fn divisions_apply_to_the_interval_their_index_names() {
    let only = |index: usize, divisions: u64| {
        let mut table = [0u64; 16];
        table[index] = divisions;
        Settings {
            roundup_power2_divisions: table,
            ..Settings::default()
        }
    };
    let second = only(1, 4);
    assert_eq!(rounding::round_size(&second, 5 * MIB / 2 + 1), 3 * MIB);
    assert_eq!(rounding::round_size(&second, 3 * MIB), 3 * MIB);
    assert_eq!(rounding::round_size(&second, 5 * MIB / 2), 5 * MIB / 2);
    assert_eq!(
        rounding::round_size(&second, 3 * MIB / 2 + 1),
        3 * MIB / 2 + 512
    );
    let first = only(0, 4);
    assert_eq!(rounding::round_size(&first, 600 * 1024), 640 * 1024);
    assert_eq!(
        rounding::round_size(&first, 5 * MIB / 4 + 1),
        5 * MIB / 4 + MIB / 4
    );
}

/// `max_split_size`'s bounds are inclusive on the oversize side: a cached block of exactly
/// `max_split_size` is not given to a smaller request, and a request of exactly
/// `max_split_size` is oversize itself: it takes a cached block up to
/// `max_non_split_rounding` larger whole, unsplit.
#[test]
fn a_block_or_request_of_exactly_max_split_size_is_oversize() {
    let settings = Settings {
        max_split_size: 40 * MIB,
        ..Settings::default()
    };
    let mut p = pool_with(u64::MAX, settings.clone());
    let block = alloc(&mut p, 40 * MIB);
    free(&mut p, block);
    let smaller = alloc(&mut p, 30 * MIB);
    assert_ne!(smaller, block, "a 30 MiB request takes no 40 MiB block");
    assert_eq!(p.stats().counts.num_device_alloc, 2);

    let mut p = pool_with(u64::MAX, settings);
    let block = alloc(&mut p, 50 * MIB);
    free(&mut p, block);
    let exact = alloc(&mut p, 40 * MIB);
    assert_eq!(exact, block, "a 40 MiB request takes the 50 MiB block");
    assert_eq!(p.allocation_size(exact), Some(50 * MIB), "whole, unsplit");
    assert_eq!(p.stats().oversize_allocations.current, 1);
    free(&mut p, exact);
    assert_eq!(p.stats().oversize_allocations.current, 0);
}

/// A large block is split only when more than 1 MiB would remain: a 21 MiB request in its
/// 22 MiB segment keeps the whole segment, one 512 bytes smaller leaves a free rest.
#[test]
fn a_large_block_keeps_a_rest_of_exactly_1_mib() {
    let mut p = pool_with(u64::MAX, Settings::default());
    let whole = alloc(&mut p, 21 * MIB);
    assert_eq!(p.allocation_size(whole), Some(22 * MIB));
    let mut p = pool_with(u64::MAX, Settings::default());
    let split = alloc(&mut p, 21 * MIB - 512);
    assert_eq!(p.allocation_size(split), Some(21 * MIB - 512));
    assert_eq!(
        p.stats().inactive_split_bytes.large_pool.current,
        (MIB + 512) as i64
    );
}
