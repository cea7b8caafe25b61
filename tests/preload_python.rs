//! End to end from Python: `LD_PRELOAD=libcachealloc.so python3 driver.py` where the CUDA calls
//! come from a shared library loaded with ctypes (`RTLD_LOCAL`, like a PyTorch extension). The
//! runtime is then invisible to `dlsym(RTLD_NEXT)`, so these tests exercise the shim's
//! `dlopen(…, RTLD_NOLOAD)` fallback. Skipped with a message when `python3` is not installed.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use support::fake_cudart;
use support::shim::{number_after, preloaded, run_scenario, stderr, stdout};

fn python() -> Option<&'static str> {
    let found = Command::new("python3")
        .arg("-c")
        .arg("import ctypes")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        Some("python3")
    } else {
        eprintln!("skipping: python3 (with ctypes) not found");
        None
    }
}

fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload")
}

fn scenario_library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| {
        fake_cudart::compile_c_program(
            &tests_dir().join("shim_check.c"),
            "libshimcheck.so",
            &["-shared", "-fPIC", "-DSHIM_CHECK_LIBRARY"],
        )
    })
}

/// Run `scenario` in a preloaded Python process; `None` when Python is missing.
fn check(scenario: &str, env: &[(&str, &str)]) -> Option<Output> {
    let python = python()?;
    let mut cmd = preloaded(Path::new(python));
    cmd.arg(tests_dir().join("driver.py"))
        .arg(scenario_library())
        .arg(scenario)
        .env("CACHEALLOC_LOG", "cachealloc=debug")
        .envs(env.iter().copied());
    Some(run_scenario(&mut cmd, scenario))
}

#[test]
fn the_runtime_is_found_by_soname_when_loaded_rtld_local() {
    let Some(out) = check("churn", &[("SHIM_CHECK_ITERATIONS", "20000")]) else {
        return;
    };
    let log = stderr(&out);
    assert!(
        log.contains("found the CUDA runtime through dlopen(libcudart.so.12, RTLD_NOLOAD)"),
        "{log}"
    );
    let mallocs = number_after(&stdout(&out), "fake mallocs");
    assert!((1..=40).contains(&mallocs), "{mallocs} runtime allocations");
}

#[test]
fn python_out_of_memory_answers_2_and_goes_on() {
    let Some(out) = check("oom", &[("FAKECUDART_CAPACITY", "64MiB")]) else {
        return;
    };
    assert_eq!(stderr(&out).matches("CUDA out of memory").count(), 1);
}

#[test]
fn python_foreign_pointers_are_forwarded() {
    check("foreign", &[]);
}

#[test]
fn python_double_free_answers_1() {
    check("double_free", &[]);
}

#[test]
fn python_free_to_owner_device_and_reset() {
    check("cross_device", &[]);
    check("reset", &[]);
}

#[test]
fn python_free_sync_device_waits_for_work() {
    let Some(out) = check("reuse_nonblocking", &[]) else {
        return;
    };
    assert!(stdout(&out).contains("reused 1 busy 0"), "{}", stdout(&out));
}

#[test]
fn python_config_error_fails_allocations_with_3() {
    let Some(out) = check("config_error", &[("CACHEALLOC_CONF", "bogus:1")]) else {
        return;
    };
    assert_eq!(
        stderr(&out)
            .matches("cachealloc: configuration error")
            .count(),
        1,
        "{}",
        stderr(&out)
    );
}
