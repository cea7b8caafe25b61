//! End to end with two devices: a program using devices 0 and 1 of the fake runtime, from one
//! thread or several, with the library preloaded (`tests/preload/multi_device.c`). Each device's
//! pool keeps to its own device whatever device the calling thread has current: frees go to the
//! pointer's device and wait for that device's synchronization, allocations to the thread's
//! current device, and a reset, an out-of-memory retry, the exit report and a recording keep the
//! devices apart.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;
use support::fake_cudart;
use support::shim::{library, preloaded, run_scenario, stderr, stdout};

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/multi_device.c");
        fake_cudart::compile_c_program(&source, "multi_device", &["-pthread", "-ldl"])
    })
}

/// Run `scenario` under the library with `env` and require its "ok" line.
fn check(scenario: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = preloaded(program());
    cmd.arg(scenario).envs(env.iter().copied());
    run_scenario(&mut cmd, scenario)
}

fn conf(value: &str) -> (&'static str, &str) {
    ("CACHEALLOC_CONF", value)
}

/// Device 1's pointer freed with device 0 current: device 1's pool takes it back, pending until
/// device 1 synchronizes (device 0's synchronization does not count), and the current device
/// stays 0.
#[test]
fn a_free_with_another_device_current_waits_for_the_pointers_device() {
    check(
        "free_other_device",
        &[conf("count_cached_as_free:True,free_sync:device")],
    );
}

#[test]
fn each_thread_allocates_on_its_own_current_device() {
    for free_sync in ["device", "event", "none"] {
        check(
            "threads_own_devices",
            &[conf(&format!("free_sync:{free_sync}"))],
        );
    }
}

#[test]
fn mem_info_counts_the_current_devices_cache_only() {
    check(
        "mem_info_per_device",
        &[conf("count_cached_as_free:True,free_sync:none")],
    );
}

/// A reset of device 0 leaves device 1's pool and live allocations as they were, under every
/// `free_sync` policy.
#[test]
fn a_reset_of_one_device_keeps_the_other_devices_pool() {
    for free_sync in ["device", "event", "none"] {
        check(
            "reset_keeps_other_device",
            &[conf(&format!("free_sync:{free_sync}"))],
        );
    }
}

/// Device 1 runs out while device 0 holds cached memory: device 1's retry releases its own cache
/// only; the report and the statistics name device 1.
#[test]
fn an_out_of_memory_error_is_the_devices_own() {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.json");
    let out = check(
        "oom_other_device",
        &[
            ("FAKECUDART_CAPACITY", "100MiB"),
            conf(&format!("stats:json,stats_file:{}", stats.display())),
        ],
    );
    let log = stderr(&out);
    assert!(
        log.contains("Tried to allocate 70.00 MiB. GPU 1 has a total capacity of 100.00 MiB"),
        "{log}"
    );
    assert_eq!(log.matches("CUDA out of memory").count(), 1, "{log}");
    let report = read_json(&stats);
    let (zero, one) = (device_stats(&report, 0), device_stats(&report, 1));
    assert_eq!(zero["num_ooms"], 0, "{report}");
    assert_eq!(
        zero["num_device_free"], 0,
        "device 0 keeps its cache: {report}"
    );
    assert_eq!(one["num_ooms"], 1, "{report}");
    assert_eq!(one["num_device_free"], 1, "{report}");
}

/// A recording and the exit report of a run on two devices: both devices are there, each event
/// under the device of its memory (a free made with the other device current included), and
/// the recording of device 1 replays on its own.
#[test]
fn a_recording_and_report_of_two_devices_keep_them_apart() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.jsonl");
    let stats = dir.path().join("stats.json");
    check(
        "two_devices",
        &[conf(&format!(
            "trace:{},stats:json,stats_file:{}",
            trace.display(),
            stats.display()
        ))],
    );
    let text = std::fs::read_to_string(&trace).expect("the recording is written");
    let events: Vec<Value> = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).expect(l))
        .collect();
    let of = |device: i64, action: &str| -> Vec<u64> {
        events
            .iter()
            .filter(|e| e["device"] == device && e["action"] == action)
            .map(|e| e["size"].as_u64().unwrap())
            .collect()
    };
    const MIB: u64 = 1 << 20;
    assert_eq!(of(0, "alloc"), [5 * MIB], "{text}");
    assert_eq!(of(0, "free_requested"), [5 * MIB], "{text}");
    assert_eq!(
        of(0, "free_completed"),
        [0u64; 0],
        "device 0 never synchronized: {text}"
    );
    assert_eq!(of(1, "alloc"), [7 * MIB, 7 * MIB], "{text}");
    assert_eq!(of(1, "free_requested"), [7 * MIB, 7 * MIB], "{text}");
    assert_eq!(of(1, "free_completed"), [7 * MIB], "{text}");
    assert_eq!(of(0, "segment_alloc").len(), 1, "{text}");
    assert_eq!(of(1, "segment_alloc").len(), 1, "{text}");

    let report = read_json(&stats);
    let (zero, one) = (device_stats(&report, 0), device_stats(&report, 1));
    assert_eq!(zero["allocation.all.allocated"], 1, "{report}");
    assert_eq!(
        zero["active_bytes.all.current"],
        5 * MIB,
        "pending: {report}"
    );
    assert_eq!(one["allocation.all.allocated"], 2, "{report}");
    assert_eq!(
        one["active_bytes.all.current"],
        7 * MIB,
        "pending: {report}"
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cachealloc"))
        .args(["replay", trace.to_str().unwrap(), "--device", "1", "--json"])
        .output()
        .expect("cachealloc runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let replayed: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(replayed["device"], 1, "{replayed}");
    assert_eq!(replayed["allocs"], 2, "{replayed}");
    assert_eq!(replayed["frees"], 1, "{replayed}");
    assert_eq!(replayed["pending_frees"], 1, "{replayed}");
    assert_eq!(replayed["num_device_alloc"], 1, "{replayed}");
}

/// A thread freeing and allocating device 1's memory does not wait for device 0's pool while
/// another thread is inside a long call of it (a segment's cudaMalloc that takes thirty seconds,
/// `slow_malloc.c` preloaded after the library). Before the fix, every free first waited for
/// the lock of each lower device's pool, to ask it whether it owned the pointer.
#[test]
fn a_free_does_not_wait_for_another_devices_busy_pool() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let slow = fake_cudart::compile_c_program(
        &root.join("tests/preload/slow_malloc.c"),
        "libslow_malloc.so",
        &["-shared", "-fPIC", "-ldl"],
    );
    let slow_bytes = (256u64 << 20).to_string();
    let start = std::time::Instant::now();
    let out = check(
        "free_while_other_device_busy",
        &[
            (
                "LD_PRELOAD",
                &format!("{} {}", library().display(), slow.display()),
            ),
            ("SLOW_MALLOC_BYTES", &slow_bytes),
        ],
    );
    let took = start.elapsed().as_secs_f64();
    // Far below the slow cudaMalloc's thirty seconds, so that a loaded machine cannot fail it.
    assert!(
        took < 15.0,
        "took {took:.1} s: {}{}",
        stdout(&out),
        stderr(&out)
    );
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("the report is written");
    serde_json::from_str(&text).expect(&text)
}

fn device_stats(report: &Value, device: i64) -> &Value {
    report["devices"]
        .as_array()
        .and_then(|devices| devices.iter().find(|d| d["device"] == device))
        .map(|d| &d["stats"])
        .unwrap_or_else(|| panic!("no statistics for device {device}: {report}"))
}
