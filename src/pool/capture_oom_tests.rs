//! The out-of-memory hint during a CUDA graph capture when frees are still pending: it names
//! them only when their blocks, once complete, would serve the request. During a capture the
//! pool gives no cached memory back, so a completed block helps only by serving the request
//! itself (on its stream, in its pool, merged with its free neighbours), not by the bytes it
//! holds.

use super::tests::{MIB, S0};
use super::*;
use crate::backend::sim::SimDevice;
use crate::pool::oom::OomHint;

const S1: StreamId = StreamId(1);

/// A pool whose frees wait for the device (free_sync's device policy), on a device of
/// `capacity` bytes.
fn pool_with_pending_frees(capacity: u64) -> DeviceAllocator<SimDevice> {
    DeviceAllocator::new(
        SimDevice::new(capacity).with_pending_work(),
        Settings::default(),
    )
}

/// The report of `size` bytes asked for on `stream` during a capture.
fn oom_during_capture(
    p: &mut DeviceAllocator<SimDevice>,
    size: u64,
    stream: StreamId,
) -> Box<OomReport> {
    p.backend_mut().set_capturing(true);
    let Err(Error::OutOfMemory(report)) = p.malloc(size, stream) else {
        panic!("{size} bytes on stream {} fit during the capture", stream.0);
    };
    p.validate().unwrap();
    assert!(report.capture_underway);
    report
}

/// Whether `size` bytes on `stream` fit during a capture when the frees still pending had
/// completed before it began: what the hint tells the program to do.
fn fits_when_freed_before_the_capture(
    mut p: DeviceAllocator<SimDevice>,
    size: u64,
    stream: StreamId,
) -> bool {
    p.backend_mut().set_capturing(false);
    p.backend_mut().complete_work();
    p.process_pending().unwrap();
    assert_eq!(p.pending_frees(), 0);
    p.backend_mut().set_capturing(true);
    let fits = p.malloc(size, stream).is_ok();
    p.validate().unwrap();
    fits
}

/// A request of `size` bytes on `stream` that fails during a capture with frees pending that,
/// complete, would not serve it: its hint does not name them, and it fails too when they
/// complete before the capture begins.
fn pending_frees_are_not_named(mut p: DeviceAllocator<SimDevice>, size: u64, stream: StreamId) {
    let report = oom_during_capture(&mut p, size, stream);
    assert!(
        !matches!(report.hint(), OomHint::PendingDuringCapture { .. }),
        "{report}"
    );
    assert!(!fits_when_freed_before_the_capture(p, size, stream));
}

/// A 64 MiB block pending on a full 64 MiB device, and a 512-byte request: the small pool needs
/// a new 2 MiB segment, which the large block, complete, could not give (it is not given back
/// during a capture).
#[test]
fn a_pending_large_block_does_not_serve_a_small_request() {
    let mut p = pool_with_pending_frees(64 * MIB);
    let a = p.malloc(64 * MIB, S0).unwrap();
    p.free_deferred(a).unwrap();
    pending_frees_are_not_named(p, 512, S0);
}

/// Two pending 20 MiB segments do not make one 40 MiB block.
#[test]
fn pending_blocks_in_separate_segments_do_not_add_up() {
    let mut p = pool_with_pending_frees(60 * MIB);
    let a = p.malloc(20 * MIB, S0).unwrap();
    let b = p.malloc(20 * MIB, S0).unwrap();
    let _kept = p.malloc(20 * MIB, S0).unwrap();
    p.free_deferred(a).unwrap();
    p.free_deferred(b).unwrap();
    pending_frees_are_not_named(p, 40 * MIB, S0);
}

/// A block pending on another stream goes back to that stream's blocks.
#[test]
fn a_block_pending_on_another_stream_does_not_serve_this_one() {
    let mut p = pool_with_pending_frees(64 * MIB);
    let a = p.malloc(40 * MIB, S1).unwrap();
    p.free_deferred(a).unwrap();
    pending_frees_are_not_named(p, 40 * MIB, S0);
}

/// A pending 40 MiB block next to a free 20 MiB remainder of its 60 MiB segment, and a 50 MiB
/// request on a 100 MiB device: the requests fit in what the process may use (so it is not
/// exhaustion), but no free block holds 50 MiB; complete, the pending block merges with the
/// remainder into one that does. That is the hint, not fragmentation.
#[test]
fn a_pending_block_that_would_merge_into_a_serving_one_is_named() {
    let mut p = pool_with_pending_frees(100 * MIB);
    let whole = p.malloc(60 * MIB, S0).unwrap();
    p.free(whole).unwrap();
    let a = p.malloc(40 * MIB, S0).unwrap();
    assert_eq!(a, whole, "split from the cached segment");
    p.free_deferred(a).unwrap();
    let report = oom_during_capture(&mut p, 50 * MIB, S0);
    assert_eq!(
        report.hint(),
        OomHint::PendingDuringCapture {
            pending: 40 * MIB,
            block: 60 * MIB,
        },
        "{report}"
    );
    assert!(fits_when_freed_before_the_capture(p, 50 * MIB, S0));
}

/// A pending 40 MiB block that is its whole segment, on a full 60 MiB device, and a 40 MiB
/// request: complete, the block serves it alone, with no free neighbour to merge with.
#[test]
fn a_lone_pending_block_that_would_serve_is_named() {
    let mut p = pool_with_pending_frees(60 * MIB);
    let a = p.malloc(40 * MIB, S0).unwrap();
    let _kept = p.malloc(20 * MIB, S0).unwrap();
    p.free_deferred(a).unwrap();
    let report = oom_during_capture(&mut p, 40 * MIB, S0);
    assert_eq!(
        report.hint(),
        OomHint::PendingDuringCapture {
            pending: 40 * MIB,
            block: 40 * MIB,
        },
        "{report}"
    );
    assert!(fits_when_freed_before_the_capture(p, 40 * MIB, S0));
}

/// A pool on a 60 MiB device holding three 20 MiB segments, of which `freed` are free whole
/// segments (cached, not given back), and the live rest.
fn full_device_with_free_segments(freed: usize) -> DeviceAllocator<SimDevice> {
    let mut p = DeviceAllocator::new(SimDevice::new(60 * MIB), Settings::default());
    let blocks: Vec<_> = (0..3).map(|_| p.malloc(20 * MIB, S0).unwrap()).collect();
    for &b in &blocks[..freed] {
        p.free(b).unwrap();
    }
    p
}

/// Whether `size` bytes on `stream` are served outside a capture: the ladder gives whole free
/// segments back and tries again.
fn fits_outside_the_capture(mut p: DeviceAllocator<SimDevice>, size: u64) -> bool {
    p.backend_mut().set_capturing(false);
    let fits = p.malloc(size, S0).is_ok();
    p.validate().unwrap();
    fits
}

/// Whole free segments that a capture keeps cached, and requests whose segments they would
/// make room for once given back (a small request, which no large-pool block serves, and a
/// large one that no single cached segment holds): the hint says the capture held them, not
/// fragmentation (which would name a max_split_size_mb and call them parts of segments in use).
#[test]
fn whole_free_segments_a_capture_keeps_are_named() {
    for (size, segment) in [(512, 2 * MIB), (40 * MIB, 40 * MIB)] {
        let mut p = full_device_with_free_segments(2);
        let report = oom_during_capture(&mut p, size, S0);
        let hint = report.hint();
        assert_eq!(
            hint,
            OomHint::HeldDuringCapture {
                held: 40 * MIB,
                device_free: 0,
                segment,
            },
            "{report}"
        );
        let text = hint.to_string();
        assert!(
            text.starts_with("Held during the capture: 40.00 MiB"),
            "{text}"
        );
        assert!(!text.contains("max_split_size_mb"), "{text}");
        assert!(fits_outside_the_capture(p, size), "{size}");
    }
}

/// When the whole free segments would not make room for the request's segment, the hint is
/// not about them: outside the capture the request fails too.
#[test]
fn whole_free_segments_too_small_to_make_room_are_not_named() {
    let mut p = full_device_with_free_segments(1);
    let report = oom_during_capture(&mut p, 40 * MIB, S0);
    assert_eq!(report.capture_held, 20 * MIB);
    assert!(
        !matches!(report.hint(), OomHint::HeldDuringCapture { .. }),
        "{report}"
    );
    assert!(!fits_outside_the_capture(p, 40 * MIB));
}
