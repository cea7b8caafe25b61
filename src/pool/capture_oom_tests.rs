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

/// A 64 MiB block pending on a full 64 MiB device, and a 512-byte request: the small pool needs
/// a new 2 MiB segment, which the large block, complete, could not give (it is not given back
/// during a capture).
#[test]
fn a_pending_large_block_does_not_serve_a_small_request() {
    let mut p = pool_with_pending_frees(64 * MIB);
    let a = p.malloc(64 * MIB, S0).unwrap();
    p.free_deferred(a).unwrap();
    let report = oom_during_capture(&mut p, 512, S0);
    assert!(
        !matches!(report.hint(), OomHint::PendingDuringCapture { .. }),
        "{report}"
    );
    assert!(!fits_when_freed_before_the_capture(p, 512, S0));
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
    let report = oom_during_capture(&mut p, 40 * MIB, S0);
    assert!(
        !matches!(report.hint(), OomHint::PendingDuringCapture { .. }),
        "{report}"
    );
    assert!(!fits_when_freed_before_the_capture(p, 40 * MIB, S0));
}

/// A block pending on another stream goes back to that stream's blocks.
#[test]
fn a_block_pending_on_another_stream_does_not_serve_this_one() {
    let mut p = pool_with_pending_frees(64 * MIB);
    let a = p.malloc(40 * MIB, S1).unwrap();
    p.free_deferred(a).unwrap();
    let report = oom_during_capture(&mut p, 40 * MIB, S0);
    assert!(
        !matches!(report.hint(), OomHint::PendingDuringCapture { .. }),
        "{report}"
    );
    assert!(!fits_when_freed_before_the_capture(p, 40 * MIB, S0));
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
