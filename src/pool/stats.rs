//! Allocator statistics under PyTorch's names (`torch.cuda.memory_stats()`), declared once.
//!
//! A `Stat` follows PyTorch's update rules: an increase moves `current`, `peak` and
//! `allocated`; a decrease moves `current` and `freed`. The pool keeps its running counts in
//! `counters.rs` and produces these as a snapshot. Rendering (text table, JSON) lives in
//! `crate::report`; everything here is plain data.

use super::types::PoolKind;
use serde::Serialize;

/// One counter with its peak and running totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated += amount;
    }

    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current -= amount;
        self.freed += amount;
    }

    pub(super) fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }

    pub(super) fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// This stat of a pool that a device reset ended (its current value freed with it),
    /// followed by `later`, the stat of the device's pool after the reset.
    fn then(&self, later: &Stat) -> Stat {
        Stat {
            current: later.current,
            peak: self.peak.max(later.peak),
            allocated: self.allocated + later.allocated,
            freed: self.freed + self.current + later.freed,
        }
    }
}

/// A stat kept for all pools together and for each pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatArray {
    pub all: Stat,
    pub small_pool: Stat,
    pub large_pool: Stat,
}

impl StatArray {
    pub fn pool(&self, pool: PoolKind) -> &Stat {
        match pool {
            PoolKind::Small => &self.small_pool,
            PoolKind::Large => &self.large_pool,
        }
    }

    fn then(&self, later: &StatArray) -> StatArray {
        StatArray {
            all: self.all.then(&later.all),
            small_pool: self.small_pool.then(&later.small_pool),
            large_pool: self.large_pool.then(&later.large_pool),
        }
    }

    /// `(suffix, stat)` in PyTorch's order: all, large_pool, small_pool.
    pub fn entries(&self) -> [(&'static str, &Stat); 3] {
        [
            ("all", &self.all),
            ("large_pool", &self.large_pool),
            ("small_pool", &self.small_pool),
        ]
    }
}

/// Everything `torch.cuda.memory_stats()` reports for one device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceStats {
    /// Live allocations handed to the program.
    pub allocation: StatArray,
    /// Segments obtained from the device (none counted for expandable segments, as in PyTorch).
    pub segment: StatArray,
    /// Allocated blocks plus blocks whose free is still pending.
    pub active: StatArray,
    /// Free blocks inside split segments (not releasable; none counted in expandable segments,
    /// whose free pages can be unmapped, as in PyTorch).
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    /// Bytes the program asked for (before rounding).
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    #[serde(flatten)]
    pub counts: Counts,
    /// The `max_split_size` in force; `-1` when unlimited (as PyTorch reports it).
    pub max_split_size: i64,
}

/// The plain event counts reported beside the stat arrays (reset with the running totals).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Mallocs that released every fully free segment and asked the device again.
    pub num_alloc_retries: u64,
    /// Mallocs that failed for lack of memory.
    pub num_ooms: u64,
    /// Waits for every pending free to complete (PyTorch's `synchronize_and_free_events`, made
    /// by `empty_cache` and the out-of-memory retry outside a capture whether or not a free is
    /// pending), and the device synchronizations before growing while interposed `cudaFree`s
    /// are pending (`free_sync` other than `none`, which PyTorch has not).
    pub num_sync_all_streams: u64,
    /// Segments obtained from the device (cudaMalloc calls; with expandable segments, page
    /// maps).
    pub num_device_alloc: u64,
    /// Segments returned to the device (cudaFree calls; with expandable segments, page
    /// unmaps).
    pub num_device_free: u64,
}

impl Counts {
    /// `(key, value)` under PyTorch's names.
    pub fn entries(&self) -> [(&'static str, u64); 5] {
        [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
        ]
    }
}

impl DeviceStats {
    /// A device's statistics over a `cudaDeviceReset()`: `self` those of the pool the reset
    /// ended (what was current then is freed with it), `later` those of the pool made after it
    /// (`None`: none yet). Current values are the later pool's, peaks the higher, running
    /// totals and counts the sums; the reset's freeing calls no cudaFree, so `num_device_free`
    /// does not count it.
    pub fn then(&self, later: Option<&DeviceStats>) -> DeviceStats {
        let nothing = DeviceStats {
            max_split_size: self.max_split_size,
            ..DeviceStats::default()
        };
        let later = later.unwrap_or(&nothing);
        let c = (&self.counts, &later.counts);
        DeviceStats {
            allocation: self.allocation.then(&later.allocation),
            segment: self.segment.then(&later.segment),
            active: self.active.then(&later.active),
            inactive_split: self.inactive_split.then(&later.inactive_split),
            allocated_bytes: self.allocated_bytes.then(&later.allocated_bytes),
            reserved_bytes: self.reserved_bytes.then(&later.reserved_bytes),
            active_bytes: self.active_bytes.then(&later.active_bytes),
            inactive_split_bytes: self.inactive_split_bytes.then(&later.inactive_split_bytes),
            requested_bytes: self.requested_bytes.then(&later.requested_bytes),
            oversize_allocations: self.oversize_allocations.then(&later.oversize_allocations),
            oversize_segments: self.oversize_segments.then(&later.oversize_segments),
            counts: Counts {
                num_alloc_retries: c.0.num_alloc_retries + c.1.num_alloc_retries,
                num_ooms: c.0.num_ooms + c.1.num_ooms,
                num_sync_all_streams: c.0.num_sync_all_streams + c.1.num_sync_all_streams,
                num_device_alloc: c.0.num_device_alloc + c.1.num_device_alloc,
                num_device_free: c.0.num_device_free + c.1.num_device_free,
            },
            max_split_size: later.max_split_size,
        }
    }

    /// Peaks of a pool that a device reset ended, after `reset_peak_stats`: none (its memory
    /// is freed), so that `then` takes the later pool's.
    pub fn forget_peaks(&mut self) {
        for stat in self.stats_mut() {
            stat.peak = 0;
        }
    }

    /// Running totals of a pool that a device reset ended, after `reset_accumulated_stats`:
    /// none, its memory's freeing at the reset included (it came before the call), so that
    /// `then` takes the later pool's; its peaks stay.
    pub fn forget_totals(&mut self) {
        for stat in self.stats_mut() {
            stat.current = 0;
            stat.reset_accumulated();
        }
        self.counts = Counts::default();
    }

    /// Every stat, the arrays' rows and the two oversize stats.
    fn stats_mut(&mut self) -> impl Iterator<Item = &mut Stat> {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
        .into_iter()
        .flat_map(|array| [&mut array.all, &mut array.small_pool, &mut array.large_pool])
        .chain([&mut self.oversize_allocations, &mut self.oversize_segments])
    }

    /// The stat arrays with their PyTorch names, in PyTorch's (sorted) order of appearance.
    pub fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("active", &self.active),
            ("active_bytes", &self.active_bytes),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocation", &self.allocation),
            ("inactive_split", &self.inactive_split),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("segment", &self.segment),
        ]
    }

    /// Flattened `key → value` pairs exactly as `torch.cuda.memory_stats()` names them, sorted.
    pub fn flat(&self) -> Vec<(String, i64)> {
        let mut out = Vec::with_capacity(128);
        for (name, array) in self.arrays() {
            for (pool, stat) in array.entries() {
                push_stat(&mut out, &format!("{name}.{pool}"), stat);
            }
        }
        push_stat(&mut out, "oversize_allocations", &self.oversize_allocations);
        push_stat(&mut out, "oversize_segments", &self.oversize_segments);
        for (key, value) in self.counts.entries() {
            out.push((key.into(), value as i64));
        }
        out.push(("max_split_size".into(), self.max_split_size));
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

fn push_stat(out: &mut Vec<(String, i64)>, prefix: &str, stat: &Stat) {
    out.push((format!("{prefix}.current"), stat.current));
    out.push((format!("{prefix}.peak"), stat.peak));
    out.push((format!("{prefix}.allocated"), stat.allocated));
    out.push((format!("{prefix}.freed"), stat.freed));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_follows_pytorch_update_rules() {
        let mut s = Stat::default();
        s.increase(10);
        s.increase(5);
        s.decrease(12);
        assert_eq!(
            s,
            Stat {
                current: 3,
                peak: 15,
                allocated: 15,
                freed: 12
            }
        );
        s.reset_peak();
        assert_eq!(s.peak, 3);
    }

    #[test]
    fn statistics_over_a_reset_keep_the_ended_pools_peaks_and_totals() {
        let mut ended = DeviceStats {
            max_split_size: -1,
            ..Default::default()
        };
        ended.reserved_bytes.all.increase(100);
        ended.reserved_bytes.all.decrease(30);
        ended.counts.num_ooms = 2;
        let mut later = ended.clone();
        later.reserved_bytes.all = Stat::default();
        later.reserved_bytes.all.increase(50);
        later.counts.num_ooms = 1;
        let over = ended.then(Some(&later));
        // The 70 live at the reset are freed with it.
        assert_eq!(
            over.reserved_bytes.all,
            Stat {
                current: 50,
                peak: 100,
                allocated: 150,
                freed: 100
            }
        );
        assert_eq!(over.counts.num_ooms, 3);
        // No pool since: nothing current, the rest kept.
        let alone = ended.then(None);
        assert_eq!(alone.reserved_bytes.all.current, 0);
        assert_eq!(alone.reserved_bytes.all.peak, 100);
        assert_eq!(alone.reserved_bytes.all.freed, 100);
        assert_eq!(alone.max_split_size, -1);
    }

    /// Over a reset, the running totals are the two pools' sums: the later pool's frees add
    /// to the ended pool's (and to what the reset freed), and so does each count.
    #[test]
    fn statistics_over_a_reset_add_the_later_pools_frees_and_counts() {
        let mut ended = DeviceStats::default();
        ended.allocated_bytes.all.increase(100);
        ended.allocated_bytes.all.decrease(30);
        ended.counts = Counts {
            num_alloc_retries: 1,
            num_ooms: 2,
            num_sync_all_streams: 3,
            num_device_alloc: 4,
            num_device_free: 5,
        };
        let mut later = DeviceStats::default();
        later.allocated_bytes.all.increase(50);
        later.allocated_bytes.all.decrease(20);
        later.counts = Counts {
            num_alloc_retries: 10,
            num_ooms: 20,
            num_sync_all_streams: 30,
            num_device_alloc: 40,
            num_device_free: 50,
        };
        let over = ended.then(Some(&later));
        assert_eq!(
            over.allocated_bytes.all,
            Stat {
                current: 30,
                peak: 100,
                allocated: 150,
                freed: 30 + 70 + 20
            }
        );
        assert_eq!(
            over.counts,
            Counts {
                num_alloc_retries: 11,
                num_ooms: 22,
                num_sync_all_streams: 33,
                num_device_alloc: 44,
                num_device_free: 55,
            }
        );
    }

    #[test]
    fn forgetting_the_ended_pools_totals_keeps_its_peaks() {
        let mut ended = DeviceStats::default();
        ended.reserved_bytes.all.increase(100);
        ended.reserved_bytes.all.decrease(30);
        ended.oversize_segments.increase(1);
        ended.counts.num_device_alloc = 4;
        ended.forget_totals();
        let mut later = DeviceStats::default();
        later.reserved_bytes.all.increase(50);
        let over = ended.then(Some(&later));
        // What was live at the reset was freed before the totals were reset: not counted.
        assert_eq!(
            over.reserved_bytes.all,
            Stat {
                current: 50,
                peak: 100,
                allocated: 50,
                freed: 0
            }
        );
        assert_eq!(over.oversize_segments.peak, 1);
        assert_eq!(over.oversize_segments.allocated, 0);
        assert_eq!(over.counts, Counts::default());
        let mut forgot = ended.clone();
        forgot.forget_peaks();
        assert_eq!(forgot.then(None).reserved_bytes.all, Stat::default());
    }

    #[test]
    fn flat_keys_use_pytorch_names() {
        let mut st = DeviceStats {
            max_split_size: -1,
            ..Default::default()
        };
        st.reserved_bytes.all.increase(4096);
        st.reserved_bytes.large_pool.increase(4096);
        let flat = st.flat();
        let get = |k: &str| flat.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert_eq!(get("reserved_bytes.large_pool.peak"), Some(4096));
        assert_eq!(get("reserved_bytes.all.current"), Some(4096));
        assert_eq!(get("reserved_bytes.small_pool.current"), Some(0));
        assert_eq!(get("max_split_size"), Some(-1));
        assert_eq!(get("num_alloc_retries"), Some(0));
        assert_eq!(flat.len(), 9 * 3 * 4 + 2 * 4 + 6);
    }
}
