//! The pool's running statistics in the form that is cheapest to update; `DeviceStats` (the
//! PyTorch-named view) is computed from them when asked for.
//!
//! Every malloc and free moves about ten statistics, each kept for the small pool, the large
//! pool and both together, with a current value, a peak and running totals. Most of that is
//! derivable: the `all` row's current value and totals are the sums of the two pools', and the
//! total freed is the total increased minus the net change since the last reset. So a
//! `PoolCounter` stores per pool only its peak, its distance below the peak and the increases,
//! plus the same distance and peak for the sum: an increase updates three numbers (its total
//! and the two distances) and tests both distances at once, a decrease updates the two
//! distances, and neither reads the other pool's value.
//!
//! `active` is `allocation` plus the frees still waiting for their fence (and `active_bytes`
//! likewise): an `ActiveCounter` stores only that pending part and, while anything is pending,
//! the peak of the sum — so a malloc or a free with nothing pending does not touch it at all.

use super::stats::{Counts, DeviceStats, Stat, StatArray};
use super::types::PoolKind;

#[inline]
fn slot(pool: PoolKind) -> usize {
    match pool {
        PoolKind::Small => 0,
        PoolKind::Large => 1,
    }
}

/// The stat array of two pool rows: the `all` row is their sum, except for its peak (the peak
/// of the sum, tracked by the caller).
fn with_all_row(small: Stat, large: Stat, all_peak: i64) -> StatArray {
    StatArray {
        all: Stat {
            current: small.current + large.current,
            peak: all_peak,
            allocated: small.allocated + large.allocated,
            freed: small.freed + large.freed,
        },
        small_pool: small,
        large_pool: large,
    }
}

/// One PyTorch stat array (`all`, `small_pool`, `large_pool`), stored per pool.
///
/// A value is kept as its peak and its distance below that peak: an increase lowers the
/// distance and raises the peak only when the distance would go negative (rare once a program
/// reaches its steady state), a test of the number it just wrote; a decrease raises the
/// distance. The `all` row's distance is kept the same way, so that no update reads the other
/// pool's value.
#[derive(Clone, Copy, Debug, Default)]
pub struct PoolCounter {
    /// [small, large] peak minus current value.
    below_peak: [i64; 2],
    peak: [i64; 2],
    /// Sum of increases since the last `reset_accumulated`.
    increased: [i64; 2],
    /// Current value at the last `reset_accumulated` (freed = increased - (current - base)).
    base: [i64; 2],
    /// The `all` row's peak minus its current value.
    all_below_peak: i64,
    /// Peak of the sum of both pools.
    all_peak: i64,
}

impl PoolCounter {
    #[inline]
    pub fn increase(&mut self, pool: PoolKind, amount: u64) {
        let p = slot(pool);
        let amount = amount as i64;
        self.increased[p] += amount;
        self.lower_distances(p, amount);
    }

    /// The value changed by `amount` (an increase; `apply` also passes decreases, as negative
    /// amounts that raise the distances): lower the distances below the peaks by it, raising a
    /// peak whose distance went negative, with one test for both rows, out of line when taken.
    #[inline]
    fn lower_distances(&mut self, p: usize, amount: i64) {
        self.below_peak[p] -= amount;
        self.all_below_peak -= amount;
        if (self.below_peak[p] | self.all_below_peak) < 0 {
            self.raise_peaks(p);
        }
    }

    /// New peaks: a distance below its peak went negative.
    #[cold]
    #[inline(never)]
    fn raise_peaks(&mut self, p: usize) {
        if self.below_peak[p] < 0 {
            self.peak[p] -= self.below_peak[p];
            self.below_peak[p] = 0;
        }
        if self.all_below_peak < 0 {
            self.all_peak -= self.all_below_peak;
            self.all_below_peak = 0;
        }
    }

    #[inline]
    pub fn decrease(&mut self, pool: PoolKind, amount: u64) {
        let amount = amount as i64;
        self.below_peak[slot(pool)] += amount;
        self.all_below_peak += amount;
    }

    /// A signed change: an increase when positive, a decrease when negative (PyTorch's net
    /// update of the inactive-split stats), without branching on the sign.
    #[inline]
    pub fn apply(&mut self, pool: PoolKind, delta: i64) {
        let p = slot(pool);
        self.increased[p] += delta.max(0);
        self.lower_distances(p, delta);
    }

    /// The current value of one pool's row.
    #[inline]
    fn current_of(&self, p: usize) -> i64 {
        self.peak[p] - self.below_peak[p]
    }

    /// `current_of` by pool (for the tests).
    #[cfg(test)]
    fn current(&self, pool: PoolKind) -> i64 {
        self.current_of(slot(pool))
    }

    /// The current value of the `all` row.
    pub fn current_all(&self) -> i64 {
        self.all_peak - self.all_below_peak
    }

    fn pool_stat(&self, p: usize) -> Stat {
        let current = self.current_of(p);
        Stat {
            current,
            peak: self.peak[p],
            allocated: self.increased[p],
            freed: self.increased[p] - (current - self.base[p]),
        }
    }

    /// The PyTorch view: what `StatArray`'s update rules would hold after the same updates.
    pub fn snapshot(&self) -> StatArray {
        with_all_row(self.pool_stat(0), self.pool_stat(1), self.all_peak)
    }

    fn reset_peak(&mut self) {
        self.peak = [self.current_of(0), self.current_of(1)];
        self.below_peak = [0; 2];
        self.all_peak = self.current_all();
        self.all_below_peak = 0;
    }

    fn reset_accumulated(&mut self) {
        self.increased = [0; 2];
        self.base = [self.current_of(0), self.current_of(1)];
    }
}

/// `active` (or `active_bytes`): the allocation counter plus blocks whose free is pending.
///
/// Active grows only when allocation grows (a malloc), so its peak is the larger of
/// allocation's peak and the sums seen at mallocs while something was pending; with nothing
/// pending the two are equal and nothing is tracked. Its increases are allocation's.
#[derive(Clone, Copy, Debug, Default)]
pub struct ActiveCounter {
    /// [small, large] amounts whose free is pending.
    pending: [i64; 2],
    /// `pending` at the last `reset_accumulated`.
    base: [i64; 2],
    /// Peaks of allocation + pending, sampled at mallocs while something was pending.
    peak: [i64; 2],
    all_peak: i64,
}

impl ActiveCounter {
    /// An allocation's free was deferred: it leaves `allocation` but stays active.
    #[inline]
    pub fn pend(&mut self, pool: PoolKind, amount: u64) {
        self.pending[slot(pool)] += amount as i64;
    }

    /// A deferred free completed: the block stops being active.
    #[inline]
    pub fn complete(&mut self, pool: PoolKind, amount: u64) {
        self.pending[slot(pool)] -= amount as i64;
    }

    /// Whether any free is pending (else active equals allocation and nothing is tracked).
    #[inline]
    pub fn any_pending(&self) -> bool {
        (self.pending[0] | self.pending[1]) != 0
    }

    /// Call after `allocation` grew (the only way active grows) while a free is pending.
    #[inline]
    pub fn allocation_grew(&mut self, pool: PoolKind, allocation: &PoolCounter) {
        let p = slot(pool);
        self.peak[p] = self.peak[p].max(allocation.current_of(p) + self.pending[p]);
        self.all_peak = self
            .all_peak
            .max(allocation.current_all() + self.pending[0] + self.pending[1]);
    }

    fn pool_stat(&self, p: usize, allocation: &PoolCounter) -> Stat {
        let current = allocation.current_of(p) + self.pending[p];
        let increased = allocation.increased[p];
        Stat {
            current,
            peak: allocation.peak[p].max(self.peak[p]),
            allocated: increased,
            freed: increased - (current - allocation.base[p] - self.base[p]),
        }
    }

    /// The PyTorch view, given the allocation counter it extends.
    pub fn snapshot(&self, allocation: &PoolCounter) -> StatArray {
        with_all_row(
            self.pool_stat(0, allocation),
            self.pool_stat(1, allocation),
            allocation.all_peak.max(self.all_peak),
        )
    }

    fn reset_peak(&mut self, allocation: &PoolCounter) {
        for p in 0..2 {
            self.peak[p] = allocation.current_of(p) + self.pending[p];
        }
        self.all_peak = self.peak[0] + self.peak[1];
    }

    fn reset_accumulated(&mut self) {
        self.base = self.pending;
    }
}

/// Everything `torch.cuda.memory_stats()` reports for one device, in updating form.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub allocation: PoolCounter,
    pub segment: PoolCounter,
    /// Extends `allocation`.
    pub active: ActiveCounter,
    pub inactive_split: PoolCounter,
    pub allocated_bytes: PoolCounter,
    pub reserved_bytes: PoolCounter,
    /// Extends `allocated_bytes`.
    pub active_bytes: ActiveCounter,
    pub inactive_split_bytes: PoolCounter,
    pub requested_bytes: PoolCounter,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub counts: Counts,
    /// The `max_split_size` in force; `-1` when unlimited (as PyTorch reports it).
    pub max_split_size: i64,
}

impl Counters {
    pub fn new(max_split_size: i64) -> Self {
        Self {
            max_split_size,
            ..Self::default()
        }
    }

    /// The PyTorch-named statistics as of now.
    pub fn snapshot(&self) -> DeviceStats {
        DeviceStats {
            allocation: self.allocation.snapshot(),
            segment: self.segment.snapshot(),
            active: self.active.snapshot(&self.allocation),
            inactive_split: self.inactive_split.snapshot(),
            allocated_bytes: self.allocated_bytes.snapshot(),
            reserved_bytes: self.reserved_bytes.snapshot(),
            active_bytes: self.active_bytes.snapshot(&self.allocated_bytes),
            inactive_split_bytes: self.inactive_split_bytes.snapshot(),
            requested_bytes: self.requested_bytes.snapshot(),
            oversize_allocations: self.oversize_allocations,
            oversize_segments: self.oversize_segments,
            counts: self.counts,
            max_split_size: self.max_split_size,
        }
    }

    /// A block of `size` bytes was handed out for a request of `requested` bytes (`oversize`:
    /// the block is at least `max_split_size`).
    #[inline]
    pub fn allocation_made(&mut self, pool: PoolKind, size: u64, requested: u64, oversize: bool) {
        self.allocation.increase(pool, 1);
        self.allocated_bytes.increase(pool, size);
        // A pending block is counted in both `active` and `active_bytes`: one test for both.
        if self.active.any_pending() {
            self.active_grew(pool);
        }
        self.requested_bytes.increase(pool, requested);
        if oversize {
            self.oversize_allocations.increase(1);
        }
    }

    /// The peaks of `active` and `active_bytes` after a malloc while frees are pending.
    #[cold]
    #[inline(never)]
    fn active_grew(&mut self, pool: PoolKind) {
        self.active.allocation_grew(pool, &self.allocation);
        self.active_bytes
            .allocation_grew(pool, &self.allocated_bytes);
    }

    fn counters_mut(&mut self) -> [&mut PoolCounter; 7] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// PyTorch's `reset_peak_memory_stats`.
    pub fn reset_peak(&mut self) {
        for c in self.counters_mut() {
            c.reset_peak();
        }
        self.active.reset_peak(&self.allocation);
        self.active_bytes.reset_peak(&self.allocated_bytes);
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// PyTorch's `reset_accumulated_memory_stats`.
    pub fn reset_accumulated(&mut self) {
        for c in self.counters_mut() {
            c.reset_accumulated();
        }
        self.active.reset_accumulated();
        self.active_bytes.reset_accumulated();
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.counts = Counts::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PyTorch's rules applied literally: every update moves the pool row and the `all` row.
    #[derive(Default)]
    struct Literal(StatArray);

    impl Literal {
        fn pool(&mut self, pool: PoolKind) -> &mut Stat {
            match pool {
                PoolKind::Small => &mut self.0.small_pool,
                PoolKind::Large => &mut self.0.large_pool,
            }
        }
        fn increase(&mut self, pool: PoolKind, n: u64) {
            self.0.all.increase(n);
            self.pool(pool).increase(n);
        }
        fn decrease(&mut self, pool: PoolKind, n: u64) {
            self.0.all.decrease(n);
            self.pool(pool).decrease(n);
        }
        fn apply(&mut self, pool: PoolKind, d: i64) {
            if d > 0 {
                self.increase(pool, d as u64);
            } else if d < 0 {
                self.decrease(pool, d.unsigned_abs());
            }
        }
        fn reset_peak(&mut self) {
            self.0.all.reset_peak();
            self.0.small_pool.reset_peak();
            self.0.large_pool.reset_peak();
        }
        fn reset_accumulated(&mut self) {
            self.0.all.reset_accumulated();
            self.0.small_pool.reset_accumulated();
            self.0.large_pool.reset_accumulated();
        }
    }

    #[test]
    fn agrees_with_the_literal_rules_through_updates_and_resets() {
        let mut fast = PoolCounter::default();
        let mut literal = Literal::default();
        let mut x: u64 = 0x853c_49e6_748f_ea9b;
        for step in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pool = if x & 1 == 0 {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            let n = (x >> 8) % 1000;
            let current = fast.current(pool);
            match (x >> 4) % 16 {
                0..=6 => {
                    fast.increase(pool, n);
                    literal.increase(pool, n);
                }
                7..=12 => {
                    // Never below zero, as in the pool.
                    let n = n.min(current as u64);
                    fast.decrease(pool, n);
                    literal.decrease(pool, n);
                }
                13 | 14 => {
                    let d = (n as i64 - 500).max(-current);
                    fast.apply(pool, d);
                    literal.apply(pool, d);
                }
                _ if step % 3 == 0 => {
                    fast.reset_peak();
                    literal.reset_peak();
                }
                _ => {
                    fast.reset_accumulated();
                    literal.reset_accumulated();
                }
            }
            assert_eq!(fast.snapshot(), literal.0, "after step {step}");
        }
    }

    #[test]
    fn active_agrees_with_the_literal_rules_through_deferred_frees_and_resets() {
        // Allocations of 1 unit; frees immediate or deferred, deferred ones completing later.
        let mut allocation = PoolCounter::default();
        let mut active = ActiveCounter::default();
        let (mut lit_allocation, mut lit_active) = (Literal::default(), Literal::default());
        let mut live = [0u64; 2];
        let mut pending = [0u64; 2];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for step in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (pool, p) = if x & 1 == 0 {
                (PoolKind::Small, 0)
            } else {
                (PoolKind::Large, 1)
            };
            match (x >> 4) % 20 {
                0..=7 => {
                    allocation.increase(pool, 1);
                    if active.any_pending() {
                        active.allocation_grew(pool, &allocation);
                    }
                    lit_allocation.increase(pool, 1);
                    lit_active.increase(pool, 1);
                    live[p] += 1;
                }
                8..=11 if live[p] > 0 => {
                    allocation.decrease(pool, 1);
                    lit_allocation.decrease(pool, 1);
                    lit_active.decrease(pool, 1);
                    live[p] -= 1;
                }
                12..=15 if live[p] > 0 => {
                    allocation.decrease(pool, 1);
                    active.pend(pool, 1);
                    lit_allocation.decrease(pool, 1);
                    live[p] -= 1;
                    pending[p] += 1;
                }
                16..=17 if pending[p] > 0 => {
                    active.complete(pool, 1);
                    lit_active.decrease(pool, 1);
                    pending[p] -= 1;
                }
                18 => {
                    allocation.reset_peak();
                    active.reset_peak(&allocation);
                    lit_allocation.reset_peak();
                    lit_active.reset_peak();
                }
                19 => {
                    allocation.reset_accumulated();
                    active.reset_accumulated();
                    lit_allocation.reset_accumulated();
                    lit_active.reset_accumulated();
                }
                _ => {}
            }
            assert_eq!(allocation.snapshot(), lit_allocation.0, "after step {step}");
            assert_eq!(
                active.snapshot(&allocation),
                lit_active.0,
                "active after step {step}"
            );
        }
    }

    /// One pending-free test in `allocation_made` guards both active counters: a malloc while
    /// a free is pending raises the peaks of `active` and of `active_bytes`.
    #[test]
    fn a_malloc_with_a_pending_free_raises_both_active_peaks() {
        let mut c = Counters::new(-1);
        c.allocation_made(PoolKind::Large, 4096, 4000, false);
        // Its free is deferred: it leaves `allocation` but stays active.
        c.allocation.decrease(PoolKind::Large, 1);
        c.allocated_bytes.decrease(PoolKind::Large, 4096);
        c.active.pend(PoolKind::Large, 1);
        c.active_bytes.pend(PoolKind::Large, 4096);
        c.allocation_made(PoolKind::Large, 8192, 8000, false);
        let s = c.snapshot();
        assert_eq!(s.active.all.current, 2);
        assert_eq!(s.active.all.peak, 2);
        assert_eq!(s.active_bytes.all.current, 4096 + 8192);
        assert_eq!(s.active_bytes.large_pool.peak, 4096 + 8192);
        assert_eq!(s.allocated_bytes.all.peak, 8192);
    }

    #[test]
    fn snapshot_carries_scalars_and_resets() {
        let mut c = Counters::new(-1);
        c.reserved_bytes.increase(PoolKind::Large, 4096);
        c.counts.num_device_alloc += 1;
        c.reserved_bytes.decrease(PoolKind::Large, 4096);
        let s = c.snapshot();
        assert_eq!(s.reserved_bytes.all.peak, 4096);
        assert_eq!(s.reserved_bytes.large_pool.freed, 4096);
        assert_eq!(s.max_split_size, -1);
        c.reset_accumulated();
        c.reset_peak();
        let s = c.snapshot();
        assert_eq!(s.reserved_bytes.all, Stat::default());
        assert_eq!(s.counts.num_device_alloc, 0);
    }
}
