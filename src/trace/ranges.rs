//! The address ranges of expandable segments, as a recording shows them: where the driver
//! reserved each one, and the device memory under which the pool's ranges come out the size
//! the recording's were, or fit between them — what a faithful replay needs to reserve its
//! ranges where the recording's were (`range_hints`).
//!
//! A recording of cachealloc's own (trace format version 2 on) names each range: a
//! `range_reserve` line with its address, size and page size, and a `range_release` line when
//! it is given back. The ranges are then read from those lines, and the device memory is the
//! one under which the pool reserves ranges of the recorded sizes (the capacity, when it does;
//! none for ranges at the pool's bound, which a device of unlimited memory reserves).
//!
//! A PyTorch snapshot (and a version 1 recording) has no entry for a reservation, so the ranges
//! are found from the page maps and unmaps. A range's first map is at its start, and every
//! later map of its pool and stream lies within what it has mapped so far or right after it
//! (PyTorch maps a free block's pages from its start, and a range's free blocks lie below its
//! highest mapped page or begin there). So a map belongs to the live range of its pool and
//! stream whose extent — its start up to the end of the highest page it ever mapped — reaches
//! it; any other map starts a range (the small pool maps 2 MiB pages one at a time, the large
//! pool 20 MiB ones). A pool and stream may hold several ranges: one is reserved when none has
//! room for a request. An unmap belongs to the range whose extent holds it; a range whose last
//! mapped page is unmapped was given back (PyTorch releases it then, without a trace entry),
//! and a device reset gives back them all.
//!
//! One case reads two ways: a map right at the end of a range's extent is the range growing, or
//! a second range reserved right after a fully mapped one. Where the device's memory is known,
//! the range's size settles it (a range ends 1⅛ of the memory after its start); `range_hints`
//! first finds the ranges without it, takes the memory they imply (or the capacity, if
//! smaller), and reads the maps again under that size.
//!
//! A recording that begins mid-run has ranges before its first entry: the rebuilt start state's
//! (`RangeChange::Adopt`, placed first). Every map of a pool and stream inside such a range is
//! its own, and a map just below it (no range between) shows that it reaches down there. Its
//! start being a lower bound, it bounds the memory only as the upper of two ranges.

use crate::pool::{PoolKind, StreamId, page_size, pool_with_page, range_size};
use std::collections::{BTreeMap, BTreeSet};

/// A recording's entry that changes the ranges of expandable segments or their mapped pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeChange {
    /// `range_reserve` (cachealloc's recordings only): a range of `size` bytes, mapped in pages
    /// of `page` bytes.
    Reserve { addr: u64, size: u64, page: u64 },
    /// `range_release` (cachealloc's recordings only).
    Release { addr: u64 },
    /// `segment_map`.
    Map {
        addr: u64,
        size: u64,
        stream: StreamId,
    },
    /// `segment_unmap`.
    Unmap { addr: u64, size: u64 },
    /// `device_reset`: every range is gone, without unmaps.
    DeviceReset,
    /// A range reserved before the recording began, `mapped` bytes of it mapped (from the
    /// rebuilt start state, not the recording: it goes before the recording's changes). The
    /// replay installs it with the start state; it is no reservation of the replay's.
    Adopt {
        addr: u64,
        size: u64,
        page: u64,
        stream: StreamId,
        mapped: u64,
    },
}

/// Where an expandable segment's address range was reserved, the size of its pool's pages
/// (2 MiB small, 20 MiB large), and for how long it was kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Its start; for a range there before the recording, as far down as its pages reach, at
    /// the start or in the recording.
    pub addr: u64,
    pub page: u64,
    /// The index among the recording's range changes of its `range_reserve`, or where that is
    /// not recorded, of its first map.
    pub reserved: usize,
    /// The index of the change that gave it back (`None`: kept to the end).
    pub given_back: Option<usize>,
    /// It was there before the recording (`RangeChange::Adopt`).
    pub adopted: bool,
}

/// What a faithful replay takes from the recording's ranges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RangeHints {
    /// The ranges in the order they were reserved.
    pub reservations: Vec<Reservation>,
    /// The device memory the replay sizes its ranges with (see `device_total`).
    pub device_total: Option<u64>,
}

impl RangeHints {
    /// The start addresses of the ranges reserved during the recording, in the order they were
    /// reserved (adopted ranges are the start state's).
    pub fn addresses(&self) -> Vec<u64> {
        self.reservations
            .iter()
            .filter(|r| !r.adopted)
            .map(|r| r.addr)
            .collect()
    }
}

/// The ranges of `changes` and the device memory to size them with, for a replay of
/// `capacity` bytes (`None`: unknown).
pub fn range_hints(changes: &[RangeChange], capacity: Option<u64>) -> RangeHints {
    if changes
        .iter()
        .any(|c| matches!(c, RangeChange::Reserve { .. }))
    {
        return recorded_ranges(changes, capacity);
    }
    let mut ranges = find_ranges(changes, None);
    let mut total = device_total(capacity, total_from_reservations(&ranges));
    // Read again under the range size that memory gives, until the two agree (a split range
    // can only bring the memory down; a few rounds settle it).
    for _ in 0..4 {
        let Some(memory) = total else { break };
        let again = find_ranges(changes, Some(memory));
        let total_again = device_total(capacity, total_from_reservations(&again));
        let settled = total_again == total;
        (ranges, total) = (again, total_again);
        if settled {
            break;
        }
    }
    RangeHints {
        reservations: ranges,
        device_total: total,
    }
}

/// The most device memory under which PyTorch reserves ranges no larger than the recording's
/// (`None`: the recording reserved none, or any memory would). On a device with more, a replay
/// reserves larger ranges, which cannot all lie where the recording's did.
pub fn most_memory(changes: &[RangeChange]) -> Option<u64> {
    range_hints(changes, None).device_total
}

/// The ranges a recording names with `range_reserve` and `range_release` lines, and the device
/// memory under which the pool reserves ranges of their sizes.
///
/// A pool reserves ranges of `range_size` — or of a request's own pages when the request is
/// larger — so the smallest range of each pool bounds the memory from above, and equals its
/// range under it unless every range of that pool was such a request. The capacity is taken
/// when it gives some pool its smallest range and no pool a larger one (a saved run's simulated
/// device); else the most memory the smallest ranges allow (a GPU's memory exceeds the capacity
/// a replay infers from its recording, which leaves out what other users held, and a range is
/// a whole number of pages: the memory is found within a page's worth).
fn recorded_ranges(changes: &[RangeChange], capacity: Option<u64>) -> RangeHints {
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    let mut reservations: Vec<Reservation> = Vec::new();
    // Page size → the smallest range of its pool.
    let mut smallest: BTreeMap<u64, u64> = BTreeMap::new();
    for (at, &change) in changes.iter().enumerate() {
        match change {
            RangeChange::Reserve { addr, page, .. } | RangeChange::Adopt { addr, page, .. } => {
                if let Some(gone) = live.insert(addr, reservations.len()) {
                    reservations[gone].given_back = Some(at);
                }
                reservations.push(Reservation {
                    addr,
                    page,
                    reserved: at,
                    given_back: None,
                    adopted: matches!(change, RangeChange::Adopt { .. }),
                });
                // An adopted range's size is inferred, not recorded: it bounds no memory.
                if let RangeChange::Reserve { size, .. } = change {
                    let least = smallest.entry(page).or_insert(size);
                    *least = (*least).min(size);
                }
            }
            RangeChange::Release { addr } => {
                if let Some(gone) = live.remove(&addr) {
                    reservations[gone].given_back = Some(at);
                }
            }
            RangeChange::DeviceReset => {
                for gone in std::mem::take(&mut live).into_values() {
                    reservations[gone].given_back = Some(at);
                }
            }
            RangeChange::Map { .. } | RangeChange::Unmap { .. } => {}
        }
    }
    let gives = |total: u64| {
        let ranges = || {
            smallest
                .iter()
                .map(move |(&page, &size)| (range_size_in_pages(total, page), size))
        };
        ranges().all(|(range, size)| range <= size) && ranges().any(|(range, size)| range == size)
    };
    let most = smallest
        .iter()
        .filter_map(|(&page, &size)| most_memory_for_range(size, page))
        .min();
    let device_total = match capacity {
        Some(c) if gives(c) => Some(c),
        _ => most,
    };
    RangeHints {
        reservations,
        device_total,
    }
}

/// `range_size` for a pool named by its page size.
fn range_size_in_pages(total: u64, page: u64) -> u64 {
    range_size(total, pool_of_page(page))
}

/// The pool whose expandable segments map pages of `page` bytes, or of maps `page` bytes long:
/// the small pool maps one page at a time, and any other length is a run of large pages.
pub(super) fn pool_of_page(page: u64) -> PoolKind {
    pool_with_page(page).unwrap_or(PoolKind::Large)
}

/// The most device memory under which a pool with pages of `page` bytes reserves ranges of no
/// more than `size` bytes (ranges grow with the memory, so a binary search finds it); `None`
/// when any memory does (a range at the pool's bound: a device of unlimited memory).
fn most_memory_for_range(size: u64, page: u64) -> Option<u64> {
    if range_size_in_pages(u64::MAX, page) <= size {
        return None;
    }
    let (mut low, mut high) = (0u64, u64::MAX);
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if range_size_in_pages(mid, page) <= size {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    Some(low)
}

/// The device memory a faithful replay sizes expandable segments' ranges with: its capacity,
/// but no more than lets the ranges fit between the recorded ones.
fn device_total(capacity: Option<u64>, from_reservations: Option<u64>) -> Option<u64> {
    match (capacity, from_reservations) {
        (Some(c), Some(r)) => Some(c.min(r)),
        (c, r) => c.or(r),
    }
}

/// A range while `find_ranges` follows it.
struct LiveRange {
    pool: PoolKind,
    stream: StreamId,
    /// Bytes mapped now.
    mapped: u64,
    /// The end of the highest page it has mapped.
    end: u64,
    /// Where its range ends on a device of known memory (`u64::MAX`: unknown).
    limit: u64,
    /// Its place in the list of reservations.
    reservation: usize,
    /// It was there before the recording (`RangeChange::Adopt`).
    adopted: bool,
}

/// The ranges reserved by `changes`, in order; `total`, the device's memory when known, bounds
/// each range by its size.
fn find_ranges(changes: &[RangeChange], total: Option<u64>) -> Vec<Reservation> {
    let mut live: BTreeMap<u64, LiveRange> = BTreeMap::new();
    let mut starts: Vec<Reservation> = Vec::new();
    for (at, &change) in changes.iter().enumerate() {
        match change {
            RangeChange::Map { addr, size, stream } => {
                // A small range's maps are one 2 MiB page each; a large one's are 20 MiB pages.
                let pool = pool_of_page(size);
                let end = addr.saturating_add(size);
                // The range starting closest below: the only one whose extent can hold `addr`,
                // ranges being disjoint.
                if let Some((_, range)) = live.range_mut(..=addr).next_back()
                    && range.pool == pool
                    && range.stream == stream
                    && addr <= range.end
                    && addr < range.limit
                {
                    range.mapped = range.mapped.saturating_add(size);
                    range.end = range.end.max(end);
                    continue;
                }
                // Below a range there before the recording, of its pool and stream, with no
                // range between: pages it had unmapped before (its start was known only as
                // far down as its pages then reached). It reaches down here.
                if let Some((&start, range)) = live.range(addr..).next()
                    && range.adopted
                    && range.pool == pool
                    && range.stream == stream
                    && addr < start
                {
                    let mut range = live.remove(&start).expect("found above");
                    range.mapped = range.mapped.saturating_add(size);
                    starts[range.reservation].addr = addr;
                    live.insert(addr, range);
                    continue;
                }
                // A range live at this address was given back without a trace entry.
                if let Some(gone) = live.remove(&addr) {
                    starts[gone.reservation].given_back = Some(at);
                }
                let limit = total.map_or(u64::MAX, |t| {
                    addr.saturating_add(range_size(t, pool).max(size))
                });
                live.insert(
                    addr,
                    LiveRange {
                        pool,
                        stream,
                        mapped: size,
                        end,
                        limit,
                        reservation: starts.len(),
                        adopted: false,
                    },
                );
                starts.push(Reservation {
                    addr,
                    page: page_size(pool),
                    reserved: at,
                    given_back: None,
                    adopted: false,
                });
            }
            RangeChange::Adopt {
                addr,
                size,
                page,
                stream,
                mapped,
            } => {
                // Every map of its pool and stream inside it is its own.
                let end = addr.saturating_add(size);
                live.insert(
                    addr,
                    LiveRange {
                        pool: pool_of_page(page),
                        stream,
                        mapped,
                        end,
                        limit: end,
                        reservation: starts.len(),
                        adopted: true,
                    },
                );
                starts.push(Reservation {
                    addr,
                    page,
                    reserved: at,
                    given_back: None,
                    adopted: true,
                });
            }
            RangeChange::Unmap { addr, size } => {
                if let Some((&start, range)) = live.range_mut(..=addr).next_back()
                    && addr < range.end
                {
                    range.mapped = range.mapped.saturating_sub(size);
                    if range.mapped == 0 {
                        starts[range.reservation].given_back = Some(at);
                        live.remove(&start);
                    }
                }
            }
            RangeChange::DeviceReset => {
                for range in std::mem::take(&mut live).into_values() {
                    starts[range.reservation].given_back = Some(at);
                }
            }
            // Only in recordings whose ranges `recorded_ranges` reads.
            RangeChange::Reserve { .. } | RangeChange::Release { .. } => {}
        }
    }
    starts
}

/// The most device memory under which the ranges PyTorch reserves fit between the recorded
/// ones. `None` when no two were reserved at the same time. A faithful replay without a known
/// capacity sizes its ranges with it, and one with a capacity with the smaller of the two, so
/// that they land where the recording's did.
///
/// A range is 1⅛ of the device's memory rounded up to whole pages of its pool, so each range
/// must fit, whole pages and all, below the next range kept at the same time: the distance is
/// rounded down to whole pages of the lower range's pool, then taken × 8/9, and the closest fit
/// wins. (Without the rounding, a large range reserved below a small one came out one 20 MiB
/// page longer than the distance and was placed elsewhere.) A range given back bounds nothing
/// reserved after it: the later range may lie across its place.
///
/// The closest pair of ranges kept at the same time are neighbours among the live ranges when
/// the later of the two is reserved (a range between them would be closer to both), so one
/// pass in time order, measuring each new range against its live neighbours, finds it.
pub fn total_from_reservations(reservations: &[Reservation]) -> Option<u64> {
    // (change index, 0 = given back / 1 = reserved, reservation): a range given back at the
    // change that reserves another is gone before it comes.
    let mut moments: Vec<(usize, u8, usize)> = Vec::with_capacity(2 * reservations.len());
    for (i, r) in reservations.iter().enumerate() {
        moments.push((r.reserved, 1, i));
        if let Some(at) = r.given_back {
            moments.push((at, 0, i));
        }
    }
    moments.sort_unstable();
    // A range there before the recording may begin below where its pages were seen: it bounds
    // the ranges below it, not its own size.
    let fit = |lower: &Reservation, upper: &Reservation| {
        if lower.adopted {
            return None;
        }
        let gap = upper.addr.checked_sub(lower.addr).filter(|&g| g > 0)?;
        Some(memory_fitting(lower, gap))
    };
    let mut live: BTreeSet<(u64, usize)> = BTreeSet::new();
    let mut best: Option<u64> = None;
    for (_, reserved, i) in moments {
        let r = &reservations[i];
        if reserved == 0 {
            live.remove(&(r.addr, i));
            continue;
        }
        let below = live.range(..(r.addr, i)).next_back();
        let above = live.range((r.addr, i)..).next();
        let fits = [
            below.and_then(|&(_, j)| fit(&reservations[j], r)),
            above.and_then(|&(_, j)| fit(r, &reservations[j])),
        ];
        for f in fits.into_iter().flatten() {
            best = Some(best.map_or(f, |b| b.min(f)));
        }
        live.insert((r.addr, i));
    }
    best
}

/// The most device memory under which `lower`'s range fits in the `gap` bytes above its start.
fn memory_fitting(lower: &Reservation, gap: u64) -> u64 {
    let whole_pages = gap / lower.page * lower.page;
    let room = if whole_pages > 0 { whole_pages } else { gap };
    room / 9 * 8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::rounding::{LARGE_BUFFER, SMALL_BUFFER};

    const MIB: u64 = 1 << 20;
    const BASE: u64 = 0x7f00_0000_0000;

    fn map(addr: u64, size: u64) -> RangeChange {
        RangeChange::Map {
            addr,
            size,
            stream: StreamId(0),
        }
    }

    fn unmap(addr: u64, size: u64) -> RangeChange {
        RangeChange::Unmap { addr, size }
    }

    fn addresses(changes: &[RangeChange], capacity: Option<u64>) -> Vec<u64> {
        range_hints(changes, capacity).addresses()
    }

    /// A range reserved from the start and kept to the end.
    fn lasting(addr: u64, page: u64) -> Reservation {
        Reservation {
            addr,
            page,
            reserved: 0,
            given_back: None,
            adopted: false,
        }
    }

    /// Each reservation gets its own hint: a range given back (its last page unmapped) and
    /// reserved again takes the address of its new first map, not the next range's.
    #[test]
    fn reservations_follow_ranges_given_back_and_reserved_again() {
        let (small, small_again, large) = (BASE, BASE + (100 << 30), BASE + (200 << 30));
        let changes = [
            map(small, 2 * MIB),
            map(small + 2 * MIB, 2 * MIB),
            unmap(small, 4 * MIB),
            map(small_again, 2 * MIB),
            map(large, 40 * MIB),
            map(large + 40 * MIB, 20 * MIB),
        ];
        let hints = range_hints(&changes, None);
        assert_eq!(hints.addresses(), [small, small_again, large]);
        // The closest two ranges kept together are 100 GiB apart: 8/9 of that is the most
        // device memory under which ranges of 1 1/8 of it fit between them.
        assert_eq!(hints.device_total, Some((100 << 30) / 9 * 8));
    }

    /// A pool and stream may hold two ranges at once: the large pool reserves a second when
    /// the first has no room left. Its maps are its own (not the first range's), and its
    /// unmaps are not taken from the small range reserved between the two, which stays live:
    /// its next map is no new reservation.
    #[test]
    fn a_second_range_of_one_pool_and_stream_is_a_reservation_of_its_own() {
        let (large, small, large_again) = (BASE, BASE + (100 << 30), BASE + (200 << 30));
        let changes = [
            map(large, 20 * MIB),
            map(large + 20 * MIB, 40 * MIB),
            map(small, 2 * MIB),
            map(large_again, 20 * MIB),
            unmap(large_again, 20 * MIB),
            map(small + 2 * MIB, 2 * MIB),
            // Unmapped in the middle and mapped again there: still the first range.
            unmap(large + 20 * MIB, 20 * MIB),
            map(large + 20 * MIB, 20 * MIB),
        ];
        assert_eq!(addresses(&changes, None), [large, small, large_again]);
    }

    /// A range given back bounds only the ranges reserved while it was kept: one reserved
    /// later may lie across its place (a run of expandable segments on a 1.5 GiB device
    /// reserved a large range 540 MiB below one it had given back; counting that distance
    /// sized the replay's ranges for a 480 MiB device).
    #[test]
    fn a_range_given_back_does_not_bound_later_ones() {
        let (high, given_back, later) = (BASE + (20 << 30), BASE + (10 << 30), BASE + (9 << 30));
        let changes = [
            map(high, 20 * MIB),
            map(given_back, 20 * MIB),
            unmap(given_back, 20 * MIB),
            map(later, 20 * MIB),
        ];
        let hints = range_hints(&changes, None);
        assert_eq!(hints.addresses(), [high, given_back, later]);
        assert_eq!(hints.reservations[1].given_back, Some(2));
        // Bounded by the 10 GiB from `given_back` to `high` and the 11 GiB from `later` to
        // it; not by the 1 GiB between `later` and the range given back before it came.
        assert_eq!(hints.device_total, Some((10 << 30) / 9 * 8));
    }

    /// A device reset gives back every range without unmaps: the same address mapped again
    /// afterwards is a new range, also for the other pool.
    #[test]
    fn a_device_reset_gives_back_every_range() {
        let changes = [
            map(BASE, 20 * MIB),
            map(BASE + (90 << 30), 2 * MIB),
            RangeChange::DeviceReset,
            map(BASE, 2 * MIB),
            map(BASE + (90 << 30), 20 * MIB),
        ];
        let hints = range_hints(&changes, None);
        assert_eq!(
            hints.addresses(),
            [BASE, BASE + (90 << 30), BASE, BASE + (90 << 30)]
        );
        assert_eq!(hints.reservations[0].given_back, Some(2));
        assert_eq!(hints.reservations[1].given_back, Some(2));
        assert_eq!(hints.reservations[2].page, SMALL_BUFFER);
    }

    /// A second large range reserved right after a fully mapped first one (an upward driver):
    /// without the device's memory the map at the first one's end reads as it growing; with
    /// it, the range's size ends the first range there. The first range here is 9,220 MiB (an
    /// 8 GiB device), with a small range 20 GiB above bounding the memory.
    #[test]
    fn a_range_right_after_a_full_one_is_told_apart_by_the_range_size() {
        let range = range_size(8 << 30, PoolKind::Large);
        assert_eq!(range, 9220 * MIB);
        let small = BASE + (20 << 30);
        let changes = [
            map(BASE, 4000 * MIB),
            map(small, 2 * MIB),
            map(BASE + 4000 * MIB, range - 4000 * MIB),
            map(BASE + range, 2500 * MIB),
        ];
        assert_eq!(
            addresses(&changes, Some(8 << 30)),
            [BASE, small, BASE + range]
        );
        // Without the capacity the memory comes from the distance to the small range (20 GiB
        // rounded down to whole pages, × 8/9: more than 8 GiB), so the reading stays.
        assert_eq!(addresses(&changes, None), [BASE, small]);
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
                for pair in [[lower, upper], [upper, lower]] {
                    let total = total_from_reservations(&pair).unwrap();
                    assert!(
                        range_size_in_pages(total, page) <= gap,
                        "gap {gap}, page {page}"
                    );
                    assert!(
                        range_size_in_pages(total, page) + page > gap,
                        "gap {gap}, page {page}"
                    );
                }
            }
        }
        // A small range of a 16 GiB device (18,432 MiB) gives back the 16 GiB exactly, up to
        // the division's rounding.
        let small = lasting(BASE, SMALL_BUFFER);
        let next = lasting(BASE + 18432 * MIB, LARGE_BUFFER);
        let total = total_from_reservations(&[small, next]).unwrap();
        assert!((16384 * MIB - total) < 16, "{total}");
        assert!(
            range_size_in_pages(4622 * MIB / 9 * 8, LARGE_BUFFER) > audit_gap,
            "the case before the fix"
        );
    }

    /// The one pass in time order finds what comparing every pair kept at the same time finds.
    #[test]
    fn the_sweep_agrees_with_every_pair() {
        let mut rng = crate::trace::rng::SplitMix64::new(5);
        for _ in 0..2000 {
            let n = rng.between(0, 12) as usize;
            let ranges: Vec<Reservation> = (0..n)
                .map(|i| {
                    let reserved = 2 * i;
                    let given_back = rng
                        .chance(0.5)
                        .then(|| reserved + 1 + 2 * rng.below(n as u64 + 1) as usize);
                    Reservation {
                        addr: BASE + rng.below(64) * (1 << 30) + rng.below(4) * LARGE_BUFFER,
                        page: [SMALL_BUFFER, LARGE_BUFFER][rng.below(2) as usize],
                        reserved,
                        given_back,
                        adopted: false,
                    }
                })
                .collect();
            let overlap = |a: &Reservation, b: &Reservation| {
                let until = |r: &Reservation| r.given_back.unwrap_or(usize::MAX);
                a.reserved < until(b) && b.reserved < until(a)
            };
            let every_pair = ranges
                .iter()
                .flat_map(|lower| ranges.iter().map(move |upper| (lower, upper)))
                .filter(|(lower, upper)| upper.addr > lower.addr && overlap(lower, upper))
                .map(|(lower, upper)| memory_fitting(lower, upper.addr - lower.addr))
                .min();
            // Ranges kept together never share an address; the sweep skips such pairs.
            let clash = ranges.iter().enumerate().any(|(i, a)| {
                ranges[i + 1..]
                    .iter()
                    .any(|b| a.addr == b.addr && overlap(a, b))
            });
            if !clash {
                assert_eq!(total_from_reservations(&ranges), every_pair, "{ranges:?}");
            }
        }
    }

    fn reserve(addr: u64, size: u64, page: u64) -> RangeChange {
        RangeChange::Reserve { addr, size, page }
    }

    /// A recording that names its ranges is read as named: a range never mapped (its request
    /// failed) still takes its place in the order, maps do not start ranges, a range given back
    /// and reserved again is a reservation of its own, and a reset gives back the rest.
    #[test]
    fn named_ranges_are_taken_as_they_are_named() {
        let total = 8u64 << 30;
        let (large, small) = (
            range_size(total, PoolKind::Large),
            range_size(total, PoolKind::Small),
        );
        assert!(600 * LARGE_BUFFER > large);
        let (a, b, c) = (BASE, BASE + (20 << 30), BASE + (40 << 30));
        let changes = [
            reserve(a, 600 * LARGE_BUFFER, LARGE_BUFFER),
            reserve(b, small, SMALL_BUFFER),
            map(b, 2 * MIB),
            map(a, 20 * MIB),
            // A map far from any range's extent: inference would start a range here.
            map(a + (4 << 30), 20 * MIB),
            unmap(b, 2 * MIB),
            RangeChange::Release { addr: b },
            reserve(c, large, LARGE_BUFFER),
            reserve(b, small, SMALL_BUFFER),
            RangeChange::DeviceReset,
        ];
        let hints = range_hints(&changes, None);
        assert_eq!(hints.addresses(), [a, b, c, b]);
        let given_back: Vec<_> = hints.reservations.iter().map(|r| r.given_back).collect();
        assert_eq!(given_back, [Some(9), Some(6), Some(9), Some(9)]);
        assert_eq!(hints.reservations[1].page, SMALL_BUFFER);
        // The memory gives both pools their smallest range (the first large range was a
        // request's own, larger than the pool's range).
        let memory = hints.device_total.unwrap();
        assert_eq!(range_size(memory, PoolKind::Large), large);
        assert_eq!(range_size(memory, PoolKind::Small), small);
        assert!(memory >= total && memory - total < SMALL_BUFFER, "{memory}");
    }

    /// A range reserved at the address of one still live gives that one back (its release
    /// line is missing), and the smallest of a pool's named ranges gives the memory, though a
    /// larger one (a request's own) came first.
    #[test]
    fn named_ranges_reserved_again_and_of_a_requests_own_size() {
        let total = 8u64 << 30;
        let large = range_size(total, PoolKind::Large);
        let changes = [
            reserve(BASE, 600 * LARGE_BUFFER, LARGE_BUFFER),
            reserve(BASE + (40 << 30), large, LARGE_BUFFER),
            reserve(BASE, large, LARGE_BUFFER),
        ];
        let hints = range_hints(&changes, None);
        let given_back: Vec<_> = hints.reservations.iter().map(|r| r.given_back).collect();
        assert_eq!(given_back, [Some(2), None, None]);
        let memory = hints.device_total.unwrap();
        assert_eq!(range_size(memory, PoolKind::Large), large);
        // A range at the pool's bound: a device of any memory reserves it.
        let bound = range_size(u64::MAX, PoolKind::Large);
        let hints = range_hints(&[reserve(BASE, bound, LARGE_BUFFER)], None);
        assert_eq!(hints.device_total, None);
    }

    /// A map of the other pool right at a range's end starts a range of its own; a map in a
    /// range larger than the pool's (a request's own size) is in it, however high.
    #[test]
    fn maps_belong_to_a_range_of_their_pool_within_its_size() {
        let changes = [map(BASE, 2 * MIB), map(BASE + 2 * MIB, 20 * MIB)];
        assert_eq!(addresses(&changes, None), [BASE, BASE + 2 * MIB]);
        let total = 8u64 << 30;
        assert_eq!(range_size(total, PoolKind::Large), 9220 * MIB);
        let changes = [
            map(BASE, 10000 * MIB),
            unmap(BASE + 9600 * MIB, 20 * MIB),
            map(BASE + 9600 * MIB, 20 * MIB),
        ];
        assert_eq!(addresses(&changes, Some(total)), [BASE]);
    }

    /// A map of the other pool at the start of a live range: that range was given back
    /// without a trace entry, and bounds no range reserved after it.
    #[test]
    fn a_map_at_a_live_ranges_start_gives_it_back() {
        let changes = [map(BASE, 20 * MIB), map(BASE, 2 * MIB)];
        let hints = range_hints(&changes, None);
        assert_eq!(hints.addresses(), [BASE, BASE]);
        assert_eq!(hints.reservations[0].given_back, Some(1));
        assert_eq!(hints.device_total, None);
    }

    /// A range there before the recording is the start state's: a recording that names its
    /// ranges does not reserve it.
    #[test]
    fn adopted_ranges_are_not_among_the_named_reservations() {
        let changes = [
            RangeChange::Adopt {
                addr: BASE,
                size: 9220 * MIB,
                page: LARGE_BUFFER,
                stream: StreamId(0),
                mapped: 20 * MIB,
            },
            reserve(BASE + (20 << 30), 9220 * MIB, LARGE_BUFFER),
        ];
        let hints = range_hints(&changes, None);
        assert_eq!(hints.addresses(), [BASE + (20 << 30)]);
        assert!(hints.reservations[0].adopted);
    }

    /// The memory a replay of named ranges runs with: the capacity when it gives the recorded
    /// ranges (a saved run of the simulated device, exactly), else the most memory that does
    /// (a GPU, whose recording shows less memory than it has: a capacity inferred from an
    /// out-of-memory leaves out the memory that other users held).
    #[test]
    fn named_ranges_give_the_device_memory() {
        let total = (80u64 << 30) - 3 * MIB;
        let changes = [
            reserve(BASE, range_size(total, PoolKind::Large), LARGE_BUFFER),
            reserve(
                BASE + (100 << 30),
                range_size(total, PoolKind::Small),
                SMALL_BUFFER,
            ),
        ];
        assert_eq!(range_hints(&changes, Some(total)).device_total, Some(total));
        let inferred = total - (500 << 20);
        let memory = range_hints(&changes, Some(inferred)).device_total.unwrap();
        assert_eq!(range_hints(&changes, None).device_total, Some(memory));
        let pools = [PoolKind::Large, PoolKind::Small];
        for pool in pools {
            assert_eq!(range_size(memory, pool), range_size(total, pool));
        }
        assert!(
            pools
                .iter()
                .any(|&p| range_size(memory + 1, p) > range_size(total, p)),
            "the most memory that gives the ranges"
        );
        assert!(memory >= total && memory - total < SMALL_BUFFER, "{memory}");
    }
}
