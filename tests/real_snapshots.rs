//! Real PyTorch memory snapshots: every file loads, every traced device converts, the rebuilt
//! start state is consistent, and the recorded figures match what the recordings show (the
//! replay-parity reference's table).
//!
//! Traces come from `$CACHEALLOC_TRACES`, else `<crate root>/../shared/traces/real`.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use support::traces::{snapshot_files, traces_dir_or_skip};

use cachealloc::trace::recording::{Action, BlockState, DeviceRecording};
use cachealloc::trace::{CapacityEstimate, Op, StartState, TraceError, read_snapshot};

const MIB: u64 = 1 << 20;

/// Traced devices of every snapshot in the folder, with the file's path relative to it.
fn traced_devices(dir: &Path) -> Vec<(String, DeviceRecording)> {
    let mut out = Vec::new();
    for path in snapshot_files(dir) {
        let rel = path.strip_prefix(dir).unwrap().display().to_string();
        match read_snapshot(&path) {
            Ok(snap) => out.extend(snap.traced_devices().map(|d| (rel.clone(), d.clone()))),
            Err(TraceError::NotSnapshot { .. }) => {}
            Err(e) => panic!("{rel}: {e}"),
        }
    }
    out
}

/// Apply the recorded effects of the trace to a start state and return the end state as
/// (segments: addr → size, live blocks: addr → requested).
fn apply_forward(
    rec: &DeviceRecording,
    start: &StartState,
) -> (BTreeMap<u64, u64>, BTreeMap<u64, u64>) {
    let mut segments: BTreeMap<u64, u64> =
        start.segments.iter().map(|s| (s.addr, s.size)).collect();
    let mut live: BTreeMap<u64, u64> = start.live_blocks().map(|b| (b.addr, b.requested)).collect();
    let free_action = rec.free_action();
    for e in &rec.entries {
        match e.action {
            Action::Alloc => assert!(live.insert(e.addr, e.size).is_none()),
            a if a == free_action => assert!(live.remove(&e.addr).is_some()),
            Action::SegmentAlloc => assert!(segments.insert(e.addr, e.size).is_none()),
            Action::SegmentFree => assert_eq!(segments.remove(&e.addr), Some(e.size)),
            _ => {}
        }
    }
    (segments, live)
}

fn end_state(rec: &DeviceRecording) -> (BTreeMap<u64, u64>, BTreeMap<u64, u64>) {
    let segments = rec
        .segments
        .iter()
        .map(|s| (s.address, s.total_size))
        .collect();
    let live = rec
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::Allocated)
        .map(|b| (b.address, b.requested_size))
        .collect();
    (segments, live)
}

#[test]
fn every_snapshot_file_loads_or_is_rejected_clearly() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    let files = snapshot_files(&dir);
    assert!(!files.is_empty());
    for path in files {
        match read_snapshot(&path) {
            Ok(snap) => assert!(!snap.devices.is_empty(), "{}", path.display()),
            Err(e @ TraceError::NotSnapshot { .. }) => {
                let text = e.to_string();
                assert!(text.contains(&path.display().to_string()), "{text}");
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn faithful_start_state_is_consistent_on_every_traced_device() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    let devices = traced_devices(&dir);
    assert!(
        devices.len() >= 20,
        "found only {} traced devices",
        devices.len()
    );
    for (rel, rec) in devices {
        let figures = rec.figures();
        if rec.is_expandable() {
            // code_location begins with nothing reserved, and its start is rebuilt empty (cut
            // short to begin with pages mapped, it is tested in tests/parity.rs).
            let replay = rec
                .faithful()
                .unwrap_or_else(|e| panic!("{rel} device {}: {e}", rec.device.0));
            assert_eq!(replay.start, StartState::default(), "{rel}");
            assert_eq!(figures.start_reserved_bytes, 0, "{rel}");
            continue;
        }
        let replay = rec
            .faithful()
            .unwrap_or_else(|e| panic!("{rel} device {}: {e}", rec.device.0));
        let start = &replay.start;
        start.validate().unwrap();
        assert_eq!(
            start.reserved_bytes(),
            figures.start_reserved_bytes,
            "{rel}: start reserved"
        );
        // The recorded effects of the trace carry the start state to the recorded end state.
        assert_eq!(apply_forward(&rec, start), end_state(&rec), "{rel}");
        // Every free has a live id; ids are dense and each is freed at most once.
        let mut live = vec![false; replay.workload.num_ids as usize];
        for b in start.live_blocks().filter_map(|b| b.id) {
            live[b as usize] = true;
        }
        for op in &replay.workload.ops {
            if let Op::Alloc { id, .. } = *op {
                live[id as usize] = true;
            } else if let Some(id) = op.freed_id() {
                assert!(live[id as usize], "{rel}: free of dead id {id}");
                live[id as usize] = false;
            }
        }
        assert_eq!(
            replay.workload.ops.len(),
            replay.workload.source_index.len()
        );
        let plain = rec.plain();
        assert_eq!(plain.allocs(), figures.allocs);
        let plain_frees = plain
            .ops
            .iter()
            .filter(|op| matches!(op, Op::Free { .. }))
            .count();
        assert_eq!(plain_frees + figures.orphan_frees, figures.frees, "{rel}");
        eprintln!(
            "{rel} dev {}: start {} MiB reserved, {} live ({} freed in trace), peak {} MiB, \
             {} SA / {} SF, {} retries, {} empty_cache, orphans {}, capacity {:?}",
            rec.device.0,
            start.reserved_bytes() / MIB,
            start.live_blocks().count(),
            start.num_ids(),
            figures.recorded_peak_reserved_bytes / MIB,
            figures.recorded_segment_allocs,
            figures.recorded_segment_frees,
            figures.recorded_retries,
            figures.empty_cache_calls,
            figures.orphan_frees,
            rec.capacity()
        );
    }
}

/// What the recorded runs did, from the replay-parity reference's table (MiB; retries and OOM
/// where the reference states them).
struct Expected {
    file: &'static str,
    peak_mib: f64,
    segment_allocs: Option<usize>,
    segment_frees: Option<usize>,
    retries: Option<usize>,
}

const fn exp(file: &'static str, peak_mib: f64) -> Expected {
    Expected {
        file,
        peak_mib,
        segment_allocs: None,
        segment_frees: None,
        retries: None,
    }
}

const EXPECTED: &[Expected] = &[
    Expected {
        segment_allocs: Some(61),
        segment_frees: Some(0),
        retries: Some(0),
        ..exp("decomfl/edd30e0/memory.pickle", 1810.0)
    },
    Expected {
        segment_allocs: Some(126),
        segment_frees: Some(6),
        retries: Some(1),
        ..exp("discrete_diffusion/657e3e3/memory_snapshot.json", 22314.0)
    },
    exp(
        "octree-nca/3e8aa21/mem_snapshots/cuda_single_step.pickle",
        22.0,
    ),
    exp(
        "octree-nca/3e8aa21/mem_snapshots/traditional_single_step.pickle",
        94.0,
    ),
    Expected {
        segment_allocs: Some(22),
        segment_frees: Some(17),
        retries: Some(1),
        ..exp(
            "octree-nca/3e8aa21/mem_snapshots/inference2_peso_oct.pickle",
            23238.0,
        )
    },
    exp("octree-nca/752276c/my_snapshot.pickle", 8770.0),
    exp("octree-nca/b602628/my_snapshot.pickle", 23280.0),
    exp("octree-nca/db23ad8/my_snapshot.pickle", 8768.0),
    exp("octree-nca/e67173f/my_snapshot.pickle", 19894.0),
    Expected {
        segment_allocs: Some(16),
        segment_frees: Some(11),
        retries: Some(1),
        ..exp("octree-nca/d47727a/my_snapshot.pickle", 21166.0)
    },
    exp("octree-nca/0cc7299/my_snapshot.pickle", 20976.0),
    exp("tomi-toy/f289cab/snapshots/snapshot.pickle", 22.0),
    exp("eor_nn/6686e9f/snapshot.pickle", 128.0),
    Expected {
        segment_allocs: Some(152),
        ..exp("ftcourse/9f4902c/memory_snapshot.pickle", 6172.0)
    },
    Expected {
        segment_allocs: Some(420),
        segment_frees: Some(420),
        retries: Some(0),
        ..exp("sqattn/126d2e6/cuda_memory_snapshot.pickle", 5534.0)
    },
    exp("cs336-magma27/15883f2/memory_snapshot.pickle", 13524.0),
    exp(
        "cs336-wedsonlin/8630bcf/results/medium_128_inference_memory_snapshot.pickle",
        1682.0,
    ),
    exp(
        "cs336-wedsonlin/8630bcf/results/medium_512_inference_memory_snapshot.pickle",
        1890.0,
    ),
    exp(
        "cs336-wedsonlin/8630bcf/results/medium_128_training_memory_snapshot.pickle",
        6900.0,
    ),
    exp(
        "cs336-wedsonlin/8630bcf/results/medium_512_training_memory_snapshot.pickle",
        12074.0,
    ),
    exp(
        "cs336-wedsonlin/8630bcf/results/medium_1024_training_memory_snapshot.pickle",
        24012.0,
    ),
];

#[test]
fn recorded_figures_match_the_reference_table() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    for e in EXPECTED {
        let snap = read_snapshot(dir.join(e.file)).unwrap();
        let rec = &snap.devices[0];
        let f = rec.figures();
        let peak = f.recorded_peak_reserved_bytes as f64 / MIB as f64;
        assert_eq!(peak, e.peak_mib, "{}: peak reserved MiB", e.file);
        if let Some(n) = e.segment_allocs {
            assert_eq!(f.recorded_segment_allocs, n, "{}: cudaMalloc", e.file);
        }
        if let Some(n) = e.segment_frees {
            assert_eq!(f.recorded_segment_frees, n, "{}: cudaFree", e.file);
        }
        if let Some(n) = e.retries {
            assert_eq!(f.recorded_retries, n, "{}: retries", e.file);
        }
    }
}

#[test]
fn discrete_diffusion_oom_and_capacity() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    let snap = read_snapshot(dir.join("discrete_diffusion/657e3e3/memory_snapshot.json")).unwrap();
    let rec = &snap.devices[0];
    let oom = rec.figures().recorded_oom.expect("an oom entry");
    assert_eq!(oom.event_index, 1117);
    assert_eq!(oom.size, 384 * MIB);
    assert_eq!(oom.reserved_bytes, 22218 * MIB);
    let capacity = rec.capacity().unwrap();
    assert_eq!(
        capacity,
        CapacityEstimate::Exact {
            bytes: 23_561_895_936, // 22,470.375 MiB
            oom_index: 1117
        }
    );
    let replay = rec.faithful().unwrap();
    assert_eq!(replay.capacity, Some(23_561_895_936));
    // The failed request is in the workload as an Oom op at its entry; the release burst before
    // it (the OOM ladder) is not an EmptyCache op, the one at the end of the trace is.
    let at = |i: usize| replay.workload.source_index.iter().position(|&s| s == i);
    let oom_op = at(1117).expect("an op for entry 1117");
    assert!(matches!(replay.workload.ops[oom_op], Op::Oom { size, .. } if size == 384 * MIB));
    assert_eq!(at(1116), None);
    let empties: Vec<usize> = replay
        .workload
        .ops
        .iter()
        .zip(&replay.workload.source_index)
        .filter(|(op, _)| matches!(op, Op::EmptyCache))
        .map(|(_, &i)| i)
        .collect();
    assert_eq!(empties, vec![1294]);
}

#[test]
fn sqattn_empty_cache_calls_and_bracket() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    let snap = read_snapshot(dir.join("sqattn/126d2e6/cuda_memory_snapshot.pickle")).unwrap();
    let rec = &snap.devices[0];
    let f = rec.figures();
    assert_eq!(f.empty_cache_calls, 28);
    let replay = rec.faithful().unwrap();
    let ops = &replay.workload.ops;
    assert_eq!(
        ops.iter().filter(|o| matches!(o, Op::EmptyCache)).count(),
        28
    );
    // No cudaMalloc failed: no capacity to impose.
    assert_eq!(rec.capacity(), None);
    assert_eq!(replay.capacity, None);
    // The one orphan free of a plain replay is a seeded block in faithful mode.
    assert_eq!(f.orphan_frees, 1);
    assert_eq!(replay.start.num_ids(), 1);
}

#[test]
fn octree_retry_brackets_capacity() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    for file in [
        "octree-nca/d47727a/my_snapshot.pickle",
        "octree-nca/3e8aa21/mem_snapshots/inference2_peso_oct.pickle",
    ] {
        let snap = read_snapshot(dir.join(file)).unwrap();
        let rec = &snap.devices[0];
        let Some(CapacityEstimate::Bracket { low, high }) = rec.capacity() else {
            panic!("{file}: expected a capacity bracket")
        };
        assert_eq!(low, rec.figures().recorded_peak_reserved_bytes);
        assert!(low < high, "{file}: {low} < {high}");
        let cap = rec.faithful().unwrap().capacity.unwrap();
        assert!(low <= cap && cap < high);
    }
}

#[test]
fn expandable_trace_reads_and_replays_faithfully_from_an_empty_start() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    let snap = read_snapshot(dir.join("code_location/52e52b2/memory_snapshot.pickle")).unwrap();
    assert!(snap.settings.as_ref().unwrap().expandable_segments);
    let traced: Vec<_> = snap.traced_devices().collect();
    assert_eq!(traced.len(), 3);
    for rec in traced {
        assert!(rec.is_expandable());
        let faithful = rec.faithful().unwrap();
        assert!(faithful.start.segments.is_empty());
        assert_eq!(faithful.workload.allocs(), rec.figures().allocs);
        assert_eq!(rec.plain().allocs(), rec.figures().allocs);
        assert!(rec.figures().recorded_segment_maps > 0);
    }
    let dev1 = &snap.devices[1];
    let oom = dev1.figures().recorded_oom.unwrap();
    assert_eq!(oom.device_free / MIB, 91);
    assert!(
        dev1.plain()
            .ops
            .iter()
            .any(|op| matches!(op, Op::Oom { .. }))
    );
}
