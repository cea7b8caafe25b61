//! A bounded run of the benchmark harness (the full run is `cargo bench --bench pool_speed`):
//! both allocators replay the same short operation sequence, and the table renders.

#[path = "../benches/support/mod.rs"]
mod support;

use cachealloc::backend::sim::SimDevice;
use cachealloc::pool::{BlockState, DeviceAllocator, Settings, StreamId};
use cachealloc::trace::synth::SynthSpec;
use cachealloc::trace::{Op, Workload};

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

/// Both allocators replay the whole of each synthetic row's workload: every allocation and every
/// free, ending with the ids it allocates and never frees.
#[test]
fn both_allocators_replay_the_whole_workload() {
    use support::same_work::{Replayed, check, offset_allocator_replayed, pool_replayed};
    let synth = |spec: &str, seed| spec.parse::<SynthSpec>().unwrap().generate(seed).unwrap();
    let workloads = [
        synth("loguniform:ops=20000", 3),
        synth("transformer:layers=2,steps=4", 1),
        support::equal_size::equal_size_churn(),
    ];
    for workload in workloads {
        let ops = support::alloc_free_ops(&workload);
        let n = workload.num_ids as usize;
        let mut live = vec![false; n];
        let (mut allocations, mut frees) = (0, 0);
        for op in &ops {
            match *op {
                Op::Alloc { id, .. } => (allocations, live[id as usize]) = (allocations + 1, true),
                Op::Free { id } => (frees, live[id as usize]) = (frees + 1, false),
                _ => unreachable!("{op:?}"),
            }
        }
        let expected = Replayed {
            allocations,
            frees,
            live: (0..n).filter(|&id| live[id]).collect(),
        };
        assert!(frees > 0 && !expected.live.is_empty(), "{}", workload.name);
        assert_eq!(pool_replayed(&ops, n), expected, "{}", workload.name);
        assert_eq!(offset_allocator_replayed(&ops, n).as_ref(), Ok(&expected));
        assert_eq!(check(&ops, n), Ok(expected));
    }
}

/// A free that completed later than the program asked for it (at a synchronization, in the
/// recording) is still that allocation's free: the comparison frees it there, rather than
/// keeping it live to the end. Other operations (a requested free's first half, empty_cache)
/// have no counterpart in offset-allocator and are left out.
#[test]
fn every_kind_of_free_is_a_free_in_the_comparison() {
    let mut workload = allocations(&[4096, 8192, 512]);
    workload.ops.extend([
        Op::FreeRequested {
            id: 0,
            until_device_sync: false,
            outlasts_device_sync: false,
        },
        Op::FreeAtSync {
            id: 0,
            first_in_request: true,
        },
        Op::FreeRequested {
            id: 1,
            until_device_sync: true,
            outlasts_device_sync: false,
        },
        Op::FreeAtGrowthSync { id: 1 },
        Op::EmptyCache,
        Op::Free { id: 2 },
    ]);
    assert_eq!(
        support::alloc_free_ops(&workload)[3..],
        [Op::Free { id: 0 }, Op::Free { id: 1 }, Op::Free { id: 2 }]
    );
}

/// A workload of `sizes`, all live at the end.
fn allocations(sizes: &[u64]) -> Workload {
    let mut workload = Workload::new("allocations");
    for (id, &size) in (0..).zip(sizes) {
        workload.ops.push(Op::Alloc {
            id,
            size,
            stream: StreamId(0),
            recorded_addr: None,
        });
    }
    workload.num_ids = sizes.len() as u32;
    workload
}

/// offset-allocator manages 2 TiB (2^32 − 1 units of 512 bytes); the pool's simulated device
/// 128 TiB. Three allocations of 1 TiB: the pool holds them, offset-allocator only the first.
/// The row is refused, not timed as if offset-allocator had done the pool's work.
#[test]
#[should_panic(expected = "offset-allocator refused allocation 1 (id 1) of 1099511627776 bytes")]
fn a_row_offset_allocator_cannot_hold_is_refused() {
    let workload = allocations(&[1 << 40, 1 << 40, 1 << 40]);
    support::Row::measure_with("too large", &workload, support::Reps::Exactly(1), false);
}

/// A request of 2 TiB or more is no count of 512-byte units offset-allocator takes (a u32):
/// refused, not truncated to a small one.
#[test]
#[should_panic(expected = "2199023255552 bytes is more than offset-allocator's range")]
fn a_request_beyond_offset_allocators_range_is_refused() {
    let workload = allocations(&[2 << 40]);
    support::Row::measure_with("too large", &workload, support::Reps::Exactly(1), false);
}

/// The benchmark's command line: `--help` prints the usage (and runs nothing), a mistyped or
/// unknown option, a missing or bad value, a zero count and an option given twice are refused
/// with a message naming them, instead of a full run with the defaults.
#[test]
fn the_command_line_takes_its_options_and_refuses_the_rest() {
    use support::Reps;
    use support::options::{Options, Parsed, USAGE, parse};
    let parse = |args: &[&str]| parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>());
    let run = |args: &[&str]| match parse(args) {
        Ok(Parsed::Run(options)) => options,
        other => panic!("{args:?}: {other:?}"),
    };
    let refused = |args: &[&str]| parse(args).expect_err(&format!("{args:?} taken"));

    // cargo bench adds --bench.
    let defaults = run(&["--bench"]);
    assert_eq!(
        defaults,
        Options {
            quick: false,
            reps: Reps::Until {
                min: 7,
                budget: 0.5,
                max: 3000
            },
            only: None,
            replay: true,
            loguniform: None,
        }
    );
    assert_eq!(run(&[]), defaults);
    let quick = run(&["--quick", "--bench"]);
    assert!(quick.quick);
    assert_eq!(
        quick.reps,
        Reps::Until {
            min: 3,
            budget: 0.05,
            max: 300
        }
    );
    let all = run(&[
        "--quick",
        "--reps",
        "5",
        "--only",
        "sqattn",
        "--no-replay",
        "--loguniform",
        "budget_gib=4",
        "--bench",
    ]);
    assert_eq!(
        all,
        Options {
            quick: true,
            reps: Reps::Exactly(5),
            only: Some("sqattn".into()),
            replay: false,
            loguniform: Some("budget_gib=4".into()),
        }
    );
    assert!(all.wants("real: sqattn") && !all.wants("real: decomfl"));

    for help in [&["--help"][..], &["--bench", "-h"], &["--quick", "--help"]] {
        assert_eq!(parse(help), Ok(Parsed::Help), "{help:?}");
    }
    for option in [
        "--quick",
        "--reps",
        "--only",
        "--no-replay",
        "--loguniform",
        "--help",
    ] {
        assert!(
            USAGE.contains(option),
            "{option} missing from the usage:\n{USAGE}"
        );
    }

    assert_eq!(
        refused(&["--rep", "3"]),
        "unknown option \"--rep\"; allowed: --quick, --reps N, --only TEXT, --no-replay, \
         --loguniform PARAMS, --help"
    );
    assert!(refused(&["sqattn"]).starts_with("unknown option \"sqattn\""));
    assert_eq!(
        refused(&["--reps"]),
        "--reps needs a value: a count of pairs, at least 1"
    );
    assert_eq!(
        refused(&["--only"]),
        "--only needs a value: text of the rows' names"
    );
    assert_eq!(
        refused(&["--reps", "0"]),
        "--reps 0: a count of pairs, at least 1"
    );
    assert_eq!(
        refused(&["--reps", "five"]),
        "--reps \"five\": a count of pairs, at least 1"
    );
    assert_eq!(
        refused(&["--only", "a", "--only", "b"]),
        "--only is given twice; give it once"
    );
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
