//! The miss ladder while a CUDA graph capture is underway: the pool obtains new memory and makes
//! none of the calls that would end the capture (the simulated device fails them then, as a
//! real one would end the capture).

use super::tests::{MIB, S0, pool_with};
use super::*;
use crate::backend::sim::SimDevice;

const S1: StreamId = StreamId(1);

/// The default settings, with fixed and with expandable segments.
fn native_and_expandable() -> [Settings; 2] {
    let expandable = Settings {
        expandable_segments: true,
        ..Settings::default()
    };
    [Settings::default(), expandable]
}

/// A pool whose frees wait for the device (free_sync's device policy), on an unlimited device.
fn pool_with_pending_frees(settings: Settings) -> DeviceAllocator<SimDevice> {
    DeviceAllocator::new(SimDevice::new(u64::MAX).with_pending_work(), settings)
}

#[test]
fn during_a_capture_a_miss_grows_rather_than_wait_for_pending_frees() {
    for settings in native_and_expandable() {
        let mut p = pool_with_pending_frees(settings);
        let a = p.malloc(10 * MIB, S0).unwrap();
        p.free_deferred(a).unwrap();
        p.backend_mut().set_capturing(true);
        let b = p.malloc(10 * MIB, S0).unwrap();
        p.validate().unwrap();
        assert_ne!(a, b, "the pending block stays pending");
        assert_eq!(p.backend().counters().synchronizes, 0);
        assert_eq!(p.pending_frees(), 1);
        // After the capture, the next miss waits for the device and reuses the block.
        p.backend_mut().set_capturing(false);
        let c = p.malloc(10 * MIB, S0).unwrap();
        p.validate().unwrap();
        assert_eq!(c, a);
        assert_eq!(p.backend().counters().synchronizes, 1);
        assert_eq!(p.pending_frees(), 0);
    }
}

#[test]
fn an_out_of_memory_during_a_capture_gives_nothing_back_and_says_so() {
    let mut p = pool_with(40 * MIB, Settings::default());
    let _kept = p.malloc(20 * MIB, S0).unwrap();
    // A whole cached segment of another stream: only giving it back makes room.
    let other = p.malloc(20 * MIB, S1).unwrap();
    p.free(other).unwrap();
    p.backend_mut().set_capturing(true);
    let Err(Error::OutOfMemory(report)) = p.malloc(20 * MIB, S0) else {
        panic!("a request that needs cached memory given back fails during a capture");
    };
    p.validate().unwrap();
    assert!(report.capture_underway);
    assert_eq!(p.backend().counters().frees, 0, "nothing given back");
    let stats = p.stats();
    assert_eq!(stats.reserved_bytes.all.current, 40 * MIB as i64);
    assert_eq!(stats.counts.num_alloc_retries, 0);
    assert_eq!(stats.counts.num_ooms, 1);
    let text = report.to_string();
    assert!(
        text.contains(
            "A CUDA graph capture was underway: cachealloc gave no cached memory back to the \
             device and waited for no pending free, since each synchronizes the device and \
             would end the capture; outside a capture it does both before it fails."
        ),
        "{text}"
    );
    // After the capture the ladder gives the cached segment back and the request fits.
    p.backend_mut().set_capturing(false);
    p.malloc(20 * MIB, S0).unwrap();
    p.validate().unwrap();
    assert_eq!(p.backend().counters().frees, 1);
    assert_eq!(p.stats().counts.num_alloc_retries, 1);
}

/// An out-of-memory outside a capture does not speak of one.
#[test]
fn an_out_of_memory_outside_a_capture_names_none() {
    let mut p = pool_with(20 * MIB, Settings::default());
    let Err(Error::OutOfMemory(report)) = p.malloc(40 * MIB, S0) else {
        panic!("a request beyond the device fails");
    };
    assert!(!report.capture_underway);
    assert!(!report.to_string().contains("capture"), "{report}");
}

/// `empty_cache()` during a capture: PyTorch's `release_cached_blocks` leaves the default pools
/// alone while a capture is underway — no `synchronize_and_free_events` (so no
/// `num_sync_all_streams`), no segment released, no error — since either would end the
/// capture. After it, the next call gives the cached memory back.
#[test]
fn empty_cache_during_a_capture_does_nothing_as_in_pytorch() {
    for settings in native_and_expandable() {
        let mut p = pool_with_pending_frees(settings);
        let cached = p.malloc(20 * MIB, S0).unwrap();
        p.free(cached).unwrap();
        let pending = p.malloc(10 * MIB, S1).unwrap();
        p.free_deferred(pending).unwrap();
        let before = p.stats();
        p.backend_mut().set_capturing(true);
        assert_eq!(p.empty_cache(), Ok(()));
        p.validate().unwrap();
        assert_eq!(p.stats(), before);
        assert_eq!(p.pending_frees(), 1);
        assert_eq!(p.backend().counters().synchronizes, 0);
        p.backend_mut().set_capturing(false);
        p.empty_cache().unwrap();
        p.validate().unwrap();
        let s = p.stats();
        assert_eq!(s.counts.num_sync_all_streams, 1);
        assert_eq!(s.reserved_bytes.all.current, 0);
        assert_eq!(p.pending_frees(), 0);
    }
}

/// The `Capture` event marks where a capture changed what the pool did, ahead of that call's
/// other events: a miss (then only new memory, or out of memory: `size` is the rounded
/// request) and `empty_cache()` (then nothing; `size` 0). A request a cached block serves has
/// none (served alike during a capture), nor has a miss outside a capture.
#[test]
fn a_capture_event_comes_before_what_the_capture_changed() {
    use std::sync::{Arc, Mutex};
    for settings in native_and_expandable() {
        let expandable = settings.expandable_segments;
        let mut p = pool_with(100 * MIB, settings);
        let events: Arc<Mutex<Vec<PoolEvent>>> = Arc::default();
        let sink = Arc::clone(&events);
        p.set_event_sink(Some(Box::new(move |e: &PoolEvent| {
            sink.lock().unwrap().push(*e);
        })));
        let cached = p.malloc(10 * MIB, S1).unwrap();
        p.free(cached).unwrap();
        p.backend_mut().set_capturing(true);
        let take = || std::mem::take(&mut *events.lock().unwrap());
        take();
        // A hit.
        p.malloc(10 * MIB, S1).unwrap();
        assert!(
            matches!(take()[..], [PoolEvent::Alloc { .. }]),
            "expandable {expandable}"
        );
        // A miss.
        p.malloc(30 * MIB, S0).unwrap();
        let grown = take();
        let capture = PoolEvent::Capture {
            size: 30 * MIB,
            stream: S0,
        };
        assert_eq!(grown.first(), Some(&capture), "expandable {expandable}");
        assert!(
            matches!(grown.last(), Some(PoolEvent::Alloc { .. })),
            "{grown:?}"
        );
        assert_eq!(grown.iter().filter(|e| **e == capture).count(), 1);
        // `empty_cache()`.
        p.empty_cache().unwrap();
        let capture = PoolEvent::Capture {
            size: 0,
            stream: S0,
        };
        assert_eq!(take(), [capture, PoolEvent::EmptyCache]);
        // Out of memory.
        assert!(p.malloc(90 * MIB, S0).is_err());
        let failed = take();
        assert!(
            matches!(
                failed[..],
                [
                    PoolEvent::Capture { size, stream: S0 },
                    PoolEvent::Oom { .. }
                ] if size == 90 * MIB
            ),
            "expandable {expandable}: {failed:?}"
        );
        // After the capture.
        p.backend_mut().set_capturing(false);
        p.malloc(20 * MIB, S0).unwrap();
        let grown = take();
        assert!(
            !grown.iter().any(|e| matches!(e, PoolEvent::Capture { .. })),
            "{grown:?}"
        );
    }
}
