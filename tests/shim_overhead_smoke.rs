//! A bounded run of the shim-overhead benchmark's pieces (the full run is
//! `cargo bench --bench shim_overhead`): the C program times pairs under the debug library and
//! without it, the core timing runs, and the runtime counters (the pool's device allocations,
//! for the core) show the timed pairs were cache hits. No timing is asserted.

#[path = "../benches/quick_arg/mod.rs"]
#[allow(dead_code)] // the tests parse; the benchmark reads its own command line
mod quick_arg;
#[path = "../benches/shim_pairs/mod.rs"]
mod shim_pairs;
mod support;

use shim_pairs::{PairsRun, SIZES, Setup, run_pairs, time_core_pairs};
use support::fake_cudart;

/// Pairs per round and rounds: small, so the debug build stays quick.
const PAIRS: u64 = 500;
const ROUNDS: u64 = 2;

fn assert_sensible(run: &PairsRun) {
    let sizes: Vec<u64> = run.ns_per_pair.iter().map(|(s, _)| *s).collect();
    assert_eq!(sizes, SIZES, "one line per size, in order");
    for (size, ns) in &run.ns_per_pair {
        assert!(
            ns.is_finite() && *ns > 0.0,
            "{size} B: {ns} ns per pair is not a duration"
        );
    }
}

#[test]
fn pairs_under_the_shim_are_cache_hits() {
    let lib = support::shim::library();
    for free_sync in ["none", "device"] {
        let run = run_pairs(
            Setup::Shim {
                library: &lib,
                free_sync,
            },
            &SIZES,
            PAIRS,
            ROUNDS,
        )
        .unwrap();
        assert_sensible(&run);
        // One segment per pool at most: every timed pair was served from the cache.
        assert!(
            run.fake_mallocs <= SIZES.len() as u64,
            "free_sync:{free_sync}: {} runtime allocations",
            run.fake_mallocs
        );
        match free_sync {
            "none" => assert_eq!(run.fake_device_syncs, 0, "none reuses at once"),
            // Pending blocks come back only after a synchronization, which the pool makes
            // when no ready block fits.
            _ => assert!(run.fake_device_syncs > 0, "device: no synchronization"),
        }
    }
}

#[test]
fn pairs_without_the_shim_reach_the_fake_runtime_every_time() {
    let run = run_pairs(Setup::FakeAlone, &SIZES, PAIRS, ROUNDS).unwrap();
    assert_sensible(&run);
    // A warm-up pair per size, then every timed pair.
    assert_eq!(run.fake_mallocs, SIZES.len() as u64 * (1 + PAIRS * ROUNDS));
}

/// The core row times cache hits too: the warm-up pair's segment serves every timed pair.
#[test]
fn core_pairs_are_cache_hits() {
    for size in SIZES {
        let run = time_core_pairs(size, PAIRS, ROUNDS);
        let ns = run.ns_per_pair;
        assert!(ns.is_finite() && ns > 0.0, "{size} B: {ns} ns per pair");
        assert_eq!(run.device_allocs, 1, "{size} B: segments obtained");
    }
}

/// The benchmark's command line (recorded_frees' too): `--help` prints the usage and runs
/// nothing; an argument it does not take is refused, not ignored (a full run).
#[test]
fn the_command_line_takes_quick_and_help_and_refuses_the_rest() {
    use quick_arg::{QuickArg, parse};
    let parse = |args: &[&str]| parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>());
    assert_eq!(parse(&["--bench"]), Ok(QuickArg::Run { quick: false }));
    assert_eq!(parse(&[]), Ok(QuickArg::Run { quick: false }));
    assert_eq!(
        parse(&["--quick", "--bench"]),
        Ok(QuickArg::Run { quick: true })
    );
    assert_eq!(parse(&["--bench", "--help"]), Ok(QuickArg::Help));
    assert_eq!(parse(&["-h", "--quick"]), Ok(QuickArg::Help));
    for args in [&["--quik"][..], &["--reps", "3"], &["512"]] {
        assert_eq!(
            parse(args),
            Err(format!(
                "unknown option {:?}; allowed: --quick, --help",
                args[0]
            )),
            "{args:?}"
        );
    }
}
