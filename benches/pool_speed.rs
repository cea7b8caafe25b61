//! Benchmark: the pool's malloc+free cost next to offset-allocator replaying the same operation
//! sequence, on the synthetic log-uniform trace and the real traces, plus replay speed.
//!
//! `cargo bench --bench pool_speed` (`-- --quick` for a short run). Real traces are read from
//! `$CACHEALLOC_TRACES` or `../shared/traces/real` when present.
//!
//! Each row times alternating pairs of passes (the pool's, then offset-allocator's): at least 7,
//! and more until the pool's passes add up to half a second (at most 3,000 pairs), so that the
//! short real traces are timed over hundreds of pairs (`--quick`: at least 3, 0.05 s, 300).
//!
//! `-- --help` lists the further options (`benches/support/options.rs`), which
//! scripts/bench-instructions.sh, bench-decomposition.sh and bench-live-set.sh use: `--reps N`
//! exactly N pairs, `--only TEXT` rows whose name contains TEXT, `--no-replay` skips the
//! replay-speed column, `--loguniform PARAMS` changes the log-uniform row's workload (as
//! `cachealloc synth loguniform:PARAMS` takes it, e.g. `budget_gib=10`: how many allocations
//! stay live). An unknown option is refused.

#[path = "../tests/support/ci.rs"]
mod ci;
mod support;
#[path = "../tests/support/traces.rs"]
#[allow(dead_code)] // the bench uses only the folder lookup
mod traces;

use cachealloc::trace::read_snapshot;
use cachealloc::trace::synth::{SynthKind, SynthSpec};
use support::options::{self, Parsed};
use support::{Row, print_table};
use traces::traces_dir;

/// The real traces with the most allocations (plain replay: from an empty device).
const REAL_TRACES: [&str; 5] = [
    "decomfl/edd30e0/memory.pickle",
    "cs336-wedsonlin/8630bcf/results/medium_1024_training_memory_snapshot.pickle",
    "ftcourse/9f4902c/memory_snapshot.pickle",
    "sqattn/126d2e6/cuda_memory_snapshot.pickle",
    "cs336-magma27/15883f2/memory_snapshot.pickle",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match options::parse(&args) {
        Ok(Parsed::Run(options)) => options,
        Ok(Parsed::Help) => {
            print!("{}", options::USAGE);
            return;
        }
        Err(e) => {
            eprintln!("pool_speed: {e}\n\n{}", options::USAGE);
            std::process::exit(2);
        }
    };
    let (quick, reps) = (options.quick, options.reps);
    let mut rows = Vec::new();
    let mut measure = |name: &str, workload: &cachealloc::trace::Workload| {
        rows.push(Row::measure_with(name, workload, reps, options.replay));
    };

    let name = "synthetic log-uniform 512 B–256 MiB";
    if options.wants(name) {
        let mut params: Vec<&str> = Vec::new();
        if quick {
            params.push("ops=100000");
        }
        params.extend(options.loguniform.as_deref());
        let spec: SynthSpec = if params.is_empty() {
            SynthSpec::new(SynthKind::LogUniform)
        } else {
            let text = format!("loguniform:{}", params.join(","));
            text.parse().unwrap_or_else(|e| {
                eprintln!("pool_speed: --loguniform: {text}: {e}");
                std::process::exit(2)
            })
        };
        let workload = spec.generate(42).expect("valid spec");
        match &options.loguniform {
            Some(p) => {
                let live = mean_live(&workload);
                measure(&format!("{name} ({p}; {live:.0} live)"), &workload);
            }
            None => measure(name, &workload),
        }
    }

    let name = "synthetic transformer training";
    if options.wants(name) {
        let spec = SynthSpec::new(SynthKind::Transformer);
        measure(name, &spec.generate(1).expect("valid spec"));
    }

    let name = "synthetic equal-size churn";
    if options.wants(name) {
        measure(name, &support::equal_size::equal_size_churn());
    }

    match traces_dir() {
        Some(dir) => {
            for rel in REAL_TRACES {
                let name = rel.split('/').next().unwrap_or(rel);
                if !options.wants(&format!("real: {name}")) {
                    continue;
                }
                let Ok(snapshot) = read_snapshot(dir.join(rel)) else {
                    eprintln!("skipping {rel}: not readable");
                    continue;
                };
                if let Some(rec) = snapshot.traced_devices().next() {
                    measure(&format!("real: {name}"), &rec.plain());
                }
            }
        }
        None => eprintln!("real traces not found (set CACHEALLOC_TRACES): synthetic rows only"),
    }

    print_table(&rows);
}

/// The number of live allocations, averaged over the workload's operations.
fn mean_live(workload: &cachealloc::trace::Workload) -> f64 {
    use cachealloc::trace::Op;
    let (mut live, mut sum) = (0i64, 0i64);
    for op in &workload.ops {
        if matches!(op, Op::Alloc { .. }) {
            live += 1;
        } else if op.freed_id().is_some() {
            live -= 1;
        }
        sum += live;
    }
    sum as f64 / workload.ops.len().max(1) as f64
}
