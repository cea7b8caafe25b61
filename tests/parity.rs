//! Parity with PyTorch on real recorded traces: a faithful replay of every trace (native
//! segments, and expandable ones that begin with nothing reserved) reproduces the recorded peak
//! reserved bytes, cudaMalloc and cudaFree counts (page maps and unmaps with expandable
//! segments), retries, OOM point, and puts every allocation at its recorded address.
//!
//! Traces come from `$CACHEALLOC_TRACES` or `../shared/traces/real`; the test says when it skips.

use cachealloc::trace::{ReplayConfig, read_snapshot, replay_faithful};
mod support;

use std::path::Path;
use support::traces::{snapshot_files, traces_dir_or_skip};

/// Replay every traced device of `file` faithfully and compare. Returns the failures and the
/// number of expandable-segments devices replayed.
fn check_file(file: &Path) -> (Vec<String>, usize) {
    let mut failures = Vec::new();
    let mut expandable = 0;
    let Ok(snapshot) = read_snapshot(file) else {
        return (failures, 0); // not a memory snapshot (e.g. a kineto trace): covered elsewhere
    };
    for rec in snapshot.traced_devices() {
        expandable += usize::from(rec.is_expandable());
        let settings = rec.replay_settings();
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
            "cudaMalloc calls and page maps",
            s.counts.num_device_alloc,
            (rec_fig.recorded_segment_allocs + rec_fig.recorded_segment_maps) as u64,
        );
        check(
            "cudaFree calls and page unmaps",
            s.counts.num_device_free,
            (rec_fig.recorded_segment_frees + rec_fig.recorded_segment_unmaps) as u64,
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
    (failures, expandable)
}

#[test]
fn faithful_replay_reproduces_every_trace() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    let files = snapshot_files(&dir);
    assert!(
        !files.is_empty(),
        "no snapshot files under {}",
        dir.display()
    );
    let (mut failures, mut expandable) = (Vec::new(), 0);
    for file in &files {
        let (f, e) = check_file(file);
        failures.extend(f);
        expandable += e;
    }
    if files
        .iter()
        .any(|f| f.to_string_lossy().contains("code_location"))
    {
        assert!(
            expandable >= 3,
            "code_location's three expandable-segments devices were not replayed"
        );
    }
    assert!(
        failures.is_empty(),
        "parity failures:\n{}",
        failures.join("\n")
    );
}
