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

    /// Where the driver reserved the address ranges of expandable segments, in trace order,
    /// with their pools' page sizes (`reservations`): the replay's hints (`addresses`) and the
    /// device memory they imply (`total_from_reservations`).
    pub fn reservations(&self) -> Vec<Reservation> {
        reservations(self.entries.iter().filter_map(|e| {
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
/// page maps and unmaps in trace order.
///
/// A range's first map is at its start, and every later map of its pool and stream lies within
/// what it has mapped so far or right after it (PyTorch maps a range's pages from its start
/// up, and maps again where it unmapped). So a map of a pool and stream belongs to the live
/// range of that pool and stream whose extent — its start up to the end of the highest page
/// it ever mapped — reaches it; any other map starts a range (the small pool maps 2 MiB pages
/// one at a time, the large pool 20 MiB ones). A pool and stream may hold several ranges: one
/// is reserved when none has room for a request. An unmap belongs to the range whose extent
/// holds it; a range whose last mapped page is unmapped was given back (PyTorch releases it
/// then, without a trace entry), so a later map there reserves again.
pub fn reservations(changes: impl IntoIterator<Item = PageChange>) -> Vec<Reservation> {
    let mut live: BTreeMap<u64, LiveRange> = BTreeMap::new();
    let mut starts: Vec<Reservation> = Vec::new();
    for (
        at,
        PageChange {
            mapped,
            addr,
            size,
            stream,
        },
    ) in changes.into_iter().enumerate()
    {
        // The range starting closest below: the only one whose extent can hold `addr`, ranges
        // being disjoint.
        let below = live.range_mut(..=addr).next_back();
        if mapped {
            let small = size == SMALL_BUFFER;
            match below {
                Some((_, range))
                    if range.small == small && range.stream == stream && addr <= range.end =>
                {
                    range.mapped += size;
                    range.end = range.end.max(addr + size);
                }
                _ => {
                    live.insert(
                        addr,
                        LiveRange {
                            small,
                            stream,
                            mapped: size,
                            end: addr + size,
                            reservation: starts.len(),
                        },
                    );
                    let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
                    starts.push(Reservation {
                        addr,
                        page,
                        reserved: at,
                        given_back: None,
                    });
                }
            }
        } else if let Some((&start, range)) = below
            && addr < range.end
        {
            range.mapped = range.mapped.saturating_sub(size);
            if range.mapped == 0 {
                starts[range.reservation].given_back = Some(at);
                live.remove(&start);
            }
        }
    }
    starts
}

/// A reserved range while `reservations` follows it.
struct LiveRange {
    small: bool,
    stream: StreamId,
    /// Bytes mapped now.
    mapped: u64,
    /// The end of the highest page it has mapped.
    end: u64,
    /// Its place in the list of reservations.
    reservation: usize,
}

/// Where an expandable segment's address range was reserved, the size of its pool's pages
/// (2 MiB small, 20 MiB large), and while which page changes it was reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub addr: u64,
    pub page: u64,
    /// The index of its first map among the recording's page changes.
    pub reserved: usize,
    /// The index of the unmap that gave it back (`None`: kept to the end).
    pub given_back: Option<usize>,
}

impl Reservation {
    /// Whether the two ranges were reserved at the same time.
    fn coexists_with(&self, other: &Reservation) -> bool {
        let until = |r: &Reservation| r.given_back.unwrap_or(usize::MAX);
        self.reserved < until(other) && other.reserved < until(self)
    }
}

/// The start addresses of `reservations`, in their order.
pub fn addresses(reservations: &[Reservation]) -> Vec<u64> {
    reservations.iter().map(|r| r.addr).collect()
}

/// The most device memory under which the ranges PyTorch reserves fit between the recorded
/// ones (from `reservations`). `None` when no two were reserved at the same time. A faithful
/// replay without a known capacity sizes its ranges with it, and a replay with one sizes them
/// with the smaller of the two, so that they land where the recording's did.
///
/// A range is 1⅛ of the device's memory rounded up to whole pages of its pool, so each range
/// must fit, whole pages and all, below the next range reserved while it was: the distance is
/// rounded down to whole pages of the lower range's pool, then taken × 8/9, and the closest fit
/// wins. (Without the rounding, a large range reserved below a small one came out one 20 MiB
/// page longer than the distance and was placed elsewhere.) A range given back bounds nothing
/// reserved after it: the later range may lie across its place.
pub fn total_from_reservations(reservations: Vec<Reservation>) -> Option<u64> {
    reservations
        .iter()
        .filter_map(|lower| {
            let gap = reservations
                .iter()
                .filter(|upper| upper.addr > lower.addr && upper.coexists_with(lower))
                .map(|upper| upper.addr - lower.addr)
                .min()?;
            let whole_pages = gap / lower.page * lower.page;
            let room = if whole_pages > 0 { whole_pages } else { gap };
            Some(room / 9 * 8)
        })
        .min()
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
    let reservations = rec.reservations();
    config.reservation_hints = addresses(&reservations);
    config.device_total = device_total(config.capacity, total_from_reservations(reservations));
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
        let reservations = rec.reservations();
        assert_eq!(addresses(&reservations), [small, small_again, large]);
        // The closest two ranges are 100 GiB apart: 8/9 of that is the most device memory
        // under which ranges of 1 1/8 of it fit between them.
        assert_eq!(
            total_from_reservations(reservations),
            Some((100 << 30) / 9 * 8)
        );
    }

    /// A pool and stream may hold two ranges at once: the large pool reserves a second when
    /// the first has no room left. Its maps are its own (not the first range's), and its
    /// unmaps are not taken from the small range reserved between the two, which stays live:
    /// its next map is no new reservation.
    #[test]
    fn a_second_range_of_one_pool_and_stream_is_a_reservation_of_its_own() {
        let (large, small, large_again) = (BASE, BASE + (100 << 30), BASE + (200 << 30));
        let rec = recording(
            vec![
                entry(Action::SegmentMap, large, 20 * MIB),
                entry(Action::SegmentMap, large + 20 * MIB, 40 * MIB),
                entry(Action::SegmentMap, small, 2 * MIB),
                entry(Action::SegmentMap, large_again, 20 * MIB),
                entry(Action::SegmentUnmap, large_again, 20 * MIB),
                entry(Action::SegmentMap, small + 2 * MIB, 2 * MIB),
                // Unmapped in the middle and mapped again there: still the first range.
                entry(Action::SegmentUnmap, large + 20 * MIB, 20 * MIB),
                entry(Action::SegmentMap, large + 20 * MIB, 20 * MIB),
            ],
            vec![],
        );
        assert_eq!(addresses(&rec.reservations()), [large, small, large_again]);
    }

    /// A range reserved from the start and kept to the end.
    fn lasting(addr: u64, page: u64) -> Reservation {
        Reservation {
            addr,
            page,
            reserved: 0,
            given_back: None,
        }
    }

    /// A range given back bounds only the ranges reserved while it was: one reserved later
    /// may lie across its place (a run of expandable segments on a 1.5 GiB device reserved a
    /// large range 540 MiB below one it had given back; counting that distance sized the
    /// replay's ranges for a 480 MiB device).
    #[test]
    fn a_range_given_back_does_not_bound_later_ones() {
        let (high, given_back, later) = (BASE + (20 << 30), BASE + (10 << 30), BASE + (9 << 30));
        let rec = recording(
            vec![
                entry(Action::SegmentMap, high, 20 * MIB),
                entry(Action::SegmentMap, given_back, 20 * MIB),
                entry(Action::SegmentUnmap, given_back, 20 * MIB),
                entry(Action::SegmentMap, later, 20 * MIB),
            ],
            vec![],
        );
        let reservations = rec.reservations();
        assert_eq!(addresses(&reservations), [high, given_back, later]);
        assert_eq!(reservations[1].given_back, Some(2));
        // Bounded by the 10 GiB to `high` (given_back) and the 11 GiB from `later` to it; not
        // by the 1 GiB between `later` and the range given back before it was reserved.
        assert_eq!(
            total_from_reservations(reservations),
            Some((10 << 30) / 9 * 8)
        );
    }

    /// The range a pool reserves on a device of `total` bytes (the pool's own formula:
    /// 1 1/8 of the memory, rounded up to whole pages).
    fn range(total: u64, page: u64) -> u64 {
        (total + total / 8).div_ceil(page) * page
    }

    /// Whatever the distance between two recorded ranges, the range of the lower one's pool,
    /// sized with the total it implies, fits in it, and is within one page of it (so the total
    /// is no smaller than it must be: it is also the simulated device's memory). A library
    /// recording on a 4 GiB device reserved its small range, then its large one 4,622 MiB
    /// lower: 8/9 of that distance made the large range 4,640 MiB, and the replay placed it
    /// elsewhere.
    #[test]
    fn ranges_sized_from_the_reservations_fit_between_them() {
        let audit_gap = 4622 * MIB;
        let mut gaps = vec![
            audit_gap,
            100 << 30,
            1162 * MIB,
            18432 * MIB,
            20 * MIB,
            21 * MIB,
        ];
        gaps.extend((0..2000u64).map(|i| 1000 * MIB + i * 7 * MIB + i % 5 * 4096));
        for gap in gaps {
            for page in [SMALL_BUFFER, LARGE_BUFFER] {
                let lower = lasting(BASE, page);
                let upper = lasting(BASE + gap, SMALL_BUFFER + LARGE_BUFFER - page);
                // In either order of reservation.
                for pair in [vec![lower, upper], vec![upper, lower]] {
                    let total = total_from_reservations(pair).unwrap();
                    assert!(range(total, page) <= gap, "gap {gap}, page {page}");
                    assert!(range(total, page) + page > gap, "gap {gap}, page {page}");
                }
            }
        }
        // A small range of a 16 GiB device (18,432 MiB) gives back the 16 GiB exactly, up to
        // the division's rounding.
        let small = lasting(BASE, SMALL_BUFFER);
        let next = lasting(BASE + 18432 * MIB, LARGE_BUFFER);
        let total = total_from_reservations(vec![small, next]).unwrap();
        assert!((16384 * MIB - total) < 16, "{total}");
        assert!(
            range(4622 * MIB / 9 * 8, LARGE_BUFFER) > audit_gap,
            "the case before the fix"
        );
    }
}
