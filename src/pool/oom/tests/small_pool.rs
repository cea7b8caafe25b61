//! Requests and the other pool's free memory: a small request and the large pool's, a large
//! request and the small pool's.

use super::*;
use crate::pool::rounding::SMALL_BUFFER;

/// A request of the small pool cannot use the large pool's free memory, whatever the
/// settings: the hint says so rather than advising on allocation order.
#[test]
fn a_small_request_is_told_the_large_pools_memory_cannot_serve_it() {
    let report = OomReport {
        requested: 512 * 1024,
        rounded: 512 * 1024,
        alloc_size: SMALL_BUFFER,
        device_free: MIB,
        pool_largest_free_block: 0,
        // Too small a piece for any max_split_size_mb to keep whole.
        large_pool_largest_free_block: 16 * MIB,
        ..fragmented()
    };
    // Expandable segments are the setting to try: the small pool's blocks then lie in one
    // address range, and free blocks merge across its 2 MiB pages (a run of requests of
    // 512 bytes to 1 MiB on 1100 MiB that fails natively fits so).
    assert!(report.hint().settings_may_help());
    let text = report.to_string();
    assert!(
        text.contains("no block of its pool is cached free."),
        "{text}"
    );
    assert!(
        text.ends_with(
            "Requests of 1 MiB or less are served only from the small pool's 2 MiB \
             segments; memory reserved in the large pool serves only larger requests. A \
             setting to try: expandable_segments:True, under which the small pool's blocks \
             lie in one address range and free blocks merge across its 2 MiB pages; \
             `cachealloc replay` of a recorded trace shows whether any setting helps. Else \
             keep less memory alive."
        ),
        "{text}"
    );
    assert!(!text.contains("no setting changes that"), "{text}");
    assert!(!text.contains("allocate the large tensors first"), "{text}");
    // Under roundup_power2_divisions, which pad small blocks too, they are the setting to
    // try (680 KiB requests take 704 KiB blocks under 8 divisions: two to a segment, not
    // three).
    let divided = OomReport {
        divisions_padding: 7 * MIB,
        ..report.clone()
    };
    let hint = divided.hint();
    assert!(hint.settings_may_help());
    assert!(
        hint.to_string().contains(
            "and roundup_power2_divisions round the blocks up by 7.00 MiB in all, so fewer \
             fit in each. A setting to try: roundup_power2_divisions with more divisions \
             (finer steps), or none"
        ),
        "{hint}"
    );
    // Under expandable segments, the large pool's whole pages may be what leaves no room.
    let expandable = OomReport {
        expandable_segments: true,
        ..report
    };
    let hint = expandable.hint();
    assert!(hint.settings_may_help());
    assert!(
        hint.to_string().contains(
            "A setting to try: expandable_segments:False (the default), under which larger \
             requests take segments rounded to 2 MiB, not whole 20 MiB pages"
        ),
        "{hint}"
    );
}

/// Under expandable segments a small request refused its page gets no max_split_size_mb
/// value, however large the large pool's free block: the ladder has unmapped its whole
/// pages, and what is left (here 36 MiB across the ends of two pages) no value gives back.
/// Nor is a native segment named twice: the small pool's pages are its segments' size.
#[test]
fn a_small_request_refused_its_page_gets_no_max_split_size_value() {
    let report = OomReport {
        requested: 512 * 1024,
        rounded: 512 * 1024,
        alloc_size: SMALL_BUFFER,
        device_free: MIB,
        pool_largest_free_block: 0,
        large_pool_largest_free_block: 36 * MIB,
        expandable_segments: true,
        refused_map: Some(SMALL_BUFFER),
        ..fragmented()
    };
    let text = report.to_string();
    assert!(!text.contains("max_split_size_mb:"), "{text}");
    assert!(
        text.contains(
            "A setting to try: expandable_segments:False (the default), under which larger \
             requests take segments rounded to 2 MiB, not whole 20 MiB pages"
        ),
        "{text}"
    );
    assert_eq!(
        text.matches("expandable_segments:False").count(),
        1,
        "{text}"
    );
}

/// A small request fails while the large pool's free memory lies in a segment still in use
/// (a 1000 MiB segment split by a 500 MiB request): a max_split_size_mb keeps such memory in
/// whole segments, which the pool returns to the device, so it is the value to try.
#[test]
fn a_small_request_gets_a_value_that_keeps_the_large_pools_free_memory_whole() {
    let report = OomReport {
        requested: 500 * 1024,
        rounded: 500 * 1024,
        alloc_size: SMALL_BUFFER,
        device_total: GIB,
        device_free: MIB,
        allocated: 500 * MIB,
        live_requested: 500 * MIB,
        reserved: 1000 * MIB,
        largest_free_blocks: vec![500 * MIB],
        free_blocks: 1,
        pool_largest_free_block: 0,
        large_pool_largest_free_block: 500 * MIB,
        ..fragmented()
    };
    let hint = report.hint();
    assert_eq!(report.suggested_max_split_size_mb(), Some(256));
    assert!(hint.settings_may_help());
    let text = hint.to_string();
    assert!(
        text.contains(
            "The large pool's free memory cannot serve them, and goes back to the device only \
             as whole segments: its largest free block, 500.00 MiB, lies in a segment still \
             in use. A value to try: max_split_size_mb:256 (added to the other settings in \
             force)"
        ),
        "{text}"
    );
    assert!(!text.contains("no setting changes that"), "{text}");
    assert!(
        text.ends_with(
            "Another setting to try: expandable_segments:True, under which the free pages of \
             any segment go back to the device."
        ),
        "{text}"
    );
    // A value already in force is replaced, not added to.
    let set = OomReport {
        max_split_size: 1024 * MIB,
        ..report
    };
    assert!(
        set.to_string()
            .contains("max_split_size_mb:256 (in place of max_split_size_mb:1024)"),
        "{set}"
    );
}

/// 2000 requests of 512 KiB, every fourth kept, leave 750 MiB of the small pool unallocated
/// in segments that each hold a live block; a 1 GiB request then fails with 536 MiB free.
/// That memory is no room for it, under any setting: a kind of its own, not fragmentation,
/// whose hint says so and names none.
#[test]
fn the_small_pools_unallocated_memory_is_no_room_for_a_large_request() {
    let report = OomReport {
        requested: GIB,
        rounded: GIB,
        alloc_size: GIB,
        device_total: 1536 * MIB,
        device_free: 536 * MIB,
        allocated: 250 * MIB,
        live_requested: 250 * MIB,
        reserved: 1000 * MIB,
        largest_free_blocks: vec![3 * MIB / 2; 16],
        free_blocks: 500,
        pool_largest_free_block: 0,
        pool_unallocated: 0,
        other_pool_free: 750 * MIB,
        large_pool_largest_free_block: 0,
        ..fragmented()
    };
    let hint = report.hint();
    assert!(
        matches!(
            hint,
            OomHint::SmallPoolHeld {
                unallocated: 0,
                small_pool_unallocated,
                ..
            } if small_pool_unallocated == 750 * MIB
        ),
        "{hint:?}"
    );
    assert!(!hint.settings_may_help());
    let text = report.to_string();
    assert!(
        text.ends_with(
            "Hint: Fragmentation of the small pool: 0 bytes reserved but unallocated in the \
             large pool plus 536.00 MiB free on the device would not hold this 1024.00 MiB \
             block, and the 750.00 MiB reserved but unallocated in the small pool serves \
             only requests of 1 MiB or less: it lies in 2 MiB segments (pages, under \
             expandable segments) that each still hold a live block, and goes back to the \
             device only when they are wholly free. No allocator setting gives it to this \
             request: keep fewer small tensors alive here."
        ),
        "{text}"
    );
    assert!(!text.contains("expandable_segments:True"), "{text}");
    // When the large pool's memory and the free memory would hold it, the small pool's is
    // named apart, not counted.
    let large_room = OomReport {
        device_total: 2 * GIB,
        reserved: 1900 * MIB,
        device_free: 136 * MIB,
        largest_free_blocks: vec![450 * MIB, 450 * MIB],
        free_blocks: 502,
        pool_largest_free_block: 450 * MIB,
        pool_unallocated: 900 * MIB,
        large_pool_largest_free_block: 450 * MIB,
        ..report
    };
    assert!(
        matches!(
            large_room.hint(),
            OomHint::Fragmentation {
                other_pool_unallocated,
                ..
            } if other_pool_unallocated == 750 * MIB
        ),
        "{large_room:?}"
    );
    assert!(large_room.hint().settings_may_help());
    assert!(
        large_room.to_string().contains(
            "Hint: Fragmentation: 900.00 MiB reserved but unallocated in the large pool (the \
             750.00 MiB of the small pool serves only requests of 1 MiB or less) plus \
             136.00 MiB free on the device would hold this 1024.00 MiB block"
        ),
        "{large_room}"
    );
}

/// Blocks whose frees are still pending are reserved and not allocated, but they are no pool's
/// free memory: what a large request's pool lacks is not named the small pool's when the small
/// pool caches nothing free (a 40 MiB large block freed during a CUDA graph capture read as
/// "the 40.00 MiB of the small pool").
#[test]
fn pending_blocks_are_not_the_small_pools_memory() {
    let report = OomReport {
        requested: 15 * MIB,
        rounded: 15 * MIB,
        alloc_size: 20 * MIB,
        device_total: 100 * MIB,
        device_free: 10 * MIB,
        allocated: 40 * MIB,
        live_requested: 80 * MIB,
        pending_requested: 40 * MIB,
        reserved: 90 * MIB,
        largest_free_blocks: vec![10 * MIB],
        free_blocks: 1,
        pool_largest_free_block: 10 * MIB,
        pool_unallocated: 10 * MIB,
        other_pool_free: 0,
        large_pool_largest_free_block: 10 * MIB,
        ..fragmented()
    };
    let text = report.to_string();
    assert!(!text.contains("small pool"), "{text}");
}
