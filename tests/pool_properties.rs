//! Property test: random malloc / free / deferred free / empty_cache / statistics-reset
//! sequences on the simulated device (with device work that completes only when told to), under
//! random settings (max_split_size, per-interval roundup divisions, max_non_split_rounding,
//! garbage collection under a memory fraction, expandable segments), checked after every step
//! against a shadow model of the live allocations, against PyTorch's statistics rules (peaks,
//! running totals, resets), and by the pool's own invariant walker. `PROPTEST_CASES` raises the
//! number of cases (scripts/proptest-long.sh).

use cachealloc::backend::sim::SimDevice;
use cachealloc::pool::rounding::round_size;
use cachealloc::pool::{
    BadPointer, DeviceAllocator, DevicePtr, DeviceStats, Error, Settings, Stat, StreamId,
};
use proptest::prelude::*;
use std::collections::BTreeMap;

const MIB: u64 = 1 << 20;
const OPS_PER_CASE: usize = 2000;
const MAX_LIVE: usize = 300;

#[derive(Clone, Debug)]
enum Step {
    Alloc {
        size: u64,
        stream: u64,
    },
    Free {
        pick: usize,
    },
    /// Free behind a fence: the block stays pending until the device's work completes.
    DeferredFree {
        pick: usize,
    },
    /// Free recorded on other streams: pending until the device's work completes, never a
    /// reason to synchronize before growing.
    FreeAfterStreams {
        pick: usize,
    },
    /// Free behind a fence, then recorded streams (an interposed cudaFree of a recorded
    /// allocation under free_sync:device).
    DeferredFreeAfterStreams {
        pick: usize,
    },
    CompleteWork,
    DoubleFree,
    EmptyCache,
    /// `torch.cuda.reset_peak_memory_stats()`.
    ResetPeak,
    /// `torch.cuda.reset_accumulated_memory_stats()`.
    ResetAccumulated,
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..=MIB,
        3 => MIB..=20 * MIB,
        1 => 20 * MIB..=200 * MIB,
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => (size_strategy(), 0u64..3).prop_map(|(size, stream)| Step::Alloc { size, stream }),
        6 => any::<usize>().prop_map(|pick| Step::Free { pick }),
        2 => any::<usize>().prop_map(|pick| Step::DeferredFree { pick }),
        1 => any::<usize>().prop_map(|pick| Step::FreeAfterStreams { pick }),
        1 => any::<usize>().prop_map(|pick| Step::DeferredFreeAfterStreams { pick }),
        1 => Just(Step::CompleteWork),
        1 => Just(Step::DoubleFree),
        1 => Just(Step::EmptyCache),
        1 => Just(Step::ResetPeak),
        1 => Just(Step::ResetAccumulated),
    ]
}

fn settings_strategy() -> impl Strategy<Value = (Settings, u64)> {
    let divisions =
        proptest::collection::vec(prop_oneof![Just(0u64), Just(1), Just(4), Just(8)], 16);
    (
        (
            prop_oneof![Just(u64::MAX), Just(20 * MIB), Just(64 * MIB)],
            prop_oneof![2 => Just(20 * MIB), 1 => Just(100 * MIB)],
            prop_oneof![Just(None), Just(Some(0u64)), Just(Some(4)), Just(Some(8))],
            divisions,
        ),
        prop_oneof![Just(u64::MAX), Just(512 * MIB), Just(2048 * MIB)],
        prop_oneof![2 => Just(false), 1 => Just(true)],
        prop_oneof![2 => Just(1.0), 1 => Just(0.5), 1 => Just(0.8)],
        prop_oneof![2 => Just(0.0), 1 => Just(0.5), 1 => Just(0.9)],
    )
        .prop_map(
            |((mss, rounding, uniform, mixed), capacity, expandable_segments, fraction, gc)| {
                // One division count for every interval, or one per interval.
                let roundup_power2_divisions = match uniform {
                    Some(div) => [div; 16],
                    None => mixed.try_into().expect("16 intervals"),
                };
                let settings = Settings {
                    max_split_size: mss,
                    max_non_split_rounding: rounding,
                    roundup_power2_divisions,
                    garbage_collection_threshold: gc,
                    per_process_memory_fraction: fraction,
                    expandable_segments,
                };
                (settings, capacity)
            },
        )
}

struct Shadow {
    /// address → (block size, requested size)
    live: BTreeMap<u64, (u64, u64)>,
    last_freed: Option<DevicePtr>,
}

impl Shadow {
    /// A live allocation chosen by `pick`, which the step frees: `None` when none is live.
    fn take_live(&mut self, pick: usize) -> Option<DevicePtr> {
        let addr = *self.live.keys().nth(pick.checked_rem(self.live.len())?)?;
        self.live.remove(&addr);
        Some(DevicePtr::new(addr).expect("a live allocation is never at address 0"))
    }

    fn check_disjoint(&self, addr: u64, size: u64) {
        if let Some((&a, &(s, _))) = self.live.range(..addr + size).next_back() {
            assert!(
                a + s <= addr,
                "allocation {addr:#x}+{size} overlaps live {a:#x}+{s}"
            );
        }
    }
}

fn check_against_shadow(p: &DeviceAllocator<SimDevice>, shadow: &Shadow) {
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(s.allocation.all.current as usize, shadow.live.len());
    assert_eq!(
        s.active.all.current as usize,
        shadow.live.len() + p.pending_frees()
    );
    assert!(s.active.all.peak >= s.allocation.all.peak);
    let requested: u64 = shadow.live.values().map(|(_, r)| r).sum();
    if p.pending_frees() == 0 {
        assert_eq!(s.requested_bytes.all.current as u64, requested);
    } else {
        assert!(s.requested_bytes.all.current as u64 >= requested);
    }
    assert_eq!(s.reserved_bytes.all.current as u64, p.backend().used());
}

/// What PyTorch's statistics rules predict from outside the pool. A peak is the largest value
/// the stat has had since the last reset; for the stats below no single call moves a value up
/// and back down (a call may release memory and then obtain some, never the other way round),
/// so the largest value seen between steps is exact. One exception, PyTorch's too: with
/// expandable segments a malloc maps pages in steps, and when a later step fails the pages
/// already mapped stay until the retry ladder unmaps them, so reserved memory may peak inside
/// the call (its peak is then only bounded below). Running totals and event counts
/// never fall, except to zero at a reset of the accumulated stats.
struct StatsModel {
    /// Largest `current` seen since the last peak reset, per `peaked` entry.
    peaks: Vec<i64>,
    last: DeviceStats,
    expandable_segments: bool,
}

/// The stats whose peaks the model predicts exactly: all but the inactive-split ones, which a
/// malloc may move up (pending frees completing) and back down (the block it takes) in one call.
fn peaked(s: &DeviceStats) -> Vec<(String, Stat)> {
    every_stat(s)
        .into_iter()
        .filter(|(name, _)| !name.starts_with("inactive_split"))
        .collect()
}

/// Every stat, for the rules that hold for all of them.
fn every_stat(s: &DeviceStats) -> Vec<(String, Stat)> {
    let mut all: Vec<(String, Stat)> = s
        .arrays()
        .iter()
        .flat_map(|(name, array)| {
            array
                .entries()
                .map(|(pool, stat)| (format!("{name}.{pool}"), *stat))
        })
        .collect();
    all.push(("oversize_allocations".into(), s.oversize_allocations));
    all.push(("oversize_segments".into(), s.oversize_segments));
    all
}

impl StatsModel {
    fn new(p: &DeviceAllocator<SimDevice>) -> Self {
        let last = p.stats();
        Self {
            peaks: peaked(&last).iter().map(|(_, s)| s.current).collect(),
            last,
            expandable_segments: p.settings().expandable_segments,
        }
    }

    /// Check the stats after `step`.
    fn check(&mut self, p: &DeviceAllocator<SimDevice>, step: &Step) {
        let now = p.stats();
        let reset_peak = matches!(step, Step::ResetPeak);
        let reset_totals = matches!(step, Step::ResetAccumulated);
        for (i, (name, stat)) in peaked(&now).into_iter().enumerate() {
            self.peaks[i] = if reset_peak {
                stat.current
            } else {
                self.peaks[i].max(stat.current)
            };
            let mapped_in_steps = self.expandable_segments && name.starts_with("reserved_bytes.");
            if mapped_in_steps {
                self.peaks[i] = self.peaks[i].max(stat.peak);
            }
            assert_eq!(stat.peak, self.peaks[i], "{name}.peak after {step:?}");
        }
        for ((name, stat), (_, before)) in every_stat(&now).into_iter().zip(every_stat(&self.last))
        {
            assert!(stat.current >= 0, "{name}.current < 0 after {step:?}");
            assert!(
                stat.peak >= stat.current,
                "{name}.peak < current after {step:?}"
            );
            if reset_peak {
                assert_eq!(stat.peak, stat.current, "{name}.peak after {step:?}");
            }
            if reset_totals {
                assert_eq!(
                    (stat.allocated, stat.freed),
                    (0, 0),
                    "{name} totals after reset"
                );
            } else {
                assert!(
                    stat.allocated >= before.allocated && stat.freed >= before.freed,
                    "{name}'s running totals fell after {step:?}: {before:?} -> {stat:?}"
                );
            }
        }
        for ((key, count), (_, before)) in now
            .counts
            .entries()
            .into_iter()
            .zip(self.last.counts.entries())
        {
            if reset_totals {
                assert_eq!(count, 0, "{key} after reset");
            } else {
                assert!(count >= before, "{key} fell after {step:?}");
            }
        }
        self.last = now;
    }
}

fn run(settings: Settings, capacity: u64, steps: Vec<Step>) {
    let device = SimDevice::new(capacity).with_pending_work();
    let mut p = DeviceAllocator::new(device, settings.clone());
    let mut shadow = Shadow {
        live: BTreeMap::new(),
        last_freed: None,
    };
    let mut model = StatsModel::new(&p);
    for step in steps {
        match step.clone() {
            Step::Alloc { size, stream } => {
                if shadow.live.len() >= MAX_LIVE {
                    continue;
                }
                match p.malloc(size, StreamId(stream)) {
                    Ok(ptr) => {
                        let block = p.allocation_size(ptr).expect("live allocation has a size");
                        assert_eq!(ptr.addr() % 512, 0);
                        assert!(block >= round_size(&settings, size));
                        let inside = p
                            .backend()
                            .segments()
                            .any(|(a, s)| a <= ptr.addr() && ptr.addr() + block <= a + s);
                        assert!(inside, "allocation outside every device segment");
                        shadow.check_disjoint(ptr.addr(), block);
                        shadow.live.insert(ptr.addr(), (block, size));
                    }
                    Err(Error::OutOfMemory(report)) => {
                        // After the whole ladder, the segment (or with expandable segments,
                        // the pages for the request) really did not fit.
                        assert!(capacity != u64::MAX);
                        let needed = if settings.expandable_segments {
                            let page = if report.rounded <= MIB {
                                2 * MIB
                            } else {
                                20 * MIB
                            };
                            report.rounded.div_ceil(page) * page
                        } else {
                            report.alloc_size
                        };
                        // per_process_memory_fraction caps what the pool may reserve.
                        let limit = if settings.per_process_memory_fraction < 1.0 {
                            (settings.per_process_memory_fraction * capacity as f64) as u64
                        } else {
                            capacity
                        };
                        assert!(
                            report.reserved + needed > limit,
                            "OOM although {} reserved + {needed} fits in {limit}",
                            report.reserved,
                        );
                    }
                    Err(e) => panic!("unexpected error {e:?}"),
                }
            }
            Step::Free { pick } => {
                let Some(ptr) = shadow.take_live(pick) else {
                    continue;
                };
                p.free(ptr).unwrap();
                shadow.last_freed = Some(ptr);
            }
            Step::DeferredFree { pick } => {
                let Some(ptr) = shadow.take_live(pick) else {
                    continue;
                };
                p.free_deferred(ptr).unwrap();
            }
            Step::FreeAfterStreams { pick } => {
                let Some(ptr) = shadow.take_live(pick) else {
                    continue;
                };
                let streams = [StreamId(100 + pick as u64 % 3)];
                assert_eq!(p.free_after_streams(ptr, &streams), Ok(vec![]));
            }
            Step::DeferredFreeAfterStreams { pick } => {
                let Some(ptr) = shadow.take_live(pick) else {
                    continue;
                };
                let streams = [StreamId(100 + pick as u64 % 3)];
                assert_eq!(p.free_deferred_after_streams(ptr, &streams), Ok(vec![]));
            }
            Step::CompleteWork => p.backend_mut().complete_work(),
            Step::DoubleFree => {
                if let Some(ptr) = shadow.last_freed
                    && !shadow.live.contains_key(&ptr.addr())
                {
                    // A live allocation may since hold the address inside its block.
                    let holder = shadow
                        .live
                        .range(..ptr.addr())
                        .next_back()
                        .filter(|&(&a, &(block, _))| ptr.addr() < a + block)
                        .map(|(&start, &(_, requested))| (start, requested));
                    match (p.free(ptr), holder) {
                        (
                            Err(Error::InvalidPointer {
                                reason: BadPointer::Interior { start, requested },
                                ..
                            }),
                            Some(live),
                        ) => assert_eq!((start, requested), live, "the allocation named"),
                        // Cached or unmapped again, or in a block whose deferred free is
                        // pending.
                        (
                            Err(Error::InvalidPointer {
                                reason:
                                    BadPointer::CachedFree
                                    | BadPointer::Unmapped
                                    | BadPointer::AlreadyFreed
                                    | BadPointer::InsidePending { .. },
                                ..
                            })
                            | Err(Error::NotOwned { .. }),
                            None,
                        ) => {}
                        (other, holder) => {
                            panic!("double free: {other:?}, live allocation there: {holder:?}")
                        }
                    }
                }
            }
            Step::EmptyCache => {
                p.empty_cache().unwrap();
                // Every remaining segment holds a live allocation.
                for seg in p.segments() {
                    assert!(
                        seg.blocks
                            .iter()
                            .any(|b| b.state == cachealloc::pool::BlockState::Allocated),
                        "empty_cache kept a free segment at {:#x}",
                        seg.addr
                    );
                }
            }
            Step::ResetPeak => p.reset_peak_stats(),
            Step::ResetAccumulated => p.reset_accumulated_stats(),
        }
        check_against_shadow(&p, &shadow);
        model.check(&p, &step);
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_invariant(
        (settings, capacity) in settings_strategy(),
        steps in proptest::collection::vec(step_strategy(), OPS_PER_CASE),
    ) {
        run(settings, capacity, steps);
    }
}
