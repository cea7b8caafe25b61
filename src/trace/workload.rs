//! A workload: the sequence of operations a replay drives through the pool.
//!
//! Readers (PyTorch snapshots, our own format, RMM logs) and the synthetic generator all produce
//! this; replay, sweep and the benchmarks consume it. Allocations are named by a dense id so a
//! free needs no address lookup.

use crate::pool::StreamId;

/// Dense id of one allocation within a workload (index into the live table).
pub type AllocId = u32;

/// One step of a workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// The program asks for `size` bytes (the requested, unrounded size) on `stream`.
    /// `recorded_addr` is where the recording allocator put it, when known.
    Alloc {
        id: AllocId,
        size: u64,
        stream: StreamId,
        recorded_addr: Option<u64>,
    },
    /// The program frees allocation `id`; after an `Op::FreeRequested` of it, that free
    /// completes here (its block is reusable from here on).
    Free { id: AllocId },
    /// The program freed allocation `id`, but the recording returned its block to the pool
    /// only later, at the `Op::Free` of it (a free that waited for device work: a
    /// `free_requested` whose `free_completed` does not follow at once). The allocation leaves
    /// the allocation statistics here, as in the recorded allocator. A synchronization of the
    /// replay's pool before that `Op::Free` completes it (as one would have in the program).
    /// `until_device_sync`: the free waits for a device synchronization (the library's
    /// `cudaFree` under `free_sync:device` or `event`), so the pool synchronizes before it
    /// grows while the free waits; otherwise (PyTorch's `record_stream`) only an
    /// out-of-memory retry or `empty_cache()` synchronizes. `outlasts_device_sync`: the free
    /// waits for a stream of another device, which the recorded pool's synchronization before
    /// growing did not cover (a cachealloc trace's free still waiting after a
    /// `sync_before_growth` that completed others): the replay's synchronizations before
    /// growing do not complete it either.
    FreeRequested {
        id: AllocId,
        until_device_sync: bool,
        outlasts_device_sync: bool,
    },
    /// The free of allocation `id` completed in the recording inside the next request, at the
    /// synchronization of its out-of-memory retry (PyTorch's `release_cached_blocks`): after
    /// that request's search for a free block, which did not see its block. The replay holds
    /// the block until its pool synchronizes, or until that request is served without a
    /// synchronization. (Its free was requested before: at an `Op::FreeRequested`, or before
    /// the recording began.) `first_in_request`: the trace shows no release of that request's
    /// before it, so that a garbage collection, which runs before the synchronization, released
    /// nothing: where the replay's would release a segment, the free was completed before the
    /// request (`process_events`, which the trace shows alike) instead.
    FreeAtSync { id: AllocId, first_in_request: bool },
    /// The free of allocation `id`, requested before (`Op::FreeRequested`), completed in the
    /// recording where its pool synchronized the device before growing (a cachealloc trace's
    /// `sync_before_growth`, version 7). The replay leaves it to its own pool: it completes at
    /// the pool's next synchronization (before growing, which the next request makes where it
    /// too finds no free block while a free waits for the device; an out-of-memory retry;
    /// `empty_cache()`), as the program's pool would have completed it on the replay's
    /// device, not here where the recorded pool's did.
    FreeAtGrowthSync { id: AllocId },
    /// The program synchronized the device (a cachealloc trace's `device_synchronize`, version
    /// 7): the frees it completed follow as `Op::Free`s (not those it did not cover: a free
    /// waiting for another device's stream, or made by another thread while it ran); the
    /// replay completes here those it left to its pool (`Op::FreeAtGrowthSync`), whose
    /// recorded completion came before. Not one of the pool's synchronizations.
    DeviceSynchronize,
    /// The program called `empty_cache()`.
    EmptyCache,
    /// The next request (`Alloc` or `Oom`) or `EmptyCache` ran while a CUDA graph capture was
    /// underway, and the recorded pool missed (or emptied nothing) for it (a cachealloc
    /// trace's `capture`): the replay runs it with the simulated device capturing, so that the
    /// pool only asks for new memory (no synchronization, no release), or does nothing.
    Capture,
    /// The program reset the device (`cudaDeviceReset()`, in a cachealloc trace): the recorded
    /// pool was dropped with its memory, without a cudaFree. Preceded by the frees of every
    /// live allocation, it is replayed as an `empty_cache()` whose returns of memory to the
    /// device are not counted as device calls, nor its synchronization as one.
    DeviceReset,
    /// The program set the pool's memory fraction (a cachealloc trace's `memory_fraction`):
    /// from here on the pool may reserve `fraction` of the device's total memory (1 = no
    /// limit).
    MemoryFraction { fraction: f64 },
    /// A request that ran out of memory in the recording (it has no `Alloc`). With a capacity
    /// set, replay retries it as a probe allocation. `size`: what the program asked for where
    /// the recording says (a cachealloc trace), else the rounded request (PyTorch's trace).
    Oom {
        size: u64,
        stream: StreamId,
        device_free: u64,
    },
}

impl Op {
    /// The allocation whose free this op completes (`Free`; `FreeAtSync` and `FreeAtGrowthSync`,
    /// completed at a later synchronization), if any: it is no longer live after it.
    pub fn freed_id(&self) -> Option<AllocId> {
        match *self {
            Op::Free { id } | Op::FreeAtSync { id, .. } | Op::FreeAtGrowthSync { id } => Some(id),
            Op::Alloc { .. }
            | Op::FreeRequested { .. }
            | Op::DeviceSynchronize
            | Op::EmptyCache
            | Op::Capture
            | Op::DeviceReset
            | Op::MemoryFraction { .. }
            | Op::Oom { .. } => None,
        }
    }
}

/// A sequence of operations plus where each came from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    /// Human-readable origin (file name, generator and seed).
    pub name: String,
    pub ops: Vec<Op>,
    /// For each op, the index of the entry in the source trace it came from (same length as
    /// `ops`; empty for generated workloads).
    pub source_index: Vec<usize>,
    /// Number of distinct allocation ids used (ids are `0..num_ids`).
    pub num_ids: u32,
}

impl Workload {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// Append an op that came from source entry `index`.
    pub fn push(&mut self, op: Op, index: usize) {
        if let Op::Alloc { id, .. } = op {
            self.num_ids = self.num_ids.max(id + 1);
        }
        self.ops.push(op);
        self.source_index.push(index);
    }

    /// The memory fractions the program set as it ran (`Op::MemoryFraction`), in order.
    pub fn memory_fractions(&self) -> impl Iterator<Item = f64> + '_ {
        self.ops.iter().filter_map(|op| match *op {
            Op::MemoryFraction { fraction } => Some(fraction),
            _ => None,
        })
    }

    /// Set every memory fraction the program sets as it runs (`Op::MemoryFraction`) to
    /// `fraction`: the workload of a program that set that one instead.
    pub fn set_memory_fractions(&mut self, fraction: f64) {
        for op in &mut self.ops {
            if let Op::MemoryFraction { fraction: set } = op {
                *set = fraction;
            }
        }
    }

    /// The memory fraction in force at every request of the workload (its allocations and the
    /// recording's failed requests): `configured`, or what the program set before its first
    /// request; `None` when the program changed it between two requests (no one limit holds
    /// throughout).
    pub fn fraction_throughout(&self, configured: f64) -> Option<f64> {
        let mut current = configured;
        let mut at_requests: Option<f64> = None;
        for op in &self.ops {
            match *op {
                Op::MemoryFraction { fraction } => current = fraction,
                Op::Alloc { .. } | Op::Oom { .. } => match at_requests {
                    None => at_requests = Some(current),
                    Some(f) if f != current => return None,
                    Some(_) => {}
                },
                _ => {}
            }
        }
        Some(at_requests.unwrap_or(current))
    }

    /// Number of allocations (not frees) in the workload.
    pub fn allocs(&self) -> usize {
        self.ops
            .iter()
            .filter(|op| matches!(op, Op::Alloc { .. }))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(ops: Vec<Op>) -> Workload {
        let mut w = Workload::new("test");
        for op in ops {
            w.push(op, 0);
        }
        w
    }

    fn alloc(id: AllocId) -> Op {
        Op::Alloc {
            id,
            size: 512,
            stream: StreamId(0),
            recorded_addr: None,
        }
    }

    /// The fraction at every request: the configured one, or the program's set before its
    /// first request (the last of those); set again to the same value, still one; changed
    /// between two requests, none — a change after the last request, or before a recorded
    /// failure, counts like one before an allocation.
    #[test]
    fn the_fraction_in_force_throughout_is_the_one_before_the_first_request() {
        let set = |fraction| Op::MemoryFraction { fraction };
        let oom = Op::Oom {
            size: 512,
            stream: StreamId(0),
            device_free: 0,
        };
        assert_eq!(workload(vec![alloc(0)]).fraction_throughout(0.5), Some(0.5));
        assert_eq!(
            workload(vec![set(0.9), set(0.7), alloc(0), Op::Free { id: 0 }])
                .fraction_throughout(0.5),
            Some(0.7)
        );
        assert_eq!(
            workload(vec![set(0.7), alloc(0), set(0.7), alloc(1)]).fraction_throughout(1.0),
            Some(0.7)
        );
        assert_eq!(
            workload(vec![alloc(0), set(0.7), alloc(1)]).fraction_throughout(1.0),
            None
        );
        assert_eq!(
            workload(vec![alloc(0), set(0.7), oom]).fraction_throughout(1.0),
            None
        );
        assert_eq!(
            workload(vec![alloc(0), set(0.7)]).fraction_throughout(1.0),
            Some(1.0)
        );
        assert_eq!(workload(vec![set(0.7)]).fraction_throughout(1.0), Some(0.7));
    }
}
