//! Property test: random malloc / free / deferred free / empty_cache sequences on the simulated
//! device (with device work that completes only when told to), checked
//! against a shadow model of the live allocations and the pool's own invariant walker after
//! every step. `PROPTEST_CASES` raises the number of cases (scripts/proptest-long.sh).

use cachealloc::backend::sim::SimDevice;
use cachealloc::pool::rounding::round_size;
use cachealloc::pool::{BadPointer, DeviceAllocator, DevicePtr, Error, Settings, StreamId};
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
    ]
}

fn settings_strategy() -> impl Strategy<Value = (Settings, u64)> {
    (
        prop_oneof![Just(u64::MAX), Just(20 * MIB), Just(64 * MIB)],
        prop_oneof![Just(0u64), Just(4), Just(8)],
        prop_oneof![Just(u64::MAX), Just(512 * MIB), Just(2048 * MIB)],
        prop_oneof![2 => Just(false), 1 => Just(true)],
    )
        .prop_map(|(mss, div, capacity, expandable_segments)| {
            let settings = Settings {
                max_split_size: mss,
                roundup_power2_divisions: [div; 16],
                expandable_segments,
                ..Settings::default()
            };
            (settings, capacity)
        })
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

fn run(settings: Settings, capacity: u64, steps: Vec<Step>) {
    let device = SimDevice::new(capacity).with_pending_work();
    let mut p = DeviceAllocator::new(device, settings.clone());
    let mut shadow = Shadow {
        live: BTreeMap::new(),
        last_freed: None,
    };
    for step in steps {
        match step {
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
                        assert!(
                            report.reserved + needed > capacity,
                            "OOM although {} reserved + {needed} fits in {capacity}",
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
                    match p.free(ptr) {
                        // The address may since hold a block whose deferred free is pending.
                        Err(Error::InvalidPointer {
                            reason: BadPointer::NotAnAllocation | BadPointer::AlreadyFreed,
                            ..
                        })
                        | Err(Error::NotOwned { .. }) => {}
                        other => panic!("double free accepted: {other:?}"),
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
        }
        check_against_shadow(&p, &shadow);
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
