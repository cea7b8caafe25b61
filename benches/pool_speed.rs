//! Benchmark: the pool's malloc+free cost next to offset-allocator replaying the same operation
//! sequence, on the synthetic log-uniform trace and the real traces, plus replay speed.
//!
//! `cargo bench --bench pool_speed` (`-- --quick` for a short run). Real traces are read from
//! `$CACHEALLOC_TRACES` or `../shared/traces/real` when present.
//!
//! Further options (used by scripts/bench-instructions.sh): `--reps N` passes per allocator,
//! `--only TEXT` rows whose name contains TEXT, `--no-replay` skips the replay-speed column.

mod support;
#[path = "../tests/support/traces.rs"]
#[allow(dead_code)] // the bench uses only the folder lookup
mod traces;

use cachealloc::pool::StreamId;
use cachealloc::trace::read_snapshot;
use cachealloc::trace::rng::SplitMix64;
use cachealloc::trace::synth::{SynthKind, SynthSpec};
use cachealloc::trace::{AllocId, Op, Workload};
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

/// Command-line options (cargo bench adds `--bench`, ignored here).
struct Options {
    quick: bool,
    reps: usize,
    only: Option<String>,
    replay: bool,
}

impl Options {
    fn parse() -> Options {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let value = |flag: &str| {
            let at = args.iter().position(|a| a == flag)?;
            let v = args.get(at + 1);
            Some(v.unwrap_or_else(|| panic!("{flag} needs a value")).clone())
        };
        let quick = args.iter().any(|a| a == "--quick");
        let reps = value("--reps").map_or(if quick { 3 } else { 7 }, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("--reps takes a count, not {v:?}"))
        });
        Options {
            quick,
            reps: reps.max(1),
            only: value("--only"),
            replay: !args.iter().any(|a| a == "--no-replay"),
        }
    }

    fn wants(&self, name: &str) -> bool {
        self.only.as_deref().is_none_or(|only| name.contains(only))
    }
}

fn main() {
    let options = Options::parse();
    let (quick, reps) = (options.quick, options.reps);
    let mut rows = Vec::new();
    let mut measure = |name: &str, workload: &cachealloc::trace::Workload| {
        rows.push(Row::measure_with(name, workload, reps, options.replay));
    };

    let name = "synthetic log-uniform 512 B–256 MiB";
    if options.wants(name) {
        let mut spec = SynthSpec::new(SynthKind::LogUniform);
        if quick {
            spec = "loguniform:ops=100000".parse().expect("valid spec");
        }
        measure(name, &spec.generate(42).expect("valid spec"));
    }

    let name = "synthetic transformer training";
    if options.wants(name) {
        let spec = SynthSpec::new(SynthKind::Transformer);
        measure(name, &spec.generate(1).expect("valid spec"));
    }

    let name = "synthetic equal-size churn";
    if options.wants(name) {
        measure(name, &equal_size_churn());
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

/// Many free blocks of one size, each between two live blocks so that none coalesce (one
/// tensor shape freed layer after layer), then churn: allocate that size, free a random one of
/// them. Every search lands in one long size class: the worst case of a size-class index.
fn equal_size_churn() -> Workload {
    const SIZE: u64 = 2 << 20;
    const SPACER: u64 = (2 << 20) + (512 << 10);
    const PAIRS: u32 = 2048;
    const CHURN: usize = 50_000;
    let stream = StreamId(0);
    let mut workload = Workload::new("equal-size churn");
    let mut next_id = 0;
    let mut alloc = |ops: &mut Vec<Op>, size| {
        next_id += 1;
        ops.push(Op::Alloc {
            id: next_id - 1,
            size,
            stream,
            recorded_addr: None,
        });
        next_id - 1
    };
    let mut live = Vec::new();
    for _ in 0..PAIRS {
        live.push(alloc(&mut workload.ops, SIZE));
        alloc(&mut workload.ops, SPACER);
    }
    let mut rng = SplitMix64::new(7);
    let mut free_random = |ops: &mut Vec<Op>, live: &mut Vec<AllocId>| {
        let id = live.swap_remove(rng.below(live.len() as u64) as usize);
        ops.push(Op::Free { id });
    };
    for _ in 0..PAIRS / 2 {
        free_random(&mut workload.ops, &mut live);
    }
    for _ in 0..CHURN {
        live.push(alloc(&mut workload.ops, SIZE));
        free_random(&mut workload.ops, &mut live);
    }
    workload.num_ids = next_id;
    workload
}
