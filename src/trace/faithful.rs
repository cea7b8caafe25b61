//! Faithful replay of a recording: the rebuilt start state installed at its real addresses, the
//! recording's capacity and settings, and the driver's segment addresses, so that the replay can
//! be compared figure for figure (and address for address) with what PyTorch did.

use super::figures::RecordedFigures;
use super::recording::{Action, DeviceRecording};
use super::replay::{ReplayConfig, ReplayOutcome, StartLayout, replay};
use super::start_state::StartState;
use crate::pool::rounding::{LARGE_BUFFER, SMALL_BUFFER};
use crate::pool::{BlockSeed, SegmentSeed, Settings, StreamId};
use std::collections::BTreeMap;

impl StartState {
    /// The layout the replay installs into the pool.
    pub fn layout(&self) -> StartLayout {
        let segments = self
            .segments
            .iter()
            .map(|s| SegmentSeed {
                addr: s.addr,
                size: s.size,
                stream: s.stream,
                pool: s.pool,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| BlockSeed {
                        addr: b.addr,
                        size: b.size,
                        requested: b.requested,
                        allocated: b.allocated,
                    })
                    .collect(),
            })
            .collect();
        let ids = self
            .segments
            .iter()
            .map(|s| s.blocks.iter().map(|b| b.id).collect())
            .collect();
        StartLayout { segments, ids }
    }
}

impl DeviceRecording {
    /// The settings a faithful replay runs with: the recorded ones (the defaults when the file
    /// names none), with expandable segments on when the recording used them (a snapshot of an
    /// older PyTorch names no settings: only its `segment_map` entries show them).
    pub fn replay_settings(&self) -> Settings {
        let mut settings = self
            .settings
            .as_ref()
            .map(|s| s.to_settings())
            .unwrap_or_default();
        settings.expandable_segments |= self.is_expandable();
        settings
    }

    /// Where the driver reserved the address ranges of expandable segments, in trace order
    /// (`reservation_addresses`).
    pub fn reservation_addresses(&self) -> Vec<u64> {
        reservation_addresses(self.entries.iter().filter_map(|e| {
            let mapped = match e.action {
                Action::SegmentMap => true,
                Action::SegmentUnmap => false,
                _ => return None,
            };
            Some(PageChange {
                mapped,
                addr: e.addr,
                size: e.size,
                stream: e.stream,
            })
        }))
    }

    /// The device memory the recorded reservations imply (`total_from_reservations`).
    pub fn total_from_reservations(&self) -> Option<u64> {
        total_from_reservations(self.reservation_addresses())
    }

    /// `(size, address)` of every `segment_alloc`, in trace order: where the driver put them.
    pub fn segment_addresses(&self) -> Vec<(u64, u64)> {
        self.entries
            .iter()
            .filter(|e| e.action == Action::SegmentAlloc)
            .map(|e| (e.size, e.addr))
            .collect()
    }
}

/// A `segment_map` (`mapped`) or `segment_unmap` entry of a recording.
#[derive(Clone, Copy, Debug)]
pub struct PageChange {
    pub mapped: bool,
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
}

/// Where the driver reserved the address ranges of expandable segments, from a recording's
/// page maps and unmaps in trace order. A range's first map is at its
/// start; a map for a pool and stream with no range reserved starts one (the small pool maps
/// 2 MiB pages one at a time, the large pool 20 MiB ones); a range whose last mapped page is
/// unmapped was given back (PyTorch releases it then, without a trace entry), so the next map
/// for its pool and stream reserves again.
pub fn reservation_addresses(changes: impl IntoIterator<Item = PageChange>) -> Vec<u64> {
    // Live ranges: start → (small pool, stream, bytes mapped).
    let mut live: BTreeMap<u64, (bool, StreamId, u64)> = BTreeMap::new();
    let mut starts = Vec::new();
    for PageChange {
        mapped,
        addr,
        size,
        stream,
    } in changes
    {
        if mapped {
            let small = size == SMALL_BUFFER;
            let range = live
                .values_mut()
                .find(|(s, st, _)| *s == small && *st == stream);
            match range {
                Some((_, _, bytes)) => *bytes += size,
                None => {
                    live.insert(addr, (small, stream, size));
                    starts.push(addr);
                }
            }
        } else if let Some((&start, (_, _, bytes))) = live.range_mut(..=addr).next_back() {
            *bytes = bytes.saturating_sub(size);
            if *bytes == 0 {
                live.remove(&start);
            }
        }
    }
    starts
}

/// The most device memory under which the ranges PyTorch reserves fit between the recorded
/// ones (`starts`, from `reservation_addresses`). `None` with fewer than two. A faithful replay
/// without a known capacity sizes its ranges with it, so that they land where the recording's
/// did.
///
/// A range is 1⅛ of the device's memory rounded up to whole pages (20 MiB in the large pool),
/// so the closest two reservations' distance is first rounded down to whole large pages, then
/// taken × 8/9: without the rounding, a large range reserved after a small one came out one
/// page longer than the distance and was placed elsewhere.
pub fn total_from_reservations(mut starts: Vec<u64>) -> Option<u64> {
    starts.sort_unstable();
    // (A range given back and reserved again at the same place is one.)
    starts.dedup();
    let gap = starts.windows(2).map(|w| w[1] - w[0]).min()?;
    let whole_pages = gap / LARGE_BUFFER * LARGE_BUFFER;
    let room = if whole_pages > 0 { whole_pages } else { gap };
    Some(room / 9 * 8)
}

/// A faithful replay's result next to the recording's own figures.
#[derive(Clone, Debug)]
pub struct FaithfulOutcome {
    pub outcome: ReplayOutcome,
    pub recorded: RecordedFigures,
    /// The capacity the replay ran with.
    pub capacity: Option<u64>,
}

/// The device memory a faithful replay sizes expandable segments' ranges with: its capacity,
/// but no more than lets the ranges fit between the recorded ones.
pub fn device_total(capacity: Option<u64>, from_reservations: Option<u64>) -> Option<u64> {
    match (capacity, from_reservations) {
        (Some(c), Some(r)) => Some(c.min(r)),
        (c, r) => c.or(r),
    }
}

/// Replay `rec` faithfully. `config.settings` is used as given (callers start from the
/// recording's settings); a capacity in `config` overrides the one inferred from the trace.
pub fn replay_faithful(
    rec: &DeviceRecording,
    config: &ReplayConfig,
) -> Result<FaithfulOutcome, String> {
    let faithful = rec.faithful().map_err(|e| e.to_string())?;
    let mut config = config.clone();
    config.capacity = config.capacity.or(faithful.capacity);
    config.address_hints = rec.segment_addresses();
    config.reservation_hints = rec.reservation_addresses();
    config.device_total = device_total(config.capacity, rec.total_from_reservations());
    let layout = faithful.start.layout();
    let outcome = replay(&faithful.workload, &config, Some(&layout))
        .map_err(|e| format!("{}: {e}", rec.source))?;
    Ok(FaithfulOutcome {
        outcome,
        recorded: rec.figures(),
        capacity: config.capacity,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::fixtures::{BASE, MIB, entry, recording};

    /// Each reservation gets its own hint: a range given back (its last page unmapped) and
    /// reserved again takes the address of its new first map, not the next range's.
    #[test]
    fn reservations_follow_ranges_given_back_and_reserved_again() {
        let (small, small_again, large) = (BASE, BASE + (100 << 30), BASE + (200 << 30));
        let rec = recording(
            vec![
                entry(Action::SegmentMap, small, 2 * MIB),
                entry(Action::SegmentMap, small + 2 * MIB, 2 * MIB),
                entry(Action::SegmentUnmap, small, 4 * MIB),
                entry(Action::SegmentMap, small_again, 2 * MIB),
                entry(Action::SegmentMap, large, 40 * MIB),
                entry(Action::SegmentMap, large + 40 * MIB, 20 * MIB),
            ],
            vec![],
        );
        assert_eq!(rec.reservation_addresses(), [small, small_again, large]);
        // The closest two ranges are 100 GiB apart: 8/9 of that is the most device memory
        // under which ranges of 1 1/8 of it fit between them.
        assert_eq!(rec.total_from_reservations(), Some((100 << 30) / 9 * 8));
    }

    /// The range a pool reserves on a device of `total` bytes (the pool's own formula:
    /// 1 1/8 of the memory, rounded up to whole pages).
    fn range(total: u64, page: u64) -> u64 {
        (total + total / 8).div_ceil(page) * page
    }

    /// Whatever the distance between two recorded ranges, ranges of both pools sized with the
    /// total it implies fit in it. A library recording on a 4 GiB device reserved its small
    /// range, then its large one 4,622 MiB lower: 8/9 of that distance made the large range
    /// 4,640 MiB, and the replay placed it elsewhere.
    #[test]
    fn ranges_sized_from_the_reservations_fit_between_them() {
        let audit_gap = 4622 * MIB;
        let mut gaps = vec![audit_gap, 100 << 30, 1162 * MIB, 20 * MIB, 21 * MIB];
        gaps.extend((0..2000u64).map(|i| 1000 * MIB + i * 7 * MIB + i % 5 * 4096));
        for gap in gaps {
            let total = total_from_reservations(vec![BASE, BASE + gap]).unwrap();
            for page in [SMALL_BUFFER, LARGE_BUFFER] {
                assert!(range(total, page) <= gap, "gap {gap}, page {page}");
            }
            // And not needlessly smaller: within one large page of the distance.
            assert!(range(total, LARGE_BUFFER) + LARGE_BUFFER > gap, "gap {gap}");
        }
        assert!(
            range(4622 * MIB / 9 * 8, LARGE_BUFFER) > audit_gap,
            "the case before the fix"
        );
    }
}
