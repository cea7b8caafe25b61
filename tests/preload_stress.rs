//! Multithreaded stress through the shim: `tests/preload/stress.c` runs 8 threads of random
//! cudaMalloc/cudaFree (512 B to 64 MiB, cross-thread frees, two devices, occasional
//! cudaDeviceSynchronize) under `LD_PRELOAD=libcachealloc.so`, once per `free_sync` policy. The
//! program checks per-allocation patterns (no two live allocations ever shared memory) and frees
//! every pointer; this test then holds the shim's exit-time JSON statistics against the
//! program's own counts and the fake runtime's counters.
//!
//! Operations per thread: `$CACHEALLOC_STRESS_OPS`, default 10^4 (a few seconds);
//! `scripts/stress-long.sh` runs many more.

mod support;

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use support::fake_cudart;
use support::shim::{preloaded, run_ok, stderr, stdout};

/// Threads in the program (its `THREADS`).
const THREADS: u64 = 8;
/// Operations per thread in the normal run.
const DEFAULT_OPS_PER_THREAD: u64 = 10_000;

fn ops_per_thread() -> u64 {
    match std::env::var("CACHEALLOC_STRESS_OPS") {
        Ok(text) => text.trim().parse().unwrap_or_else(|_| {
            panic!("CACHEALLOC_STRESS_OPS={text:?} is not a positive whole number")
        }),
        Err(_) => DEFAULT_OPS_PER_THREAD,
    }
}

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/stress.c");
        fake_cudart::compile_c_program(&source, "stress", &[])
    })
}

/// What one run printed (`key value` pairs) and the shim's statistics per device.
struct Run {
    counts: HashMap<String, u64>,
    devices: Vec<Value>,
}

impl Run {
    fn count(&self, key: &str) -> u64 {
        *self
            .counts
            .get(key)
            .unwrap_or_else(|| panic!("the program printed no '{key}'"))
    }

    /// `key` of every device's statistics, summed.
    fn stat_sum(&self, key: &str) -> i64 {
        self.devices.iter().map(|d| stat(d, key)).sum()
    }
}

fn stat(device: &Value, key: &str) -> i64 {
    device["stats"][key]
        .as_i64()
        .unwrap_or_else(|| panic!("no statistic '{key}' in {device}"))
}

fn stress(free_sync: &str) -> Run {
    let dir = tempfile::tempdir().expect("temporary directory");
    let stats_path = dir.path().join("stats.json");
    // count_cached_as_free: the program's final cudaMemGetInfo returns frees still pending
    // (device, event) to their pools, so the exit statistics hold no pending block.
    let conf = format!(
        "free_sync:{free_sync},count_cached_as_free:True,stats:json,stats_file:{}",
        stats_path.display()
    );
    let ops = ops_per_thread();
    let mut cmd = preloaded(program());
    cmd.arg(ops.to_string()).env("CACHEALLOC_CONF", conf);
    let out = run_ok(&mut cmd);
    let text = stdout(&out);
    assert!(
        text.contains("ok stress"),
        "no ok line:\n{text}\n{}",
        stderr(&out)
    );
    assert!(stderr(&out).is_empty(), "unexpected log:\n{}", stderr(&out));
    println!("free_sync:{free_sync}, {ops} operations per thread:\n{text}");

    let words: Vec<&str> = text.split_whitespace().collect();
    let counts = words
        .windows(2)
        .filter_map(|pair| Some((pair[0].to_string(), pair[1].parse().ok()?)))
        .collect();
    let json = std::fs::read_to_string(&stats_path)
        .unwrap_or_else(|e| panic!("{} not written at exit: {e}", stats_path.display()));
    let doc: Value = serde_json::from_str(&json).expect("valid JSON statistics");
    let devices = doc["devices"].as_array().expect("devices array").clone();
    Run { counts, devices }
}

/// Everything the program allocated came back; the shim's statistics agree with the program's
/// count and with what the fake runtime still holds.
fn check_consistent(free_sync: &str) {
    let run = stress(free_sync);
    let ops = ops_per_thread();
    let mallocs = run.count("mallocs");

    // The program's own checks: no shared memory, every pointer freed, nothing failed.
    assert_eq!(run.count("overlaps"), 0);
    assert_eq!(run.count("errors"), 0);
    assert_eq!(run.count("ooms"), 0, "16 GiB per device is plenty");
    assert_eq!(run.count("frees"), mallocs, "every pointer freed");
    assert!(
        mallocs >= THREADS * ops / 4,
        "{mallocs} allocations for {ops} operations on each of {THREADS} threads"
    );
    assert!(run.count("cross_frees") > 0, "no pointer crossed threads");

    // The shim saw exactly those allocations, on both devices, and holds none at exit.
    assert_eq!(run.devices.len(), 2, "both devices had a pool");
    for device in &run.devices {
        // Pending frees count as active (and requested) until their fence completes, as in
        // PyTorch's free_block; the final synchronization completed them all.
        for key in [
            "allocation.all.current",
            "allocated_bytes.all.current",
            "requested_bytes.all.current",
            "active.all.current",
            "active_bytes.all.current",
        ] {
            assert_eq!(stat(device, key), 0, "{key} at exit, {device}");
        }
        // What the pool reserves is exactly what the fake runtime still holds on that device.
        let ordinal = device["device"].as_i64().expect("device ordinal");
        let held = run.count(&format!("device{ordinal}_bytes"));
        assert_eq!(
            stat(device, "reserved_bytes.all.current"),
            held as i64,
            "reserved bytes of device {ordinal} against the fake's bytes in use"
        );
        assert_eq!(stat(device, "num_ooms"), 0);
        // With every block back in the cache and cached blocks counted as free, the whole
        // device is free again.
        assert_eq!(
            run.count(&format!("device{ordinal}_free")),
            run.count(&format!("device{ordinal}_total")),
            "cudaMemGetInfo of device {ordinal} at the end"
        );
    }
    assert_eq!(run.stat_sum("allocation.all.allocated"), mallocs as i64);
    assert_eq!(run.stat_sum("allocation.all.freed"), mallocs as i64);
    // Every runtime allocation and free came from the pools, and they were few: the cache works.
    let fake_mallocs = run.count("fake_mallocs");
    assert_eq!(run.stat_sum("num_device_alloc"), fake_mallocs as i64);
    assert_eq!(
        run.stat_sum("num_device_free"),
        run.count("fake_frees") as i64
    );
    assert!(
        fake_mallocs * 10 < mallocs,
        "{mallocs} cudaMalloc calls became {fake_mallocs} runtime allocations"
    );
}

#[test]
fn eight_threads_under_free_sync_device_never_share_memory_and_free_everything() {
    check_consistent("device");
}

#[test]
fn eight_threads_under_free_sync_event_never_share_memory_and_free_everything() {
    check_consistent("event");
}

#[test]
fn eight_threads_under_free_sync_none_never_share_memory_and_free_everything() {
    check_consistent("none");
}
