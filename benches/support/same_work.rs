//! What makes the table a comparison: offset-allocator does the work the pool does. Both timed
//! passes run the same operations, but offset-allocator's `allocate` answers `None` when its
//! range (2 TiB, `u32::MAX` units of 512 bytes) has no room, and a request of 2 TiB or more is
//! no count of units it takes; its timed pass does not look (a failed allocation is then
//! skipped, with its free, and a too large request truncated), so the pool's time would be set
//! against less work. The pool's simulated device holds 128 TiB. Checked once per row, outside
//! the clock: offset-allocator is deterministic, so every timed pass, on a fresh allocator, does
//! what this one did.

use super::{OFFSET_MAX_ALLOCS, OFFSET_UNIT, new_offset_allocator, run_offset_allocator, run_pool};
use cachealloc::backend::sim::SimDevice;
use cachealloc::pool::{DeviceAllocator, Settings};
use cachealloc::trace::Op;

/// What one allocator did with an operation sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replayed {
    /// Allocations made.
    pub allocations: usize,
    /// Allocations freed.
    pub frees: usize,
    /// The ids live at the end, ascending.
    pub live: Vec<usize>,
}

/// The units offset-allocator is asked for, `None` for a request beyond its range.
pub fn offset_units(size: u64) -> Option<u32> {
    u32::try_from(size.div_ceil(OFFSET_UNIT).max(1)).ok()
}

fn live_ids<T>(live: &[Option<T>]) -> Vec<usize> {
    (live.iter().enumerate())
        .filter_map(|(id, slot)| slot.is_some().then_some(id))
        .collect()
}

/// The pool's replay of `ops`, as the timed pass runs it, on an unlimited simulated device.
/// (Counted by the harness, not from the pool's statistics, which the experiment builds of
/// scripts/bench-decomposition.sh turn off.)
pub fn pool_replayed(ops: &[Op], num_ids: usize) -> Replayed {
    let mut pool = DeviceAllocator::new(SimDevice::new(u64::MAX), Settings::default());
    let mut live = vec![None; num_ids];
    let mut allocations = 0;
    run_pool(&mut pool, &mut live, ops, |_| allocations += 1);
    let live = live_ids(&live);
    Replayed {
        allocations,
        // A free is made exactly when its id is live (never twice, never before its malloc).
        frees: allocations - live.len(),
        live,
    }
}

/// offset-allocator's replay of `ops`, as the timed pass runs it (its code, one operation at a
/// time), or the first allocation it cannot make.
pub fn offset_allocator_replayed(ops: &[Op], num_ids: usize) -> Result<Replayed, String> {
    let mut alloc = new_offset_allocator();
    let mut live = vec![None; num_ids];
    let (mut allocations, mut frees) = (0, 0);
    for op in ops {
        match *op {
            Op::Alloc { id, size, .. } => {
                if offset_units(size).is_none() {
                    return Err(format!(
                        "allocation {allocations} (id {id}): a request of {size} bytes is more \
                         than offset-allocator's range ({} bytes): this workload cannot be \
                         compared",
                        u64::from(u32::MAX) * OFFSET_UNIT
                    ));
                }
                run_offset_allocator(&mut alloc, &mut live, std::slice::from_ref(op));
                if live[id as usize].is_none() {
                    return Err(format!(
                        "offset-allocator refused allocation {allocations} (id {id}) of {size} \
                         bytes: no room for it in its range of {} bytes (at most \
                         {OFFSET_MAX_ALLOCS} allocations live), where the pool's simulated device \
                         has room: this workload cannot be compared",
                        u64::from(u32::MAX) * OFFSET_UNIT
                    ));
                }
                allocations += 1;
            }
            Op::Free { id } => {
                frees += usize::from(live[id as usize].is_some());
                run_offset_allocator(&mut alloc, &mut live, std::slice::from_ref(op));
            }
            _ => {}
        }
    }
    Ok(Replayed {
        allocations,
        frees,
        live: live_ids(&live),
    })
}

/// Both allocators' replays of `ops`, which must be the same work: the same allocations and
/// frees, the same ids live at the end.
pub fn check(ops: &[Op], num_ids: usize) -> Result<Replayed, String> {
    let offset = offset_allocator_replayed(ops, num_ids)?;
    let pool = pool_replayed(ops, num_ids);
    if pool != offset {
        return Err(format!(
            "the pool and offset-allocator replayed different work: {} allocations, {} frees, \
             {} live at the end against {}, {}, {}",
            pool.allocations,
            pool.frees,
            pool.live.len(),
            offset.allocations,
            offset.frees,
            offset.live.len()
        ));
    }
    Ok(pool)
}
