//! Fragmentation, pages refused to an expandable segment, and a block cached for another
//! stream.

use super::*;

/// Under a fraction limit, the fragmentation hint counts only the free device memory the
/// limit still allows, and says so.
#[test]
fn fragmentation_under_a_fraction_limit_counts_what_the_limit_allows() {
    let report = OomReport {
        allowed_maximum: Some(78 * GIB + 256 * MIB),
        ..fragmented()
    };
    match report.hint() {
        OomHint::Fragmentation {
            device_free,
            fraction_capped,
            ..
        } => assert_eq!((device_free, fraction_capped), (256 * MIB, true)),
        other => panic!("expected fragmentation: {other:?}"),
    }
    assert!(
        report.to_string().contains(
            "Fragmentation: 18.00 GiB reserved but unallocated plus 256.00 MiB free on the \
             device within the per_process_memory_fraction limit would hold"
        ),
        "{report}"
    );
}

/// With expandable segments, memory grows by whole pages: a request refused because its
/// pages do not fit is told so, whatever its size, and told that a native segment would fit
/// when it would (a 1010 MiB block mapped 51 pages of a 1 GiB device, and a 12 MiB request
/// needs a page more than the 10 MiB free at the range's end).
#[test]
fn an_expandable_segment_growing_by_more_than_is_free_is_named() {
    let report = OomReport {
        allocated: 1010 * MIB,
        live_requested: 1010 * MIB,
        reserved: 1020 * MIB,
        device_total: GIB,
        device_free: 4 * MIB,
        requested: 12 * MIB,
        rounded: 12 * MIB,
        alloc_size: 12 * MIB,
        largest_free_blocks: vec![10 * MIB],
        free_blocks: 1,
        pool_largest_free_block: 10 * MIB,
        large_pool_largest_free_block: 10 * MIB,
        expandable_segments: true,
        refused_map: Some(20 * MIB),
        ..fragmented()
    };
    let text = report.to_string();
    assert!(
        text.contains("rounded to a 12.00 MiB block, in pages mapped into an expandable segment."),
        "{text}"
    );
    assert!(
        text.contains(
            "Expandable segments grow by whole pages: the 20.00 MiB of pages it needed next \
             are more than the device has free."
        ),
        "{text}"
    );
    // Pages, not the order of allocation, stood in the way; a native segment of the
    // request's size (12 MiB) might fit in the 14 MiB reserved but unallocated plus free.
    assert!(!text.contains("allocate the large tensors first"), "{text}");
    assert!(!text.contains("expandable_segments:True"), "{text}");
    assert!(
        text.ends_with(
            "A setting to try: expandable_segments:False (the default), under which a \
             new segment for this block takes 12.00 MiB, not whole pages."
        ),
        "{text}"
    );
    // Not when even that is too little.
    let larger = OomReport {
        requested: 16 * MIB,
        rounded: 16 * MIB,
        alloc_size: 16 * MIB,
        ..report.clone()
    };
    assert!(!larger.to_string().contains("expandable_segments:False"));
    // Nor is the order of allocation named when a native segment would not fit either: a
    // 1.5 MiB request (a 20 MiB segment) refused the page after a 1 MiB free block.
    let tail = OomReport {
        allocated: 1019 * MIB,
        live_requested: 1019 * MIB,
        requested: 3 * MIB / 2,
        rounded: 3 * MIB / 2,
        alloc_size: 20 * MIB,
        largest_free_blocks: vec![MIB],
        pool_largest_free_block: MIB,
        large_pool_largest_free_block: MIB,
        ..report.clone()
    };
    let text = tail.to_string();
    assert!(
        text.ends_with(
            "Every free cached block is smaller than 20 MiB, the smallest \
             max_split_size_mb, so no value keeps pieces this small whole. Keep less memory \
             alive."
        ),
        "{text}"
    );
    // Without a refused map there is nothing to say of pages.
    let mapped = OomReport {
        refused_map: None,
        ..report
    };
    assert!(!mapped.to_string().contains("whole pages"));
}

/// With expandable segments the suggestion says what `max_split_size_mb` still does there
/// (it keeps large cached blocks from small requests), not that it stops splitting, and
/// no segment size is named.
#[test]
fn an_expandable_fragmentation_hint_says_what_max_split_size_does_there() {
    let native = OomReport {
        device_free: 1010 * MIB,
        alloc_size: 1020 * MIB,
        ..fragmented()
    };
    assert!(native.to_string().contains("a new segment for it takes"));
    assert!(native.to_string().contains("are then never split"));
    let report = OomReport {
        expandable_segments: true,
        ..native
    };
    let text = report.to_string();
    assert!(
        text.contains(
            "with expandable segments it splits nothing whole, but requests smaller than \
             512 MiB no longer take cached blocks of 512 MiB or more"
        ),
        "{text}"
    );
    assert!(!text.contains("are then never split"), "{text}");
    assert!(!text.contains("a new segment for it takes"), "{text}");
}

/// A block cached for another stream goes back to the device when it is a whole segment:
/// max_split_size_mb keeps it whole and expandable segments return its pages, so both are
/// named to try (1100 MiB freed on stream 1, 100 MiB taken there, 1000 MiB asked for on
/// stream 0 on 1.5 GiB fit under either).
#[test]
fn a_block_of_another_stream_names_the_settings_that_return_it() {
    let report = OomReport {
        requested: 1000 * MIB,
        rounded: 1000 * MIB,
        alloc_size: 1000 * MIB,
        device_total: 1536 * MIB,
        device_free: 436 * MIB,
        allocated: 100 * MIB,
        live_requested: 100 * MIB,
        reserved: 1100 * MIB,
        largest_free_blocks: vec![1000 * MIB],
        free_blocks: 1,
        pool_largest_free_block: 1000 * MIB,
        pool_unallocated: 1000 * MIB,
        other_stream_fit: Some((StreamId(1), 1000 * MIB)),
        ..fragmented()
    };
    let text = format!("{report:#}");
    assert!(
        text.ends_with(
            "or all of them on one stream, lets it be reused. Settings to try too: \
             max_split_size_mb (blocks at or above it are never split, so free memory that \
             large stays in whole segments, which the pool returns to the device when it \
             needs a new one), and expandable_segments:True (free pages go back to the \
             device)."
        ),
        "{text}"
    );
    let expandable = OomReport {
        expandable_segments: true,
        ..report
    };
    assert!(!expandable.to_string().contains("expandable_segments:True"));
}

/// Blocks whose frees are still pending (a replay holds them until its trace completes them)
/// are reserved but unallocated, yet no room: a 42 MiB request with 30 MiB of them, nothing
/// cached free and 40 MiB free on a 110 MiB device of which 10 MiB is used outside cachealloc
/// is not fragmentation ("0 bytes ... plus 40 MiB ... would hold this 42 MiB block" is false):
/// the memory outside is what is missing, 2 MiB of it.
#[test]
fn blocks_of_pending_frees_are_no_room() {
    let report = OomReport {
        requested: 42 * MIB,
        rounded: 42 * MIB,
        alloc_size: 42 * MIB,
        device_total: 110 * MIB,
        device_free: 40 * MIB,
        allocated: 30 * MIB,
        live_requested: 60 * MIB,
        pending_requested: 30 * MIB,
        reserved: 60 * MIB,
        largest_free_blocks: vec![],
        free_blocks: 0,
        pool_largest_free_block: 0,
        pool_unallocated: 0,
        large_pool_largest_free_block: 0,
        ..fragmented()
    };
    assert_eq!(
        report.hint(),
        OomHint::Untracked {
            untracked: 10 * MIB,
            missing: 2 * MIB,
            fraction_limit: None,
        },
        "{report}"
    );
    // A small request: the pending half of a 2 MiB segment is no room for a 1 MiB block, and
    // the 1 MiB free on the device cannot hold a new 2 MiB segment.
    let small = OomReport {
        requested: MIB,
        rounded: MIB,
        alloc_size: 2 * MIB,
        device_total: 4 * MIB,
        device_free: MIB,
        allocated: MIB,
        live_requested: 2 * MIB,
        pending_requested: MIB,
        reserved: 2 * MIB,
        ..report
    };
    match small.hint() {
        OomHint::SegmentTooLarge {
            left: Some(left), ..
        } => assert_eq!((left.device_free, left.unallocated), (MIB, 0), "{small}"),
        other => panic!("expected a segment too large: {other:?}\n{small}"),
    }
}
