//! Benchmark: the pool's malloc+free cost next to offset-allocator replaying the same operation
//! sequence, on the synthetic log-uniform trace and the real traces, plus replay speed.
//!
//! `cargo bench --bench pool_speed` (`-- --quick` for a short run). Real traces are read from
//! `$CACHEALLOC_TRACES` or `../shared/traces/real` when present.

mod support;

use cachealloc::trace::synth::{SynthKind, SynthSpec};
use support::{Row, print_table};

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

    print_table(&rows);
}
