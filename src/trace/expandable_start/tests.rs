//! Unit tests of `super` (the expandable_start module), kept in their own file.

use crate::pool::{PoolKind, StreamId};
use crate::trace::fixtures::{BASE, MIB, at, entry, recording, segment};
use crate::trace::recording::{Action, CallSite, DeviceRecording, RecordedSegment, TraceEntry};
use crate::trace::{ReplayConfig, ReplayOutcome, replay_faithful};

const GIB: u64 = 1 << 30;

/// A run of mapped pages of an expandable segment, from `(offset, size, requested,
/// allocated)` blocks.
fn run(addr: u64, size: u64, stream: u64, blocks: &[(u64, u64, u64, bool)]) -> RecordedSegment {
    RecordedSegment {
        is_expandable: true,
        stream: StreamId(stream),
        ..segment(addr, size, blocks)
    }
}

/// 40 MiB of mapped pages on stream 0: a 20 MiB block, then a 4 MiB one allocated at the
/// start of the 20 MiB page after it (`SegmentMap` and `Alloc` at `BASE + 20 MiB`).
fn grown_by_a_map() -> RecordedSegment {
    run(
        BASE,
        40 * MIB,
        0,
        &[
            (0, 20 * MIB, 20 * MIB, true),
            (20 * MIB, 4 * MIB, 4 * MIB, true),
            (24 * MIB, 16 * MIB, 0, false),
        ],
    )
}

fn on(stream: u64, action: Action, addr: u64, size: u64) -> TraceEntry {
    TraceEntry {
        stream: StreamId(stream),
        ..entry(action, addr, size)
    }
}

fn replayed(rec: &DeviceRecording) -> ReplayOutcome {
    let config = ReplayConfig {
        settings: rec.replay_settings(),
        ..ReplayConfig::default()
    };
    replay_faithful(rec, &config).unwrap().outcome
}

/// (address, size, allocated, id) of every block of the start's runs, and each range's
/// (address, runs).
type Blocks = Vec<(u64, u64, bool, Option<u32>)>;
fn start_of(rec: &DeviceRecording) -> (Blocks, Vec<(u64, usize)>) {
    let start = rec.faithful().unwrap().start;
    let blocks = start
        .blocks()
        .map(|b| (b.addr, b.size, b.allocated, b.id))
        .collect();
    let ranges = start
        .ranges
        .iter()
        .map(|r| (r.addr, r.runs.len()))
        .collect();
    (blocks, ranges)
}

/// The pool and size of the range at the start of `rec` that holds the run at `addr`, on a
/// device of `memory` bytes when given.
fn range_holding(rec: &DeviceRecording, addr: u64, memory: Option<u64>) -> Option<(PoolKind, u64)> {
    let start = rec.faithful_on(memory).unwrap().start;
    let range = start
        .ranges
        .iter()
        .find(|r| r.runs.iter().any(|x| x.addr == addr));
    range.map(|r| (r.pool, r.size))
}

/// A recording that begins with pages mapped: the pages its maps add are taken away, and
/// the replay maps them again where the recording did.
#[test]
fn pages_mapped_in_the_trace_are_unmapped_at_its_start() {
    let rec = recording(
        vec![
            entry(Action::SegmentMap, BASE + 20 * MIB, 20 * MIB),
            entry(Action::Alloc, BASE + 20 * MIB, 4 * MIB),
        ],
        vec![grown_by_a_map()],
    );
    assert_eq!(rec.figures().start_reserved_bytes, 20 * MIB);
    let (blocks, ranges) = start_of(&rec);
    assert_eq!(blocks, [(BASE, 20 * MIB, true, None)]);
    assert_eq!(ranges, [(BASE, 1)]);
    let out = replayed(&rec);
    assert_eq!(out.allocs_at_recorded_addr, 1);
    assert_eq!(out.stats.counts.num_device_alloc, 1);
    assert_eq!(out.stats.reserved_bytes.all.peak as u64, 40 * MIB);
}

/// Pages the trace unmaps were mapped at its start, holding the blocks it frees, in the run
/// they touch; `empty_cache()` unmaps them again.
#[test]
fn pages_unmapped_in_the_trace_are_mapped_at_its_start() {
    let rec = recording(
        vec![
            entry(Action::FreeCompleted, BASE + 20 * MIB, 4 * MIB),
            entry(Action::SegmentUnmap, BASE + 20 * MIB, 20 * MIB),
        ],
        vec![run(
            BASE,
            20 * MIB,
            0,
            &[(0, 4 * MIB, 4 * MIB, true), (4 * MIB, 16 * MIB, 0, false)],
        )],
    );
    let (blocks, ranges) = start_of(&rec);
    assert_eq!(
        blocks,
        [
            (BASE, 4 * MIB, true, None),
            (BASE + 4 * MIB, 16 * MIB, false, None),
            (BASE + 20 * MIB, 4 * MIB, true, Some(0)),
            (BASE + 24 * MIB, 16 * MIB, false, None),
        ]
    );
    assert_eq!(ranges, [(BASE, 1)], "one run of 40 MiB");
    let out = replayed(&rec);
    assert_eq!((out.frees, out.empty_cache_calls), (1, 1));
    assert_eq!(out.stats.counts.num_device_free, 1);
    assert_eq!(out.stats.reserved_bytes.all.current as u64, 20 * MIB);
}

/// Where two of the snapshot's runs meet, two ranges meet: pages mapped again there by
/// undoing an unmap join neither run across that place. Here the upper range was reserved
/// where pages of another were unmapped (given back) just before; at the start those pages
/// lie in a range of their own, right after the lower run's.
#[test]
fn pages_mapped_again_do_not_join_a_run_across_where_two_ranges_meet() {
    let upper = BASE + 20 * MIB;
    let rec = recording(
        vec![
            entry(Action::SegmentUnmap, upper, 20 * MIB),
            entry(Action::SegmentMap, upper, 40 * MIB),
            entry(Action::Alloc, upper, 40 * MIB),
        ],
        vec![
            run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
            run(upper, 40 * MIB, 0, &[(0, 40 * MIB, 40 * MIB, true)]),
        ],
    );
    let start = rec.faithful().unwrap().start;
    let runs: Vec<Vec<(u64, u64)>> = start
        .ranges
        .iter()
        .map(|r| r.runs.iter().map(|x| (x.addr, x.size)).collect())
        .collect();
    assert_eq!(runs, [vec![(BASE, 20 * MIB)], vec![(upper, 20 * MIB)]]);
}

/// A map in pages whose pool was guessed says which pool's they are: here the small
/// pool's, which mapped nine 2 MiB pages after one it held at the start, then unmapped all
/// ten at once (20 MiB, whole large pages: nothing else tells).
#[test]
fn a_map_tells_the_pool_of_pages_mapped_again() {
    let far = BASE + 100 * GIB;
    let mut entries: Vec<TraceEntry> = (1..10)
        .map(|i| entry(Action::SegmentMap, far + i * 2 * MIB, 2 * MIB))
        .collect();
    entries.push(entry(Action::SegmentUnmap, far, 20 * MIB));
    let rec = recording(
        entries,
        vec![run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)])],
    );
    let start = rec.faithful().unwrap().start;
    let ranges: Vec<(u64, PoolKind, u64)> = start
        .ranges
        .iter()
        .map(|r| (r.addr, r.pool, r.mapped_bytes()))
        .collect();
    assert_eq!(
        ranges,
        [
            (BASE, PoolKind::Large, 20 * MIB),
            (far, PoolKind::Small, 2 * MIB)
        ]
    );
}

/// Pages mapped again by undoing an unmap join only the runs they touch of their own
/// stream and pool: not stream 1's run right below them, nor a large run right above small
/// pages they join.
#[test]
fn pages_mapped_again_join_only_runs_of_their_stream_and_pool() {
    let rec = recording(
        vec![entry(Action::SegmentUnmap, BASE + 20 * MIB, 20 * MIB)],
        vec![run(BASE, 20 * MIB, 1, &[(0, 20 * MIB, 20 * MIB, true)])],
    );
    let start = rec.faithful().unwrap().start;
    let ranges: Vec<(u64, u64, u64)> = start
        .ranges
        .iter()
        .map(|r| (r.addr, r.stream.0, r.mapped_bytes()))
        .collect();
    assert_eq!(
        ranges,
        [(BASE, 1, 20 * MIB), (BASE + 20 * MIB, 0, 20 * MIB)]
    );
    let rec = recording(
        vec![entry(Action::SegmentUnmap, BASE + 2 * MIB, 2 * MIB)],
        vec![
            run(BASE, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
            run(
                BASE + 4 * MIB,
                20 * MIB,
                0,
                &[(0, 20 * MIB, 20 * MIB, true)],
            ),
        ],
    );
    let start = rec.faithful().unwrap().start;
    let ranges: Vec<(u64, PoolKind, u64)> = start
        .ranges
        .iter()
        .map(|r| (r.addr, r.pool, r.mapped_bytes()))
        .collect();
    assert_eq!(
        ranges,
        [
            (BASE, PoolKind::Small, 4 * MIB),
            (BASE + 4 * MIB, PoolKind::Large, 20 * MIB)
        ]
    );
}

/// Pages mapped again whose pool was a guess, joined to a run whose pool is known, take
/// that pool for certain: a small block placed in them later in the walk is a
/// contradiction, not a new guess.
#[test]
fn a_guess_joined_to_a_known_run_is_no_guess() {
    let p = BASE + 100 * GIB;
    let rec = recording(
        vec![
            entry(Action::FreeCompleted, p - 20 * MIB, 512),
            entry(Action::SegmentUnmap, p, 20 * MIB),
            entry(Action::SegmentUnmap, p - 20 * MIB, 20 * MIB),
        ],
        vec![run(
            p + 20 * MIB,
            20 * MIB,
            0,
            &[(0, 20 * MIB, 20 * MIB, true)],
        )],
    );
    let err = rec.faithful().unwrap_err().to_string();
    assert!(
        err.contains("entry 0: free at 0x7f18fec00000 of 512 bytes, a small pool block, in pages of the large pool"),
        "{err}"
    );
}

/// Large pages seen later inside pages mapped again outweigh small ones seen there, below
/// them or above.
#[test]
fn large_pages_seen_inside_outweigh_small_ones() {
    use crate::pool::PoolKind::Large;
    let far = BASE + 100 * GIB;
    let rec = recording(
        vec![
            entry(Action::SegmentUnmap, far, 40 * MIB),
            entry(Action::SegmentMap, far + 20 * MIB, 20 * MIB),
            entry(Action::SegmentMap, far + 2 * MIB, 2 * MIB),
        ],
        vec![
            run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
            run(far + 2 * MIB, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)]),
            run(far + 20 * MIB, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)]),
        ],
    );
    assert_eq!(range_holding(&rec, far, None).map(|r| r.0), Some(Large));
}

/// The pages of their stream seen next to pages mapped again tell their pool when the two
/// could share a range: right next to them, but not across another stream's pages.
#[test]
fn pages_seen_next_to_them_tell_unless_another_streams_lie_between() {
    use crate::pool::PoolKind::{Large, Small};
    let far = BASE + 100 * GIB;
    let large_run = || run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]);
    let small_at = |at: u64| run(at, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)]);
    let adjacent = recording(
        vec![
            entry(Action::SegmentUnmap, far, 20 * MIB),
            entry(Action::SegmentMap, far + 20 * MIB, 2 * MIB),
        ],
        vec![large_run(), small_at(far + 20 * MIB)],
    );
    assert_eq!(
        range_holding(&adjacent, far, None).map(|r| r.0),
        Some(Small)
    );
    let across = recording(
        vec![
            entry(Action::SegmentUnmap, far, 20 * MIB),
            on(1, Action::SegmentMap, far + 20 * MIB, 20 * MIB),
            entry(Action::SegmentMap, far + 40 * MIB, 2 * MIB),
        ],
        vec![
            large_run(),
            run(far + 20 * MIB, 20 * MIB, 1, &[(0, 20 * MIB, 0, false)]),
            small_at(far + 40 * MIB),
        ],
    );
    assert_eq!(range_holding(&across, far, None).map(|r| r.0), Some(Large));
}

/// Another stream's pages seen across pages mapped again, from below their start, make
/// pages of their own stream seen there only afterwards tell nothing.
#[test]
fn another_streams_pages_from_below_take_the_place_over() {
    use crate::pool::PoolKind::Large;
    let far = BASE + 100 * GIB;
    let rec = recording(
        vec![
            entry(Action::SegmentUnmap, far, 20 * MIB),
            on(1, Action::SegmentMap, far - 20 * MIB, 40 * MIB),
            on(1, Action::SegmentUnmap, far - 20 * MIB, 40 * MIB),
            entry(Action::SegmentMap, far, 2 * MIB),
        ],
        vec![
            run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
            run(far, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)]),
        ],
    );
    assert_eq!(range_holding(&rec, far, None).map(|r| r.0), Some(Large));
}

/// No device has less memory than the recording reserved: ranges placed so that they
/// imply less do not size the start's ranges.
#[test]
fn an_estimate_below_the_reserved_memory_is_not_taken() {
    let above = BASE + 60 * MIB;
    let far = BASE + 100 * GIB;
    let rec = recording(
        vec![
            on(1, Action::SegmentMap, BASE, 20 * MIB),
            on(1, Action::Alloc, BASE, 20 * MIB),
            entry(Action::SegmentUnmap, far, 20 * MIB),
        ],
        vec![
            run(BASE, 20 * MIB, 1, &[(0, 20 * MIB, 20 * MIB, true)]),
            run(above, 60 * MIB, 0, &[(0, 60 * MIB, 60 * MIB, true)]),
            run(far + 60 * MIB, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
        ],
    );
    let start = rec.faithful().unwrap().start;
    let sizes: Vec<(u64, u64)> = start
        .ranges
        .iter()
        .filter(|r| r.pool == PoolKind::Large)
        .map(|r| (r.addr, r.size))
        .collect();
    // The new range 60 MiB below the start's would imply a device of 53 MiB, less than
    // the 102 MiB reserved: the start's range is sized as on a device of unknown memory,
    // up to the next range,
    assert_eq!(sizes, [(above, far - above)]);
    // and the pages unmapped at `far` are guessed as on such a device: one small range
    // holds them and the small pages 40 MiB above (not on a device of 53 MiB).
    assert_eq!(
        range_holding(&rec, far, None).map(|r| r.0),
        Some(PoolKind::Small)
    );
}

/// Pages mapped again by undoing an unmap that touch no run are the large pool's (whole
/// 20 MiB pages) until a block placed in them says otherwise.
#[test]
fn an_unmapped_runs_pool_is_told_by_its_blocks() {
    let small = BASE + 100 * GIB;
    let rec = recording(
        vec![
            entry(Action::FreeCompleted, small + 512, 512),
            entry(Action::SegmentUnmap, small, 20 * MIB),
        ],
        vec![run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)])],
    );
    let start = rec.faithful().unwrap().start;
    let pools: Vec<_> = start.ranges.iter().map(|r| (r.addr, r.pool)).collect();
    use crate::pool::PoolKind::{Large, Small};
    assert_eq!(pools, [(BASE, Large), (small, Small)]);
    // Not whole large pages: the small pool's at once.
    let rec = recording(
        vec![entry(Action::SegmentUnmap, small, 6 * MIB)],
        vec![run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)])],
    );
    let start = rec.faithful().unwrap().start;
    assert_eq!(start.ranges[1].pool, Small);
}

/// Wholly free pages the trace only unmaps take the pool of pages seen at their place
/// later, else of the nearest pages of their stream that could share a range with them.
#[test]
fn an_unmapped_runs_pool_is_told_by_pages_around_it() {
    use crate::pool::PoolKind::{Large, Small};
    let far = BASE + 100 * GIB;
    let pool_at = |rec: &DeviceRecording, addr: u64| range_holding(rec, addr, None).map(|r| r.0);
    // The same pages mapped again later, one small page.
    let rec = recording(
        vec![
            entry(Action::SegmentUnmap, far, 20 * MIB),
            entry(Action::SegmentMap, far, 2 * MIB),
        ],
        vec![
            run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
            run(far, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)]),
        ],
    );
    assert_eq!(pool_at(&rec, far), Some(Small));
    // A small run of the stream nearer than the large one; one of another stream nearer
    // still does not count.
    let near = far + 60 * MIB;
    let rec = recording(
        vec![entry(Action::SegmentUnmap, far, 20 * MIB)],
        vec![
            run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
            run(far - 6 * MIB, 2 * MIB, 1, &[(0, 2 * MIB, 512, true)]),
            run(near, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
        ],
    );
    assert_eq!(pool_at(&rec, far), Some(Small));
    // A large run next to it, but not whole large pages away: it cannot share a range.
    let rec = recording(
        vec![entry(Action::SegmentUnmap, far, 20 * MIB)],
        vec![
            run(BASE, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
            run(
                far + 22 * MIB,
                20 * MIB,
                0,
                &[(0, 20 * MIB, 20 * MIB, true)],
            ),
        ],
    );
    assert_eq!(pool_at(&rec, far), Some(Small));
    let rec = recording(
        vec![entry(Action::SegmentUnmap, far, 20 * MIB)],
        vec![run(
            far + 40 * MIB,
            20 * MIB,
            0,
            &[(0, 20 * MIB, 20 * MIB, true)],
        )],
    );
    assert_eq!(pool_at(&rec, far), Some(Large));
}

/// Once all of a stream's pages are unmapped, PyTorch has given its ranges back, and those
/// it reserves again may swap places: pages seen later at the place of wholly free pages
/// unmapped before then do not tell their pool.
#[test]
fn pages_seen_after_the_streams_ranges_were_given_back_do_not_tell_a_pool() {
    use crate::pool::PoolKind::{Large, Small};
    let (far, top) = (BASE + 100 * GIB, BASE + 200 * GIB);
    // Large pages at `far` and small ones at `top` unmapped (empty_cache()), then the
    // small pool's range reserved at `far` and the large pool's at `top`.
    let swapped = |kept: Vec<RecordedSegment>| {
        let runs = [
            run(far, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
            run(top, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
        ];
        recording(
            vec![
                entry(Action::SegmentUnmap, far, 20 * MIB),
                entry(Action::SegmentUnmap, top, 2 * MIB),
                entry(Action::SegmentMap, far, 2 * MIB),
                entry(Action::Alloc, far, 512),
                entry(Action::SegmentMap, top, 20 * MIB),
                entry(Action::Alloc, top, 20 * MIB),
            ],
            kept.into_iter().chain(runs).collect(),
        )
    };
    let pool_at = |rec: &DeviceRecording, addr: u64| {
        let start = rec.faithful().unwrap().start;
        let run = start.ranges.iter().flat_map(|r| &r.runs);
        run.filter(|x| x.addr == addr).map(|x| x.pool).next()
    };
    let rec = swapped(Vec::new());
    assert_eq!(pool_at(&rec, far), Some(Large));
    assert_eq!(pool_at(&rec, top), Some(Small));
    // With other pages of the stream mapped all along, no range was given back: the small
    // pages seen at `far` say what its pages were.
    let rec = swapped(vec![run(
        BASE,
        20 * MIB,
        0,
        &[(0, 20 * MIB, 20 * MIB, true)],
    )]);
    assert_eq!(pool_at(&rec, far), Some(Small));
}

/// The small pool maps its stream's lowest unmapped page, so wholly free pages the trace
/// only unmaps were not small pages of their stream when, with the stream's small range
/// kept, its small pool maps a page above them later and none at them; nor when a small
/// range holding them and the small pages seen would span more than the device's memory.
#[test]
fn an_unmapped_runs_pool_is_not_small_where_the_small_pool_could_not_have_it() {
    use crate::pool::PoolKind::{Large, Small};
    let far = BASE + 100 * GIB;
    let pool_at = |rec: &DeviceRecording, addr: u64, memory: Option<u64>| {
        range_holding(rec, addr, memory).map(|r| r.0)
    };
    let large_run = || run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]);
    // The stream's small range, kept: pages mapped below the large run.
    let kept_small = || run(BASE - 100 * MIB, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]);
    // Small pages of the stream mapped later inside the pages: those at their start tell;
    // one above their start alone does not, while the small range is kept (the map would
    // have taken the lowest of them), and does when it may have been given back.
    let inside = |at: &[u64], kept: bool| {
        let maps = at.iter().map(|&a| entry(Action::SegmentMap, a, 2 * MIB));
        let runs = at
            .iter()
            .map(|&a| run(a, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)]));
        let held = [large_run()].into_iter().chain(kept.then(kept_small));
        let entries = [entry(Action::SegmentUnmap, far, 20 * MIB)];
        recording(
            entries.into_iter().chain(maps).collect(),
            held.chain(runs).collect(),
        )
    };
    assert_eq!(
        pool_at(&inside(&[far, far + 2 * MIB], true), far, None),
        Some(Small)
    );
    assert_eq!(
        pool_at(&inside(&[far + 4 * MIB], true), far, None),
        Some(Large)
    );
    assert_eq!(
        pool_at(&inside(&[far + 4 * MIB], false), far, None),
        Some(Small)
    );
    // Pages of the stream at their start seen only after another stream's there: the range
    // was given back and reserved again in between, and they tell nothing.
    let taken_over = recording(
        vec![
            entry(Action::SegmentUnmap, far, 20 * MIB),
            on(1, Action::SegmentMap, far, 40 * MIB),
            on(1, Action::SegmentUnmap, far, 40 * MIB),
            entry(Action::SegmentMap, far, 2 * MIB),
        ],
        vec![large_run(), run(far, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)])],
    );
    assert_eq!(pool_at(&taken_over, far, None), Some(Large));
    // One mapped later above them, after an `empty_cache()` (an unmap just before a map
    // would be a release for want of memory, which bounds the capacity).
    let above = far + 60 * MIB;
    let after_empty_cache = |kept: bool| {
        let held = [run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)])].into_iter();
        recording(
            vec![
                entry(Action::SegmentUnmap, far, 20 * MIB),
                entry(Action::Alloc, BASE, 20 * MIB),
                entry(Action::FreeCompleted, BASE, 20 * MIB),
                entry(Action::SegmentMap, above, 2 * MIB),
            ],
            held.chain(kept.then(kept_small))
                .chain([run(above, 2 * MIB, 0, &[(0, 2 * MIB, 0, false)])])
                .collect(),
        )
    };
    assert_eq!(after_empty_cache(true).capacity(), None);
    assert_eq!(pool_at(&after_empty_cache(true), far, None), Some(Large));
    assert_eq!(pool_at(&after_empty_cache(false), far, None), Some(Small));
    // Small pages at `at` in the snapshot (mapped before the trace, perhaps).
    let small_at = |at: u64| {
        recording(
            vec![entry(Action::SegmentUnmap, far, 20 * MIB)],
            vec![large_run(), run(at, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)])],
        )
    };
    assert_eq!(pool_at(&small_at(above), far, None), Some(Small));
    // Small pages 10 GiB above: one small range holds both only on a device of more than
    // 10 GiB, whose small pool had them all mapped at once.
    let rec = small_at(far + 10 * GIB);
    assert_eq!(pool_at(&rec, far, None), Some(Small));
    assert_eq!(pool_at(&rec, far, Some(16 * GIB)), Some(Small));
    assert_eq!(pool_at(&rec, far, Some(8 * GIB)), Some(Large));
}

/// Without the device's memory, the pools are guessed again under the memory the start's
/// ranges are sized with: here the memory that two ranges the recording reserves, one
/// right below the other, imply.
#[test]
fn an_unmapped_runs_pool_is_guessed_again_under_the_estimated_memory() {
    use crate::pool::PoolKind::{Large, Small};
    use crate::pool::range_size;
    let far = BASE + 100 * GIB;
    let high = far + 10 * GIB;
    let top = far + 40 * GIB;
    let below_top = top - range_size(8 * GIB, PoolKind::Large);
    let rec = recording(
        vec![
            entry(Action::SegmentUnmap, far, 20 * MIB),
            on(1, Action::SegmentMap, top, 20 * MIB),
            on(1, Action::Alloc, top, 20 * MIB),
            on(2, Action::SegmentMap, below_top, 20 * MIB),
            on(2, Action::Alloc, below_top, 20 * MIB),
        ],
        vec![
            run(high, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
            run(top, 20 * MIB, 1, &[(0, 20 * MIB, 20 * MIB, true)]),
            run(below_top, 20 * MIB, 2, &[(0, 20 * MIB, 20 * MIB, true)]),
        ],
    );
    let pool_at = |memory: Option<u64>| range_holding(&rec, far, memory);
    // 10 GiB from the small pages: on a device of 16 GiB, one small range holds both.
    assert_eq!(pool_at(Some(16 * GIB)).unwrap().0, Small);
    // The recording's ranges imply about 8 GiB: then it cannot.
    let (pool, size) = pool_at(None).unwrap();
    assert_eq!((pool, size), (Large, range_size(8 * GIB, PoolKind::Large)));
}

/// A capacity the recording only brackets bounds what the device could map by the
/// bracket's top, in the second walk too (not by its middle, which a replay runs with).
#[test]
fn a_bracketed_capacity_bounds_the_guesses_by_its_top() {
    use crate::pool::PoolKind::{Large, Small};
    use crate::trace::CapacityEstimate;
    let far = BASE + 100 * GIB;
    let rec = recording(
        vec![
            entry(Action::SegmentUnmap, far, 20 * MIB),
            entry(Action::SegmentMap, BASE + 20 * MIB, 20 * MIB),
            entry(Action::Alloc, BASE + 20 * MIB, 20 * MIB),
        ],
        vec![
            run(
                BASE,
                40 * MIB,
                0,
                &[
                    (0, 20 * MIB, 20 * MIB, true),
                    (20 * MIB, 20 * MIB, 20 * MIB, true),
                ],
            ),
            run(far + 56 * MIB, 2 * MIB, 0, &[(0, 2 * MIB, 512, true)]),
        ],
    );
    // The unmap released cached pages for the map after it, which did not fit.
    assert_eq!(
        rec.capacity(),
        Some(CapacityEstimate::Bracket {
            low: 42 * MIB,
            high: 62 * MIB
        })
    );
    let pool_at = |memory: Option<u64>| range_holding(&rec, far, memory).map(|r| r.0);
    // The unmapped pages and the small ones span 58 MiB: a device of up to 62 MiB could
    // have had them all mapped.
    assert_eq!(pool_at(None), Some(Small));
    assert_eq!(pool_at(Some(62 * MIB)), Some(Small));
    assert_eq!(pool_at(Some(56 * MIB)), Some(Large));
}

/// The device memory, when known (`--device-memory`), sizes the ranges there at the start.
#[test]
fn a_known_device_memory_sizes_the_start_ranges() {
    use crate::pool::range_size;
    let rec = recording(
        vec![entry(Action::FreeCompleted, BASE, 20 * MIB)],
        vec![run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)])],
    );
    for memory in [8 * GIB, 80 * GIB] {
        let start = rec.faithful_on(Some(memory)).unwrap().start;
        let sizes: Vec<u64> = start.ranges.iter().map(|r| r.size).collect();
        assert_eq!(sizes, [range_size(memory, PoolKind::Large)]);
    }
}

/// A range there at the start ends short of a range the recording reserves above it while
/// it is kept, and only then: one reserved far above leaves its size as it is.
#[test]
fn a_start_range_ends_only_where_a_later_range_is_reserved_within_it() {
    use crate::pool::range_size;
    let full = range_size(8 * GIB, PoolKind::Large);
    let start_sizes = |later: u64| {
        let rec = recording(
            vec![
                on(1, Action::SegmentMap, later, 20 * MIB),
                on(1, Action::Alloc, later, 20 * MIB),
            ],
            vec![
                run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
                run(later, 20 * MIB, 1, &[(0, 20 * MIB, 20 * MIB, true)]),
            ],
        );
        let start = rec.faithful_on(Some(8 * GIB)).unwrap().start;
        start
            .ranges
            .iter()
            .map(|r| (r.size, r.cut_short))
            .collect::<Vec<_>>()
    };
    assert_eq!(start_sizes(BASE + 100 * GIB), [(full, false)]);
    // 1 GiB up to it: 51 whole pages.
    assert_eq!(start_sizes(BASE + GIB), [(51 * 20 * MIB, true)]);
}

/// A private pool's run at the start lies in a range of its own, apart from a run of the
/// default pool of the same stream and pool of pages next to it.
#[test]
fn a_private_pools_run_at_the_start_has_a_range_of_its_own() {
    let rec = recording(
        vec![entry(Action::FreeCompleted, BASE, 20 * MIB)],
        vec![
            run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)]),
            RecordedSegment {
                private_pool: Some((1, 2)),
                ..run(BASE + 60 * MIB, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)])
            },
        ],
    );
    let (_, ranges) = start_of(&rec);
    assert_eq!(ranges, [(BASE, 1), (BASE + 60 * MIB, 1)]);
}

/// A range's pages unmapped before the recording and mapped again in it lie below its
/// lowest run at the start: the range reaches down to them, and the replay maps them where
/// the recording did.
#[test]
fn a_range_reaches_down_to_pages_mapped_below_it() {
    let rec = recording(
        vec![
            entry(Action::SegmentMap, BASE, 20 * MIB),
            entry(Action::Alloc, BASE, 20 * MIB),
            entry(Action::SegmentMap, BASE + 40 * MIB, 100 * MIB),
            entry(Action::Alloc, BASE + 40 * MIB, 100 * MIB),
        ],
        vec![run(
            BASE,
            140 * MIB,
            0,
            &[
                (0, 20 * MIB, 20 * MIB, true),
                (20 * MIB, 20 * MIB, 20 * MIB, true),
                (40 * MIB, 100 * MIB, 100 * MIB, true),
            ],
        )],
    );
    let start = rec.faithful().unwrap().start;
    let ranges: Vec<_> = start
        .ranges
        .iter()
        .map(|r| (r.addr, r.runs[0].addr))
        .collect();
    assert_eq!(ranges, [(BASE, BASE + 20 * MIB)]);
    let out = replayed(&rec);
    assert_eq!(out.allocs_at_recorded_addr, 2);
    assert_eq!(out.stats.counts.num_device_alloc, 2);
    assert_eq!(out.stats.reserved_bytes.all.peak as u64, 140 * MIB);
}

/// A segment of its own ending right where such pages begin does not stop the range
/// reaching down to them.
#[test]
fn a_range_reaches_down_to_a_segment_right_below() {
    let rec = recording(
        vec![
            entry(Action::SegmentMap, BASE, 20 * MIB),
            entry(Action::Alloc, BASE, 20 * MIB),
        ],
        vec![
            segment(BASE - 20 * MIB, 20 * MIB, &[(0, 20 * MIB, 20 * MIB, true)]),
            run(
                BASE,
                40 * MIB,
                0,
                &[
                    (0, 20 * MIB, 20 * MIB, true),
                    (20 * MIB, 20 * MIB, 20 * MIB, true),
                ],
            ),
        ],
    );
    let start = rec.faithful().unwrap().start;
    let ranges: Vec<_> = start
        .ranges
        .iter()
        .map(|r| (r.addr, r.runs[0].addr))
        .collect();
    assert_eq!(ranges, [(BASE, BASE + 20 * MIB)]);
}

/// Nor does a range reach down across a segment of its own lying between: the map below
/// is in another range.
#[test]
fn a_range_does_not_reach_down_across_a_segment() {
    let high = BASE + 40 * MIB;
    let rec = recording(
        vec![
            entry(Action::SegmentMap, BASE, 20 * MIB),
            entry(Action::Alloc, BASE, 20 * MIB),
        ],
        vec![
            run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
            segment(BASE + 20 * MIB, 20 * MIB, &[(0, 20 * MIB, 20 * MIB, true)]),
            run(high, 20 * MIB, 0, &[(0, 20 * MIB, 20 * MIB, true)]),
        ],
    );
    let start = rec.faithful().unwrap().start;
    let ranges: Vec<_> = start.ranges.iter().map(|r| r.addr).collect();
    assert_eq!(ranges, [high]);
}

/// A range all of whose pages `empty_cache()` unmaps is given back; pages mapped at its
/// place afterwards reserve a range again (where the recording's was).
#[test]
fn a_range_given_back_in_the_trace_is_reserved_again() {
    let rec = recording(
        vec![
            entry(Action::FreeCompleted, BASE, 30 * MIB),
            at(Action::SegmentUnmap, BASE, 40 * MIB, CallSite::EmptyCache),
            entry(Action::SegmentMap, BASE, 20 * MIB),
            entry(Action::Alloc, BASE, 10 * MIB),
            entry(Action::SegmentMap, BASE + 20 * MIB, 40 * MIB),
            entry(Action::Alloc, BASE + 10 * MIB, 40 * MIB),
        ],
        vec![run(
            BASE,
            60 * MIB,
            0,
            &[
                (0, 10 * MIB, 10 * MIB, true),
                (10 * MIB, 40 * MIB, 40 * MIB, true),
                (50 * MIB, 10 * MIB, 0, false),
            ],
        )],
    );
    let out = replayed(&rec);
    assert_eq!(out.allocs_at_recorded_addr, 2);
    assert_eq!(out.empty_cache_calls, 1);
    let counts = &out.stats.counts;
    assert_eq!((counts.num_device_alloc, counts.num_device_free), (2, 1));
}

/// A range reserved during the recording goes where the recording's driver put it, though
/// the trace maps pages of a range that was there before it first: that map reserves
/// nothing.
#[test]
fn ranges_reserved_before_the_trace_are_not_reserved_again() {
    let later = BASE + 100 * GIB;
    let rec = recording(
        vec![
            on(0, Action::SegmentMap, BASE + 20 * MIB, 20 * MIB),
            on(0, Action::Alloc, BASE + 20 * MIB, 4 * MIB),
            on(1, Action::SegmentMap, later, 20 * MIB),
            on(1, Action::Alloc, later, 4 * MIB),
        ],
        vec![
            grown_by_a_map(),
            run(
                later,
                20 * MIB,
                1,
                &[(0, 4 * MIB, 4 * MIB, true), (4 * MIB, 16 * MIB, 0, false)],
            ),
        ],
    );
    let f = rec.faithful().unwrap();
    let hints = crate::trace::ranges::range_hints(&f.range_changes, None);
    assert_eq!(hints.addresses(), [later]);
    let out = replayed(&rec);
    assert_eq!(out.allocs_at_recorded_addr, 2);
    assert_eq!(out.stats.counts.num_device_alloc, 2);
}

/// A recording whose walk meets pages that cannot be so is refused, naming the entry.
#[test]
fn impossible_pages_are_refused_by_entry() {
    let end = vec![run(BASE, 20 * MIB, 0, &[(0, 20 * MIB, 0, false)])];
    let cases = [
        (
            vec![
                entry(Action::SegmentMap, BASE, 20 * MIB),
                entry(Action::FreeCompleted, BASE, 2 * MIB),
            ],
            "entry 0: segment_map at 0x7f0000000000, but the block at 0x7f0000000000 in its \
             pages is live later",
        ),
        (
            vec![entry(Action::SegmentMap, BASE + 20 * MIB, 20 * MIB)],
            "entry 0: segment_map of 20971520 bytes at 0x7f0001400000, but those pages are \
             not all mapped later",
        ),
        (
            vec![entry(Action::SegmentUnmap, BASE, 20 * MIB)],
            "entry 0: segment_unmap of 20971520 bytes at 0x7f0000000000, but the pages at \
             0x7f0000000000 are mapped later",
        ),
        (
            vec![entry(Action::FreeCompleted, BASE, 512)],
            "entry 0: free at 0x7f0000000000 of 512 bytes, a small pool block, in pages of \
             the large pool",
        ),
        (
            vec![entry(Action::FreeCompleted, BASE + 19 * MIB, 2 * MIB)],
            "reaches past the mapped pages, which end at 0x7f0001400000",
        ),
        (
            vec![entry(Action::SegmentMap, BASE, 22 * MIB)],
            "segment_map of 23068672 bytes at 0x7f0000000000: neither one 2 MiB page",
        ),
        (
            vec![entry(Action::SegmentUnmap, BASE + 40 * MIB, 0)],
            "segment_unmap of 0 bytes at 0x7f0002800000: not whole pages",
        ),
        (
            vec![
                entry(Action::FreeCompleted, BASE, 4 * MIB),
                entry(Action::FreeCompleted, BASE, 4 * MIB),
            ],
            "entry 0: free at 0x7f0000000000, but a block is still live there",
        ),
        // Pages mapped again by undoing an unmap: a guess of their pool stands only until
        // a block placed in them says which.
        (
            vec![
                entry(Action::FreeCompleted, BASE + 44 * MIB, 512),
                entry(Action::FreeCompleted, BASE + 40 * MIB, 4 * MIB),
                entry(Action::SegmentUnmap, BASE + 40 * MIB, 20 * MIB),
            ],
            "entry 0: free at 0x7f0002c00000 of 512 bytes, a small pool block, in pages of \
             the large pool",
        ),
    ];
    for (entries, want) in cases {
        let rec = recording(entries, end.clone());
        let err = rec.faithful().unwrap_err().to_string();
        assert!(err.contains(want), "{err}\nwants: {want}");
    }
    // Pages of stream 0 mapped by a map on stream 1.
    let rec = recording(vec![on(1, Action::SegmentMap, BASE, 20 * MIB)], end.clone());
    let err = rec.faithful().unwrap_err().to_string();
    let want = "entry 0: segment_map at 0x7f0000000000 on stream 1, in pages of stream 0";
    assert!(err.contains(want), "{err}\nwants: {want}");
    // Pages mapped where a segment of its own (cudaMalloc'd) lies later.
    let native = segment(BASE + 40 * MIB, 20 * MIB, &[(0, 20 * MIB, 0, false)]);
    let rec = recording(
        vec![entry(Action::SegmentMap, BASE + 40 * MIB, 20 * MIB)],
        [end.clone(), vec![native]].concat(),
    );
    let err = rec.faithful().unwrap_err().to_string();
    let want = "entry 0: segment_map at 0x7f0002800000, inside the segment at 0x7f0002800000, \
                which is not expandable";
    assert!(err.contains(want), "{err}\nwants: {want}");
}
