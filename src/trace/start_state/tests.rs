//! Unit tests of `super` (the start_state module), kept in their own file.

use super::*;
use crate::trace::fixtures::{BASE, MIB, entry, recording, segment};
use crate::trace::recording::{RecordedSettings, TraceEntry};

/// The first rebuilt segment's blocks, as (size, allocated).
fn first_segment_blocks(rec: &DeviceRecording) -> Vec<(u64, bool)> {
    let start = reconstruct_start(rec, None).unwrap();
    start.segments[0]
        .blocks
        .iter()
        .map(|b| (b.size, b.allocated))
        .collect()
}

#[test]
fn orphan_free_keeps_its_unsplit_tail() {
    // A 19.25 MiB block in a 20 MiB segment was not split (0.75 MiB ≤ 1 MiB would remain);
    // the trace frees it; at the end the segment is one free block.
    let req = 19 * MIB + MIB / 4;
    let rec = recording(
        vec![entry(Action::FreeCompleted, BASE, req)],
        vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
    );
    let start = reconstruct_start(&rec, None).unwrap();
    let blocks = &start.segments[0].blocks;
    assert_eq!(blocks.len(), 1);
    assert_eq!(
        blocks[0],
        SeedBlock {
            addr: BASE,
            size: 20 * MIB,
            requested: req,
            allocated: true,
            id: Some(0),
        }
    );
}

/// Under `max_split_size` a request of that size or more takes its block whole: a cached
/// segment up to `max_non_split_rounding` larger (a 45 MiB request in a 60 MiB segment
/// under `max_split_size_mb:40`), or a segment of its own rounded up to 2 MiB (40.5 MiB in
/// 42 MiB). The block reappears as the whole segment, tail and all; without the setting
/// the same gaps are free blocks (the large pool would have split them off).
#[test]
fn an_oversize_block_keeps_its_long_unsplit_tail() {
    let blocks = |max_split: Option<u64>, requested: u64, segment_size: u64| {
        let mut rec = recording(
            vec![entry(Action::FreeCompleted, BASE, requested)],
            vec![segment(BASE, segment_size, &[(0, segment_size, 0, false)])],
        );
        rec.settings = Some(RecordedSettings {
            max_split_size: max_split,
            ..RecordedSettings::default()
        });
        first_segment_blocks(&rec)
    };
    let oversize = Some(40 * MIB);
    assert_eq!(blocks(oversize, 45 * MIB, 60 * MIB), [(60 * MIB, true)]);
    assert_eq!(
        blocks(oversize, 40 * MIB + MIB / 2, 42 * MIB),
        [(42 * MIB, true)]
    );
    assert_eq!(
        blocks(None, 45 * MIB, 60 * MIB),
        [(45 * MIB, true), (15 * MIB, false)]
    );
    // A request below max_split_size is split as in the large pool.
    assert_eq!(
        blocks(oversize, 30 * MIB, 34 * MIB),
        [(30 * MIB, true), (4 * MIB, false)]
    );
}

/// Exactly 1 MiB would remain: PyTorch does not split (it splits only when more than
/// 1 MiB would), so the block keeps it as its tail.
#[test]
fn a_tail_of_exactly_one_mib_stays_with_its_block() {
    let rec = recording(
        vec![entry(Action::FreeCompleted, BASE, 19 * MIB)],
        vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
    );
    assert_eq!(first_segment_blocks(&rec), [(20 * MIB, true)]);
}

#[test]
fn a_later_block_just_past_fixes_a_guessed_end() {
    // At start: O = 10 MiB request + 0.5 MiB unsplit tail, X = 5 MiB right after it, then
    // 24.5 MiB free. The trace frees X, then O. Undoing O's free alone cannot see the tail;
    // X reappearing 0.5 MiB past O's rounded end reveals it.
    let x = BASE + 10 * MIB + MIB / 2;
    let rec = recording(
        vec![
            entry(Action::FreeCompleted, x, 5 * MIB),
            entry(Action::FreeCompleted, BASE, 10 * MIB),
        ],
        vec![segment(BASE, 40 * MIB, &[(0, 40 * MIB, 0, false)])],
    );
    let start = reconstruct_start(&rec, None).unwrap();
    let sizes: Vec<(u64, bool, Option<AllocId>)> = start.segments[0]
        .blocks
        .iter()
        .map(|b| (b.size, b.allocated, b.id))
        .collect();
    assert_eq!(
        sizes,
        vec![
            (10 * MIB + MIB / 2, true, Some(0)),
            (5 * MIB, true, Some(1)),
            (24 * MIB + MIB / 2, false, None),
        ]
    );
    start.validate().unwrap();
}

/// A block reappearing exactly 1 MiB past a guessed end reveals a 1 MiB tail (no free
/// large-pool block is 1 MiB); 1 MiB free at a segment's start cannot be.
#[test]
fn one_mib_gaps_are_tails_or_contradictions() {
    let x = BASE + 11 * MIB;
    let rec = recording(
        vec![
            entry(Action::FreeCompleted, x, 5 * MIB),
            entry(Action::FreeCompleted, BASE, 10 * MIB),
        ],
        vec![segment(BASE, 40 * MIB, &[(0, 40 * MIB, 0, false)])],
    );
    assert_eq!(
        first_segment_blocks(&rec),
        [(11 * MIB, true), (5 * MIB, true), (24 * MIB, false)]
    );
    let rec = recording(
        vec![entry(Action::FreeCompleted, BASE + MIB, 5 * MIB)],
        vec![segment(BASE, 40 * MIB, &[(0, 40 * MIB, 0, false)])],
    );
    let err = reconstruct_start(&rec, None).unwrap_err().to_string();
    assert!(
        err.contains("leaves a free gap of 1048576 bytes at the segment start"),
        "{err}"
    );
}

/// A free gap of 1 MiB or less after a block whose end is known cannot be: right after a
/// block live at the end, or after one whose end a block just past it already fixed (here
/// X, at 10.5 MiB, fixes O's end; Y then reappears 0.5 MiB past it).
#[test]
fn a_small_gap_after_a_known_end_is_a_contradiction() {
    let gap_after = |entries: Vec<TraceEntry>, blocks: &[(u64, u64, u64, bool)]| {
        let rec = recording(entries, vec![segment(BASE, 40 * MIB, blocks)]);
        reconstruct_start(&rec, None).unwrap_err().to_string()
    };
    let err = gap_after(
        vec![entry(
            Action::FreeCompleted,
            BASE + 5 * MIB + MIB / 2,
            5 * MIB,
        )],
        &[(0, 5 * MIB, 5 * MIB, true), (5 * MIB, 35 * MIB, 0, false)],
    );
    assert!(
        err.contains("leaves a free gap of 524288 bytes after the block at 0x7f0000000000"),
        "{err}"
    );
    let x = BASE + 10 * MIB + MIB / 2;
    let err = gap_after(
        vec![
            entry(Action::FreeCompleted, x + MIB / 2, 5 * MIB),
            entry(Action::Alloc, x, 5 * MIB),
            entry(Action::FreeCompleted, x, 5 * MIB),
            entry(Action::FreeCompleted, BASE, 10 * MIB),
        ],
        &[(0, 40 * MIB, 0, false)],
    );
    assert!(
        err.contains("entry 0: free at 0x7f0000b00000 leaves a free gap of 524288 bytes after the block at 0x7f0000000000"),
        "{err}"
    );
}

#[test]
fn segments_freed_in_the_trace_exist_at_start_and_new_ones_do_not() {
    let rec = recording(
        vec![
            entry(Action::SegmentAlloc, BASE, 20 * MIB),
            entry(Action::Alloc, BASE, 5 * MIB),
            entry(Action::SegmentFree, BASE + 64 * MIB, 2 * MIB),
        ],
        vec![segment(
            BASE,
            20 * MIB,
            &[(0, 5 * MIB, 5 * MIB, true), (5 * MIB, 15 * MIB, 0, false)],
        )],
    );
    let start = reconstruct_start(&rec, None).unwrap();
    assert_eq!(start.segments.len(), 1);
    let seg = &start.segments[0];
    assert_eq!(
        (seg.addr, seg.size, seg.pool),
        (BASE + 64 * MIB, 2 * MIB, PoolKind::Small)
    );
    assert_eq!(seg.blocks.len(), 1);
    assert!(!seg.blocks[0].allocated);
    assert_eq!(start.reserved_bytes(), 2 * MIB);
    // On the stream the cudaFree names: only that stream's requests reuse it.
    let rec = recording(
        vec![TraceEntry {
            stream: StreamId(3),
            ..entry(Action::SegmentFree, BASE, 20 * MIB)
        }],
        vec![],
    );
    let start = reconstruct_start(&rec, None).unwrap();
    assert_eq!(start.segments[0].stream, StreamId(3));
}

#[test]
fn contradictions_are_errors_naming_the_entry() {
    // An alloc whose block is not in the end state and was never freed.
    let rec = recording(
        vec![
            entry(Action::Alloc, BASE, 5 * MIB),
            entry(Action::Alloc, BASE + 5 * MIB, 5 * MIB),
        ],
        vec![segment(
            BASE,
            20 * MIB,
            &[(0, 5 * MIB, 5 * MIB, true), (5 * MIB, 15 * MIB, 0, false)],
        )],
    );
    let err = reconstruct_start(&rec, None).unwrap_err().to_string();
    assert!(
        err.contains("entry 1") && err.contains("no block is live"),
        "{err}"
    );
    // A cudaMalloc of a segment that holds blocks live from before it.
    let rec = recording(
        vec![entry(Action::SegmentAlloc, BASE, 20 * MIB)],
        vec![segment(
            BASE,
            20 * MIB,
            &[(0, 5 * MIB, 5 * MIB, true), (5 * MIB, 15 * MIB, 0, false)],
        )],
    );
    let err = reconstruct_start(&rec, None).unwrap_err().to_string();
    assert!(err.contains("entry 0") && err.contains("predate"), "{err}");
    // A free outside every segment, and one right past a segment's end.
    let rec = recording(vec![entry(Action::FreeCompleted, 512, 512)], vec![]);
    assert!(reconstruct_start(&rec, None).is_err());
    let past = BASE + 20 * MIB;
    let rec = recording(
        vec![entry(Action::FreeCompleted, past, 512)],
        vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
    );
    let err = reconstruct_start(&rec, None).unwrap_err().to_string();
    assert!(
        err.contains(&format!("address {past:#x} lies in no segment")),
        "{err}"
    );
    // An alloc of another size than the block there holds later.
    let rec = recording(
        vec![entry(Action::Alloc, BASE, 4 * MIB)],
        vec![segment(
            BASE,
            20 * MIB,
            &[(0, 5 * MIB, 5 * MIB, true), (5 * MIB, 15 * MIB, 0, false)],
        )],
    );
    let err = reconstruct_start(&rec, None).unwrap_err().to_string();
    assert!(
        err.contains(
            "alloc at 0x7f0000000000 of 4194304 bytes, but the block there later holds 5242880"
        ),
        "{err}"
    );
    // A free inside a block live later.
    let rec = recording(
        vec![entry(Action::FreeCompleted, BASE + MIB, 2 * MIB)],
        vec![segment(
            BASE,
            20 * MIB,
            &[(0, 5 * MIB, 5 * MIB, true), (5 * MIB, 15 * MIB, 0, false)],
        )],
    );
    let err = reconstruct_start(&rec, None).unwrap_err().to_string();
    assert!(
        err.contains("free at 0x7f0000100000, inside the live block at 0x7f0000000000"),
        "{err}"
    );
    // A cudaMalloc of another size than the segment there later.
    let rec = recording(
        vec![entry(Action::SegmentAlloc, BASE, 40 * MIB)],
        vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
    );
    let err = reconstruct_start(&rec, None).unwrap_err().to_string();
    assert!(
        err.contains("segment_alloc at 0x7f0000000000 of 41943040 bytes, but the segment there is 20971520 bytes"),
        "{err}"
    );
    // A cudaFree of a segment across one there later.
    let rec = recording(
        vec![entry(Action::SegmentFree, BASE + 10 * MIB, 20 * MIB)],
        vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
    );
    let err = reconstruct_start(&rec, None).unwrap_err().to_string();
    assert!(
        err.contains("segment_free at 0x7f0000a00000 of 20971520 bytes overlaps the segment at 0x7f0000000000"),
        "{err}"
    );
    // A block freed twice with no alloc between.
    let rec = recording(
        vec![
            entry(Action::FreeCompleted, BASE, 5 * MIB),
            entry(Action::FreeCompleted, BASE, 5 * MIB),
        ],
        vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
    );
    let err = reconstruct_start(&rec, None).unwrap_err().to_string();
    assert!(
        err.contains("entry 0: free at 0x7f0000000000, but a block is still live there"),
        "{err}"
    );
}

/// Sizes no device can hold are refused by name instead of wrapping around: in the end
/// state (a block, or the segment) and in an entry.
#[test]
fn sizes_beyond_the_address_space_are_refused() {
    let beyond = |rec: &DeviceRecording| reconstruct_start(rec, None).unwrap_err().to_string();
    let block = recording(
        vec![],
        vec![segment(BASE, 20 * MIB, &[(0, u64::MAX, 0, false)])],
    );
    let err = beyond(&block);
    assert!(
        err.contains(&format!("{} bytes at {BASE:#x} reach beyond", u64::MAX)),
        "{err}"
    );
    let whole = recording(vec![], vec![segment(u64::MAX - MIB, 20 * MIB, &[])]);
    assert!(
        beyond(&whole).contains("reach beyond"),
        "{}",
        beyond(&whole)
    );
    let free = recording(
        vec![entry(Action::FreeCompleted, BASE, u64::MAX)],
        vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
    );
    let err = beyond(&free);
    assert!(
        err.contains("entry 0") && err.contains("reach beyond"),
        "{err}"
    );
}

/// An expandable-segments recording that begins with nothing reserved replays from an
/// empty start, with expandable segments on though the file names no settings.
#[test]
fn expandable_recordings_from_nothing_start_empty() {
    let from_empty = recording(
        vec![
            entry(Action::SegmentMap, BASE, 20 * MIB),
            entry(Action::Alloc, BASE, MIB),
        ],
        vec![RecordedSegment {
            is_expandable: true,
            ..segment(
                BASE,
                20 * MIB,
                &[(0, MIB, MIB, true), (MIB, 19 * MIB, 0, false)],
            )
        }],
    );
    let f = from_empty.faithful().unwrap();
    assert_eq!(f.start, StartState::default());
    assert!(from_empty.settings.is_none());
    assert!(from_empty.replay_settings().expandable_segments);
    assert_eq!(f.workload.allocs(), 1);
}

/// An end state the pool cannot hold is refused, naming what is wrong, both as the start
/// of a replay and as the state `cachealloc state` reads: overlapping segments, a small
/// segment that is not 2 MiB, and a free large-pool block of 1 MiB (PyTorch splits a large
/// block only when more than 1 MiB would remain).
#[test]
fn an_end_state_the_pool_cannot_hold_is_refused() {
    let free = |addr: u64| segment(addr, 20 * MIB, &[(0, 20 * MIB, 0, false)]);
    let cases = [
        (
            vec![free(BASE), free(BASE + 10 * MIB)],
            format!("segment {:#x} overlaps the one before it", BASE + 10 * MIB),
        ),
        (
            vec![RecordedSegment {
                pool: PoolKind::Small,
                ..segment(BASE, 4 * MIB, &[(0, 4 * MIB, 0, false)])
            }],
            format!("small-pool segment {BASE:#x} is 4194304 bytes, not 2 MiB"),
        ),
        (
            vec![segment(
                BASE,
                20 * MIB,
                &[(0, 19 * MIB, 19 * MIB, true), (19 * MIB, MIB, 0, false)],
            )],
            format!(
                "free large-pool block at {:#x} of 1048576 bytes",
                BASE + 19 * MIB
            ),
        ),
    ];
    for (segments, want) in cases {
        let rec = recording(vec![], segments);
        let err = reconstruct_start(&rec, None).unwrap_err().to_string();
        assert!(
            err.contains("rebuilt start state is invalid") && err.contains(&want),
            "{err}\nwants: {want}"
        );
        let err = end_state(&rec, 80 << 30).unwrap_err().to_string();
        assert!(err.contains(&want), "{err}\nwants: {want}");
    }
}

/// An end-state segment whose blocks do not lie in it, do not add up to it, or do not
/// cover it one after another is refused by name rather than read as some other state.
#[test]
fn end_state_blocks_must_lie_in_and_fill_their_segment() {
    let mut below = segment(
        BASE,
        20 * MIB,
        &[(0, 5 * MIB, 5 * MIB, true), (5 * MIB, 15 * MIB, 0, false)],
    );
    below.address = BASE + MIB;
    let short = segment(BASE, 20 * MIB, &[(0, 10 * MIB, 10 * MIB, true)]);
    // Blocks that lie in the segment and add up to it, but do not cover it: read as they
    // are, one would be lost (both at one address), or a gap left free.
    let twice = segment(
        BASE,
        20 * MIB,
        &[(0, 10 * MIB, 10 * MIB, true), (0, 10 * MIB, 10 * MIB, true)],
    );
    let across = segment(
        BASE,
        20 * MIB,
        &[(0, 15 * MIB, 15 * MIB, true), (5 * MIB, 5 * MIB, 0, false)],
    );
    let empty = segment(BASE, 20 * MIB, &[(0, 0, 0, true), (0, 20 * MIB, 0, false)]);
    let cases = [
        (
            below,
            format!(
                "end-state segment {:#x}: its block at {BASE:#x} of 5242880 bytes lies \
                 outside it",
                BASE + MIB
            ),
        ),
        (
            short,
            format!(
                "end-state segment {BASE:#x}: blocks add up to 10485760 bytes, total_size \
                 says 20971520"
            ),
        ),
        (
            twice,
            format!(
                "end-state segment {BASE:#x}: its block at {BASE:#x} lies across the block \
                 before it, which ends at {:#x}",
                BASE + 10 * MIB
            ),
        ),
        (
            across,
            format!(
                "end-state segment {BASE:#x}: its block at {:#x} lies across the block \
                 before it, which ends at {:#x}",
                BASE + 5 * MIB,
                BASE + 15 * MIB
            ),
        ),
        (
            empty,
            format!("end-state segment {BASE:#x}: its block at {BASE:#x} is of 0 bytes"),
        ),
    ];
    for (seg, want) in cases {
        let rec = recording(vec![], vec![seg]);
        let err = reconstruct_start(&rec, None).unwrap_err().to_string();
        assert!(err.contains(&want), "{err}\nwants: {want}");
        let err = end_state(&rec, 80 << 30).unwrap_err().to_string();
        assert!(err.contains(&want), "{err}\nwants: {want}");
    }
}
