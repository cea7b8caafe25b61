//! Shared by the benchmark binary and its bounded test: replay one operation sequence through
//! the pool and through offset-allocator, and time both.

pub mod equal_size;
pub mod options;
pub mod same_work;

use cachealloc::backend::sim::SimDevice;
use cachealloc::pool::{DeviceAllocator, DevicePtr, Settings};
use cachealloc::trace::{Op, ReplayConfig, Workload, replay};
use std::time::Instant;

/// offset-allocator counts in u32 units; 512 B units give it a 2 TiB range.
const OFFSET_UNIT: u64 = 512;
/// The most allocations offset-allocator's node table holds at once.
const OFFSET_MAX_ALLOCS: u32 = 1 << 20;

/// A fresh offset-allocator of the whole range (its node table allocated and written here).
pub fn new_offset_allocator() -> offset_allocator::Allocator<u32> {
    offset_allocator::Allocator::<u32>::with_max_allocs(u32::MAX, OFFSET_MAX_ALLOCS)
}

/// One timing: best and median nanoseconds per operation over the repetitions.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub min_ns: f64,
    pub median_ns: f64,
}

/// The best and the median of `samples` (at least one); the median of an even number of
/// samples is the mean of the two middle ones.
pub fn timing(mut samples: Vec<f64>) -> Timing {
    samples.sort_by(|a, b| a.partial_cmp(b).expect("no NaN timings"));
    let middle = samples.len() / 2;
    let median_ns = if samples.len().is_multiple_of(2) {
        (samples[middle - 1] + samples[middle]) / 2.0
    } else {
        samples[middle]
    };
    Timing {
        min_ns: samples[0],
        median_ns,
    }
}

/// The id → handle table of a replay, with its pages touched now rather than inside the timed
/// loop (a zeroed allocation is mapped lazily, and first-touch page faults are not allocator
/// work).
fn untimed_table<T: Clone>(len: usize) -> Vec<Option<T>> {
    let mut table = vec![None; len];
    for slot in table.iter_mut() {
        *slot = std::hint::black_box(None);
    }
    table
}

/// The alloc/free operations of a workload, for the allocator comparison. A free that completed
/// at a later synchronization in the recording (`FreeAtSync`, `FreeAtGrowthSync`) is a `Free`
/// there, as every other completed free; the operations offset-allocator has no counterpart for
/// (a free's request, `empty_cache`, synchronizations, ...) are dropped.
pub fn alloc_free_ops(workload: &Workload) -> Vec<Op> {
    (workload.ops.iter())
        .filter_map(|op| match op {
            Op::Alloc { .. } => Some(op.clone()),
            _ => op.freed_id().map(|id| Op::Free { id }),
        })
        .collect()
}

/// Replay `ops` on `pool` (the untimed warm-up, the body of the timed pass, and the harness
/// test), handing each new allocation to `placed` (a no-op in the timed pass).
#[inline(always)]
pub fn run_pool(
    pool: &mut DeviceAllocator<SimDevice>,
    live: &mut [Option<DevicePtr>],
    ops: &[Op],
    mut placed: impl FnMut(DevicePtr),
) {
    for op in ops {
        match *op {
            Op::Alloc {
                id, size, stream, ..
            } => {
                let ptr = pool.malloc(size, stream).expect("unlimited device");
                placed(ptr);
                live[id as usize] = Some(ptr);
            }
            Op::Free { id } => {
                if let Some(ptr) = live[id as usize].take() {
                    pool.free(ptr).expect("live pointer");
                }
            }
            _ => {}
        }
    }
}

/// A pool whose tables are sized for `ops` but which holds nothing: one untimed pass, then
/// everything freed and `empty_cache()`. It starts the timed pass in the state of a fresh
/// pool (no segments, no blocks, block ids from 0) — as a training loop's pool is after its
/// first step — the way offset-allocator starts with its node table allocated at
/// construction.
pub fn warm_pool(ops: &[Op], num_ids: usize) -> DeviceAllocator<SimDevice> {
    let mut pool = DeviceAllocator::new(SimDevice::new(u64::MAX), Settings::default());
    let mut live = vec![None; num_ids];
    run_pool(&mut pool, &mut live, ops, |_| {});
    for ptr in live.into_iter().flatten() {
        pool.free(ptr).expect("live pointer");
    }
    pool.empty_cache().expect("sim device releases");
    assert_eq!(pool.stats().segment.all.current, 0, "warm pool is empty");
    pool.reset_accumulated_stats();
    pool.reset_peak_stats();
    pool
}

/// One timed pass of a pool on an unlimited simulated device: ns per malloc-or-free. The pool
/// and the id table are made by the caller, outside the clock, and the pool is handed back to
/// be dropped outside it. (Never inlined: scripts/bench-instructions.sh counts the
/// instructions inside it.)
#[inline(never)]
pub fn pool_pass(
    mut pool: DeviceAllocator<SimDevice>,
    mut live: Vec<Option<DevicePtr>>,
    ops: &[Op],
) -> (f64, DeviceAllocator<SimDevice>) {
    let start = Instant::now();
    run_pool(&mut pool, &mut live, ops, |_| {});
    let ns = start.elapsed().as_nanos() as f64 / ops.len() as f64;
    std::hint::black_box(pool.stats().allocation.all.current);
    (ns, pool)
}

/// One timed pass of a fresh offset-allocator (sizes rounded up to 512 B units): ns per
/// allocate-or-free. Its node storage is allocated by the caller, outside the clock, and it is
/// handed back to be dropped outside it. (Never inlined, as `pool_pass`.) It does not look at
/// what `allocate` answers: `same_work::check` has made sure, before, that every allocation
/// succeeds and every size fits a u32 count of units.
#[inline(never)]
pub fn offset_allocator_pass(
    mut alloc: offset_allocator::Allocator<u32>,
    mut live: Vec<Option<offset_allocator::Allocation<u32>>>,
    ops: &[Op],
) -> (f64, offset_allocator::Allocator<u32>) {
    let start = Instant::now();
    run_offset_allocator(&mut alloc, &mut live, ops);
    let ns = start.elapsed().as_nanos() as f64 / ops.len() as f64;
    std::hint::black_box(alloc.storage_report().total_free_space);
    (ns, alloc)
}

/// Replay `ops` on offset-allocator: the body of its timed pass, and `same_work`'s check, one
/// operation at a time. Note: this must stay the only caller of offset-allocator's `allocate`
/// and `free` in the benchmark. They are inlined here only while they have one caller; a second
/// (a check that called them itself) left them out of line and cost offset-allocator 10 more
/// instructions per operation on cs336-magma27 (234 to 244, scripts/bench-instructions.sh),
/// moving the ratio in the pool's favour. (Never inlined, so that both callers run this code.)
#[inline(never)]
pub fn run_offset_allocator(
    alloc: &mut offset_allocator::Allocator<u32>,
    live: &mut [Option<offset_allocator::Allocation<u32>>],
    ops: &[Op],
) {
    for op in ops {
        match *op {
            Op::Alloc { id, size, .. } => {
                let units = size.div_ceil(OFFSET_UNIT).max(1) as u32;
                live[id as usize] = alloc.allocate(units);
            }
            Op::Free { id } => {
                if let Some(a) = live[id as usize].take() {
                    alloc.free(a);
                }
            }
            _ => {}
        }
    }
}

/// How many alternating pairs of passes to time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reps {
    /// Exactly this many pairs (the instruction counts and the smoke test want one).
    Exactly(usize),
    /// At least `min` pairs, and more until the pool's passes add up to `budget` seconds, up to
    /// `max` pairs: a real trace of a few thousand operations is timed over hundreds of short
    /// pairs instead of a few, so that one interruption or slow moment of the machine moves
    /// the medians little.
    Until { min: usize, budget: f64, max: usize },
}

impl Reps {
    fn done(&self, pairs: usize, pool_seconds: f64) -> bool {
        match *self {
            Reps::Exactly(n) => pairs >= n.max(1),
            Reps::Until { min, budget, max } => {
                pairs >= max || (pairs >= min.max(1) && pool_seconds >= budget)
            }
        }
    }
}

/// Both allocators over the same operations, their passes alternating so that a machine that
/// speeds up or slows down during the run affects both alike: (pool, offset-allocator, the
/// median over the repetitions of the ratio of each pair of passes run back to back, the
/// number of pairs). Panics, before timing anything, when offset-allocator cannot do the
/// pool's work (`same_work::check`).
pub fn time_both(ops: &[Op], num_ids: usize, reps: Reps) -> (Timing, Timing, f64, usize) {
    if let Err(e) = same_work::check(ops, num_ids) {
        panic!("{e}");
    }
    let (mut pool, mut offset, mut paired) = (Vec::new(), Vec::new(), Vec::new());
    let mut pool_seconds = 0.0;
    while !reps.done(pool.len(), pool_seconds) {
        let warm = warm_pool(ops, num_ids);
        let (pool_ns, used) = pool_pass(warm, untimed_table(num_ids), ops);
        pool.push(pool_ns);
        pool_seconds += pool_ns * ops.len() as f64 * 1e-9;
        drop(used);
        let fresh = new_offset_allocator();
        let (offset_ns, used) = offset_allocator_pass(fresh, untimed_table(num_ids), ops);
        offset.push(offset_ns);
        paired.push(pool_ns / offset_ns);
        drop(used);
    }
    let pairs = pool.len();
    (
        timing(pool),
        timing(offset),
        timing(paired).median_ns,
        pairs,
    )
}

/// Replay speed of the whole replay path (ops per second, best of `reps`).
pub fn replay_rate(workload: &Workload, reps: usize) -> f64 {
    let config = ReplayConfig::default();
    let mut best = f64::MAX;
    for _ in 0..reps {
        let start = Instant::now();
        let out = replay(workload, &config, None).expect("plain replay succeeds");
        std::hint::black_box(out.stats.counts.num_device_alloc);
        best = best.min(start.elapsed().as_secs_f64());
    }
    workload.ops.len() as f64 / best
}

/// One row of the comparison table.
pub struct Row {
    pub name: String,
    pub ops: usize,
    pub pool: Timing,
    pub offset: Timing,
    /// Median of the per-repetition ratios (pool pass / the offset-allocator pass after it).
    pub paired_ratio: f64,
    /// Pairs of passes timed.
    pub pairs: usize,
    pub replay_ops_per_s: f64,
}

impl Row {
    /// Time both allocators on `workload`, and (with `with_replay`) the whole replay path;
    /// without it the replay speed is reported as 0.
    pub fn measure_with(name: &str, workload: &Workload, reps: Reps, with_replay: bool) -> Row {
        let ops = alloc_free_ops(workload);
        let (pool, offset, paired_ratio, pairs) = time_both(&ops, workload.num_ids as usize, reps);
        Row {
            name: name.to_string(),
            ops: ops.len(),
            pool,
            offset,
            paired_ratio,
            pairs,
            replay_ops_per_s: if with_replay {
                replay_rate(workload, pairs)
            } else {
                0.0
            },
        }
    }

    pub fn ratio(&self) -> f64 {
        self.pool.median_ns / self.offset.median_ns
    }
}

pub fn print_table(rows: &[Row]) {
    println!(
        "| workload | ops | pairs | cachealloc ns/op (min / median) | offset-allocator ns/op (min / median) | ratio (median) | ratio (paired passes, median) | replay Mops/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.1} / {:.1} | {:.1} / {:.1} | {:.2}x | {:.2}x | {:.1} |",
            r.name,
            r.ops,
            r.pairs,
            r.pool.min_ns,
            r.pool.median_ns,
            r.offset.min_ns,
            r.offset.median_ns,
            r.ratio(),
            r.paired_ratio,
            r.replay_ops_per_s / 1e6
        );
    }
}
