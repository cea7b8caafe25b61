//! Turning one device's recording into a [`Workload`].
//!
//! - `alloc` → `Op::Alloc` with a fresh id (in trace order) and `recorded_addr`.
//! - The free action (`free_completed`, or `free_requested` in a file without completions; see
//!   `DeviceRecording::free_action`) → `Op::Free` of the id live at that address. A
//!   `free_requested` that the next entry does not complete (a free that waited for the
//!   streams of `record_stream`) → `Op::FreeRequested`, where the allocation statistics drop
//!   it, as PyTorch's `free()` does.
//! - An explicit `empty_cache()` burst → one `Op::EmptyCache`, at the burst's first entry. The
//!   OOM ladder's own releases are not operations (see `bursts`).
//! - `oom` → `Op::Oom`, which a replay with a capacity retries as a probe allocation.
//! - Segment entries, `snapshot` and `annotate` produce nothing: the replayed pool makes its own
//!   segment calls.
//!
//! Two modes. **Plain**: replay from an empty pool; frees of addresses allocated before
//! recording began ("orphan frees") are skipped (counted in the figures), and an allocation at
//! an address still live (the trace lacks a free) frees the earlier allocation first.
//! **Faithful**: replay from the rebuilt start state ([`StartState`]); blocks live at trace
//! start that the trace frees carry ids `0..k` and trace allocations continue from `k`, so no
//! free is an orphan; an allocation at a live address is an error.
//! `source_index` is the index of the trace entry each op came from.

use rustc_hash::FxHashMap;

use super::bursts::{BurstKind, release_bursts};
use super::error::TraceError;
use super::ranges::RangeChange;
use super::recording::{Action, CallSite, DeviceRecording, TraceEntry};
use super::retry_sync::{AtRetry, completed_at_retries};
use super::start_state::{StartState, reconstruct_start};
use super::workload::{AllocId, Op, Workload};

/// Everything a faithful replay needs.
#[derive(Clone, Debug, PartialEq)]
pub struct FaithfulReplay {
    /// Pool state to install before the first op.
    pub start: StartState,
    pub workload: Workload,
    /// Device capacity to simulate, when the recording implies one (see `capacity`).
    pub capacity: Option<u64>,
    /// The ranges of expandable segments at the start (`RangeChange::Adopt`), then the
    /// recording's changes to them: where the replay finds where to reserve its ranges.
    pub range_changes: Vec<RangeChange>,
}

impl DeviceRecording {
    /// The workload replayed from an empty pool (orphan frees skipped).
    pub fn plain(&self) -> Workload {
        let mut live = FxHashMap::default();
        // Plain mode tolerates everything; errors only arise for seeded ids.
        build(self, &mut live, None, false).unwrap_or_else(|_| Workload::new(self.name()))
    }

    /// The start state and workload for a replay that reproduces the recording exactly, on
    /// the device the recording implies.
    pub fn faithful(&self) -> Result<FaithfulReplay, TraceError> {
        self.faithful_on(None)
    }

    /// As `faithful`, on a device of `device_memory` bytes when it is known (`--device-memory`):
    /// the ranges of expandable segments there at the start are sized from it.
    pub fn faithful_on(&self, device_memory: Option<u64>) -> Result<FaithfulReplay, TraceError> {
        let start = reconstruct_start(self, device_memory)?;
        let mut live: FxHashMap<u64, Option<AllocId>> =
            start.live_blocks().map(|b| (b.addr, b.id)).collect();
        let workload = build(self, &mut live, Some(&start), true)?;
        let capacity = self.capacity().and_then(|c| c.replay_capacity());
        Ok(FaithfulReplay {
            range_changes: start.range_changes(self),
            start,
            workload,
            capacity,
        })
    }
}

/// Build the workload. `live` maps addresses live at trace start to their ids (`None`: live but
/// never freed by the trace); `start`, the state at trace start where it is known (its ids
/// come first). With `strict`, a free that finds no id is an error.
fn build(
    rec: &DeviceRecording,
    live: &mut FxHashMap<u64, Option<AllocId>>,
    start: Option<&StartState>,
    strict: bool,
) -> Result<Workload, TraceError> {
    let first_id = start.map_or(0, StartState::num_ids);
    let fail = |index: usize, detail: String| {
        TraceError::inconsistent(
            &rec.source,
            format!("device {} entry {index}: {detail}", rec.device.0),
        )
    };
    let mut workload = Workload::new(rec.name());
    workload.num_ids = first_id;
    let mut next_id = first_id;
    let free_action = rec.free_action();
    let all_bursts = release_bursts(&rec.entries);
    let empty_cache_starts: Vec<usize> = all_bursts
        .iter()
        .filter(|b| b.kind == BurstKind::EmptyCache)
        .map(|b| b.start)
        .collect();
    let mut bursts = empty_cache_starts.iter().peekable();
    let at_retry = if free_action == Action::FreeCompleted {
        completed_at_retries(&rec.entries, &all_bursts, start.map(|s| &s.segments[..]))
    } else {
        vec![None; rec.entries.len()]
    };
    for (index, entry) in rec.entries.iter().enumerate() {
        match entry.action {
            Action::Alloc => {
                let id = next_id;
                next_id += 1;
                match live.insert(entry.addr, Some(id)) {
                    Some(_) if strict => {
                        return Err(fail(
                            index,
                            format!("alloc at {:#x}, which is already live", entry.addr),
                        ));
                    }
                    // The trace lacks the earlier allocation's free: free it here, where the
                    // recorded program must have freed it.
                    Some(Some(earlier)) => workload.push(Op::Free { id: earlier }, index),
                    _ => {}
                }
                workload.push(
                    Op::Alloc {
                        id,
                        size: entry.size,
                        stream: entry.stream,
                        recorded_addr: Some(entry.addr),
                    },
                    index,
                );
            }
            a if a == free_action => match live.remove(&entry.addr) {
                Some(Some(id)) => match at_retry[index] {
                    Some(at) => {
                        let first_in_request = at == AtRetry::FirstInRequest;
                        let op = Op::FreeAtSync {
                            id,
                            first_in_request,
                        };
                        workload.push(op, index);
                    }
                    None => workload.push(Op::Free { id }, index),
                },
                Some(None) if strict => {
                    return Err(fail(
                        index,
                        format!(
                            "free at {:#x} of a block the start state says is never freed",
                            entry.addr
                        ),
                    ));
                }
                None if strict => {
                    return Err(fail(
                        index,
                        format!("free at {:#x}, where nothing is live", entry.addr),
                    ));
                }
                _ => {}
            },
            Action::SegmentFree | Action::SegmentUnmap => {
                if bursts.peek().is_some_and(|&&start| start == index) {
                    bursts.next();
                    workload.push(Op::EmptyCache, index);
                }
            }
            Action::Oom => workload.push(
                Op::Oom {
                    size: entry.size,
                    stream: entry.stream,
                    device_free: entry.device_free.unwrap_or(0),
                },
                index,
            ),
            // A free that waited for device work (`record_stream`): it leaves the allocation
            // statistics here, its block the pool only at its completion.
            Action::FreeRequested if free_action == Action::FreeCompleted => {
                if let Some(&Some(id)) = live.get(&entry.addr)
                    && !completes_at_once(&rec.entries, index)
                {
                    let op = Op::FreeRequested {
                        id,
                        until_device_sync: false,
                        outlasts_device_sync: false,
                    };
                    workload.push(op, index);
                }
            }
            Action::FreeRequested
            | Action::FreeCompleted
            | Action::SegmentAlloc
            | Action::SegmentMap
            | Action::Snapshot
            | Action::Annotate => {}
        }
    }
    Ok(workload)
}

/// Whether the `free_requested` at `index` completes at once: the next entry completes it, and
/// its frames do not place it in a later call (a completion whose frames name `malloc` or
/// `empty_cache` was found by that call: the free waited, and the allocator found its work
/// done, or synchronized, as soon as the program's next call began).
pub(super) fn completes_at_once(entries: &[TraceEntry], index: usize) -> bool {
    let request = &entries[index];
    entries.get(index + 1).is_some_and(|e| {
        e.action == Action::FreeCompleted
            && e.addr == request.addr
            && !matches!(e.call_site, CallSite::Malloc | CallSite::EmptyCache)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{PoolKind, StreamId};
    use crate::trace::fixtures::{BASE, MIB, at, entry, oom, recording, segment};
    use crate::trace::recording::CallSite;

    /// A 2 MiB small segment lives from before the trace with one block the trace frees; the
    /// trace allocates, frees, calls empty_cache() (which releases its new segment and the old
    /// one), then fails a request.
    fn sample() -> DeviceRecording {
        let old = BASE + 100 * MIB;
        recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                entry(Action::Alloc, BASE, 3 * MIB),
                entry(Action::FreeRequested, old, 4096),
                entry(Action::FreeCompleted, old, 4096),
                entry(Action::FreeRequested, BASE, 3 * MIB),
                entry(Action::FreeCompleted, BASE, 3 * MIB),
                at(Action::SegmentFree, BASE, 20 * MIB, CallSite::EmptyCache),
                at(Action::SegmentFree, old, 2 * MIB, CallSite::EmptyCache),
                entry(Action::Alloc, BASE + 40 * MIB, 700),
                oom(64 * MIB, 10 * MIB),
            ],
            vec![segment(
                BASE + 40 * MIB,
                2 * MIB,
                &[(0, 1024, 700, true), (1024, 2 * MIB - 1024, 0, false)],
            )],
        )
    }

    #[test]
    fn plain_skips_orphan_frees_and_keeps_empty_cache_and_oom() {
        let rec = recording(
            // The small segment the last alloc lands in is cudaMalloc'd in the trace.
            {
                let mut e = sample().entries;
                e.insert(8, entry(Action::SegmentAlloc, BASE + 40 * MIB, 2 * MIB));
                e
            },
            sample().segments,
        );
        let w = rec.plain();
        let stream = StreamId(0);
        assert_eq!(
            w.ops,
            vec![
                Op::Alloc {
                    id: 0,
                    size: 3 * MIB,
                    stream,
                    recorded_addr: Some(BASE)
                },
                Op::Free { id: 0 },
                Op::EmptyCache,
                Op::Alloc {
                    id: 1,
                    size: 700,
                    stream,
                    recorded_addr: Some(BASE + 40 * MIB)
                },
                Op::Oom {
                    size: 64 * MIB,
                    stream,
                    device_free: 10 * MIB
                },
            ]
        );
        assert_eq!(w.source_index, vec![1, 5, 6, 9, 10]);
        assert_eq!(w.num_ids, 2);
        assert_eq!(rec.figures().orphan_frees, 1);
    }

    #[test]
    fn faithful_seeds_the_blocks_the_trace_frees() {
        let rec = recording(
            {
                let mut e = sample().entries;
                e.insert(8, entry(Action::SegmentAlloc, BASE + 40 * MIB, 2 * MIB));
                e
            },
            sample().segments,
        );
        let replay = rec.faithful().unwrap();
        // The old small segment, with the 4 KiB block (id 0) the trace frees.
        assert_eq!(replay.start.segments.len(), 1);
        let seg = &replay.start.segments[0];
        assert_eq!((seg.addr, seg.pool), (BASE + 100 * MIB, PoolKind::Small));
        assert_eq!(seg.blocks[0].id, Some(0));
        assert_eq!(seg.blocks[0].size, 4096);
        let w = &replay.workload;
        assert_eq!(w.num_ids, 3);
        assert!(matches!(w.ops[0], Op::Alloc { id: 1, .. }));
        assert_eq!(w.ops[1], Op::Free { id: 0 });
        assert_eq!(w.ops[2], Op::Free { id: 1 });
        // Capacity from the OOM: reserved there (2 MiB) + device_free (10 MiB).
        assert_eq!(replay.capacity, Some(12 * MIB));
    }

    #[test]
    fn faithful_reports_a_recording_it_cannot_rebuild() {
        // The last alloc lands outside every segment the recording knows.
        let mut rec = sample();
        rec.entries[8].addr = BASE + 80 * MIB;
        let err = rec.faithful().unwrap_err().to_string();
        assert!(
            err.contains("test.pickle") && err.contains("entry 8") && err.contains("no segment"),
            "{err}"
        );
    }

    /// A `free_requested` that the next entry does not complete, because that entry completes
    /// another block, waits: it leaves the allocation statistics at once. Completed right
    /// before an `oom`, the frees were completed by its retry's synchronization. An `oom` keeps
    /// its stream, as the request that failed had it.
    #[test]
    fn a_free_is_completed_at_once_only_by_its_own_completion() {
        let stream = StreamId(7);
        let rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                entry(Action::Alloc, BASE, 3 * MIB),
                entry(Action::Alloc, BASE + 3 * MIB, 3 * MIB),
                entry(Action::FreeRequested, BASE + 3 * MIB, 3 * MIB),
                entry(Action::FreeRequested, BASE, 3 * MIB),
                entry(Action::FreeCompleted, BASE + 3 * MIB, 3 * MIB),
                entry(Action::FreeCompleted, BASE, 3 * MIB),
                TraceEntry {
                    stream,
                    ..oom(64 * MIB, MIB)
                },
            ],
            vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
        );
        let ops = rec.plain().ops;
        assert_eq!(
            ops[2..],
            [
                Op::FreeRequested {
                    id: 1,
                    until_device_sync: false,
                    outlasts_device_sync: false,
                },
                Op::FreeRequested {
                    id: 0,
                    until_device_sync: false,
                    outlasts_device_sync: false,
                },
                Op::FreeAtSync {
                    id: 1,
                    first_in_request: true
                },
                Op::FreeAtSync {
                    id: 0,
                    first_in_request: true
                },
                Op::Oom {
                    size: 64 * MIB,
                    stream,
                    device_free: MIB
                }
            ]
        );
    }

    /// A request that ran out of memory while a free waited for another stream: PyTorch's
    /// retry synchronizes (`release_cached_blocks`), which completes the free after the
    /// request's search for a free block, then releases the segment the free left wholly free,
    /// and the retry gets a new segment. Replayed before the request, the completion would
    /// serve it from the freed block instead.
    #[test]
    fn a_free_completed_by_a_retry_returns_after_the_search() {
        let (a, b, c) = (BASE + 200 * MIB, BASE + 100 * MIB, BASE + 300 * MIB);
        let malloc = |action, addr, size| at(action, addr, size, CallSite::Malloc);
        let rec = recording(
            vec![
                malloc(Action::SegmentAlloc, a, 40 * MIB),
                malloc(Action::Alloc, a, 40 * MIB),
                at(Action::FreeRequested, a, 40 * MIB, CallSite::Other),
                malloc(Action::SegmentAlloc, b, 40 * MIB),
                malloc(Action::Alloc, b, 40 * MIB),
                // A 30 MiB request: no free block, 80 + 30 MiB do not fit in 100.
                malloc(Action::FreeCompleted, a, 40 * MIB),
                malloc(Action::SegmentFree, a, 40 * MIB),
                malloc(Action::SegmentAlloc, c, 30 * MIB),
                malloc(Action::Alloc, c, 30 * MIB),
            ],
            vec![
                segment(c, 30 * MIB, &[(0, 30 * MIB, 30 * MIB, true)]),
                segment(b, 40 * MIB, &[(0, 40 * MIB, 40 * MIB, true)]),
            ],
        );
        let config = crate::trace::ReplayConfig {
            capacity: Some(100 * MIB),
            ..Default::default()
        };
        let run = crate::trace::replay_faithful(&rec, &config).unwrap();
        let (out, recorded) = (&run.outcome, &run.recorded);
        let counts = &out.stats.counts;
        assert_eq!(
            (
                out.allocs_at_recorded_addr,
                counts.num_device_alloc,
                counts.num_device_free,
                counts.num_alloc_retries
            ),
            (3, 3, 1, 1)
        );
        assert_eq!(
            (recorded.recorded_segment_allocs, recorded.recorded_retries),
            (3, 1)
        );
    }

    /// Two allocations at one address with no free between: plain mode frees the earlier one
    /// there (the recorded program must have), faithful mode refuses the recording.
    #[test]
    fn an_alloc_at_a_live_address_frees_the_earlier_one_in_plain_mode() {
        let rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                entry(Action::Alloc, BASE, 3 * MIB),
                entry(Action::Alloc, BASE, 3 * MIB),
                entry(Action::FreeCompleted, BASE, 3 * MIB),
            ],
            vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
        );
        let w = rec.plain();
        let alloc = |id| Op::Alloc {
            id,
            size: 3 * MIB,
            stream: StreamId(0),
            recorded_addr: Some(BASE),
        };
        assert_eq!(
            w.ops,
            vec![alloc(0), Op::Free { id: 0 }, alloc(1), Op::Free { id: 1 }]
        );
        assert_eq!(w.source_index, vec![1, 2, 2, 3]);
        assert_eq!(rec.figures().missing_frees, 1);
        assert_eq!(sample().figures().missing_frees, 0);
        let err = rec.faithful().unwrap_err().to_string();
        assert!(err.contains("cannot be replayed faithfully"), "{err}");
    }

    /// A free that waited for `record_stream` streams: requested, then completed after another
    /// allocation. The workload frees it from the allocation statistics at the request (as
    /// PyTorch's `free()` does) and returns its block at the completion; a completion that
    /// follows its request at once stays one `Free`.
    #[test]
    fn a_free_completed_later_than_requested_leaves_allocation_at_the_request() {
        let rec = recording(
            vec![
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
                entry(Action::Alloc, BASE, 3 * MIB),
                entry(Action::FreeRequested, BASE, 3 * MIB),
                entry(Action::Alloc, BASE + 3 * MIB, 3 * MIB),
                entry(Action::FreeCompleted, BASE, 3 * MIB),
                entry(Action::FreeRequested, BASE + 3 * MIB, 3 * MIB),
                entry(Action::FreeCompleted, BASE + 3 * MIB, 3 * MIB),
            ],
            vec![segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)])],
        );
        let w = rec.plain();
        let alloc = |id, at| Op::Alloc {
            id,
            size: 3 * MIB,
            stream: StreamId(0),
            recorded_addr: Some(at),
        };
        assert_eq!(
            w.ops,
            vec![
                alloc(0, BASE),
                Op::FreeRequested {
                    id: 0,
                    until_device_sync: false,
                    outlasts_device_sync: false,
                },
                alloc(1, BASE + 3 * MIB),
                Op::Free { id: 0 },
                Op::Free { id: 1 },
            ]
        );
        let out = crate::trace::replay::replay(&w, &Default::default(), None).unwrap();
        assert_eq!(
            out.ops, 4,
            "a free requested and completed later is one event"
        );
        assert_eq!(out.frees, 2);
        let s = out.stats;
        assert_eq!(s.allocation.all.peak, 1, "{s:?}");
        assert_eq!(s.allocated_bytes.all.peak, 3 * MIB as i64);
        assert_eq!(s.active.all.peak, 2);
        assert_eq!(s.requested_bytes.all.peak, 6 * MIB as i64);
        assert_eq!(s.allocation.all.current, 0);
        assert_eq!(s.active.all.current, 0);
    }
}
