//! A memory fraction set while the pool runs (`set_memory_fraction`, PyTorch's
//! `setMemoryFraction` behind `torch.cuda.set_per_process_memory_fraction`): the limit binds from
//! the next request that needs memory from the device, a fraction of 1 lifts it, garbage
//! collection acts only while one is set, and a pool given the fraction before its first request
//! behaves as one configured with it.

use super::tests::{MIB, S0, alloc, cache, free, pool_with};
use super::*;
use crate::backend::sim::SimDevice;
use std::sync::{Arc, Mutex};

/// A segment that brings the reserved memory exactly to the limit is allowed (PyTorch refuses
/// only what would pass it): half of a 1 GiB device, a 512 MiB request is served.
#[test]
fn a_segment_that_reaches_the_limit_exactly_is_served() {
    let settings = Settings {
        per_process_memory_fraction: 0.5,
        ..Settings::default()
    };
    let mut p = pool_with(1024 * MIB, settings);
    alloc(&mut p, 512 * MIB);
    assert_eq!(p.stats().reserved_bytes.all.current, 512 * MIB as i64);
}

/// A fraction without a `garbage_collection_threshold` collects no garbage (PyTorch collects
/// only when the threshold is above 0): a request that misses grows beside the cached 40 MiB
/// block, which stays cached and serves the next 40 MiB request.
#[test]
fn a_fraction_without_a_threshold_collects_no_garbage() {
    let settings = Settings {
        per_process_memory_fraction: 0.5,
        ..Settings::default()
    };
    let mut p = pool_with(1024 * MIB, settings);
    let cached = alloc(&mut p, 40 * MIB);
    free(&mut p, cached);
    let _big = alloc(&mut p, 60 * MIB);
    assert_eq!(p.stats().counts.num_device_free, 0);
    assert_eq!(alloc(&mut p, 40 * MIB), cached);
}

/// Of a 1 GiB device, half: with 300 MiB reserved, a second 300 MiB segment would pass 512 MiB
/// and is refused, the report naming the limit; lifted with a fraction of 1, it is served.
#[test]
fn a_fraction_limits_the_next_segment_and_one_of_1_lifts_it() {
    let mut p = pool_with(1024 * MIB, Settings::default());
    let _live = alloc(&mut p, 300 * MIB);
    p.set_memory_fraction(0.5).unwrap();
    assert_eq!(p.settings().per_process_memory_fraction, 0.5);
    let Err(Error::OutOfMemory(report)) = p.malloc(300 * MIB, S0) else {
        panic!("served past the limit of 512 MiB");
    };
    assert_eq!(report.allowed_maximum, Some(512 * MIB));
    p.validate().unwrap();
    // A request the cache serves needs no memory from the device: a 200 MiB block (a new
    // segment within the limit, 500 MiB reserved) cached, then under a limit of 256 MiB, which
    // the pool is already past, serves again.
    let second = alloc(&mut p, 200 * MIB);
    free(&mut p, second);
    p.set_memory_fraction(0.25).unwrap();
    assert_eq!(alloc(&mut p, 200 * MIB), second);
    assert!(matches!(p.malloc(MIB, S0), Err(Error::OutOfMemory(_))));
    p.set_memory_fraction(1.0).unwrap();
    alloc(&mut p, 300 * MIB);
    assert_eq!(p.stats().reserved_bytes.all.current, 800 * MIB as i64);
}

/// A fraction outside [0, 1] is refused, naming the range, and the limit in force stays.
#[test]
fn a_fraction_outside_0_to_1_is_refused_and_changes_nothing() {
    let mut p = pool_with(1024 * MIB, Settings::default());
    p.set_memory_fraction(0.5).unwrap();
    for bad in [1.5, -0.1, f64::NAN, f64::INFINITY] {
        let refused = p.set_memory_fraction(bad);
        let Err(e @ Error::InvalidFraction(_)) = refused else {
            panic!("{bad} accepted: {refused:?}");
        };
        assert!(
            e.to_string()
                .ends_with("set it within [0, 1] (1 = no limit)"),
            "{e}"
        );
        assert_eq!(p.settings().per_process_memory_fraction, 0.5);
    }
    assert!(matches!(
        p.malloc(600 * MIB, S0),
        Err(Error::OutOfMemory(report)) if report.allowed_maximum == Some(512 * MIB)
    ));
}

/// Garbage collection with a threshold and no fraction does nothing; once the program sets a
/// fraction it collects, blocks cached before counting as old as the searches since.
#[test]
fn a_fraction_set_as_it_runs_turns_garbage_collection_on() {
    let threshold_only = || {
        let settings = Settings {
            garbage_collection_threshold: 0.5,
            ..Settings::default()
        };
        let mut p = pool_with(1024 * MIB, settings);
        let live = alloc(&mut p, 216 * MIB);
        cache(&mut p, &[40 * MIB, 20 * MIB]);
        (p, live)
    };
    let (mut unlimited, _live) = threshold_only();
    alloc(&mut unlimited, 100 * MIB);
    assert_eq!(unlimited.stats().counts.num_device_free, 0);

    let (mut p, _live) = threshold_only();
    p.set_memory_fraction(0.5).unwrap();
    // 276 MiB reserved, collected above 256 MiB: both cached blocks go in one pass.
    alloc(&mut p, 100 * MIB);
    assert_eq!(p.stats().counts.num_device_free, 2);
    assert_eq!(p.stats().reserved_bytes.all.current, 316 * MIB as i64);
}

/// Set before the first request, the fraction is the setting: the same operations (a seeded
/// mix with frees and failures) give the same addresses, failures and statistics as a pool
/// configured with `per_process_memory_fraction`.
#[test]
fn a_fraction_set_before_the_first_request_is_the_setting() {
    let settings = |fraction: f64| Settings {
        garbage_collection_threshold: 0.6,
        per_process_memory_fraction: fraction,
        ..Settings::default()
    };
    let mut configured = pool_with(1024 * MIB, settings(0.4));
    let mut set = pool_with(1024 * MIB, settings(1.0));
    set.set_memory_fraction(0.4).unwrap();
    let mut live: Vec<(DevicePtr, DevicePtr)> = Vec::new();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut failures = 0;
    for _ in 0..4000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        if state.is_multiple_of(3) && !live.is_empty() {
            let (a, b) = live.swap_remove((state >> 8) as usize % live.len());
            configured.free(a).unwrap();
            set.free(b).unwrap();
        } else {
            let size = 1 + (state >> 16) % (48 * MIB);
            match (configured.malloc(size, S0), set.malloc(size, S0)) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a, b);
                    live.push((a, b));
                }
                (Err(Error::OutOfMemory(_)), Err(Error::OutOfMemory(_))) => failures += 1,
                other => panic!("the pools parted at {size} bytes: {other:?}"),
            }
        }
    }
    assert!(failures > 0, "the limit of 40 % was reached");
    assert_eq!(configured.stats(), set.stats());
    configured.validate().unwrap();
    set.validate().unwrap();
}

/// Each fraction set is an event, for a recording to replay where the program set it.
#[test]
fn setting_a_fraction_is_an_event() {
    let mut p = pool_with(1024 * MIB, Settings::default());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    p.set_event_sink(Some(Box::new(move |e: &PoolEvent| {
        sink.lock().unwrap().push(*e);
    })));
    p.set_memory_fraction(0.3).unwrap();
    let _ = p.set_memory_fraction(2.0);
    assert_eq!(
        *seen.lock().unwrap(),
        [PoolEvent::MemoryFraction { fraction: 0.3 }]
    );
}

/// `SimDevice` reports its capacity as its total memory, from which the limit is taken.
#[test]
fn the_limit_is_the_fraction_of_the_devices_total_memory() {
    let mut sim = SimDevice::new(1024 * MIB);
    sim.set_total(Some(2048 * MIB));
    let mut p = DeviceAllocator::new(sim, Settings::default());
    p.set_memory_fraction(0.25).unwrap();
    let Err(Error::OutOfMemory(report)) = p.malloc(600 * MIB, S0) else {
        panic!("served past the limit of 512 MiB");
    };
    assert_eq!(report.allowed_maximum, Some(512 * MIB));
}

/// A device that cannot tell its memory when the fraction is set (`cudaMemGetInfo` failing
/// once) does not drop the limit: the next request that needs memory takes it, of the total the
/// device then reports, and a request past it is refused.
#[test]
fn a_limit_the_device_could_not_size_yet_is_taken_at_the_next_request() {
    let mut p = pool_with(1024 * MIB, Settings::default());
    p.backend_mut().inject_mem_info_failures(1);
    p.set_memory_fraction(0.25).unwrap();
    let Err(Error::OutOfMemory(report)) = p.malloc(300 * MIB, S0) else {
        panic!("served past the limit of 256 MiB");
    };
    assert_eq!(report.allowed_maximum, Some(256 * MIB));
    // As for a configured fraction whose first request found the device silent.
    let settings = Settings {
        per_process_memory_fraction: 0.25,
        ..Settings::default()
    };
    let mut configured = pool_with(1024 * MIB, settings);
    configured.backend_mut().inject_mem_info_failures(1);
    alloc(&mut configured, 100 * MIB);
    assert!(matches!(
        configured.malloc(200 * MIB, S0),
        Err(Error::OutOfMemory(report)) if report.allowed_maximum == Some(256 * MIB)
    ));
}

/// The garbage-collection clock runs from the moment a fraction below 1 is set, whether or not
/// the device could size the limit yet: PyTorch's `setMemoryFraction` sets the limit at once
/// (from `totalGlobalMem`), and `get_free_block` counts every large-pool search from then on.
/// Here the device is silent when the fraction is set, and five requests the cached 20 MiB
/// block serves pass the 40 MiB one by before the next miss sizes the limit: the 40 MiB block
/// is then six searches old, the 20 MiB one, cached again after the last, one; the mean is 3.5
/// and only the 40 MiB block, which covers the 20 MiB target alone, goes.
#[test]
fn searches_age_cached_blocks_while_the_limit_waits_for_the_device() {
    let settings = Settings {
        garbage_collection_threshold: 0.5,
        ..Settings::default()
    };
    let mut p = pool_with(1024 * MIB, settings);
    let _live = alloc(&mut p, 216 * MIB);
    let [older, younger] = [40, 20].map(|mib| alloc(&mut p, mib * MIB));
    free(&mut p, older);
    free(&mut p, younger);
    p.backend_mut().inject_mem_info_failures(1);
    p.set_memory_fraction(0.5).unwrap();
    for _ in 0..5 {
        let again = alloc(&mut p, 20 * MIB);
        assert_eq!(again, younger);
        free(&mut p, again);
    }
    // 276 MiB reserved, collected above 256 MiB of the 512 MiB now allowed.
    alloc(&mut p, 100 * MIB);
    let s = p.stats();
    assert_eq!(s.counts.num_device_free, 1, "only the older block goes");
    assert_eq!(s.reserved_bytes.all.current, (216 + 20 + 100) * MIB as i64);
}
