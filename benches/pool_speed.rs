//! Benchmark: the pool's malloc+free cost next to offset-allocator replaying the same operation
//! sequence, on the synthetic log-uniform trace and the real traces, plus replay speed.
//!
//! `cargo bench --bench pool_speed` (`-- --quick` for a short run). Real traces are read from
//! `$CACHEALLOC_TRACES` or `../shared/traces/real` when present.

mod support;
#[path = "../tests/support/traces.rs"]
#[allow(dead_code)] // the bench uses only the folder lookup
mod traces;

use cachealloc::trace::read_snapshot;
use cachealloc::trace::synth::{SynthKind, SynthSpec};
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
    let quick = std::env::args().any(|a| a == "--quick");
    let reps = if quick { 3 } else { 7 };
    let mut rows = Vec::new();

    let mut spec = SynthSpec::new(SynthKind::LogUniform);
    if quick {
        spec = "loguniform:ops=100000".parse().expect("valid spec");
    }
    let synthetic = spec.generate(42).expect("valid spec");
    rows.push(Row::measure(
        "synthetic log-uniform 512 B–256 MiB",
        &synthetic,
        reps,
    ));

    let transformer = SynthSpec::new(SynthKind::Transformer)
        .generate(1)
        .expect("valid spec");
    rows.push(Row::measure(
        "synthetic transformer training",
        &transformer,
        reps,
    ));

    match traces_dir() {
        Some(dir) => {
            for rel in REAL_TRACES {
                let Ok(snapshot) = read_snapshot(dir.join(rel)) else {
                    eprintln!("skipping {rel}: not readable");
                    continue;
                };
                if let Some(rec) = snapshot.traced_devices().next() {
                    let name = rel.split('/').next().unwrap_or(rel);
                    rows.push(Row::measure(&format!("real: {name}"), &rec.plain(), reps));
                }
            }
        }
        None => eprintln!("real traces not found (set CACHEALLOC_TRACES): synthetic rows only"),
    }

    print_table(&rows);
}
