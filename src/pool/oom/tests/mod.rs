//! Tests of the out-of-memory report, one file per kind of hint (or concept); here the
//! shared fixture and the tests of every kind.

mod exhaustion;
mod fragmentation;
mod padding;
mod segment;
mod small_pool;
mod suggestion;

use super::*;

const GIB: u64 = 1 << 30;

/// An 80 GiB device on which a 1000 MiB request failed with 18 GiB reserved but unallocated.
fn fragmented() -> OomReport {
    OomReport {
        expandable_segments: false,
        device: DeviceId(0),
        stream: StreamId(0),
        requested: 1_048_575_900,
        rounded: 1000 * MIB,
        alloc_size: 1000 * MIB,
        device_total: 80 * GIB,
        device_free: 512 * MIB,
        device_memory_unknown: false,
        allocated: 60 * GIB,
        live_requested: 60 * GIB,
        pending_requested: 0,
        pending_fit: None,
        reserved: 78 * GIB,
        allowed_maximum: None,
        largest_free_blocks: vec![600 * MIB, 300 * MIB, 20 * MIB, 2 * MIB, MIB],
        free_blocks: 5,
        pool_largest_free_block: 600 * MIB,
        pool_unallocated: 18 * GIB,
        other_pool_free: 0,
        other_streams_free: 0,
        other_streams_largest_free_block: 0,
        other_stream_fit: None,
        own_stream_fit: None,
        divisions_padding: 0,
        block_padding: 0,
        large_pool_largest_free_block: 600 * MIB,
        max_split_size: u64::MAX,
        refused_map: None,
        capture_underway: false,
        capture_held: 0,
    }
}

#[test]
fn inconsistent_snapshots_do_not_panic() {
    let report = OomReport {
        allocated: 10 * GIB,
        live_requested: 10 * GIB,
        reserved: 5 * GIB,
        device_free: 100 * GIB,
        requested: u64::MAX,
        rounded: u64::MAX,
        ..fragmented()
    };
    assert_eq!(report.unallocated(), 0);
    assert_eq!(report.untracked(), 0);
    assert!(matches!(report.hint(), OomHint::Exhausted { .. }));
    assert!(!report.to_string().is_empty());
}

/// The hints that name a value to try point to a replay of a recording, except in the
/// alternate form, which a replay's own output and the shim's log (which give that replay's
/// answer or the command) use; the hints that name what no setting changes do not.
#[test]
fn only_hints_a_setting_may_help_point_to_a_replay() {
    let report = fragmented();
    assert!(report.hint().settings_may_help());
    assert!(
        report
            .to_string()
            .contains("`cachealloc replay` of a recorded trace")
    );
    let alternate = format!("{report:#}");
    assert!(!alternate.contains("cachealloc replay"), "{alternate}");
    assert!(
        alternate.ends_with(
            "cannot use are released first. Another setting to try: \
             expandable_segments:True, PyTorch's advice when memory reserved but unallocated \
             is large."
        ),
        "{alternate}"
    );
    let exhausted = OomReport {
        allocated: 79 * GIB + 512 * MIB,
        live_requested: 79 * GIB + 512 * MIB,
        reserved: 79 * GIB + 512 * MIB,
        ..fragmented()
    };
    assert!(matches!(exhausted.hint(), OomHint::Exhausted { .. }));
    assert!(!exhausted.hint().settings_may_help());
    assert_eq!(exhausted.to_string(), format!("{exhausted:#}"));
}
