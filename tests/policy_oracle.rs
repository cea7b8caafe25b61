//! Differential test of the pool's policy: random malloc / free / free after another stream /
//! deferred free (`free_sync:device`, whose rule the reference states as cachealloc's) /
//! empty_cache / memory-fraction change / statistics-reset sequences under random settings
//! (max_split_size from the 20 MiB that PyTorch's parser takes up, max_non_split_rounding,
//! per-interval roundup divisions, garbage collection under a memory fraction, expandable
//! segments, device capacity), run through `DeviceAllocator` and through
//! `support::reference_pool` — a plain, literal implementation of PyTorch's policy from the
//! reference text and PyTorch's source — each on its own simulated device. After every step
//! both must have answered alike (the same address, or both out of memory), asked their
//! devices for the same segments, and report the same statistics, key by key; an out-of-memory
//! report must describe the cache and the device as the reference finds them. The real traces
//! (tests/parity.rs) show the policy on what programs do; this shows it on what they rarely
//! do: long classes of equal blocks, the oversize rules, the retry ladder, GC.
//! `PROPTEST_CASES` raises the number of cases (scripts/proptest-long.sh runs it too).

mod support;

use cachealloc::backend::sim::SimDevice;
use cachealloc::pool::{DeviceAllocator, DevicePtr, DeviceStats, Error, Settings, StreamId};
use proptest::prelude::*;
use support::reference_pool::{CacheView, ReferencePool, round_size};

const MIB: u64 = 1 << 20;
const OPS_PER_CASE: usize = 1500;
const MAX_LIVE: usize = 600;

#[derive(Clone, Debug)]
enum Step {
    Alloc {
        size: u64,
        stream: u64,
    },
    Free {
        pick: usize,
        how: FreeKind,
    },
    /// The device finishes all work issued so far.
    CompleteWork,
    /// `count` allocations of one size in a row.
    Burst {
        size: u64,
        stream: u64,
        count: usize,
    },
    /// Free every second live allocation in address order, leaving equal free blocks between
    /// live ones (a long class of the free index).
    FreeAlternate,
    EmptyCache,
    /// `torch.cuda.set_per_process_memory_fraction` while the program runs.
    SetFraction(f64),
    ResetPeak,
    ResetAccumulated,
}

/// How a free hands its block back.
#[derive(Clone, Copy, Debug)]
enum FreeKind {
    /// Reusable at once.
    AtOnce,
    /// Recorded on another stream (`Tensor.record_stream`): the block waits for that stream's
    /// work. Always the same stream: PyTorch completes each stream's queue of events in order,
    /// but visits the queues in its hash map's order, which no model can follow (and the order
    /// decides the inactive-split running totals).
    AfterStreams,
    /// Deferred until the device has finished the work issued before it (`free_sync:device`,
    /// cachealloc's own rule).
    Deferred,
    /// Deferred, and another stream's work may also use it: on the simulated device, one queue
    /// of work, that work completes with the device's, so the reference sees a deferred free.
    /// The case this free exists for — its device fence done while another device's stream
    /// fence is not, so that the block then waits for the stream — cannot arise here; the
    /// pool's own tests (`src/pool/tests.rs`) cover it.
    DeferredAfterStreams,
}

/// Sizes that recur, so that equal free blocks gather in one class.
fn recurring_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(512u64),
        Just(4096),
        Just(MIB),
        Just(3 * MIB),
        Just(24 * MIB),
        Just(96 * MIB)
    ]
}

/// Recurring sizes mixed with sizes spread over both pools and past the oversize limits.
fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => recurring_size(),
        4 => 1u64..=MIB,
        3 => MIB..=24 * MIB,
        1 => 24 * MIB..=300 * MIB,
    ]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => (size_strategy(), 0u64..3).prop_map(|(size, stream)| Step::Alloc { size, stream }),
        9 => any::<usize>().prop_map(|pick| Step::Free { pick, how: FreeKind::AtOnce }),
        2 => any::<usize>().prop_map(|pick| Step::Free { pick, how: FreeKind::AfterStreams }),
        2 => any::<usize>().prop_map(|pick| Step::Free { pick, how: FreeKind::Deferred }),
        1 => any::<usize>().prop_map(|pick| Step::Free {
            pick,
            how: FreeKind::DeferredAfterStreams
        }),
        1 => Just(Step::CompleteWork),
        1 => (recurring_size(), 0u64..3, 33usize..100)
            .prop_map(|(size, stream, count)| Step::Burst { size, stream, count }),
        1 => Just(Step::FreeAlternate),
        1 => Just(Step::EmptyCache),
        1 => prop_oneof![Just(0.3), Just(0.5), Just(0.8), Just(1.0)].prop_map(Step::SetFraction),
        1 => Just(Step::ResetPeak),
        1 => Just(Step::ResetAccumulated),
    ]
}

fn settings_strategy() -> impl Strategy<Value = (Settings, u64)> {
    let divisions = proptest::collection::vec(
        prop_oneof![Just(0u64), Just(1), Just(2), Just(4), Just(8)],
        16,
    );
    (
        prop_oneof![
            Just(u64::MAX),
            Just(20 * MIB),
            Just(21 * MIB),
            Just(64 * MIB),
            Just(200 * MIB)
        ],
        prop_oneof![2 => Just(20 * MIB), 1 => Just(100 * MIB)],
        prop_oneof![Just(None), Just(Some(0u64)), Just(Some(4))],
        divisions,
        prop_oneof![
            Just(u64::MAX),
            Just(512 * MIB),
            Just(2048 * MIB),
            Just(8192 * MIB)
        ],
        prop_oneof![2 => Just(1.0), 1 => Just(0.5), 1 => Just(0.8)],
        prop_oneof![2 => Just(0.0), 1 => Just(0.3), 1 => Just(0.7)],
        prop_oneof![2 => Just(false), 1 => Just(true)],
    )
        .prop_map(
            |(mss, rounding, uniform, mixed, capacity, fraction, gc, expandable)| {
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
                    expandable_segments: expandable,
                };
                // An expandable range is 1⅛ of the device's memory: the device needs a size.
                let capacity = if expandable {
                    capacity.min(8192 * MIB)
                } else {
                    capacity
                };
                (settings, capacity)
            },
        )
}

/// The keys whose values differ, as `torch.cuda.memory_stats()` names them.
fn differences(pool: &DeviceStats, reference: &DeviceStats) -> Vec<String> {
    pool.flat()
        .into_iter()
        .zip(reference.flat())
        .filter(|(a, b)| a.1 != b.1)
        .map(|((key, ours), (_, theirs))| format!("{key}: pool {ours}, reference {theirs}"))
        .collect()
}

/// One malloc on both allocators, which must answer alike.
fn malloc_both(
    pool: &mut DeviceAllocator<SimDevice>,
    reference: &mut ReferencePool,
    live: &mut Vec<u64>,
    size: u64,
    stream: u64,
    step: usize,
) {
    let mut report = None;
    let ours = match pool.malloc(size, StreamId(stream)) {
        Ok(ptr) => Some(ptr.addr()),
        Err(Error::OutOfMemory(r)) => {
            report = Some(r);
            None
        }
        Err(e) => panic!("step {step}: unexpected error {e:?}"),
    };
    let theirs = reference.malloc(size, stream);
    assert_eq!(
        ours,
        theirs,
        "step {step}: malloc({size}) on stream {stream} (rounded {}) placed differently",
        round_size(pool.settings(), size)
    );
    live.extend(ours);
    if let Some(r) = report {
        // The report describes the cache and the device as they are after the whole ladder.
        let rounded = round_size(pool.settings(), size);
        assert_eq!((r.requested, r.rounded), (size, rounded), "step {step}");
        let described = CacheView {
            free_blocks: r.free_blocks,
            largest_free_blocks: r.largest_free_blocks.clone(),
            pool_largest_free_block: r.pool_largest_free_block,
            other_streams_free: r.other_streams_free,
            other_streams_largest_free_block: r.other_streams_largest_free_block,
            reserved: r.reserved,
            device_free: r.device_free,
            alloc_size: r.alloc_size,
        };
        let view = reference.cache_view(rounded, stream);
        assert_eq!(
            described, view,
            "step {step}: the out-of-memory report of malloc({size})"
        );
    }
}

fn free_both(
    pool: &mut DeviceAllocator<SimDevice>,
    reference: &mut ReferencePool,
    addr: u64,
    step: usize,
) {
    pool.free(DevicePtr::new(addr).expect("not null"))
        .unwrap_or_else(|e| panic!("step {step}: free({addr:#x}) refused: {e:?}"));
    reference.free(addr);
}

/// One free of `addr` on both allocators, handed back as `how` says.
fn free_how(
    pool: &mut DeviceAllocator<SimDevice>,
    reference: &mut ReferencePool,
    addr: u64,
    how: FreeKind,
    step: usize,
) {
    let ptr = DevicePtr::new(addr).expect("not null");
    let used_by = [StreamId(100)];
    let unfenced = match how {
        FreeKind::AtOnce => return free_both(pool, reference, addr, step),
        FreeKind::AfterStreams => {
            reference.free_after_streams(addr);
            pool.free_after_streams(ptr, &used_by)
        }
        FreeKind::Deferred => {
            reference.free_deferred(addr);
            pool.free_deferred(ptr).map(|()| vec![])
        }
        FreeKind::DeferredAfterStreams => {
            reference.free_deferred(addr);
            pool.free_deferred_after_streams(ptr, &used_by)
        }
    };
    assert_eq!(
        unfenced,
        Ok(vec![]),
        "step {step}: {how:?} free of {addr:#x}"
    );
}

/// Free every second live allocation in address order.
fn free_every_second(
    pool: &mut DeviceAllocator<SimDevice>,
    reference: &mut ReferencePool,
    live: &mut Vec<u64>,
    step: usize,
) {
    live.sort_unstable();
    let mut kept = Vec::with_capacity(live.len() / 2 + 1);
    for (n, addr) in live.drain(..).enumerate() {
        if n % 2 == 0 {
            kept.push(addr);
        } else {
            free_both(pool, reference, addr, step);
        }
    }
    *live = kept;
}

fn run(settings: Settings, capacity: u64, steps: Vec<Step>) {
    let device = SimDevice::new(capacity).with_pending_work();
    let mut pool = DeviceAllocator::new(device, settings.clone());
    let mut reference = ReferencePool::new(SimDevice::new(capacity), settings.clone());
    let mut live: Vec<u64> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Alloc { size, stream } if live.len() < MAX_LIVE => {
                malloc_both(&mut pool, &mut reference, &mut live, size, stream, i);
            }
            Step::Burst {
                size,
                stream,
                count,
            } => {
                for _ in 0..count.min(MAX_LIVE.saturating_sub(live.len())) {
                    malloc_both(&mut pool, &mut reference, &mut live, size, stream, i);
                }
            }
            Step::Alloc { .. } => {}
            Step::FreeAlternate => free_every_second(&mut pool, &mut reference, &mut live, i),
            Step::Free { pick, how } => {
                if live.is_empty() {
                    continue;
                }
                let addr = live.swap_remove(pick % live.len());
                free_how(&mut pool, &mut reference, addr, how, i);
            }
            Step::CompleteWork => {
                pool.backend_mut().complete_work();
                reference.complete_work();
            }
            Step::EmptyCache => {
                pool.empty_cache().expect("empty_cache");
                reference.release_cached_blocks();
            }
            Step::SetFraction(fraction) => {
                pool.set_memory_fraction(fraction)
                    .expect("a fraction in [0, 1]");
                reference.set_memory_fraction(fraction);
            }
            Step::ResetPeak => {
                pool.reset_peak_stats();
                reference.reset_peak_stats();
            }
            Step::ResetAccumulated => {
                pool.reset_accumulated_stats();
                reference.reset_accumulated_stats();
            }
        }
        assert_same_state(&pool, &reference, &format!("step {i} ({step:?})"));
    }
    pool.validate().unwrap();
}

/// Both allocators report the same statistics and device segments.
fn assert_same_state(pool: &DeviceAllocator<SimDevice>, reference: &ReferencePool, when: &str) {
    let stats = pool.stats();
    if stats != reference.stats {
        let diff = differences(&stats, &reference.stats).join("\n");
        panic!("{when}: statistics differ:\n{diff}");
    }
    let segments: Vec<(u64, u64)> = pool.backend().segments().collect();
    let expected: Vec<(u64, u64)> = reference.device.segments().collect();
    assert_eq!(segments, expected, "{when}: device segments differ");
}

/// Hundreds of thousands of live blocks, as a program with many small tensors holds: the
/// pool's block table grows past the size at which it stops keeping three quarters of its
/// slots empty (2^20 slots), its free index files classes of tens of thousands of equal
/// fragments, and `empty_cache` gives the large table back. Placement and statistics must
/// still be PyTorch's.
#[test]
fn three_hundred_thousand_blocks_are_placed_as_pytorch_places_them() {
    const BLOCKS: usize = 300_000;
    let settings = Settings::default();
    let mut pool = DeviceAllocator::new(SimDevice::new(u64::MAX), settings.clone());
    let mut reference = ReferencePool::new(SimDevice::new(u64::MAX), settings);
    let mut live = Vec::with_capacity(BLOCKS);
    let size_of = |i: usize| 512 * (1 + (i * 7919) % 5) as u64;
    for i in 0..BLOCKS {
        malloc_both(&mut pool, &mut reference, &mut live, size_of(i), 0, i);
    }
    assert_same_state(&pool, &reference, "after the mallocs");
    // Every second block freed: fragments between live blocks, none can merge.
    free_every_second(&mut pool, &mut reference, &mut live, 0);
    assert_same_state(&pool, &reference, "after freeing every second block");
    // Best fit among the fragments.
    for i in 0..BLOCKS / 3 {
        malloc_both(
            &mut pool,
            &mut reference,
            &mut live,
            size_of(i * 3 + 1),
            0,
            i,
        );
    }
    assert_same_state(&pool, &reference, "after reusing the fragments");
    pool.validate().unwrap();
    for (n, addr) in live.drain(..).enumerate() {
        free_both(&mut pool, &mut reference, addr, n);
    }
    pool.empty_cache().expect("empty_cache");
    reference.release_cached_blocks();
    assert_same_state(&pool, &reference, "after empty_cache");
    for i in 0..1000 {
        malloc_both(&mut pool, &mut reference, &mut live, size_of(i), 0, i);
    }
    assert_same_state(&pool, &reference, "after starting over");
    pool.validate().unwrap();
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn the_pool_places_and_counts_as_pytorch_does(
        (settings, capacity) in settings_strategy(),
        steps in proptest::collection::vec(step_strategy(), OPS_PER_CASE),
    ) {
        run(settings, capacity, steps);
    }
}
