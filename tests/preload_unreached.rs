//! A program that asks for cachealloc's statistics or a trace but whose CUDA calls never reach
//! it (a statically linked runtime, the driver API, a library opened with dlopen rather than
//! preloaded) is told why it got nothing, at exit; one that never used CUDA is left silent.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use support::fake_cudart::{compile_c_program, compile_c_without_runtime};
use support::shim::{library, preloaded, run_ok, stderr, stdout};

fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/unreached.c")
}

/// Run `program` with `args` under the shim, `CACHEALLOC_CONF` set to `conf` when given.
fn run(program: &Path, args: &[&Path], conf: Option<&str>) -> Output {
    let mut cmd = preloaded(program);
    cmd.args(args);
    if let Some(conf) = conf {
        cmd.env("CACHEALLOC_CONF", conf);
    }
    let out = run_ok(&mut cmd);
    assert_eq!(stdout(&out), "ok\n");
    out
}

#[test]
fn a_static_runtime_is_named_when_statistics_or_a_trace_were_asked_for() {
    let program = compile_c_without_runtime(&source(), "unreached_static", &["-ldl"]);
    let driver = compile_c_without_runtime(
        &source(),
        "libcuda.so.1-stand-in",
        &["-DSTAND_IN_DRIVER", "-shared", "-fPIC"],
    );
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.jsonl");
    let trace_conf = format!("trace:{}", trace.display());
    for (conf, asked) in [
        ("stats:text", "statistics at exit"),
        (trace_conf.as_str(), "a trace"),
    ] {
        let err = stderr(&run(&program, &[&driver], Some(conf)));
        assert_eq!(
            err.lines().count(),
            1,
            "one line, the notice, for {conf}: {err}"
        );
        assert!(
            err.starts_with(&format!(
                "cachealloc: CACHEALLOC_CONF asks for {asked}, but no CUDA call reached \
                 cachealloc in this process: it used CUDA (the driver libcuda.so.1 is loaded) \
                 without the shared runtime libcudart.so"
            )),
            "{err}"
        );
        assert!(err.contains("build with -cudart shared"), "{err}");
    }
    assert!(!trace.exists(), "no call, no recording");
    // Nothing asked for, nothing said; no CUDA used, nothing said either.
    assert_eq!(stderr(&run(&program, &[&driver], None)), "");
    assert_eq!(stderr(&run(&program, &[], Some("stats:text"))), "");
    let mut disabled = preloaded(&program);
    disabled
        .arg(&driver)
        .env("CACHEALLOC_CONF", "stats:text")
        .env("CACHEALLOC_DISABLE", "1");
    assert_eq!(stderr(&run_ok(&mut disabled)), "");
}

#[test]
fn a_shared_runtime_without_interposed_calls_is_named_too() {
    let program = compile_c_program(&source(), "unreached_shared", &["-DWITH_RUNTIME"]);
    let err = stderr(&run(&program, &[], Some("stats:json")));
    assert!(
        err.starts_with(
            "cachealloc: CACHEALLOC_CONF asks for statistics at exit, but no CUDA call reached \
             cachealloc in this process: it loaded the CUDA driver and the shared runtime \
             (libcudart.so) but made none of the calls cachealloc serves (cudaMalloc, cudaFree, \
             cudaMemGetInfo, …): any device memory it used came from"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Loaded with dlopen as PyTorch's pluggable allocator is, the library sees none of the
/// program's CUDA calls: the notice says that none of its own functions was called, not that
/// the program's memory came from calls cachealloc cannot see.
#[test]
fn a_library_opened_rather_than_preloaded_says_its_functions_were_not_called() {
    let program = compile_c_program(&source(), "unreached_opened", &["-DWITH_RUNTIME", "-ldl"]);
    let mut cmd = preloaded(&program);
    cmd.env_remove("LD_PRELOAD")
        .arg(library())
        .env("CACHEALLOC_CONF", "stats:text");
    let out = run_ok(&mut cmd);
    assert_eq!(stdout(&out), "ok\n");
    let err = stderr(&out);
    assert!(
        err.starts_with(
            "cachealloc: CACHEALLOC_CONF asks for statistics at exit, but no CUDA call reached \
             cachealloc in this process: the program's cudaMalloc does not come to cachealloc \
             (loaded with dlopen, as PyTorch's CUDAPluggableAllocator loads it, rather than \
             preloaded)"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
