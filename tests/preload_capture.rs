//! End to end with CUDA graph captures: a program that captures a stream and allocates during
//! the capture as PyTorch's caching allocator does (`tests/preload/capture_check.c`), with the
//! library preloaded in front of the fake runtime, whose captures end as invalidated on a
//! device synchronization or a `cudaFree`, as the real runtime's do. The pool makes neither
//! during a capture: a request takes new memory, or fails with an out-of-memory error that says
//! why, and the capture completes.

mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use support::fake_cudart;
use support::shim::{preloaded, run_ok, run_scenario, stderr, stdout};

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/capture_check.c");
        fake_cudart::compile_c_program(&source, "capture_check", &["-pthread", "-ldl"])
    })
}

fn check(scenario: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = preloaded(program());
    cmd.arg(scenario).envs(env.iter().copied());
    run_scenario(&mut cmd, scenario)
}

/// A block freed during the capture stays pending: the request during the capture takes new
/// memory instead of synchronizing the device, and the capture completes.
#[test]
fn a_request_during_a_capture_does_not_wait_for_pending_frees() {
    for free_sync in ["device", "event"] {
        let conf = format!("free_sync:{free_sync}");
        check("pending_free", &[("CACHEALLOC_CONF", &conf)]);
    }
}

/// With a blocking stream capturing, the legacy stream is unusable: the free's fence (under
/// `event`, an event on the legacy stream) waits for the capture's end before it is recorded.
#[test]
fn a_free_during_a_blocking_streams_capture_leaves_the_legacy_stream_alone() {
    for free_sync in ["device", "event"] {
        let conf = format!("free_sync:{free_sync}");
        check("pending_free_blocking", &[("CACHEALLOC_CONF", &conf)]);
    }
}

/// A block freed just before a capture (`torch.cuda.graph`'s `empty_cache()`) is completed by a
/// device synchronization as the capture begins, so the capture's request reuses it; not while
/// another capture is underway.
#[test]
fn frees_waiting_when_a_capture_begins_are_completed_first() {
    for free_sync in ["device", "event"] {
        let conf = format!("free_sync:{free_sync}");
        check("freed_before", &[("CACHEALLOC_CONF", &conf)]);
    }
}

/// The synchronization made as a capture begins is the library's own call: when it fails, the
/// capture begins all the same and the program reads its own unread error, not the failure.
#[test]
fn a_failed_synchronization_as_a_capture_begins_leaves_the_programs_last_error_alone() {
    check(
        "sync_fails_at_capture",
        &[("CACHEALLOC_CONF", "free_sync:device")],
    );
}

/// A recording of a run with captures (`trace:PATH`) replays as the run went: its `capture`
/// lines have the replay's miss during the capture take new memory with a free still pending,
/// its `empty_cache()` then do nothing, and its request that only the cache given back would
/// serve fail as the run's did; so the faithful replay makes the recorded cudaMalloc and
/// cudaFree calls, meets the out-of-memory error at the recorded line and puts every allocation
/// at its recorded address. (Without the lines it gives the cached segment back during the
/// capture, and the request fits.)
#[test]
fn a_recording_with_captures_replays_as_the_run_went() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("capture.jsonl");
    let conf = format!("free_sync:device,trace:{}", trace.display());
    let out = check(
        "recorded",
        &[
            ("CACHEALLOC_CONF", &conf),
            ("FAKECUDART_CAPACITY", "100MiB"),
        ],
    );
    // The block freed during the capture is pending, not the small pool's memory.
    let log = stderr(&out);
    assert!(!log.contains("small pool"), "{log}");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(
        text.matches(r#""action":"capture""#).count(),
        3,
        "the miss, the empty_cache and the failed request: {text}"
    );
    // The plain replay has no capacity, so it does not ask for the failed request again: two
    // requests of three replayed capturing.
    for (extra, captured) in [(&[][..], 2), (&["--faithful"][..], 3)] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cachealloc"));
        cmd.arg("replay").arg(&trace).arg("--json").args(extra);
        let out = run_ok(&mut cmd);
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(v["recorded_segment_allocs"], 3, "{extra:?}: {v}");
        assert_eq!(v["recorded_segment_frees"], 1, "{extra:?}: {v}");
        assert_eq!(v["num_device_alloc"], v["recorded_segment_allocs"], "{v}");
        assert_eq!(v["num_device_free"], v["recorded_segment_frees"], "{v}");
        assert_eq!(v["captured_requests"], captured, "{v}");
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cachealloc"));
    cmd.arg("replay").arg(&trace).arg("--faithful");
    let summary = stdout(&run_ok(&mut cmd));
    assert!(
        summary.contains("of these, 3 made during a CUDA graph capture"),
        "{summary}"
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cachealloc"));
    cmd.arg("replay").arg(&trace).args(["--faithful", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&run_ok(&mut cmd))).unwrap();
    assert_eq!(v["allocs"], 4, "{v}");
    assert_eq!(v["allocs_at_recorded_addr"], v["allocs"], "{v}");
    assert_eq!(v["num_ooms"], 1, "{v}");
    assert_eq!(v["first_oom_event_index"], v["recorded_oom"]["event_index"]);
}

/// A recording of a run whose frees still pending as a capture begins (one of a block recorded
/// on another stream) are completed then replays as the run went: the begin-time completion
/// writes their `free_completed` lines before the capture's requests, which the faithful replay
/// serves from the same blocks, and the capture's miss takes new memory; under both policies
/// that keep frees pending.
#[test]
fn a_recording_of_frees_completed_as_a_capture_begins_replays_as_the_run_went() {
    for free_sync in ["device", "event"] {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("before.jsonl");
        let conf = format!("free_sync:{free_sync},trace:{}", trace.display());
        check("recorded_before", &[("CACHEALLOC_CONF", &conf)]);
        let text = std::fs::read_to_string(&trace).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let capture = lines
            .iter()
            .position(|l| l.contains(r#""action":"capture""#))
            .expect("the capture's miss has its line");
        let completed = lines[..capture]
            .iter()
            .filter(|l| l.contains(r#""action":"free_completed""#))
            .count();
        assert_eq!(
            completed, 2,
            "{free_sync}: completed as the capture began: {text}"
        );
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cachealloc"));
        cmd.arg("replay").arg(&trace).args(["--faithful", "--json"]);
        let v: Value = serde_json::from_str(&stdout(&run_ok(&mut cmd))).unwrap();
        assert_eq!(
            v["num_device_alloc"], v["recorded_segment_allocs"],
            "{free_sync}: {v}"
        );
        assert_eq!(v["num_device_alloc"], 3, "{free_sync}: {v}");
        assert_eq!(
            v["num_device_free"], v["recorded_segment_frees"],
            "{free_sync}: {v}"
        );
        assert_eq!(v["allocs"], 5, "{free_sync}: {v}");
        assert_eq!(
            v["allocs_at_recorded_addr"], v["allocs"],
            "{free_sync}: {v}"
        );
        assert_eq!(v["captured_requests"], 1, "{free_sync}: {v}");
    }
}

/// A block of the C API or the pluggable allocator recorded on other streams and freed during a
/// capture (on the capturing stream, and on the legacy stream while a blocking stream captures)
/// records no event then: the capture completes, and after it the blocks wait for their
/// streams' work and are reused.
#[test]
fn a_recorded_free_during_a_capture_records_its_events_after_it() {
    check("recorded_free", &[]);
}

/// Such a free, recorded on another device's stream too, given back by `empty_cache()` right
/// after the capture: the synchronization before the release records its events, so it waits
/// for that stream too, and its segment goes back once no work uses it.
#[test]
fn a_recorded_free_during_a_capture_is_given_back_by_the_next_empty_cache() {
    check("recorded_free_emptied", &[]);
}

/// The events of frees made during a capture cannot be created after it: the request that
/// finds those frees waiting is served with new memory, and they wait until a later request
/// records their events (a stream fence of the C API; a `free_sync:event` fence of `cudaFree`).
/// A warning says so, once: also when the failure goes on from request to request, while the
/// polls of other frees have no event to record.
#[test]
fn a_free_whose_event_cannot_be_recorded_after_a_capture_does_not_fail_the_next_request() {
    for (scenario, conf) in [
        ("deferred_create_fails", "free_sync:device"),
        ("deferred_fence_create_fails", "free_sync:event"),
        ("deferred_fence_create_fails_again", "free_sync:event"),
    ] {
        let out = check(scenario, &[("CACHEALLOC_CONF", conf)]);
        let log = stderr(&out);
        let said = "the events of frees made during a CUDA graph capture could not be recorded \
                    (cudaEventCreateWithFlags failed with CUDA error 2)";
        assert_eq!(log.matches(said).count(), 1, "{scenario}:\n{log}");
    }
}

/// A recorded stream the runtime refuses an event on after the capture: its work is not waited
/// for, and a warning names it.
#[test]
fn a_stream_refused_after_a_capture_is_named_in_a_warning() {
    let out = check("deferred_refused", &[]);
    let log = stderr(&out);
    assert!(
        log.contains("a free made during a CUDA graph capture: the work of its recorded stream 0x")
            && log.contains("CUDA error 999"),
        "{log}"
    );
}

/// Such a free recorded on another device's stream, whose device is reset after the capture:
/// its event is recorded before the reset destroys the stream, not on the stale handle after it.
#[test]
fn a_recorded_free_during_a_capture_records_its_events_before_a_reset_of_their_device() {
    check("recorded_free_reset", &[]);
}

/// `cachealloc_malloc` on a capturing stream: a cached block serves it; a miss takes new memory
/// with `cudaMalloc`, the thread's capture mode relaxed for the call as PyTorch relaxes it, so a
/// global-mode capture goes on whatever mode the thread had (left as it was); so does a miss of
/// the pluggable allocator's hook. The program's own `cudaMalloc` keeps the thread's mode: the
/// capture refuses it from the global mode and ends.
#[test]
fn a_c_api_request_during_a_capture_relaxes_the_threads_capture_mode_as_pytorch_does() {
    check("direct_malloc", &[]);
}

/// Such a miss whose `cudaMalloc` fails (not out of memory): the code is returned, and the
/// thread's last error is left as it was, the library's failure not kept as the program's once
/// the mode is restored.
#[test]
fn a_failed_c_api_request_during_a_capture_leaves_the_last_error_as_it_was() {
    check("direct_malloc_fails", &[]);
}

/// With `CACHEALLOC_DISABLE=1` such a request is the runtime's `cudaMalloc`, made with the
/// thread's capture mode relaxed as when the library is enabled: the capture goes on.
#[test]
fn a_c_api_request_during_a_capture_relaxes_the_capture_mode_when_disabled_too() {
    check("direct_malloc_disabled", &[("CACHEALLOC_DISABLE", "1")]);
}

/// The same with the device reset while the capture is still underway: the event on the stream
/// the reset destroys is recorded before the reset, which completes it.
#[test]
fn a_recorded_free_during_a_capture_records_its_events_before_a_reset_during_it() {
    check("recorded_free_reset_during", &[]);
}

/// Such a free recorded on two streams, one of which the program destroys after the capture:
/// that stream's event is recorded as it is destroyed, not on the stale handle afterwards, and
/// the block waits for both streams' work.
#[test]
fn a_recorded_free_during_a_capture_records_its_event_on_a_stream_before_its_destroy() {
    check("recorded_free_destroyed", &[]);
}

/// Another thread's request, during a thread-local capture, does not synchronize the device
/// either (a device synchronization from any thread ends a capture).
#[test]
fn another_threads_request_during_a_capture_does_not_end_it() {
    check("other_thread", &[("CACHEALLOC_CONF", "free_sync:device")]);
}

/// A request that needs cached memory given back fails during a capture, with a report that
/// says why, and succeeds after it.
#[test]
fn a_request_that_needs_the_cache_given_back_fails_during_a_capture_and_says_why() {
    let out = check(
        "oom",
        &[
            ("CACHEALLOC_CONF", "free_sync:none"),
            ("FAKECUDART_CAPACITY", "64MiB"),
        ],
    );
    let log = stderr(&out);
    assert!(log.contains("CUDA out of memory"), "{log}");
    assert!(
        log.contains("A CUDA graph capture was underway: cachealloc gave no cached memory back"),
        "{log}"
    );
}

/// A request that fits only once a free made during the capture completes fails during the
/// capture, and its hint names the pending free rather than calling the memory exhausted.
#[test]
fn a_request_held_back_by_a_free_pending_during_a_capture_is_told_so() {
    let out = check(
        "oom_pending",
        &[
            ("CACHEALLOC_CONF", "free_sync:device"),
            ("FAKECUDART_CAPACITY", "64MiB"),
        ],
    );
    let log = stderr(&out);
    assert!(
        log.contains(
            "Hint: Pending during the capture: frees still pending hold 40.00 MiB, which \
             cachealloc could not wait for while a CUDA graph capture was underway"
        ),
        "{log}"
    );
    assert!(!log.contains("Not fragmentation"), "{log}");
}

/// `empty_cache()` during a capture does nothing and succeeds, as PyTorch's: no synchronization,
/// no cudaFree, the capture goes on; after it the cache is given back.
#[test]
fn empty_cache_during_a_capture_leaves_the_cache_and_the_capture_alone() {
    check("empty_cache", &[("CACHEALLOC_CONF", "free_sync:device")]);
}

/// A device reset forgets the captures of the device's streams, which it destroys, and keeps
/// another device's.
#[test]
fn a_device_reset_forgets_its_streams_and_keeps_other_devices_captures() {
    check("reset", &[("CACHEALLOC_CONF", "free_sync:device")]);
}

/// A noted stream the runtime cannot answer for is forgotten, and the failed query is the
/// library's own call: the program reads its own unread error, not the query's.
#[test]
fn a_failed_capture_query_leaves_the_programs_last_error_alone() {
    check("query_fails", &[("CACHEALLOC_CONF", "free_sync:device")]);
}

/// A stream captured more times than the table has slots, with no request between its
/// captures, takes one slot: another stream's capture is still followed, and nothing warns that
/// a capture is not.
#[test]
fn a_stream_captured_again_and_again_takes_one_slot() {
    let out = check("recaptured", &[("CACHEALLOC_CONF", "free_sync:device")]);
    let log = stderr(&out);
    assert!(!log.contains("CUDA graph captures at once"), "{log}");
}

/// Captures that ended, or whose stream was destroyed, are forgotten: the pool waits for the
/// device again before growing. Refused starts note nothing.
#[test]
fn ended_and_refused_captures_leave_the_pool_as_before() {
    for scenario in ["ended", "refused"] {
        check(scenario, &[("CACHEALLOC_CONF", "free_sync:device")]);
    }
}
