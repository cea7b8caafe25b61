//! End to end with `cudaFreeAsync`: a program frees memory it got from `cudaMalloc` with
//! `cudaFreeAsync` (`tests/preload/free_async_check.c`), with the library preloaded in front of
//! the fake runtime, whose `cudaFreeAsync` gives back the whole allocation at the pointer. A pool
//! pointer goes back to the pool instead, reused only once its stream has reached the free;
//! memory of the runtime's stream-ordered allocator is the runtime's to free.

mod support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use support::fake_cudart;
use support::shim::{preloaded, run_scenario, stderr};

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/free_async_check.c");
        fake_cudart::compile_c_program(&source, "free_async_check", &[])
    })
}

/// Run `scenario` under every `free_sync` policy (the stream-ordered free is the same under
/// each); returns the last run's log.
fn check_under_every_policy(scenario: &str) -> String {
    let mut log = String::new();
    for free_sync in ["device", "event", "none"] {
        let mut cmd = preloaded(program());
        cmd.arg(scenario)
            .env("CACHEALLOC_CONF", format!("free_sync:{free_sync}"));
        log = stderr(&run_scenario(&mut cmd, scenario));
    }
    log
}

/// The rest of the segment stays usable, the runtime frees nothing, and the block comes back
/// once the stream has reached the free.
#[test]
fn a_pool_pointer_freed_on_a_stream_is_reused_once_the_stream_reaches_the_free() {
    let log = check_under_every_policy("stream_ordered");
    assert!(log.is_empty(), "unexpected log: {log}");
}

/// `cudaFreeAsync_ptsz(p, NULL)`, as code built with per-thread default streams calls it: the
/// free is ordered on the thread's default stream.
#[test]
fn the_per_thread_form_orders_the_free_on_the_threads_default_stream() {
    check_under_every_policy("per_thread");
}

/// Another thread's `cudaFreeAsync_ptsz(p, NULL)` during a capture: its event is recorded after
/// the capture by the main thread's request, and the block still waits for the work on the
/// freeing thread's default stream (not on the recording thread's own).
#[test]
fn a_free_on_a_threads_default_stream_deferred_by_a_capture_waits_for_that_thread() {
    check_under_every_policy("per_thread_deferred");
}

#[test]
fn memory_of_the_stream_ordered_allocator_is_freed_by_the_runtime() {
    check_under_every_policy("foreign");
}

#[test]
fn a_double_or_interior_free_is_refused_and_the_pool_stays_intact() {
    let log = check_under_every_policy("bad_pointers");
    assert!(
        log.contains("cudaFreeAsync"),
        "the refusal is logged: {log}"
    );
}

/// A free on a capturing stream would be a graph node, which takes only a graph allocation: the
/// pool pointer is refused with 1, the capture goes on, and the log says why.
#[test]
fn a_pool_pointer_is_refused_on_a_capturing_stream_and_stays_allocated() {
    let log = check_under_every_policy("capturing");
    assert!(
        log.contains("capturing stream") && log.contains("stays allocated"),
        "the refusal says why: {log}"
    );
}

#[test]
fn a_stream_the_runtime_does_not_take_leaves_the_block_allocated() {
    check_under_every_policy("stale_stream");
}

/// A free made while another stream captures, whose stream the program destroys after the
/// capture and before its next request: the block still waits for the stream's work (which
/// goes on after the destroy), and no call names the destroyed stream.
#[test]
fn a_free_deferred_by_a_capture_waits_for_its_stream_destroyed_after_it() {
    check_under_every_policy("destroyed_after_capture");
}

/// The same with the stream destroyed while the capture is still underway: its event is
/// recorded then, on a stream that does not capture, and the capture goes on undisturbed.
#[test]
fn a_free_deferred_by_a_capture_waits_for_its_stream_destroyed_during_it() {
    check_under_every_policy("destroyed_during_capture");
}
