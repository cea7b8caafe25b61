//! The expandable segments of a snapshot's memory state, as the pool holds them: reserved
//! address ranges with runs of mapped pages in them.
//!
//! A snapshot shows each run of mapped pages as a segment of its own and does not record the
//! range reserved around it, which a request uses (it grows a free block into the unmapped pages
//! after it, or maps pages in a gap). The ranges are inferred from how PyTorch makes them: one
//! range per pool and stream (and private pool), of 1⅛ the device's memory (`range_size`),
//! whose pages are mapped from its start. So a group's runs, in address order, are taken to lie
//! in a range that begins at its lowest run and is `range_size` long; a run beyond that, or
//! right after the run before it (two runs of one range are never adjacent), or past a segment
//! of another group, begins the next range. A range ends early where another segment begins,
//! and reaches at least to the end of its last run.

use super::recording::DeviceRecording;
use super::start_state::SeedSegment;
use crate::pool::{MappedRunSeed, PoolKind, RangeSeed, StreamId, page_size, range_size};
use std::collections::BTreeMap;

/// An expandable segment in a state: its (inferred) reserved range and its runs of mapped
/// pages, in address order, each with the range's stream and pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedRange {
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub runs: Vec<SeedSegment>,
    /// It ends short of `range_size`, where another segment begins.
    pub cut_short: bool,
}

impl SeedRange {
    /// The bytes of its mapped pages.
    pub fn mapped_bytes(&self) -> u64 {
        self.runs
            .iter()
            .fold(0u64, |sum, r| sum.saturating_add(r.size))
    }

    /// The end of its last run (its start when it has none).
    pub fn runs_end(&self) -> u64 {
        self.runs.last().map_or(self.addr, run_end)
    }

    /// The range as the pool installs it.
    pub(crate) fn layout(&self) -> RangeSeed {
        RangeSeed {
            addr: self.addr,
            size: self.size,
            stream: self.stream,
            pool: self.pool,
            runs: self
                .runs
                .iter()
                .map(|run| MappedRunSeed {
                    addr: run.addr,
                    size: run.size,
                    blocks: run.block_seeds(),
                })
                .collect(),
        }
    }
}

/// What keeps runs apart: runs of one group may share a range, runs of two never do.
pub(crate) type Group = (PoolKind, StreamId, Option<(u64, u64)>);

/// Where a segment of a state begins and ends, and the group of a run of mapped pages (`None`
/// for a segment of its own).
pub(crate) type Occupied = (u64, u64, Option<Group>);

/// The segments of `rec`'s snapshot, as `infer_ranges` takes them.
pub(crate) fn end_state_groups(rec: &DeviceRecording) -> Vec<Occupied> {
    rec.segments
        .iter()
        .map(|s| {
            let group = s
                .is_expandable
                .then_some((s.pool, s.stream, s.private_pool));
            (s.address, s.address.saturating_add(s.total_size), group)
        })
        .collect()
}

/// The ranges that hold `runs`, the runs of mapped pages of a state's expandable segments (in
/// any order), on a device of `device_memory` bytes. `occupied` is every segment of the state,
/// runs included, in any order; a run takes the group `occupied` gives at its address, else
/// its own pool and stream.
///
/// `floors` lowers the start of a range: a range whose first run begins at a key begins at its
/// value instead (pages of the range seen below its runs), unless another segment lies between.
pub(crate) fn infer_ranges(
    occupied: &[Occupied],
    runs: Vec<SeedSegment>,
    device_memory: u64,
    floors: &BTreeMap<u64, u64>,
) -> Vec<SeedRange> {
    let mut occupied = occupied.to_vec();
    occupied.sort_unstable_by_key(|&(start, _, _)| start);
    let group_of = |addr: u64| {
        let i = occupied.partition_point(|&(start, _, _)| start < addr);
        occupied
            .get(i)
            .filter(|&&(start, _, _)| start == addr)
            .and_then(|&(_, _, group)| group)
    };
    // The start of the first segment of another group at or after `from` (below `to`).
    let foreign_start = |group: Group, from: u64, to: u64| {
        let i = occupied.partition_point(|&(start, _, _)| start < from);
        occupied[i..]
            .iter()
            .take_while(|&&(start, _, _)| start < to)
            .find(|&&(_, _, g)| g != Some(group))
            .map(|&(start, _, _)| start)
    };
    // Whether a segment lies across any of `from..to`.
    let taken = |from: u64, to: u64| {
        let i = occupied.partition_point(|&(start, _, _)| start < to);
        occupied[..i].iter().any(|&(_, end, _)| end > from)
    };
    let mut grouped: Vec<(Group, SeedSegment)> = runs
        .into_iter()
        .map(|run| {
            let group = group_of(run.addr).unwrap_or((run.pool, run.stream, None));
            (group, run)
        })
        .collect();
    grouped.sort_by_key(|(group, run)| (group.0 as u8, group.1, group.2, run.addr));
    let mut ranges: Vec<(Group, SeedRange)> = Vec::new();
    for (group, run) in grouped {
        let page = page_size(group.0);
        let want = range_size(device_memory, group.0);
        if let Some((g, range)) = ranges.last_mut()
            && *g == group
        {
            let last_end = range.runs_end();
            let joins = run.addr > last_end
                && run_end(&run) <= range.addr.saturating_add(want)
                && (run.addr - range.addr).is_multiple_of(page)
                && foreign_start(group, last_end, run.addr).is_none();
            if joins {
                range.runs.push(run);
                continue;
            }
        }
        // Whole pages below, with no segment in the way.
        let addr = floors
            .get(&run.addr)
            .copied()
            .filter(|&floor| {
                floor < run.addr
                    && (run.addr - floor).is_multiple_of(page)
                    && !taken(floor, run.addr)
            })
            .unwrap_or(run.addr);
        ranges.push((
            group,
            SeedRange {
                addr,
                size: 0,
                stream: run.stream,
                pool: run.pool,
                runs: vec![run],
                cut_short: false,
            },
        ));
    }
    // A range ends where the next segment not its own begins: another group's, or the next
    // range of its own group.
    let mut starts: Vec<u64> = ranges.iter().map(|(_, r)| r.addr).collect();
    starts.sort_unstable();
    let mut ranges = ranges
        .into_iter()
        .map(|(group, mut range)| {
            let page = page_size(range.pool);
            let last_end = range.runs_end();
            let want = range
                .addr
                .saturating_add(range_size(device_memory, range.pool));
            let next_range = starts
                .get(starts.partition_point(|&s| s < last_end))
                .copied();
            let end = [foreign_start(group, last_end, want), next_range, Some(want)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(want);
            // Whole pages from the start, at least to the end of the last run.
            range.size =
                ((end.max(last_end) - range.addr) / page * page).max(last_end - range.addr);
            range.cut_short = end < want;
            range
        })
        .collect::<Vec<_>>();
    ranges.sort_by_key(|r| r.addr);
    ranges
}

fn run_end(run: &SeedSegment) -> u64 {
    run.addr.saturating_add(run.size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::fixtures::{BASE, MIB, recording, segment};
    use crate::trace::recording::RecordedSegment;
    use crate::trace::start_state::end_state;

    const PAGE: u64 = 20 * MIB;
    /// The device's memory: its ranges are 1⅛ of it, 45 pages.
    const DEVICE: u64 = 800 * MIB;
    const RANGE: u64 = 45 * PAGE;

    /// A run of `pages` pages at `addr`, wholly free, on `stream`.
    fn run(addr: u64, pages: u64, stream: u64) -> RecordedSegment {
        RecordedSegment {
            is_expandable: true,
            stream: StreamId(stream),
            ..segment(addr, pages * PAGE, &[(0, pages * PAGE, 0, false)])
        }
    }

    /// (address, size, stream, runs) of each range taken.
    fn ranges(segments: Vec<RecordedSegment>) -> Vec<(u64, u64, u64, usize)> {
        let state = end_state(&recording(vec![], segments), DEVICE).unwrap();
        state
            .ranges
            .iter()
            .map(|r| (r.addr, r.size, r.stream.0, r.runs.len()))
            .collect()
    }

    #[test]
    fn one_range_per_stream_from_its_lowest_run() {
        let taken = ranges(vec![
            run(BASE, 2, 0),
            run(BASE + 5 * PAGE, 1, 0),
            run(BASE + 0x1_0000_0000, 1, 1),
        ]);
        assert_eq!(
            taken,
            [(BASE, RANGE, 0, 2), (BASE + 0x1_0000_0000, RANGE, 1, 1)]
        );
    }

    /// Two runs of one range are never adjacent (the snapshot shows them as one), nor beyond
    /// a range's length, nor on either side of another segment: each begins a range.
    #[test]
    fn runs_that_one_range_cannot_hold_begin_another() {
        assert_eq!(
            ranges(vec![run(BASE, 2, 0), run(BASE + 2 * PAGE, 1, 0)]),
            [(BASE, 2 * PAGE, 0, 1), (BASE + 2 * PAGE, RANGE, 0, 1)],
            "the first range ends where the next begins"
        );
        assert_eq!(
            ranges(vec![run(BASE, 1, 0), run(BASE + RANGE, 1, 0)]),
            [(BASE, RANGE, 0, 1), (BASE + RANGE, RANGE, 0, 1)]
        );
        let cut: Vec<bool> = end_state(
            &recording(vec![], vec![run(BASE, 2, 0), run(BASE + 2 * PAGE, 1, 0)]),
            DEVICE,
        )
        .unwrap()
        .ranges
        .iter()
        .map(|r| r.cut_short)
        .collect();
        assert_eq!(cut, [true, false]);
        let native = segment(BASE + 3 * PAGE, PAGE, &[(0, PAGE, PAGE, true)]);
        assert_eq!(
            ranges(vec![run(BASE, 1, 0), native, run(BASE + 5 * PAGE, 1, 0)]),
            [(BASE, 3 * PAGE, 0, 1), (BASE + 5 * PAGE, RANGE, 0, 1)]
        );
    }

    /// A run larger than a range (a request larger than 1⅛ of the device got a range of its
    /// own size) gets a range that holds it.
    #[test]
    fn a_range_holds_at_least_its_runs() {
        assert_eq!(ranges(vec![run(BASE, 50, 0)]), [(BASE, 50 * PAGE, 0, 1)]);
    }

    /// A range is whole pages from its start: one cut short by a segment that begins between
    /// pages ends at the last whole page before it, and a run not whole pages past the range's
    /// start begins a range of its own.
    #[test]
    fn ranges_are_whole_pages_from_their_start() {
        let native = segment(BASE + 3 * PAGE + 2 * MIB, PAGE, &[(0, PAGE, PAGE, true)]);
        assert_eq!(
            ranges(vec![run(BASE, 1, 0), native]),
            [(BASE, 3 * PAGE, 0, 1)]
        );
        let off = BASE + 3 * PAGE + 2 * MIB;
        assert_eq!(
            ranges(vec![run(BASE, 1, 0), run(off, 1, 0)]),
            [(BASE, 3 * PAGE, 0, 1), (off, RANGE, 0, 1)]
        );
    }

    /// A private pool's run lies in a range of its own, apart from the default pool's runs of
    /// the same stream and pool of pages.
    #[test]
    fn a_private_pools_run_has_a_range_of_its_own() {
        let private = RecordedSegment {
            private_pool: Some((1, 2)),
            ..run(BASE + 3 * PAGE, 1, 0)
        };
        assert_eq!(
            ranges(vec![run(BASE, 1, 0), private]),
            [(BASE, 3 * PAGE, 0, 1), (BASE + 3 * PAGE, RANGE, 0, 1)]
        );
    }
}
