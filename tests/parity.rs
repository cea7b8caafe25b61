//! Parity with PyTorch on real recorded traces: a faithful replay of every trace (native
//! segments and expandable ones, also cut short to begin mid-run) reproduces the recorded peak
//! reserved bytes, cudaMalloc and cudaFree counts (page maps and unmaps with expandable
//! segments), retries, OOM point, and puts every allocation at its recorded address.
//!
//! Traces come from `$CACHEALLOC_TRACES` or `../shared/traces/real`; the test says when it skips.

use cachealloc::trace::{DeviceRecording, ReplayConfig, read_snapshot, replay_faithful};
mod support;

use std::path::Path;
use support::traces::{snapshot_files, traces_dir_or_skip};

/// Replay every traced device of `file` faithfully and compare. Returns the failures and the
/// number of expandable-segments devices replayed.
fn check_file(file: &Path) -> (Vec<String>, usize) {
    let Ok(snapshot) = read_snapshot(file) else {
        return (Vec::new(), 0); // not a memory snapshot (e.g. a kineto trace): covered elsewhere
    };
    check_devices(snapshot.traced_devices())
}

/// Parity failures of the devices' faithful replays, and how many are expandable.
fn check_devices<'a>(devices: impl Iterator<Item = &'a DeviceRecording>) -> (Vec<String>, usize) {
    let mut failures = Vec::new();
    let mut expandable = 0;
    for rec in devices {
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

/// An expandable-segments recording that begins with pages mapped (its ring buffer wrapped, or
/// recording began mid-run) replays faithfully from the state rebuilt at its start:
/// code_location's devices, their first entries cut off at 63 places each (or
/// `CACHEALLOC_PARITY_CUTS` − 1: a number above a device's entry count cuts it at every entry),
/// reproduce the rest exactly — device 1's two retries and out-of-memory error included.
#[test]
fn expandable_recordings_cut_mid_run_replay_exactly() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    let file = dir.join("code_location/52e52b2/memory_snapshot.pickle");
    if !file.exists() {
        eprintln!("skipping: {} is missing", file.display());
        return;
    }
    let snapshot = read_snapshot(&file).unwrap();
    let parts: usize = std::env::var("CACHEALLOC_PARITY_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut cut = Vec::new();
    for rec in snapshot.traced_devices() {
        let n = rec.entries.len();
        let mut at: Vec<usize> = (1..parts)
            .map(|k| n * k / parts)
            .filter(|&i| i > 0)
            .collect();
        at.dedup();
        for i in at {
            let mut rest = rec.clone();
            rest.entries.drain(..i);
            let start = rest.faithful().unwrap().start;
            let reserved = rest.figures().start_reserved_bytes;
            assert!(reserved > 0, "device {} cut at {i}", rec.device.0);
            assert_eq!(
                start.reserved_bytes(),
                reserved,
                "device {} cut at {i}",
                rec.device.0
            );
            cut.push(rest);
        }
    }
    assert!(cut.len() >= 3 * 60, "{} cuts", cut.len());
    let (failures, expandable) = check_devices(cut.iter());
    assert_eq!(expandable, cut.len());
    assert!(
        failures.is_empty(),
        "parity failures:\n{}",
        failures.join("\n")
    );
}
