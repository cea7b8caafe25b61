//! A simulated device: a capacity, an address space laid out like the driver's, injectable
//! failures and a clock for pending work. Deterministic; used by tests, replay and benchmarks.

use super::range_set::RangeSet;
use super::{Backend, BackendError, Fence, MemInfo, StreamFence};
use crate::pool::segment_map::SegmentMap;
use crate::pool::{DeviceId, DevicePtr, StreamId};
use std::collections::{HashMap, VecDeque};

/// Segments are aligned to this, like the driver's 2 MiB allocation granularity.
pub const SEGMENT_ALIGNMENT: u64 = 2 << 20; // 2 MiB
/// Lowest address the simulated device hands out (addresses are handed out from the top down,
/// so they look like the driver's `0x7f…` ones; the space below is there for devices larger
/// than any real one).
pub const ADDRESS_BASE: u64 = SEGMENT_ALIGNMENT;
/// One past the highest address the simulated device hands out.
pub const ADDRESS_TOP: u64 = 0x7fff_0000_0000;
/// The most memory a simulated device can have (about 128 TiB): a larger capacity, or an
/// unlimited one, is this much, so that running out of addresses is running out of memory.
pub const ADDRESS_SPACE: u64 = ADDRESS_TOP - ADDRESS_BASE;

/// How many queued address hints an allocation looks through for one of its size.
const HINT_LOOKAHEAD: usize = 4;

/// Where a new segment goes in the address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// At the top of the highest free range that fits (what the Linux driver mostly does).
    TopDown,
    /// At the bottom of the lowest free range that fits.
    BottomUp,
}

impl Placement {
    /// The names a command line and a saved trace give them.
    pub const CHOICES: [(&'static str, Placement); 2] = [
        ("top-down", Placement::TopDown),
        ("bottom-up", Placement::BottomUp),
    ];

    /// Its name in `CHOICES`.
    pub fn name(self) -> &'static str {
        Self::CHOICES
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("top-down", |(n, _)| n)
    }

    /// The placement named `name` in `CHOICES`.
    pub fn from_name(name: &str) -> Option<Placement> {
        Self::CHOICES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, p)| p)
    }
}

/// Call counters of the simulated device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCounters {
    pub allocs: u64,
    pub frees: u64,
    pub failed_allocs: u64,
    pub synchronizes: u64,
    /// Expandable segments: page maps (each call, whatever its pages) and unmaps.
    pub maps: u64,
    pub unmaps: u64,
}

/// A simulated device.
#[derive(Debug)]
pub struct SimDevice {
    device: DeviceId,
    capacity: u64,
    /// The total memory `mem_info` reports, when not the capacity.
    total: Option<u64>,
    used: u64,
    placement: Placement,
    /// Live segments and reserved address ranges: address → size.
    segments: SegmentMap,
    /// Reserved address ranges of expandable segments (also in `segments`): address → size.
    reserved: SegmentMap,
    /// The page size of each reserved range: address → page.
    range_pages: HashMap<u64, u64>,
    /// Mapped pages of the reserved ranges (their bytes count in `used`).
    mapped: RangeSet,
    /// Recorded addresses of upcoming address reservations, in order.
    reservation_hints: VecDeque<u64>,
    /// Free parts of the managed address space `[ADDRESS_BASE, ADDRESS_TOP)`: start → end.
    free_ranges: RangeSet,
    /// Recorded `(size, address)` of upcoming segment allocations, in order.
    address_hints: VecDeque<(u64, u64)>,
    /// Upcoming `allocate` calls that fail: each entry is consumed by one call.
    injected_failures: VecDeque<Option<BackendError>>,
    /// Upcoming `mem_info` calls that fail (`inject_mem_info_failures`).
    mem_info_failures: u32,
    next_fence: u64,
    /// Fences below this value are done.
    completed_fences: u64,
    /// When true, every fence is done as soon as it is recorded (no asynchronous work).
    fences_complete_immediately: bool,
    /// Stream fences not yet reported done by `poll_fences`, oldest first.
    stream_fences: VecDeque<Fence>,
    /// A CUDA graph capture is underway (`set_capturing`): calls that would end one fail.
    capturing: bool,
    counters: SimCounters,
}

impl SimDevice {
    /// A device of `capacity` bytes (use `u64::MAX` for "unlimited": `ADDRESS_SPACE`, as is
    /// any larger capacity), top-down placement, fences done immediately.
    pub fn new(capacity: u64) -> Self {
        Self {
            device: DeviceId(0),
            capacity: capacity.min(ADDRESS_SPACE),
            total: None,
            used: 0,
            placement: Placement::TopDown,
            segments: SegmentMap::default(),
            reserved: SegmentMap::default(),
            range_pages: HashMap::new(),
            mapped: RangeSet::default(),
            reservation_hints: VecDeque::new(),
            free_ranges: RangeSet::of(ADDRESS_BASE, ADDRESS_TOP),
            address_hints: VecDeque::new(),
            injected_failures: VecDeque::new(),
            mem_info_failures: 0,
            next_fence: 1,
            completed_fences: u64::MAX,
            fences_complete_immediately: true,
            stream_fences: VecDeque::new(),
            capturing: false,
            counters: SimCounters::default(),
        }
    }

    /// Begin or end a CUDA graph capture: while one is underway, `capture_underway` says so
    /// and `synchronize`, `release` and `unmap_pages`, which would end it on a real device,
    /// fail with `cudaErrorStreamCaptureUnsupported` (900) and do nothing.
    pub fn set_capturing(&mut self, capturing: bool) {
        self.capturing = capturing;
    }

    fn refuse_during_capture(&self, call: &'static str) -> Result<(), BackendError> {
        if self.capturing {
            return Err(BackendError::Device { code: 900, call });
        }
        Ok(())
    }

    pub fn with_device(mut self, device: DeviceId) -> Self {
        self.device = device;
        self
    }

    pub fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Make fences pending until `complete_work` or `synchronize` (asynchronous device work).
    pub fn with_pending_work(mut self) -> Self {
        self.hold_work();
        self
    }

    /// From now on, fences stay pending until `complete_work` or `synchronize`.
    pub fn hold_work(&mut self) {
        self.fences_complete_immediately = false;
        self.completed_fences = 0;
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// As in `new`: at most `ADDRESS_SPACE`.
    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity.min(ADDRESS_SPACE);
    }

    /// The total memory `mem_info` reports (`None`: the capacity), as a device's total exceeds
    /// what a program can allocate on it.
    pub fn set_total(&mut self, total: Option<u64>) {
        self.total = total;
    }

    /// Bytes currently held by live segments and mapped pages.
    pub fn used(&self) -> u64 {
        self.used
    }

    pub fn counters(&self) -> SimCounters {
        self.counters
    }

    /// Live segments as `(address, size)`, in address order.
    pub fn segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.segments.iter()
    }

    /// Queue the address a recording's driver gave an allocation of `size` bytes. An allocation
    /// of that size takes the first such hint among the next few whose range is free (hints
    /// skipped over are dropped); otherwise the placement rule decides.
    pub fn push_address_hint(&mut self, size: u64, addr: u64) {
        self.address_hints.push_back((size, addr));
    }

    /// Queue the address a recording's driver gave an address reservation of an expandable
    /// segment: the next reservation takes it when that range is free.
    pub fn push_reservation_hint(&mut self, addr: u64) {
        self.reservation_hints.push_back(addr);
    }

    /// Make the next `allocate` call fail with `error` (queued; one call each).
    pub fn inject_failure(&mut self, error: BackendError) {
        self.injected_failures.push_back(Some(error));
    }

    /// Make the next `count` `mem_info` calls fail, as `cudaMemGetInfo` can.
    pub fn inject_mem_info_failures(&mut self, count: u32) {
        self.mem_info_failures = count;
    }

    /// Let the next `allocate` call proceed normally (used to space out injected failures).
    pub fn inject_success(&mut self) {
        self.injected_failures.push_back(None);
    }

    /// Mark a segment that exists before the simulation starts (e.g. rebuilt from a snapshot).
    /// Returns false if it overlaps a live segment.
    pub fn claim(&mut self, addr: u64, size: u64) -> bool {
        if addr == 0 || !self.range_is_free(addr, size) {
            return false;
        }
        self.segments.insert(addr, size);
        self.carve(addr, size);
        self.used += size;
        true
    }

    /// Mark an expandable segment that exists before the simulation starts: its address range
    /// of whole `page`s reserved, and the `(address, size)` runs in it mapped (in address
    /// order, whole pages from the range's start). `Err` says why it cannot be: the range
    /// overlaps a live segment or lies outside the address space, or a run is not such pages.
    pub fn claim_range(
        &mut self,
        addr: u64,
        size: u64,
        page: u64,
        runs: &[(u64, u64)],
    ) -> Result<(), String> {
        let end = addr
            .checked_add(size)
            .filter(|_| addr != 0 && page != 0 && size.is_multiple_of(page))
            .ok_or_else(|| {
                format!("{size} bytes at {addr:#x} are not whole pages of {page} bytes")
            })?;
        let mut cursor = addr;
        for &(start, len) in runs {
            let run_end = start.saturating_add(len);
            if start < cursor || run_end > end {
                return Err(format!(
                    "the run of {len} bytes at {start:#x} overlaps the run before it or lies \
                     outside the range"
                ));
            }
            if len == 0 || !(start - addr).is_multiple_of(page) || !len.is_multiple_of(page) {
                return Err(format!(
                    "the run of {len} bytes at {start:#x} is not whole pages of {page} bytes \
                     from the range's start"
                ));
            }
            cursor = run_end;
        }
        if !self.range_is_free(addr, size) {
            return Err(
                "it overlaps another segment, or lies outside the device's address space"
                    .to_string(),
            );
        }
        self.segments.insert(addr, size);
        self.reserved.insert(addr, size);
        self.range_pages.insert(addr, page);
        self.carve(addr, size);
        for &(start, len) in runs {
            self.mapped.insert(start, start + len);
            self.used += len;
        }
        Ok(())
    }

    /// Finish all work issued so far: every fence recorded until now is done.
    pub fn complete_work(&mut self) {
        self.completed_fences = self.next_fence;
    }

    /// Whether `size` more bytes fit in the capacity.
    fn fits(&self, size: u64) -> bool {
        self.used
            .checked_add(size)
            .is_some_and(|total| total <= self.capacity)
    }

    /// Whether `[start, end)` is whole pages of one reserved range (counted from its start).
    fn whole_pages_of_a_range(&self, start: u64, end: u64) -> bool {
        let Some((base, len)) = self.reserved.at_or_below(start) else {
            return false;
        };
        let page = self.range_pages[&base];
        end <= base + len
            && (start - base).is_multiple_of(page)
            && (end - base).is_multiple_of(page)
    }

    fn range_is_free(&self, addr: u64, size: u64) -> bool {
        !self.segments.overlaps(addr, size)
    }

    /// Take `[addr, addr + size)` out of the free ranges (the part inside the managed space).
    fn carve(&mut self, addr: u64, size: u64) {
        self.free_ranges.remove(addr, addr.saturating_add(size));
    }

    /// Give `[addr, addr + size)` back to the free ranges, merged with its neighbours.
    fn uncarve(&mut self, addr: u64, size: u64) {
        let start = addr.max(ADDRESS_BASE);
        let end = addr.saturating_add(size).min(ADDRESS_TOP);
        self.free_ranges.insert(start, end);
    }

    fn place(&mut self, size: u64) -> Option<u64> {
        let matching = self
            .address_hints
            .iter()
            .take(HINT_LOOKAHEAD)
            .position(|&(s, a)| s == size && a != 0 && self.range_is_free(a, size));
        if let Some(pos) = matching {
            let (_, addr) = self.address_hints[pos];
            self.address_hints.drain(..=pos);
            return Some(addr);
        }
        self.place_by_rule(size)
    }

    /// Where the placement rule puts `size` bytes (no hint).
    fn place_by_rule(&self, size: u64) -> Option<u64> {
        let mut ranges = self.free_ranges.iter();
        match self.placement {
            Placement::TopDown => ranges.rev().find_map(|(start, end)| {
                let addr = (end.checked_sub(size)?) / SEGMENT_ALIGNMENT * SEGMENT_ALIGNMENT;
                (addr >= start).then_some(addr)
            }),
            Placement::BottomUp => ranges.find_map(|(start, end)| {
                let addr = start.div_ceil(SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT;
                (addr.checked_add(size)? <= end).then_some(addr)
            }),
        }
    }
}

/// The error for a call the pool should never make (a bug the tests are there to catch).
fn misuse(call: &'static str) -> BackendError {
    BackendError::Device { code: 1, call }
}

impl Backend for SimDevice {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn allocate(&mut self, size: u64) -> Result<DevicePtr, BackendError> {
        if let Some(Some(error)) = self.injected_failures.pop_front() {
            self.counters.failed_allocs += 1;
            return Err(error);
        }
        let addr = if self.fits(size) {
            self.place(size)
        } else {
            None
        };
        let Some(addr) = addr else {
            self.counters.failed_allocs += 1;
            return Err(BackendError::OutOfMemory);
        };
        self.segments.insert(addr, size);
        self.carve(addr, size);
        self.used += size;
        self.counters.allocs += 1;
        Ok(DevicePtr::new(addr).expect("placement never yields address 0"))
    }

    fn release(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        self.refuse_during_capture("cudaFree")?;
        match self.segments.get(ptr.addr()) {
            Some(s) if s == size && self.reserved.get(ptr.addr()).is_none() => {
                self.segments.remove(ptr.addr());
                self.uncarve(ptr.addr(), size);
                self.used -= size;
                self.counters.frees += 1;
                Ok(())
            }
            _ => Err(misuse("sim release")),
        }
    }

    fn supports_expandable_segments(&self) -> bool {
        true
    }

    fn reserve_address_range(&mut self, size: u64, page: u64) -> Result<DevicePtr, BackendError> {
        if page == 0 || !size.is_multiple_of(page) {
            return Err(misuse(
                "sim reserve_address_range of a size not whole pages",
            ));
        }
        let hinted = self.reservation_hints.pop_front();
        let addr = match hinted {
            Some(a) if a != 0 && a % SEGMENT_ALIGNMENT == 0 && self.range_is_free(a, size) => {
                Some(a)
            }
            _ => self.place_by_rule(size),
        };
        let Some(addr) = addr else {
            return Err(BackendError::OutOfMemory);
        };
        self.segments.insert(addr, size);
        self.reserved.insert(addr, size);
        self.range_pages.insert(addr, page);
        self.carve(addr, size);
        Ok(DevicePtr::new(addr).expect("placement never yields address 0"))
    }

    fn map_pages(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let (start, end) = (ptr.addr(), ptr.addr().saturating_add(size));
        if !self.whole_pages_of_a_range(start, end) {
            return Err(misuse(
                "sim map_pages of other than whole pages of a reserved range",
            ));
        }
        if let Some(Some(error)) = self.injected_failures.pop_front() {
            self.counters.failed_allocs += 1;
            return Err(error);
        }
        if !self.fits(size) {
            self.counters.failed_allocs += 1;
            return Err(BackendError::OutOfMemory);
        }
        if start >= end || self.mapped.overlaps(start, end) {
            return Err(misuse("sim map_pages of mapped pages"));
        }
        self.mapped.insert(start, end);
        self.used += size;
        self.counters.maps += 1;
        Ok(())
    }

    fn unmap_pages(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        self.refuse_during_capture("cuMemUnmap")?;
        let (start, end) = (ptr.addr(), ptr.addr().saturating_add(size));
        if !self.whole_pages_of_a_range(start, end) || !self.mapped.covers(start, end) {
            return Err(misuse("sim unmap_pages of pages not mapped"));
        }
        self.mapped.remove(start, end);
        self.used -= size;
        self.counters.unmaps += 1;
        Ok(())
    }

    fn release_address_range(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let (addr, end) = (ptr.addr(), ptr.addr().saturating_add(size));
        if self.reserved.get(addr) != Some(size) || self.mapped.overlaps(addr, end) {
            return Err(misuse(
                "sim release_address_range of a range not reserved or mapped",
            ));
        }
        self.reserved.remove(addr);
        self.range_pages.remove(&addr);
        self.segments.remove(addr);
        self.uncarve(addr, size);
        Ok(())
    }

    fn mem_info(&mut self) -> Result<MemInfo, BackendError> {
        if self.mem_info_failures > 0 {
            self.mem_info_failures -= 1;
            return Err(BackendError::Device {
                code: 999,
                call: "cudaMemGetInfo",
            });
        }
        Ok(MemInfo {
            free: self.capacity.saturating_sub(self.used),
            total: self.total.unwrap_or(self.capacity),
        })
    }

    fn record_fence(&mut self) -> Result<Fence, BackendError> {
        let fence = Fence(self.next_fence);
        self.next_fence += 1;
        Ok(fence)
    }

    /// The simulated device has one queue of work: a stream fence is one of its fences.
    fn record_stream_fence(&mut self, _streams: &[StreamId]) -> Result<StreamFence, BackendError> {
        let fence = self.record_fence()?;
        self.stream_fences.push_back(fence);
        Ok(StreamFence {
            fence,
            unfenced: Vec::new(),
        })
    }

    /// Fences are answered from the clock: the stream fences below it are done.
    fn poll_fences(&mut self, done: &mut Vec<Fence>) -> Result<(), BackendError> {
        while let Some(&fence) = self.stream_fences.front() {
            if !self.fence_done(fence)? {
                break;
            }
            self.stream_fences.pop_front();
            done.push(fence);
        }
        Ok(())
    }

    fn fence_done(&mut self, fence: Fence) -> Result<bool, BackendError> {
        Ok(self.fences_complete_immediately || fence.0 < self.completed_fences)
    }

    fn capture_underway(&mut self) -> bool {
        self.capturing
    }

    fn synchronize(&mut self) -> Result<(), BackendError> {
        self.refuse_during_capture("cudaDeviceSynchronize")?;
        self.counters.synchronizes += 1;
        self.complete_work();
        // Done, and not for polls to report.
        self.stream_fences.clear();
        Ok(())
    }

    /// The simulated device has one queue of work: `synchronize` completed it all.
    fn wait_stream_fences(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn top_down_places_each_segment_below_the_last() {
        let mut sim = SimDevice::new(u64::MAX);
        let a = sim.allocate(20 * MIB).unwrap().addr();
        let b = sim.allocate(2 * MIB).unwrap().addr();
        assert_eq!(a, ADDRESS_TOP - 20 * MIB);
        assert_eq!(b, a - 2 * MIB);
        sim.release(DevicePtr::new(a).unwrap(), 20 * MIB).unwrap();
        // The freed top range is the highest that fits again.
        assert_eq!(sim.allocate(4 * MIB).unwrap().addr(), ADDRESS_TOP - 4 * MIB);
    }

    #[test]
    fn bottom_up_counts_upwards() {
        let mut sim = SimDevice::new(u64::MAX).with_placement(Placement::BottomUp);
        let a = sim.allocate(2 * MIB).unwrap().addr();
        let b = sim.allocate(2 * MIB).unwrap().addr();
        assert_eq!(a, ADDRESS_BASE);
        assert_eq!(b, a + 2 * MIB);
    }

    /// A device has at most the address space's bytes: 2 TiB fit on an unlimited device, and
    /// a capacity larger than the space is the space, so that a device out of addresses
    /// reports itself full.
    #[test]
    fn capacity_is_at_most_the_address_space() {
        let mut sim = SimDevice::new(u64::MAX);
        assert_eq!(sim.capacity(), ADDRESS_SPACE);
        let big = sim.allocate(2 << 40).expect("2 TiB fits");
        assert!(big.addr() >= ADDRESS_BASE && big.addr() + (2 << 40) <= ADDRESS_TOP);
        sim.set_capacity(u64::MAX / 2);
        assert_eq!(sim.capacity(), ADDRESS_SPACE);
        let info = sim.mem_info().unwrap();
        assert_eq!(info.free, ADDRESS_SPACE - (2 << 40));
        assert!(sim.allocate(ADDRESS_SPACE).is_err());
    }

    #[test]
    fn capacity_and_injected_failures_refuse_allocations() {
        let mut sim = SimDevice::new(4 * MIB);
        sim.allocate(2 * MIB).unwrap();
        assert_eq!(sim.allocate(4 * MIB), Err(BackendError::OutOfMemory));
        sim.inject_failure(BackendError::Device {
            code: 35,
            call: "cudaMalloc",
        });
        assert!(matches!(
            sim.allocate(2 * MIB),
            Err(BackendError::Device { code: 35, .. })
        ));
        assert!(sim.allocate(2 * MIB).is_ok());
        assert_eq!(
            sim.mem_info().unwrap(),
            MemInfo {
                free: 0,
                total: 4 * MIB
            }
        );
    }

    #[test]
    fn fences_wait_for_completed_work() {
        let mut sim = SimDevice::new(u64::MAX).with_pending_work();
        let f = sim.record_fence().unwrap();
        assert!(!sim.fence_done(f).unwrap());
        sim.synchronize().unwrap();
        assert!(sim.fence_done(f).unwrap());
    }

    /// The free ranges and the live segments tile the managed address space: in address order
    /// they alternate without gaps or overlaps, and no two free ranges touch (each is merged
    /// with its free neighbours).
    fn assert_tiled(sim: &SimDevice) {
        let mut pieces: Vec<(u64, u64, bool)> = sim
            .free_ranges
            .iter()
            .map(|(s, e)| (s, e, true))
            .chain(sim.segments().map(|(s, len)| (s, s + len, false)))
            .filter(|&(s, e, _)| e > ADDRESS_BASE && s < ADDRESS_TOP)
            .collect();
        pieces.sort_unstable();
        let mut at = ADDRESS_BASE;
        let mut last_free = false;
        for (s, e, free) in pieces {
            assert_eq!(s.max(ADDRESS_BASE), at, "gap or overlap at {at:#x}");
            assert!(!(free && last_free), "free ranges touch at {s:#x}");
            at = e.min(ADDRESS_TOP);
            last_free = free;
        }
        assert_eq!(at, ADDRESS_TOP, "the space is not covered to its top");
    }

    #[test]
    fn free_ranges_stay_merged_through_allocations_releases_and_claims() {
        for placement in [Placement::TopDown, Placement::BottomUp] {
            let mut sim = SimDevice::new(u64::MAX).with_placement(placement);
            let mut live: Vec<(u64, u64)> = Vec::new();
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            for _ in 0..3000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let size = (1 + x % 7) * 2 * MIB;
                match (x >> 32) % 5 {
                    0 | 1 => live.push((sim.allocate(size).unwrap().addr(), size)),
                    2 => {
                        // A claim anywhere in the space, taken only where it is free.
                        let addr = ADDRESS_BASE + ((x >> 20) % 4096) * 2 * MIB;
                        if sim.claim(addr, size) {
                            live.push((addr, size));
                        }
                    }
                    _ if !live.is_empty() => {
                        let (addr, size) = live.swap_remove((x >> 40) as usize % live.len());
                        sim.release(DevicePtr::new(addr).unwrap(), size).unwrap();
                    }
                    _ => {}
                }
                assert_tiled(&sim);
            }
            for (addr, size) in live {
                sim.release(DevicePtr::new(addr).unwrap(), size).unwrap();
            }
            assert_eq!(
                sim.free_ranges.iter().collect::<Vec<_>>(),
                [(ADDRESS_BASE, ADDRESS_TOP)],
                "everything released is one free range again"
            );
        }
    }

    /// Expandable segments: a reservation takes address space but no memory; mapped pages
    /// count against the capacity; calls the pool should never make are refused.
    #[test]
    fn reserved_ranges_hold_memory_only_where_mapped() {
        let mut sim = SimDevice::new(100 * MIB);
        sim.push_reservation_hint(0x7f20_0000_0000);
        assert!(
            sim.reserve_address_range(1 << 30, 3 * MIB).is_err(),
            "not whole pages"
        );
        let r = sim.reserve_address_range(1 << 30, 2 * MIB).unwrap();
        assert_eq!(r.addr(), 0x7f20_0000_0000, "the hint, free");
        assert_eq!(sim.used(), 0);
        let at = |off: u64| DevicePtr::new(r.addr() + off).unwrap();
        sim.map_pages(at(0), 60 * MIB).unwrap();
        assert_eq!(
            sim.map_pages(at(60 * MIB), 60 * MIB),
            Err(BackendError::OutOfMemory)
        );
        assert!(
            sim.map_pages(at(40 * MIB), 20 * MIB).is_err(),
            "mapped twice"
        );
        assert!(
            sim.map_pages(at(1 << 30), 2 * MIB).is_err(),
            "outside the range"
        );
        assert!(
            sim.map_pages(at(61 * MIB), 2 * MIB).is_err(),
            "not on a page boundary"
        );
        assert!(sim.release(r, 1 << 30).is_err(), "a range is not a segment");
        assert!(
            sim.release_address_range(r, 1 << 30).is_err(),
            "pages still mapped"
        );
        sim.unmap_pages(at(20 * MIB), 20 * MIB, StreamId(0))
            .unwrap();
        assert!(sim.unmap_pages(at(20 * MIB), 2 * MIB, StreamId(0)).is_err());
        assert_eq!(sim.used(), 40 * MIB);
        assert_eq!(sim.mem_info().unwrap().free, 60 * MIB);
        sim.unmap_pages(at(0), 20 * MIB, StreamId(0)).unwrap();
        sim.unmap_pages(at(40 * MIB), 20 * MIB, StreamId(0))
            .unwrap();
        sim.release_address_range(r, 1 << 30).unwrap();
        assert_eq!(sim.segments().count(), 0);
        let counters = sim.counters();
        assert_eq!((counters.maps, counters.unmaps), (1, 3));
        sim.set_total(Some(200 * MIB));
        assert_eq!(sim.mem_info().unwrap().total, 200 * MIB);
    }

    /// A free stretch exactly the size of a request, between two segments, takes it: at its
    /// top top-down, at its bottom bottom-up (the driver reuses such a hole).
    #[test]
    fn a_hole_of_exactly_the_size_asked_is_used() {
        for placement in [Placement::TopDown, Placement::BottomUp] {
            let mut sim = SimDevice::new(u64::MAX).with_placement(placement);
            let a = sim.allocate(2 * MIB).unwrap();
            let b = sim.allocate(4 * MIB).unwrap();
            let c = sim.allocate(2 * MIB).unwrap();
            sim.release(b, 4 * MIB).unwrap();
            assert_eq!(sim.allocate(4 * MIB), Ok(b), "{placement:?}");
            for (ptr, size) in [(a, 2 * MIB), (b, 4 * MIB), (c, 2 * MIB)] {
                sim.release(ptr, size).unwrap();
            }
        }
    }

    /// A release names a segment by its address and size, as the pool made it: another size is
    /// a misuse the simulated device refuses.
    #[test]
    fn a_release_of_another_size_is_refused() {
        let mut sim = SimDevice::new(u64::MAX);
        let a = sim.allocate(4 * MIB).unwrap();
        assert!(sim.release(a, 2 * MIB).is_err());
        assert_eq!(sim.used(), 4 * MIB);
        sim.release(a, 4 * MIB).unwrap();
    }

    /// A hint that was used leaves the queue, so it does not take a place among the few the
    /// next allocation looks through.
    #[test]
    fn a_used_address_hint_leaves_the_queue() {
        let mut sim = SimDevice::new(u64::MAX);
        sim.push_address_hint(2 * MIB, 0x7f10_0000_0000);
        for i in 0..3 {
            sim.push_address_hint(4 * MIB, 0x7f20_0000_0000 + i * 4 * MIB);
        }
        sim.push_address_hint(6 * MIB, 0x7f30_0000_0000);
        assert_eq!(sim.allocate(2 * MIB).unwrap().addr(), 0x7f10_0000_0000);
        assert_eq!(
            sim.allocate(6 * MIB).unwrap().addr(),
            0x7f30_0000_0000,
            "the fourth hint after the used one is within reach"
        );
    }

    #[test]
    fn address_hints_are_used_when_free() {
        let mut sim = SimDevice::new(u64::MAX);
        sim.push_address_hint(4 * MIB, 0x7f30_0000_0000);
        sim.push_address_hint(2 * MIB, 0x7f10_0000_0000);
        assert_eq!(sim.allocate(2 * MIB).unwrap().addr(), 0x7f10_0000_0000);
        assert_ne!(
            sim.allocate(4 * MIB).unwrap().addr(),
            0x7f30_0000_0000,
            "skipped hints are dropped"
        );
        assert!(sim.claim(0x7f20_0000_0000, 2 * MIB));
        assert!(!sim.claim(0x7f20_0000_0000, 2 * MIB));
    }
}
