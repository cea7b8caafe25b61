//! A bounded run of the benchmark harness (the full run is `cargo bench --bench pool_speed`):
//! both allocators replay the same short operation sequence, and the table renders.

#[path = "../benches/support/mod.rs"]
mod support;

use cachealloc::trace::synth::SynthSpec;

#[test]
fn harness_times_both_allocators_on_the_same_sequence() {
    let spec: SynthSpec = "loguniform:ops=20000".parse().unwrap();
    let workload = spec.generate(3).unwrap();
    let row = support::Row::measure_with("smoke", &workload, 1, true);
    assert_eq!(row.ops, 20000);
    assert!(row.pool.median_ns > 0.0 && row.offset.median_ns > 0.0);
    assert!(row.replay_ops_per_s > 0.0);
    support::print_table(&[row]);
}
