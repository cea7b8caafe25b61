//! A segment too large for the memory this process may use, or for the memory left.

use super::*;

/// A 1-10 MiB request needs a 20 MiB segment: on a device (or under a fraction limit)
/// smaller than that, with no free block to take it, no setting helps, whatever is
/// reserved but unallocated elsewhere.
#[test]
fn a_segment_larger_than_the_device_is_not_fragmentation() {
    let report = OomReport {
        requested: 8 * MIB,
        rounded: 8 * MIB,
        alloc_size: 20 * MIB,
        device_total: 10 * MIB,
        device_free: 7 * MIB,
        allocated: MIB,
        live_requested: MIB,
        reserved: 2 * MIB,
        largest_free_blocks: vec![MIB],
        free_blocks: 1,
        pool_largest_free_block: 0,
        ..fragmented()
    };
    assert_eq!(
        report.hint(),
        OomHint::SegmentTooLarge {
            request: 8 * MIB,
            segment: 20 * MIB,
            limit: 10 * MIB,
            by_fraction_limit: false,
            left: None,
        }
    );
    assert!(
        report.to_string().contains(
            "Hint: Not fragmentation: no free block can hold this 8.00 MiB block, and a new \
             segment for it takes 20.00 MiB (requests of 1-10 MiB get 20 MiB segments), more \
             than this process can use at all (10.00 MiB). No allocator setting changes \
             segment sizes: use a larger GPU."
        ),
        "{report}"
    );
}

/// A request whose block would fit in the device's free memory but whose new segment would
/// not says so, with the segment rule that applies.
#[test]
fn a_segment_larger_than_the_free_memory_is_named() {
    let small = OomReport {
        requested: 4096,
        rounded: 4096,
        alloc_size: 2 * MIB,
        device_free: MIB,
        ..fragmented()
    };
    let text = small.hint().to_string();
    assert!(
        text.contains(
            "a new segment for it takes 2.00 MiB (requests up to 1 MiB share 2 MiB segments)"
        ),
        "{text}"
    );
    let large = OomReport {
        rounded: 21 * MIB + 512,
        alloc_size: 22 * MIB,
        device_free: 21 * MIB + 512,
        ..fragmented()
    };
    let text = large.hint().to_string();
    assert!(
        text.contains("(larger requests get segments rounded up to 2 MiB)"),
        "{text}"
    );
    // The usual case, the free memory below the block itself: no such sentence.
    assert!(
        !fragmented()
            .hint()
            .to_string()
            .contains("would hold the block itself")
    );
}

/// 21 requests of 5 MiB on a 115 MiB device: five 20 MiB segments hold 20 of them, and the
/// 21st needs a sixth while 15 MiB is free. Nothing is fragmented (expandable segments map
/// 20 MiB pages and fail there too): the segment is larger than the memory left. So also
/// with a little reserved but unallocated, when that and the free memory are still less.
#[test]
fn a_segment_larger_than_the_memory_left_is_not_fragmentation() {
    let report = OomReport {
        requested: 5 * MIB,
        rounded: 5 * MIB,
        alloc_size: 20 * MIB,
        device_total: 115 * MIB,
        device_free: 15 * MIB,
        allocated: 100 * MIB,
        live_requested: 100 * MIB,
        reserved: 100 * MIB,
        largest_free_blocks: vec![],
        free_blocks: 0,
        pool_largest_free_block: 0,
        pool_unallocated: 0,
        large_pool_largest_free_block: 0,
        ..fragmented()
    };
    assert_eq!(
        report.hint(),
        OomHint::SegmentTooLarge {
            request: 5 * MIB,
            segment: 20 * MIB,
            limit: 115 * MIB,
            by_fraction_limit: false,
            left: Some(MemoryLeft {
                device_free: 15 * MIB,
                fraction_capped: false,
                unallocated: 0,
            }),
        }
    );
    assert!(!report.hint().settings_may_help());
    let text = report.to_string();
    assert!(
        text.ends_with(
            "Hint: Not fragmentation: no free block can hold this 5.00 MiB block, and a new \
             segment for it takes 20.00 MiB (requests of 1-10 MiB get 20 MiB segments), \
             more than the memory left: 15.00 MiB free on the device plus 0 bytes reserved \
             but unallocated in its pool. No allocator setting changes segment sizes, and \
             expandable segments map whole pages of 20.00 MiB: keep less memory alive or \
             use a larger GPU."
        ),
        "{text}"
    );
    // 3.25 MiB in pieces plus 15 MiB free is still less than the segment.
    let pieces = OomReport {
        allocated: 100 * MIB - 13 * MIB / 4,
        live_requested: 100 * MIB - 13 * MIB / 4,
        largest_free_blocks: vec![2 * MIB, 5 * MIB / 4],
        free_blocks: 2,
        pool_largest_free_block: 2 * MIB,
        pool_unallocated: 13 * MIB / 4,
        large_pool_largest_free_block: 2 * MIB,
        ..report.clone()
    };
    assert!(
        pieces.to_string().contains(
            "more than the memory left: 15.00 MiB free on the device plus 3.25 MiB reserved \
             but unallocated in its pool."
        ),
        "{pieces}"
    );
    // With enough in pieces for a page past them, it is fragmentation again.
    let more = OomReport {
        allocated: 90 * MIB,
        live_requested: 90 * MIB,
        pool_unallocated: 10 * MIB,
        ..pieces
    };
    assert!(
        matches!(more.hint(), OomHint::Fragmentation { .. }),
        "{more}"
    );
}
