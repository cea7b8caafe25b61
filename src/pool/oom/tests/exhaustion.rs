//! Exhaustion, the fraction limit and memory held outside cachealloc: what no block layout
//! changes.

use super::*;

#[test]
fn live_memory_over_capacity_is_exhaustion() {
    let report = OomReport {
        allocated: 79 * GIB,
        live_requested: 79 * GIB,
        reserved: 79 * GIB + 512 * MIB,
        device_free: 256 * MIB,
        requested: 2 * GIB,
        rounded: 2 * GIB,
        alloc_size: 2 * GIB,
        ..fragmented()
    };
    let hint = report.hint();
    assert_eq!(
        hint,
        OomHint::Exhausted {
            needed: 81 * GIB,
            available: 79 * GIB + 768 * MIB,
            missing: 1280 * MIB,
            by_fraction_limit: false,
        }
    );
    let text = hint.to_string();
    assert!(text.starts_with("Not fragmentation"), "{text}");
    assert!(text.contains("1.25 GiB short"), "{text}");
    assert!(!text.contains("max_split_size_mb"), "{text}");
}

/// The fraction limit is named as what binds only when the device would have had room.
#[test]
fn a_fraction_limit_below_a_need_the_device_cannot_meet_is_not_what_binds() {
    // More than the whole device: raising the limit cannot help.
    let over_device = OomReport {
        allowed_maximum: Some(79 * GIB),
        allocated: 79 * GIB,
        live_requested: 79 * GIB,
        reserved: 79 * GIB,
        device_free: GIB,
        requested: 2 * GIB,
        rounded: 2 * GIB,
        alloc_size: 2 * GIB,
        ..fragmented()
    };
    assert!(matches!(
        over_device.hint(),
        OomHint::Exhausted {
            by_fraction_limit: false,
            ..
        }
    ));
    assert!(over_device.to_string().contains("use a larger GPU"));
    // Within the device, but memory outside cachealloc holds what the limit would allow.
    let held_outside = OomReport {
        allowed_maximum: Some(60 * GIB),
        allocated: 59 * GIB,
        live_requested: 59 * GIB,
        reserved: 59 * GIB,
        device_free: GIB,
        requested: 2 * GIB,
        rounded: 2 * GIB,
        alloc_size: 2 * GIB,
        ..fragmented()
    };
    assert_eq!(
        held_outside.hint(),
        OomHint::Untracked {
            untracked: 20 * GIB,
            missing: GIB,
            fraction_limit: Some(60 * GIB),
        }
    );
    assert!(
        held_outside.to_string().contains(
            "would fit without it and with per_process_memory_fraction raised (it allows \
             60.00 GiB)"
        ),
        "{held_outside}"
    );
}

#[test]
fn fraction_limit_is_named_when_it_binds() {
    let report = OomReport {
        allowed_maximum: Some(40 * GIB),
        allocated: 39 * GIB,
        live_requested: 39 * GIB,
        reserved: 39 * GIB + 512 * MIB,
        device_free: 40 * GIB,
        requested: 2 * GIB,
        rounded: 2 * GIB,
        alloc_size: 2 * GIB,
        ..fragmented()
    };
    assert_eq!(
        report.hint(),
        OomHint::Exhausted {
            needed: 41 * GIB,
            available: 40 * GIB,
            missing: GIB,
            by_fraction_limit: true,
        }
    );
    let text = report.to_string();
    assert!(
        text.contains("is free. 40.00 GiB allowed; Of the allocated"),
        "{text}"
    );
    assert!(text.contains("per_process_memory_fraction"), "{text}");
}

#[test]
fn memory_held_by_others_is_untracked() {
    // 30 GiB used outside cachealloc; without it the 12 GiB request would fit.
    let report = OomReport {
        allocated: 39 * GIB,
        live_requested: 39 * GIB,
        reserved: 40 * GIB,
        device_free: 10 * GIB,
        requested: 12 * GIB,
        rounded: 12 * GIB,
        alloc_size: 12 * GIB,
        largest_free_blocks: vec![],
        free_blocks: 0,
        pool_largest_free_block: 0,
        ..fragmented()
    };
    assert_eq!(report.untracked(), 30 * GIB);
    assert_eq!(
        report.hint(),
        OomHint::Untracked {
            untracked: 30 * GIB,
            missing: GIB,
            fraction_limit: None,
        }
    );
    let text = report.to_string();
    assert!(text.contains("Largest free cached blocks: none."), "{text}");
    assert!(
        text.contains("Hint: Memory outside cachealloc: 30.00 GiB"),
        "{text}"
    );
}

/// During a CUDA graph capture, frees still pending count among the live requests, but the pool
/// could not wait for them: when they would leave a block that serves the request, the hint
/// says so instead of calling the memory exhausted; outside a capture, or when no such block
/// would be left (`pending_fit`, which the pool finds: `pool::capture_oom_tests`), it is
/// exhaustion.
#[test]
fn pending_frees_a_capture_kept_from_completing_are_named() {
    let during = OomReport {
        allocated: 41 * GIB,
        live_requested: 79 * GIB,
        pending_requested: 38 * GIB,
        pending_fit: Some(2 * GIB),
        reserved: 79 * GIB,
        device_free: GIB / 2,
        requested: 2 * GIB,
        rounded: 2 * GIB,
        alloc_size: 2 * GIB,
        capture_underway: true,
        ..fragmented()
    };
    let hint = during.hint();
    assert_eq!(
        hint,
        OomHint::PendingDuringCapture {
            pending: 38 * GIB,
            block: 2 * GIB,
        }
    );
    let text = hint.to_string();
    assert!(text.starts_with("Pending during the capture: frees still pending hold 38.00 GiB"));
    assert!(text.contains("a free block of 2.00 GiB"), "{text}");
    assert!(text.contains("before the capture begins"), "{text}");
    assert!(!text.contains("keep less memory alive"), "{text}");
    let outside = OomReport {
        capture_underway: false,
        ..during.clone()
    };
    assert!(matches!(outside.hint(), OomHint::Exhausted { .. }));
    let no_block = OomReport {
        pending_fit: None,
        ..during
    };
    assert!(matches!(no_block.hint(), OomHint::Exhausted { .. }));
}
