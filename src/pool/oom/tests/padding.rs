//! Blocks larger than their requests: the padding hint, and the pool's counts of padding.

use super::*;

/// Blocks larger than their requests (rounding, whole handouts) are not live memory: when
/// the requests fit, the report says so and points to settings, not to a larger GPU.
#[test]
fn blocks_over_capacity_with_requests_that_fit_are_padding() {
    let report = OomReport {
        allocated: 79 * GIB,
        live_requested: 78 * GIB,
        reserved: 79 * GIB + 512 * MIB,
        device_free: 256 * MIB,
        requested: GIB + 1,
        rounded: 2 * GIB,
        alloc_size: 2 * GIB,
        // Divisions round the live blocks up by 1 GiB, and this request by 1 GiB - 511.
        divisions_padding: 2 * GIB - 511,
        ..fragmented()
    };
    let hint = report.hint();
    assert_eq!(
        hint,
        OomHint::Padding {
            requested: 79 * GIB + 512,
            needed: 81 * GIB,
            available: 79 * GIB + 768 * MIB,
            missing: 1280 * MIB,
            held_outside: 0,
            limit: 80 * GIB,
            divisions_padding: 2 * GIB - 511,
            block_padding: 0,
            request: 2 * GIB,
            segment: 2 * GIB,
            max_split_size_mb: None,
            expandable_segments: false,
        }
    );
    assert!(hint.settings_may_help());
    let text = report.to_string();
    assert!(
        text.contains(
            "Hint: Not fragmentation, but blocks larger than their requests: live allocations \
             plus this request asked for 79.00 GiB, which fits in the 79.75 GiB this process \
             can use, but the blocks that hold them take 1.25 GiB more than that. Of the \
             padding, roundup_power2_divisions round the blocks up by 2.00 GiB. Settings \
             that change it, to try: roundup_power2_divisions with more divisions (finer \
             steps), or none; `cachealloc replay` of a recorded trace shows whether any \
             setting helps."
        ),
        "{text}"
    );
    assert!(!text.contains("larger GPU"), "{text}");
}

/// Memory outside cachealloc does not hide padding: when the requests fit in what this
/// process can obtain and their blocks do not, the blocks are what settings can change.
#[test]
fn padding_is_named_when_memory_outside_cachealloc_also_stands_in_the_way() {
    // A 1 GiB device with 200 MiB held outside; 300 + 300 + 200 MiB asked for, in blocks
    // of 384 + 384 + 256 MiB under roundup_power2_divisions:2.
    let report = OomReport {
        device_total: GIB,
        device_free: 56 * MIB,
        allocated: 768 * MIB,
        live_requested: 600 * MIB,
        reserved: 768 * MIB,
        requested: 200 * MIB,
        rounded: 256 * MIB,
        alloc_size: 256 * MIB,
        divisions_padding: 224 * MIB,
        largest_free_blocks: vec![],
        free_blocks: 0,
        pool_largest_free_block: 0,
        large_pool_largest_free_block: 0,
        ..fragmented()
    };
    assert_eq!(report.untracked(), 200 * MIB);
    let hint = report.hint();
    assert_eq!(
        hint,
        OomHint::Padding {
            requested: 800 * MIB,
            needed: GIB,
            available: 824 * MIB,
            missing: 200 * MIB,
            held_outside: 0,
            limit: GIB,
            divisions_padding: 224 * MIB,
            block_padding: 0,
            request: 256 * MIB,
            segment: 256 * MIB,
            max_split_size_mb: None,
            expandable_segments: false,
        }
    );
    let text = hint.to_string();
    assert!(
        text.contains(
            "Of the padding, roundup_power2_divisions round the blocks up by 224.00 MiB. \
             Settings that change it, to try: roundup_power2_divisions with more divisions \
             (finer steps), or none;"
        ),
        "{text}"
    );
    // No unsplit rest to take away: expandable segments are not named.
    assert!(!text.contains("expandable_segments"), "{text}");
    // Requests that fit only without the memory held outside: both causes are named.
    let more = OomReport {
        requested: 300 * MIB,
        rounded: 384 * MIB,
        alloc_size: 384 * MIB,
        ..report
    };
    let text = more.hint().to_string();
    assert!(
        text.contains(
            "asked for 900.00 MiB, which fits in the 1024.00 MiB this process may use only \
             without the 200.00 MiB held outside cachealloc (free that memory too), and the \
             blocks that hold them take 328.00 MiB more than this process can use."
        ),
        "{text}"
    );
}

/// A padding hint names what pads the blocks and the settings that change that padding,
/// to try (whether one fits, a replay shows): here blocks left with an unsplit rest hold
/// 512 MiB more than asked for.
#[test]
fn a_padding_hint_names_the_settings_that_change_its_padding() {
    let report = OomReport {
        allocated: 79 * GIB + 512 * MIB,
        live_requested: 79 * GIB,
        reserved: 79 * GIB + 512 * MIB,
        device_free: 512 * MIB,
        requested: 800 * MIB - 512,
        rounded: 800 * MIB,
        alloc_size: 800 * MIB,
        block_padding: 512 * MIB,
        ..fragmented()
    };
    let hint = report.hint();
    let text = hint.to_string();
    assert!(matches!(hint, OomHint::Padding { .. }), "{text}");
    assert!(hint.settings_may_help());
    assert!(!text.contains("roundup_power2_divisions"), "{text}");
    assert!(!text.contains("max_split_size_mb"), "{text}");
    assert!(
        text.contains(
            "but the blocks that hold them take 288.00 MiB more than that. Of the padding, \
             blocks left with a rest of 1 MiB or less unsplit hold 512.00 MiB more. Settings \
             that change it, to try: expandable_segments:True (any rest of 512 bytes or more \
             is split off, but memory is mapped in whole 20 MiB pages)"
        ),
        "{text}"
    );
    // A max_split_size_mb in force hands blocks out whole to requests at or above it.
    let split_limited = OomReport {
        max_split_size: 512 * MIB,
        ..report.clone()
    };
    let text = split_limited.hint().to_string();
    assert!(
        text.contains(
            "blocks taken whole (a request of 512 MiB or more, max_split_size_mb, takes a \
             cached block up to max_non_split_rounding_mb larger) or left with a rest of 1 \
             MiB or less unsplit hold 512.00 MiB more. Settings that change it, to try: \
             max_split_size_mb above the cached blocks taken whole, or none"
        ),
        "{text}"
    );
    // Blocks adopted from a recording made without expandable segments may still be
    // padded under them: expandable_segments:True is on already, and max_split_size_mb
    // takes no block whole there, so no setting is named.
    let adopted = OomReport {
        expandable_segments: true,
        max_split_size: 512 * MIB,
        ..report.clone()
    };
    let text = adopted.hint().to_string();
    assert!(
        text.contains(
            "Of the padding, blocks left with a rest of 1 MiB or less unsplit hold 512.00 MiB \
             more. No setting changes this padding"
        ),
        "{text}"
    );
    assert!(!adopted.hint().settings_may_help(), "{text}");
    // With expandable segments every rest is split: nothing the settings change is left.
    let expandable = OomReport {
        expandable_segments: true,
        block_padding: 0,
        ..report
    };
    let hint = expandable.hint();
    assert!(!hint.settings_may_help(), "{hint}");
    assert!(
        hint.to_string()
            .ends_with("No setting changes this padding: keep less memory alive."),
        "{hint}"
    );
}

/// The padding figures the pool gives: what the divisions add, and what blocks hold beyond
/// that. Blocks of 384 MiB for 300 MiB requests under roundup_power2_divisions:2, and a
/// 99.5 MiB request served whole from a 100 MiB cached block.
#[test]
fn the_pool_counts_what_pads_its_blocks() {
    use crate::backend::sim::SimDevice;
    use crate::pool::{DeviceAllocator, Error, Settings};
    let divided = Settings {
        roundup_power2_divisions: [2; crate::pool::rounding::ROUNDUP_INTERVALS],
        ..Settings::default()
    };
    let mut p = DeviceAllocator::new(SimDevice::new(GIB), divided);
    p.malloc(300 * MIB, StreamId(0)).unwrap();
    p.malloc(300 * MIB, StreamId(0)).unwrap();
    let Error::OutOfMemory(report) = p.malloc(400 * MIB, StreamId(0)).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert_eq!(report.divisions_padding, (84 + 84 + 112) * MIB);
    assert_eq!(report.block_padding, 0);
    let mut p = DeviceAllocator::new(SimDevice::new(GIB), Settings::default());
    let first = p.malloc(100 * MIB, StreamId(0)).unwrap();
    p.free(first).unwrap();
    p.malloc(100 * MIB - MIB / 2, StreamId(0)).unwrap();
    let Error::OutOfMemory(report) = p.malloc(1000 * MIB, StreamId(0)).unwrap_err() else {
        panic!("expected an out-of-memory error")
    };
    assert_eq!(
        (report.divisions_padding, report.block_padding),
        (0, MIB / 2)
    );
}
