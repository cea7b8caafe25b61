//! A bounded run of the benchmark harness (the full run is `cargo bench --bench pool_speed`):
//! both allocators replay the same short operation sequence, and the table renders.

#[path = "../benches/support/mod.rs"]
mod support;

use cachealloc::backend::sim::SimDevice;
use cachealloc::pool::{BlockState, DeviceAllocator, Settings};
use cachealloc::trace::synth::SynthSpec;

#[test]
fn harness_times_both_allocators_on_the_same_sequence() {
    let spec: SynthSpec = "loguniform:ops=20000".parse().unwrap();
    let workload = spec.generate(3).unwrap();
    let row = support::Row::measure_with("smoke", &workload, support::Reps::Exactly(1), true);
    assert_eq!(row.ops, 20000);
    assert!(row.pool.median_ns > 0.0 && row.offset.median_ns > 0.0);
    // One repetition: the paired ratio is that pass's ratio.
    let single = row.pool.median_ns / row.offset.median_ns;
    assert!((row.paired_ratio - single).abs() < 1e-9 * single);
    assert!(row.replay_ops_per_s > 0.0);
    support::print_table(&[row]);
}

/// The medians the table prints (each allocator's, and the paired ratios') are medians: of an
/// even number of passes, the mean of the two middle ones, not the upper one (with two pairs,
/// the upper one is the slower pass).
#[test]
fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
    let t = support::timing(vec![8.0, 1.0, 4.0, 2.0]);
    assert_eq!((t.min_ns, t.median_ns), (1.0, 3.0));
    assert_eq!(support::timing(vec![5.0, 3.0]).median_ns, 4.0);
    let t = support::timing(vec![9.0, 1.0, 4.0]);
    assert_eq!((t.min_ns, t.median_ns), (1.0, 4.0));
    assert_eq!(support::timing(vec![7.0]).median_ns, 7.0);
}

/// The default repetitions: at least `min` pairs, more until the pool's passes fill the
/// budget, never more than `max`.
#[test]
fn repetitions_stop_at_the_minimum_the_budget_or_the_maximum() {
    let spec: SynthSpec = "loguniform:ops=2000".parse().unwrap();
    let workload = spec.generate(7).unwrap();
    let pairs = |reps| support::Row::measure_with("reps", &workload, reps, false).pairs;
    let until = |min, budget, max| support::Reps::Until { min, budget, max };
    // A spent budget: the minimum.
    assert_eq!(pairs(until(2, 0.0, 50)), 2);
    // A budget no run reaches: the maximum.
    assert_eq!(pairs(until(1, 1e9, 4)), 4);
    // In between: more than the minimum, because 2,000 operations take far less than 20 ms.
    let n = pairs(until(1, 0.02, 100_000));
    assert!(n > 1 && n < 100_000, "{n} pairs");
}

/// The timed pass starts from a warmed pool (tables sized by an untimed pass, then emptied):
/// it must do what a fresh pool does — the same addresses and the same device calls.
#[test]
fn the_warmed_pool_replays_like_a_fresh_one() {
    let spec: SynthSpec = "loguniform:ops=20000".parse().unwrap();
    let workload = spec.generate(5).unwrap();
    let ops = support::alloc_free_ops(&workload);
    let n = workload.num_ids as usize;
    let replay = |mut pool: DeviceAllocator<SimDevice>| {
        let mut placed = Vec::new();
        support::run_pool(&mut pool, &mut vec![None; n], &ops, |ptr| {
            placed.push(ptr.addr())
        });
        pool.validate().unwrap();
        let stats = pool.stats();
        (
            placed,
            stats.counts.num_device_alloc,
            stats.reserved_bytes.all.peak,
        )
    };
    let warmed = replay(support::warm_pool(&ops, n));
    let fresh = replay(DeviceAllocator::new(
        SimDevice::new(u64::MAX),
        Settings::default(),
    ));
    assert!(fresh.1 > 0);
    let first_difference = (warmed.0.iter().zip(&fresh.0)).position(|(w, f)| w != f);
    assert_eq!(
        first_difference, None,
        "allocation index where the addresses differ"
    );
    assert_eq!(warmed, fresh);
}

/// The equal-size churn row does what its benchmark says: its blocks never coalesce (a free one
/// keeps its size), so the churn is served from a thousand cached blocks of one size without a
/// new segment.
#[test]
fn the_equal_size_churn_reuses_a_thousand_equal_cached_blocks() {
    use support::equal_size::{CHURN, PAIRS, SETUP_OPS, SIZE, equal_size_churn};
    let workload = equal_size_churn();
    let ops = support::alloc_free_ops(&workload);
    assert_eq!(ops.len(), SETUP_OPS + 2 * CHURN);
    let n = workload.num_ids as usize;
    let mut pool = DeviceAllocator::new(SimDevice::new(u64::MAX), Settings::default());
    let mut live = vec![None; n];
    support::run_pool(&mut pool, &mut live, &ops[..SETUP_OPS], |_| {});
    let free_blocks = |pool: &DeviceAllocator<SimDevice>| {
        let segments = pool.segments();
        let blocks = segments.iter().flat_map(|s| s.blocks.iter());
        // Segment tails left over from the setup are free too, at other sizes.
        (blocks.filter(|b| b.state == BlockState::Free && b.size == SIZE)).count()
    };
    assert_eq!(free_blocks(&pool), PAIRS as usize / 2);
    let segments = pool.stats().counts.num_device_alloc;
    let mut placed = Vec::new();
    support::run_pool(&mut pool, &mut live, &ops[SETUP_OPS..], |ptr| {
        placed.push(ptr.addr())
    });
    pool.validate().unwrap();
    assert_eq!(free_blocks(&pool), PAIRS as usize / 2);
    assert_eq!(
        pool.stats().counts.num_device_alloc,
        segments,
        "the churn grew the pool"
    );
    assert_eq!(placed.len(), CHURN);
}

/// `scripts/bench-decomposition.sh` applies `benches/experiments/parity-duties.patch` to the
/// current commit: a change to the lines it patches must regenerate it (the script refuses to
/// run otherwise, and a stale patch went unnoticed for 240 commits once).
#[test]
fn the_decomposition_patch_applies_to_the_tree() {
    let root = env!("CARGO_MANIFEST_DIR");
    let patch = format!("{root}/benches/experiments/parity-duties.patch");
    let out = std::process::Command::new("git")
        .args(["apply", "--check", &patch])
        .current_dir(root)
        .output();
    let Ok(out) = out else {
        eprintln!("skipped: git not found");
        return;
    };
    assert!(
        out.status.success(),
        "{patch} no longer applies; regenerate it (see scripts/bench-decomposition.sh):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
