//! Replay: drive a workload through the pool on the simulated device and collect what happened.
//!
//! Plain replay starts from an empty device with unlimited (or a given) capacity — the mode for
//! what-if questions. Faithful replay starts from the state rebuilt from a recording, with the
//! recording's capacity and the driver's segment addresses, to reproduce the recording exactly.

use super::workload::{AllocId, Op, Workload};
use crate::backend::sim::{Placement, SimDevice};
use crate::pool::{
    DeviceAllocator, DeviceId, DevicePtr, DeviceStats, Error, EventSink, OomReport, RangeSeed,
    SegmentSeed, Settings, format_size, page_size,
};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeSet;

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    pub settings: Settings,
    /// The device the replay stands for (named in reports).
    pub device: DeviceId,
    /// Device capacity in bytes; `None` = unlimited.
    pub capacity: Option<u64>,
    pub placement: Placement,
    /// Recorded `(size, address)` of segment allocations, used as the device's addresses.
    pub address_hints: Vec<(u64, u64)>,
    /// Addresses of the recording's address reservations (expandable segments), in order.
    pub reservation_hints: Vec<u64>,
    /// The device's total memory, where it differs from the capacity (`None`: the capacity).
    /// Expandable segments reserve ranges of 1⅛ of it.
    pub device_total: Option<u64>,
    /// Run the invariant walker after every operation (slow; for tests).
    pub check_invariants: bool,
}

impl ReplayConfig {
    /// The total memory the simulated device reports (`device_total`, else the capacity), from
    /// which the pool takes `per_process_memory_fraction`; `None` for an unlimited device.
    pub fn total(&self) -> Option<u64> {
        self.device_total.or(self.capacity)
    }
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            settings: Settings::default(),
            device: DeviceId(0),
            capacity: None,
            placement: Placement::TopDown,
            address_hints: Vec::new(),
            reservation_hints: Vec::new(),
            device_total: None,
            check_invariants: false,
        }
    }
}

/// The device state at the start of a recording: segments with their blocks, and for each
/// block the workload id of the live allocation it holds (if the workload frees it).
#[derive(Clone, Debug, Default)]
pub struct StartLayout {
    pub segments: Vec<SegmentSeed>,
    /// Parallel to `segments[i].blocks`.
    pub ids: Vec<Vec<Option<AllocId>>>,
    /// Expandable segments.
    pub ranges: Vec<RangeSeed>,
    /// `(address, id)` of the allocated blocks in `ranges` that the workload frees.
    pub range_ids: Vec<(u64, AllocId)>,
}

impl StartLayout {
    /// The bytes its segments and mapped pages hold (saturating: a corrupt recording's sum may
    /// overflow).
    pub fn held_bytes(&self) -> u64 {
        let segments = self
            .segments
            .iter()
            .fold(0u64, |sum, seg| sum.saturating_add(seg.size));
        self.ranges.iter().fold(segments, |sum, range| {
            sum.saturating_add(range.mapped_bytes())
        })
    }
}

/// The first allocation that ran out of memory.
#[derive(Clone, Debug, PartialEq)]
pub struct OomAt {
    /// Index of the op in the workload.
    pub op_index: usize,
    /// Index of the entry in the source trace, when the workload has one.
    pub source_index: Option<usize>,
    pub report: OomReport,
}

impl OomAt {
    /// Where the OOM happened as a user counts: the trace entry, else the operation.
    pub fn event_index(&self) -> usize {
        self.source_index.unwrap_or(self.op_index)
    }
}

/// What a replay did.
#[derive(Clone, Debug)]
pub struct ReplayOutcome {
    pub ops: usize,
    pub allocs: u64,
    /// Allocations whose recorded address is known, and how many landed exactly there.
    pub allocs_with_recorded_addr: u64,
    pub allocs_at_recorded_addr: u64,
    /// Frees replayed: each recorded completion of a live allocation's free (one that a
    /// synchronization of the replay's pool completed before it counts there, once).
    pub frees: u64,
    /// Frees of allocations that are not live in the replay, skipped: allocations refused by
    /// an OOM in this replay. (The workloads made from recordings leave out frees of memory
    /// allocated before recording began; the recording's figures count those.)
    pub skipped_frees: u64,
    /// Requests of 1 EB or more, which PyTorch refuses with an out-of-memory error before the
    /// pool sees them (no statistic moves); refused here the same way, and their frees skipped.
    pub requests_too_large: u64,
    pub empty_cache_calls: u64,
    /// The program's calls setting the memory fraction (`Op::MemoryFraction`).
    pub memory_fraction_calls: u64,
    /// The program's synchronizations of the device (`Op::DeviceSynchronize`).
    pub device_synchronize_calls: u64,
    /// The recording's device resets (`Op::DeviceReset`), replayed as `empty_cache()` calls
    /// whose returns of memory are not counted in `num_device_free`, nor their synchronization
    /// in `num_sync_all_streams`.
    pub device_resets: u64,
    /// The recording's own failed requests (its `oom` entries), each requested again when the
    /// replay has a capacity (and freed at once if it fits).
    pub recorded_oom_requests: u64,
    /// The requests and `empty_cache()` calls the recording made during a CUDA graph capture
    /// where its pool missed or emptied nothing (`Op::Capture`), replayed with the simulated
    /// device capturing (a failed request only when the replay has a capacity, without which it
    /// is not asked for again).
    pub captured_requests: u64,
    pub first_oom: Option<OomAt>,
    pub stats: DeviceStats,
    pub final_segments: usize,
}

/// Replay `workload` from `start` (or an empty device).
pub fn replay(
    workload: &Workload,
    config: &ReplayConfig,
    start: Option<&StartLayout>,
) -> Result<ReplayOutcome, Error> {
    replay_observed(workload, config, start, None)
}

/// Replay as [`replay`] does from an empty device, handing each event of the pool to `sink`:
/// how a replay is saved as a trace (which, like a program's recording, begins with the pool).
pub fn replay_with_sink(
    workload: &Workload,
    config: &ReplayConfig,
    sink: Box<dyn EventSink>,
) -> Result<ReplayOutcome, Error> {
    replay_observed(workload, config, None, Some(sink))
}

fn replay_observed(
    workload: &Workload,
    config: &ReplayConfig,
    start: Option<&StartLayout>,
    sink: Option<Box<dyn EventSink>>,
) -> Result<ReplayOutcome, Error> {
    let mut pool = seeded_pool(config, start)?;
    let mut live: Vec<Option<DevicePtr>> = vec![None; workload.num_ids as usize];
    if let Some(start) = start {
        for (seg, ids) in start.segments.iter().zip(&start.ids) {
            for (block, id) in seg.blocks.iter().zip(ids) {
                if let (true, Some(id)) = (block.allocated, id) {
                    let slot = live_slot(&mut live, *id);
                    *slot = DevicePtr::new(block.addr);
                }
            }
        }
        for &(addr, id) in &start.range_ids {
            *live_slot(&mut live, id) = DevicePtr::new(addr);
        }
    }
    pool.set_event_sink(sink);
    // Allocations whose free was requested and has not completed, by address.
    let mut requested: FxHashMap<u64, AllocId> = FxHashMap::default();
    // Allocations whose free a synchronization of the pool completed before the recording's
    // completion (`take_frees_completed_early`), which is then passed over.
    let mut completed_early: FxHashSet<AllocId> = FxHashSet::default();
    // Addresses of allocations whose recorded completion was the recorded pool's
    // synchronization before growing (`Op::FreeAtGrowthSync`): held, their completion left to
    // the replay's pool, and counted among the frees already.
    let mut left_to_pool: BTreeSet<u64> = BTreeSet::new();
    let mut out = ReplayOutcome {
        // A free requested and completed later is one event, its `Free`; a capture is part of
        // its request's.
        ops: workload
            .ops
            .iter()
            .filter(|op| !matches!(op, Op::FreeRequested { .. } | Op::Capture))
            .count(),
        allocs: 0,
        allocs_with_recorded_addr: 0,
        allocs_at_recorded_addr: 0,
        frees: 0,
        skipped_frees: 0,
        requests_too_large: 0,
        empty_cache_calls: 0,
        memory_fraction_calls: 0,
        device_synchronize_calls: 0,
        device_resets: 0,
        recorded_oom_requests: 0,
        captured_requests: 0,
        first_oom: None,
        stats: DeviceStats::default(),
        final_segments: 0,
    };
    // What the `empty_cache()` calls replaying the recording's device resets counted that the
    // resets did not: segments returned to the device (no cudaFree there) and a
    // synchronization each (no `synchronize_and_free_events` either).
    let (mut reset_returns, mut reset_syncs) = (0, 0);
    // Whether the frees held until a synchronization were shown before any release of their
    // request (`Op::FreeAtSync`'s `first_in_request`).
    let mut held_first_in_request = false;
    // Whether the next request or `empty_cache()` ran during a capture (`Op::Capture`).
    let mut capture_next = false;
    for (i, op) in workload.ops.iter().enumerate() {
        let marked =
            capture_next && matches!(op, Op::Alloc { .. } | Op::Oom { .. } | Op::EmptyCache);
        capture_next &= !marked;
        // A recorded failed request is asked for again only where the capacity is known.
        let capturing = marked && (config.capacity.is_some() || !matches!(op, Op::Oom { .. }));
        if capturing {
            out.captured_requests += 1;
            pool.backend_mut().set_capturing(true);
        }
        match *op {
            Op::Alloc {
                id,
                size,
                stream,
                recorded_addr,
            } => {
                out.allocs += 1;
                complete_frees_unless_retrying(&mut pool, size, held_first_in_request);
                match pool.malloc(size, stream) {
                    Ok(ptr) => {
                        if let Some(addr) = recorded_addr {
                            out.allocs_with_recorded_addr += 1;
                            out.allocs_at_recorded_addr += u64::from(addr == ptr.addr());
                        }
                        *live_slot(&mut live, id) = Some(ptr);
                    }
                    Err(e) => note_refusal(&mut out, workload, i, e)?,
                }
            }
            Op::Free { id } => {
                if let Some(ptr) = freed(&mut live, id, &mut completed_early, &mut out) {
                    if take_requested(&mut requested, ptr, id) {
                        pool.free_completed(ptr)?;
                    } else {
                        pool.free(ptr)?;
                    }
                }
            }
            Op::FreeAtSync {
                id,
                first_in_request,
            } => {
                if let Some(ptr) = freed(&mut live, id, &mut completed_early, &mut out) {
                    if !take_requested(&mut requested, ptr, id) {
                        pool.free_requested(ptr)?;
                    }
                    pool.free_completes_at_sync(ptr)?;
                    held_first_in_request = first_in_request;
                }
            }
            Op::FreeAtGrowthSync { id } => {
                if let Some(ptr) = freed(&mut live, id, &mut completed_early, &mut out) {
                    if requested.get(&ptr.addr()) == Some(&id) {
                        // (Whatever it waited for on other devices was done by then.)
                        pool.free_covered_by_device_sync(ptr)?;
                        left_to_pool.insert(ptr.addr());
                    } else {
                        pool.free(ptr)?;
                    }
                }
            }
            Op::FreeRequested {
                id,
                until_device_sync,
                outlasts_device_sync,
            } => {
                // (An allocation refused in this replay has nothing to free; its `Free` is
                // skipped and counted there.)
                if let Some(&Some(ptr)) = live.get(id as usize)
                    && requested.insert(ptr.addr(), id).is_none()
                {
                    if until_device_sync {
                        pool.free_requested_until_device_sync(ptr)?;
                    } else {
                        pool.free_requested(ptr)?;
                    }
                    if outlasts_device_sync {
                        pool.free_outlasts_device_sync(ptr)?;
                    }
                }
            }
            Op::DeviceSynchronize => {
                // What it completed of the frees the replay holds follows as `Op::Free`s;
                // those whose recorded completion came before (left to the replay's pool) it
                // completes now.
                pool.device_synchronized()?;
                complete_left_to_pool(&mut pool, &mut requested, &mut left_to_pool)?;
                out.device_synchronize_calls += 1;
            }
            Op::EmptyCache => {
                pool.empty_cache()?;
                out.empty_cache_calls += 1;
            }
            Op::DeviceReset => {
                let before = pool.stats().counts;
                pool.empty_cache()?;
                out.device_resets += 1;
                let after = pool.stats().counts;
                reset_returns += after.num_device_free - before.num_device_free;
                reset_syncs += after.num_sync_all_streams - before.num_sync_all_streams;
            }
            Op::Capture => capture_next = true,
            // The program's own call, after which it is in force whatever the settings said.
            Op::MemoryFraction { fraction } => {
                pool.set_memory_fraction(fraction)?;
                out.memory_fraction_calls += 1;
            }
            Op::Oom { size, stream, .. } => {
                // The recording's failed request: probe it when the capacity is known.
                out.recorded_oom_requests += 1;
                if config.capacity.is_some() {
                    complete_frees_unless_retrying(&mut pool, size, held_first_in_request);
                    match pool.malloc(size, stream) {
                        Ok(ptr) => pool.free(ptr)?,
                        Err(e) => note_refusal(&mut out, workload, i, e)?,
                    }
                } else if !marked {
                    // Not asked for again: the recorded request's synchronizations completed
                    // every free waiting, those left to the replay's pool too.
                    complete_left_to_pool(&mut pool, &mut requested, &mut left_to_pool)?;
                }
            }
        }
        if capturing {
            pool.backend_mut().set_capturing(false);
        }
        // The request after frees completed at its retry's synchronization has been served:
        // those it did not synchronize for complete now, as they did before it was served.
        if !matches!(op, Op::FreeAtSync { .. }) {
            pool.complete_frees_held_until_sync();
        }
        // Frees the pool's synchronization completed before the recording did: their
        // completions to come change nothing (their addresses may hold other allocations by
        // then).
        for ptr in pool.take_frees_completed_early() {
            if let Some(id) = requested.remove(&ptr.addr())
                && !left_to_pool.remove(&ptr.addr())
            {
                live[id as usize] = None;
                completed_early.insert(id);
            }
        }
        if config.check_invariants {
            pool.validate()
                .map_err(|why| Error::Invariant(format!("after op {i}: {why}")))?;
        }
    }
    pool.complete_frees_held_until_sync();
    out.stats = pool.stats();
    // The recording's resets returned their memory without a call, and synchronized nothing.
    out.stats.counts.num_device_free -= reset_returns;
    out.stats.counts.num_sync_all_streams -= reset_syncs;
    out.final_segments = pool.segments().len();
    Ok(out)
}

/// Complete the frees whose recorded completion was the recorded pool's synchronization
/// before growing, which the replay left to its own pool (`Op::FreeAtGrowthSync`): a
/// synchronization the recording made that the replay does not make itself (the program's,
/// or a failed request's not asked for again) completes them.
fn complete_left_to_pool(
    pool: &mut DeviceAllocator<SimDevice>,
    requested: &mut FxHashMap<u64, AllocId>,
    left_to_pool: &mut BTreeSet<u64>,
) -> Result<(), Error> {
    for addr in std::mem::take(left_to_pool) {
        if let (Some(_), Some(ptr)) = (requested.remove(&addr), DevicePtr::new(addr)) {
            pool.free_completed(ptr)?;
        }
    }
    Ok(())
}

/// Before a request of `size` bytes after frees the recording completed at its retry's
/// synchronization (`Op::FreeAtSync`): if a new segment fits without a release, the request
/// makes no retry, so those frees were completed before it (by PyTorch's `process_events`,
/// which the trace shows alike) and complete now. So too where the trace shows them before any
/// release of the request (`first_in_request`) and the pool would collect garbage, releasing a
/// segment, without them: a collection runs before a retry's synchronization, so its releases
/// would have come first. (With expandable segments they wait for the synchronization.)
fn complete_frees_unless_retrying(
    pool: &mut DeviceAllocator<SimDevice>,
    size: u64,
    first_in_request: bool,
) {
    if pool.frees_held_until_sync() > 0
        && !pool.settings().expandable_segments
        && (pool.new_segment_fits(size) || first_in_request && pool.collection_would_release())
    {
        pool.complete_frees_held_until_sync();
    }
}

/// The pool a replay starts with: on the simulated device `config` describes, holding the
/// segments of `start` (if any) at their addresses, with statistics counted from there (the
/// start state's blocks are current, no total has moved yet).
pub fn seeded_pool(
    config: &ReplayConfig,
    start: Option<&StartLayout>,
) -> Result<DeviceAllocator<SimDevice>, Error> {
    let capacity = config.capacity.unwrap_or(u64::MAX);
    let mut sim = SimDevice::new(capacity)
        .with_device(config.device)
        .with_placement(config.placement);
    for &(size, addr) in &config.address_hints {
        sim.push_address_hint(size, addr);
    }
    for &addr in &config.reservation_hints {
        sim.push_reservation_hint(addr);
    }
    sim.set_total(config.device_total);
    if let Some(start) = start {
        let held = start.held_bytes();
        if held > capacity {
            return Err(Error::InvalidSeed(format!(
                "the start state's segments hold {} ({held} bytes), more than the device \
                 capacity of {} ({capacity} bytes); give a larger capacity",
                format_size(held),
                format_size(capacity)
            )));
        }
        for seg in &start.segments {
            if !sim.claim(seg.addr, seg.size) {
                return Err(Error::InvalidSeed(if seg.addr == 0 {
                    format!(
                        "a segment of {} bytes at address 0, which is no device address",
                        seg.size
                    )
                } else {
                    format!(
                        "segment {:#x} of {} bytes overlaps another, or lies outside the device's \
                         address space",
                        seg.addr, seg.size
                    )
                }));
            }
        }
        for range in &start.ranges {
            let runs: Vec<(u64, u64)> = range.runs.iter().map(|r| (r.addr, r.size)).collect();
            sim.claim_range(range.addr, range.size, page_size(range.pool), &runs)
                .map_err(|why| {
                    let first = runs.first().map_or(range.addr, |&(addr, _)| addr);
                    Error::InvalidSeed(format!(
                        "the expandable segment whose pages begin at {first:#x} (its range taken \
                         as {} at {:#x}): {why}",
                        format_size(range.size),
                        range.addr
                    ))
                })?;
        }
    }
    let mut pool = DeviceAllocator::new(sim, config.settings.clone());
    if let Some(start) = start {
        for seg in &start.segments {
            pool.adopt_segment(seg)?;
        }
        for range in &start.ranges {
            pool.adopt_range(range)?;
        }
        pool.reset_accumulated_stats();
    }
    Ok(pool)
}

/// A free of allocation `id`, counted in `out`: its block, taken from `live`, for the caller
/// to return to the pool; `None` when it is not live (a free the pool completed early,
/// counted as done, or one of an allocation this replay refused, counted as skipped).
fn freed(
    live: &mut [Option<DevicePtr>],
    id: AllocId,
    completed_early: &mut FxHashSet<AllocId>,
    out: &mut ReplayOutcome,
) -> Option<DevicePtr> {
    match live.get_mut(id as usize).and_then(Option::take) {
        Some(ptr) => {
            out.frees += 1;
            Some(ptr)
        }
        None => {
            if completed_early.remove(&id) {
                out.frees += 1;
            } else {
                out.skipped_frees += 1;
            }
            None
        }
    }
}

/// Whether allocation `id` at `ptr` is one whose free was requested (`Op::FreeRequested`) and
/// has not completed; it is then no longer.
fn take_requested(requested: &mut FxHashMap<u64, AllocId>, ptr: DevicePtr, id: AllocId) -> bool {
    let held = requested.get(&ptr.addr()) == Some(&id);
    if held {
        requested.remove(&ptr.addr());
    }
    held
}

fn live_slot(live: &mut Vec<Option<DevicePtr>>, id: AllocId) -> &mut Option<DevicePtr> {
    let i = id as usize;
    if i >= live.len() {
        live.resize(i + 1, None);
    }
    &mut live[i]
}

/// A malloc failed: count it when the program would have been refused (an out-of-memory, or a
/// request of 1 EB or more) and the replay goes on; any other error ends the replay.
fn note_refusal(
    out: &mut ReplayOutcome,
    workload: &Workload,
    op_index: usize,
    error: Error,
) -> Result<(), Error> {
    match error {
        Error::OutOfMemory(report) => note_oom(out, workload, op_index, *report),
        Error::RequestTooLarge { .. } => out.requests_too_large += 1,
        e => return Err(e),
    }
    Ok(())
}

fn note_oom(out: &mut ReplayOutcome, workload: &Workload, op_index: usize, report: OomReport) {
    if out.first_oom.is_none() {
        out.first_oom = Some(OomAt {
            op_index,
            source_index: workload.source_index.get(op_index).copied(),
            report,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{BlockSeed, MappedRunSeed, PoolKind, StreamId};
    use crate::trace::fixtures::alloc;

    const MIB: u64 = 1 << 20;

    fn workload(ops: Vec<Op>) -> Workload {
        let mut w = Workload::new("test");
        for (i, op) in ops.into_iter().enumerate() {
            w.push(op, i);
        }
        w
    }

    #[test]
    fn plain_replay_counts_device_calls_and_peaks() {
        let w = workload(vec![
            alloc(0, 5 * MIB),
            alloc(1, 5 * MIB),
            Op::Free { id: 0 },
            Op::Free { id: 7 },
            alloc(2, 30 * MIB),
            Op::Free { id: 1 },
            Op::Free { id: 2 },
            Op::EmptyCache,
        ]);
        let out = replay(
            &w,
            &ReplayConfig {
                check_invariants: true,
                ..Default::default()
            },
            None,
        )
        .unwrap();
        assert_eq!(out.allocs, 3);
        assert_eq!(out.skipped_frees, 1);
        assert_eq!(out.stats.counts.num_device_alloc, 2);
        assert_eq!(out.stats.counts.num_device_free, 2);
        assert_eq!(out.stats.reserved_bytes.all.peak, 50 * MIB as i64);
        assert_eq!(out.stats.requested_bytes.all.peak, 35 * MIB as i64);
        assert_eq!(out.final_segments, 0);
    }

    #[test]
    fn capacity_makes_an_oom_at_the_right_op() {
        let mut w = workload(vec![
            alloc(0, 60 * MIB),
            alloc(1, 60 * MIB),
            Op::Free { id: 1 },
        ]);
        w.source_index = vec![10, 11, 12];
        let config = ReplayConfig {
            capacity: Some(100 * MIB),
            device: DeviceId(3),
            ..Default::default()
        };
        let out = replay(&w, &config, None).unwrap();
        let oom = out.first_oom.expect("second allocation cannot fit");
        assert_eq!((oom.op_index, oom.source_index), (1, Some(11)));
        // The report names the device the replay stands for.
        assert_eq!(oom.report.device, DeviceId(3));
        assert!(
            oom.report
                .to_string()
                .contains("GPU 3 has a total capacity")
        );
        assert_eq!(out.stats.counts.num_ooms, 1);
        assert_eq!(
            out.skipped_frees, 1,
            "the failed allocation's free is skipped"
        );
    }

    fn recorded_oom(size: u64) -> Op {
        Op::Oom {
            size,
            stream: StreamId(0),
            device_free: 0,
        }
    }

    /// Without a capacity the recording's failed request is counted but not requested: on an
    /// unlimited device it would fit, and its segment would add a cudaMalloc and raise the peak.
    #[test]
    fn a_recorded_oom_is_not_requested_on_an_unlimited_device() {
        let w = workload(vec![
            alloc(0, 5 * MIB),
            recorded_oom(64 * MIB),
            Op::Free { id: 0 },
        ]);
        let out = replay(&w, &ReplayConfig::default(), None).unwrap();
        assert_eq!(out.recorded_oom_requests, 1);
        assert_eq!(out.first_oom, None);
        assert_eq!(out.stats.counts.num_device_alloc, 1);
        assert_eq!(out.stats.reserved_bytes.all.peak, 20 * MIB as i64);
    }

    /// With a capacity the failed request is requested again; when it fits it is freed at once,
    /// so its memory is cached for the next request, not held.
    #[test]
    fn a_recorded_oom_that_fits_is_freed_at_once() {
        let w = workload(vec![
            recorded_oom(60 * MIB),
            alloc(0, 60 * MIB),
            Op::Free { id: 0 },
        ]);
        let config = ReplayConfig {
            capacity: Some(100 * MIB),
            ..Default::default()
        };
        let out = replay(&w, &config, None).unwrap();
        assert_eq!(out.recorded_oom_requests, 1);
        assert_eq!(
            out.first_oom, None,
            "the cached 60 MiB serves the allocation"
        );
        assert_eq!(out.stats.counts.num_device_alloc, 1);
        assert_eq!((out.frees, out.stats.allocation.all.current), (1, 0));
    }

    /// A free held for its recorded completion (`record_stream`) on a smaller device than the
    /// recording's: the retry of a request that needs its memory synchronizes, which completes
    /// it, as PyTorch's `synchronize_and_free_events` would; the request then takes a segment
    /// at its address. The recorded completion that comes later is passed over (counted as
    /// the free it is), not applied to the allocation now at that address.
    #[test]
    fn a_free_completed_by_the_replay_s_retry_is_not_completed_again() {
        let config = ReplayConfig {
            capacity: Some(800 * MIB),
            check_invariants: true,
            ..Default::default()
        };
        let at = seeded_pool(&config, None)
            .unwrap()
            .malloc(500 * MIB, StreamId(0))
            .unwrap()
            .addr();
        let at_address = |id| Op::Alloc {
            id,
            size: 500 * MIB,
            stream: StreamId(0),
            recorded_addr: Some(at),
        };
        let w = workload(vec![
            at_address(0),
            alloc(1, 100 * MIB),
            Op::FreeRequested {
                id: 0,
                until_device_sync: false,
                outlasts_device_sync: false,
            },
            at_address(2),
            Op::Free { id: 0 },
            Op::Free { id: 2 },
        ]);
        let out = replay(&w, &config, None).unwrap();
        assert_eq!(out.first_oom, None);
        assert_eq!(out.allocs_at_recorded_addr, 2, "the address is reused");
        let c = out.stats.counts;
        assert_eq!((c.num_alloc_retries, c.num_device_free), (1, 1));
        assert_eq!((out.frees, out.skipped_frees), (2, 0));
        assert_eq!(out.stats.allocation.all.current, 1, "the 100 MiB");
    }

    /// The start state's segments and blocks are current when the replay begins, but no total
    /// has moved: its cudaMallocs and allocations happened before the recording.
    #[test]
    fn a_seeded_start_counts_no_allocation_or_cudamalloc() {
        const BASE: u64 = 0x7f00_0000_0000;
        let block = |addr, size, allocated| BlockSeed {
            addr,
            size,
            requested: if allocated { size } else { 0 },
            allocated,
        };
        let start = StartLayout {
            segments: vec![SegmentSeed {
                addr: BASE,
                size: 20 * MIB,
                stream: StreamId(0),
                pool: PoolKind::Large,
                blocks: vec![
                    block(BASE, 4 * MIB, true),
                    block(BASE + 4 * MIB, 16 * MIB, false),
                ],
            }],
            ids: vec![vec![Some(0), None]],
            ..Default::default()
        };
        let mut w = workload(vec![Op::Free { id: 0 }]);
        w.num_ids = 1;
        let out = replay(&w, &ReplayConfig::default(), Some(&start)).unwrap();
        assert_eq!((out.frees, out.skipped_frees), (1, 0));
        let s = &out.stats;
        assert_eq!(s.counts.num_device_alloc, 0);
        let reserved = s.reserved_bytes.all;
        assert_eq!((reserved.current, reserved.allocated), (20 * MIB as i64, 0));
        let allocation = s.allocation.all;
        assert_eq!(
            (allocation.current, allocation.allocated, allocation.freed),
            (0, 0, 1)
        );
    }

    /// A start state's expandable segments hold their mapped pages: a device too small for
    /// them is refused before the replay, naming what the start state holds.
    #[test]
    fn a_start_state_of_mapped_pages_beyond_the_capacity_is_refused() {
        const RANGE: u64 = 0x7f00_0000_0000;
        let start = StartLayout {
            ranges: vec![RangeSeed {
                addr: RANGE,
                size: 100 * MIB,
                stream: StreamId(0),
                pool: PoolKind::Large,
                runs: vec![MappedRunSeed {
                    addr: RANGE,
                    size: 40 * MIB,
                    blocks: vec![BlockSeed {
                        addr: RANGE,
                        size: 40 * MIB,
                        requested: 40 * MIB,
                        allocated: true,
                    }],
                }],
            }],
            ..Default::default()
        };
        let mut config = ReplayConfig {
            capacity: Some(30 * MIB),
            ..Default::default()
        };
        config.settings.expandable_segments = true;
        let Err(Error::InvalidSeed(why)) = seeded_pool(&config, Some(&start)) else {
            panic!("40 MiB of pages on a device of 30 MiB");
        };
        assert!(
            why.contains(
                "the start state's segments hold 40.00 MiB (41943040 bytes), more than \
                 the device capacity of 30.00 MiB"
            ),
            "{why}"
        );
    }

    /// The replay's device puts each new segment where its placement says: bottom-up above
    /// the last one (as `--placement bottom-up` asks), top-down below it.
    #[test]
    fn segments_go_where_the_placement_says() {
        for (placement, ascending) in [(Placement::BottomUp, true), (Placement::TopDown, false)] {
            let config = ReplayConfig {
                placement,
                ..Default::default()
            };
            let mut pool = seeded_pool(&config, None).unwrap();
            let first = pool.malloc(30 * MIB, StreamId(0)).unwrap().addr();
            let second = pool.malloc(30 * MIB, StreamId(0)).unwrap().addr();
            assert_eq!(second > first, ascending, "{placement:?}");
        }
    }

    /// A request of 1 EB or more is refused as PyTorch refuses it, and the replay goes on.
    #[test]
    fn a_request_over_1_eb_is_refused_and_the_replay_goes_on() {
        let w = workload(vec![
            alloc(0, u64::MAX),
            alloc(1, 5 * MIB),
            Op::Free { id: 0 },
            Op::Free { id: 1 },
        ]);
        let out = replay(&w, &ReplayConfig::default(), None).unwrap();
        assert_eq!(out.requests_too_large, 1);
        assert_eq!((out.frees, out.skipped_frees), (1, 1));
        assert_eq!(out.stats.counts.num_ooms, 0, "PyTorch counts no OOM for it");
        assert_eq!(out.stats.allocation.all.allocated, 1);
    }
}
