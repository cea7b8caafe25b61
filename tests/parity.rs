//! Parity with PyTorch on real recorded traces: a faithful replay of every native trace
//! reproduces the recorded peak reserved bytes, cudaMalloc and cudaFree counts, retries, OOM
//! point, and puts every allocation at its recorded address.
//!
//! Traces come from `$CACHEALLOC_TRACES` or `../shared/traces/real`; the test says when it skips.

use cachealloc::trace::{ReplayConfig, read_snapshot, replay_faithful};
mod support;

use std::path::Path;
use support::traces::{snapshot_files, traces_dir_or_skip};

/// Replay every traced, non-expandable device of `file` faithfully and compare.
fn check_file(file: &Path) -> Vec<String> {
    let mut failures = Vec::new();
    let Ok(snapshot) = read_snapshot(file) else {
        return failures; // not a memory snapshot (e.g. a kineto trace): covered elsewhere
    };
    for rec in snapshot.traced_devices() {
        if rec.is_expandable() {
            continue;
        }
        let settings = rec
            .settings
            .as_ref()
            .map(|s| s.to_settings())
            .unwrap_or_default();
        let config = ReplayConfig {
            settings,
            ..ReplayConfig::default()
        };
        let name = rec.name();
        let run = match replay_faithful(rec, &config) {
            Ok(run) => run,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let (out, rec_fig) = (&run.outcome, &run.recorded);
        let s = &out.stats;
        let mut check = |what: &str, got: u64, want: u64| {
            if got != want {
                failures.push(format!("{name}: {what}: replay {got}, recorded {want}"));
            }
        };
        check(
            "peak reserved bytes",
            s.reserved_bytes.all.peak as u64,
            rec_fig.recorded_peak_reserved_bytes,
        );
        check(
            "cudaMalloc calls",
            s.counts.num_device_alloc,
            rec_fig.recorded_segment_allocs as u64,
        );
        check(
            "cudaFree calls",
            s.counts.num_device_free,
            rec_fig.recorded_segment_frees as u64,
        );
        check(
            "retries",
            s.counts.num_alloc_retries,
            rec_fig.recorded_retries as u64,
        );
        check(
            "allocations at their recorded address",
            out.allocs_at_recorded_addr,
            out.allocs_with_recorded_addr,
        );
        let recorded_oom = rec_fig.recorded_oom.as_ref().map(|o| o.event_index as u64);
        let replay_oom = out
            .first_oom
            .as_ref()
            .and_then(|o| o.source_index)
            .map(|i| i as u64);
        check(
            "first OOM entry (+1, 0 = none)",
            replay_oom.map_or(0, |i| i + 1),
            recorded_oom.map_or(0, |i| i + 1),
        );
        eprintln!(
            "{name}: peak reserved {} MiB, {} cudaMalloc, {} cudaFree, {} retries, {}/{} at recorded address",
            s.reserved_bytes.all.peak >> 20,
            s.counts.num_device_alloc,
            s.counts.num_device_free,
            s.counts.num_alloc_retries,
            out.allocs_at_recorded_addr,
            out.allocs_with_recorded_addr
        );
    }
    failures
}

#[test]
fn faithful_replay_reproduces_every_native_trace() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    let files = snapshot_files(&dir);
    assert!(
        !files.is_empty(),
        "no snapshot files under {}",
        dir.display()
    );
    let failures: Vec<String> = files.iter().flat_map(|f| check_file(f)).collect();
    assert!(
        failures.is_empty(),
        "parity failures:\n{}",
        failures.join("\n")
    );
}
