//! The `max_split_size_mb` value a fragmentation hint suggests.

use super::*;

#[test]
fn fragmentation_suggests_the_largest_standard_value_within_the_largest_free_block() {
    let report = fragmented();
    assert_eq!(
        report.hint(),
        OomHint::Fragmentation {
            request: 1000 * MIB,
            unallocated: 18 * GIB,
            device_free: 512 * MIB,
            fraction_capped: false,
            segment: 1000 * MIB,
            largest_free_block: 600 * MIB,
            large_pool_free_block: 0,
            suggested_max_split_size_mb: Some(512),
            current_max_split_size_mb: None,
            expandable_segments: false,
            refused_map: None,
            divisions_padding: 0,
            other_pool_unallocated: 0,
        }
    );
    let expected = [
        "CUDA out of memory. Tried to allocate 1000.00 MiB. GPU 0 has a total capacity of \
         80.00 GiB of which 512.00 MiB is free. Of the allocated memory 60.00 GiB is \
         allocated by cachealloc, and 18.00 GiB is reserved by cachealloc but unallocated.",
        "Request: 1000.00 MiB (1048575900 bytes) on stream 0x0, rounded to a 1000.00 MiB \
         block, needing a 1000.00 MiB segment.",
        "Memory not tracked by cachealloc (other processes, CUDA contexts, other \
         allocators): 1.50 GiB.",
        "Largest free cached blocks: 600.00 MiB, 300.00 MiB, 20.00 MiB, 2.00 MiB \
         (and 1 more).",
        "Hint: Fragmentation: 18.00 GiB reserved but unallocated plus 512.00 MiB free on \
         the device would hold this 1000.00 MiB block, but the largest free cached block \
         of its pool is 600.00 MiB. A value to try: max_split_size_mb:512 (added to the \
         other settings in force): blocks of 512 MiB or more are then never split, so free memory is no longer left \
         in pieces that large cut from bigger segments, and when the device cannot supply a \
         new segment, cached blocks of 512 MiB or more that the request cannot use are \
         released first. `cachealloc replay` of a recorded trace finds the values that fit. \
         Another setting to try: expandable_segments:True, PyTorch's advice when memory \
         reserved but unallocated is large.",
    ]
    .join("\n");
    assert_eq!(report.to_string(), expected);
}

/// The suggestion for a report whose largest free cached block is `largest` bytes.
fn suggestion_with_largest_free_block(largest: u64) -> Option<u64> {
    let report = OomReport {
        largest_free_blocks: vec![largest, largest / 2],
        pool_largest_free_block: largest,
        free_blocks: 2,
        ..fragmented()
    };
    match report.hint() {
        OomHint::Fragmentation {
            suggested_max_split_size_mb,
            ..
        } => suggested_max_split_size_mb,
        other => panic!("expected fragmentation: {other:?}"),
    }
}

#[test]
fn suggestion_is_a_standard_value_at_or_below_the_largest_free_block() {
    assert_eq!(suggestion_with_largest_free_block(128 * MIB), Some(128));
    assert_eq!(
        suggestion_with_largest_free_block(128 * MIB - 512),
        Some(64)
    );
    assert_eq!(suggestion_with_largest_free_block(138 * MIB), Some(128));
    assert_eq!(suggestion_with_largest_free_block(40 * MIB), Some(32));
    assert_eq!(suggestion_with_largest_free_block(20 * MIB), Some(20));
    // Never above the largest standard value.
    assert_eq!(suggestion_with_largest_free_block(3 * GIB), Some(1024));
}

#[test]
fn no_value_is_named_when_every_free_block_is_below_the_smallest() {
    assert_eq!(suggestion_with_largest_free_block(20 * MIB - 512), None);
    for current in [None, Some(4096)] {
        let report = OomReport {
            largest_free_blocks: vec![8 * MIB, 2 * MIB],
            pool_largest_free_block: 8 * MIB,
            free_blocks: 2,
            max_split_size: current.map_or(u64::MAX, |mb| mb * MIB),
            ..fragmented()
        };
        assert!(matches!(report.hint(), OomHint::Fragmentation { .. }));
        assert_eq!(report.suggested_max_split_size_mb(), None);
        let text = report.hint().to_string();
        assert!(
            text.contains("Every free cached block is smaller than 20 MiB"),
            "{text}"
        );
        assert!(!text.contains("already"), "{text}");
    }
    let none_free = OomReport {
        largest_free_blocks: vec![],
        free_blocks: 0,
        pool_largest_free_block: 0,
        ..fragmented()
    };
    assert_eq!(none_free.suggested_max_split_size_mb(), None);
}

#[test]
fn suggestion_depends_on_the_current_setting() {
    let with_setting = |mb: u64| {
        let report = OomReport {
            max_split_size: mb * MIB,
            ..fragmented()
        };
        match report.hint() {
            OomHint::Fragmentation {
                suggested_max_split_size_mb,
                current_max_split_size_mb,
                ..
            } => (suggested_max_split_size_mb, current_max_split_size_mb),
            other => panic!("expected fragmentation: {other:?}"),
        }
    };
    // A larger setting still lets blocks as large as the free pieces be split: lower it.
    assert_eq!(with_setting(4096), (Some(512), Some(4096)));
    assert_eq!(with_setting(600), (Some(512), Some(600)));
    // A setting at or below the suggestion already keeps such blocks whole.
    assert_eq!(with_setting(512), (None, Some(512)));
    assert_eq!(with_setting(256), (None, Some(256)));
    let report = OomReport {
        max_split_size: 512 * MIB,
        ..fragmented()
    };
    assert!(
        report
            .to_string()
            .contains("max_split_size_mb is already 512")
    );
}

/// The smallest value, 20, is one PyTorch 2.9 and older refuse in `PYTORCH_CUDA_ALLOC_CONF`
/// (their parser wants more than 20): the hint says so and names 21 for them; other values
/// carry no such note.
#[test]
fn a_suggestion_of_20_names_21_for_older_pytorch() {
    let hint_for = |largest: u64| {
        OomReport {
            largest_free_blocks: vec![largest, largest / 2],
            pool_largest_free_block: largest,
            free_blocks: 2,
            ..fragmented()
        }
        .hint()
        .to_string()
    };
    let twenty = hint_for(25 * MIB);
    assert!(
        twenty.contains(
            "A value to try: max_split_size_mb:20 (added to the other settings in force; \
             PyTorch 2.9 and older refuse 20, wanting more: 21 for them): "
        ),
        "{twenty}"
    );
    let more = hint_for(40 * MIB);
    assert!(more.contains("max_split_size_mb:32 (added to the other settings in force): "));
    assert!(!more.contains("PyTorch 2.9"), "{more}");
}

/// The request line gives the exact byte count beside a size in units, and only then: up to
/// 1024 bytes the size is already in bytes.
#[test]
fn the_request_line_gives_bytes_once() {
    let small = OomReport {
        requested: 100,
        rounded: 512,
        ..fragmented()
    };
    let text = small.to_string();
    assert!(
        text.contains("\nRequest: 100 bytes on stream 0x0, rounded to a 512 bytes block"),
        "{text}"
    );
    let kib = OomReport {
        requested: 1025,
        rounded: 1536,
        ..fragmented()
    };
    assert!(
        kib.to_string()
            .contains("\nRequest: 1.00 KiB (1025 bytes) on stream")
    );
}
