//! NVIDIA's real `libcudart.so.12` (PyPI `nvidia-cuda-runtime-cu12`, installed into `.venv` by
//! `scripts/setup-test-deps.sh`) on this machine without a driver: what it answers, how programs
//! bind to it, and that `libcachealloc.so` preloaded in front of it intercepts `cudaMalloc` and
//! passes the runtime's errors through unchanged.
//!
//! The runtime without a driver answers 35 `cudaErrorInsufficientDriver` to every call (100
//! `cudaErrorNoDevice` where a driver but no device is present) and leaves `cudaMalloc`'s
//! out-pointer untouched. A shim must not fabricate a success before the runtime ever succeeded,
//! so under the preload the program must see exactly the same answers.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use support::real_cudart;
use support::shim::run_ok;

/// Codes the real runtime answers without a usable GPU: 35 cudaErrorInsufficientDriver (no
/// libcuda.so.1), 100 cudaErrorNoDevice (a driver, no device).
const NO_GPU_CODES: &[i32] = &[35, 100];

fn check_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("real-cudart")
        .join("no_driver_check.c")
}

/// The check program against the real runtime, or None when the runtime is not installed.
fn check_program() -> Option<(PathBuf, PathBuf)> {
    static BUILT: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let library = real_cudart::real_cudart_or_skip()?;
            let program =
                real_cudart::compile_c_program(&library, &check_source(), "no_driver_check");
            Some((library, program))
        })
        .clone()
}

/// The program run with a clean environment as far as the loader and the shim are concerned.
fn command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for var in ["LD_PRELOAD", "LD_DEBUG", "LD_LIBRARY_PATH"] {
        cmd.env_remove(var);
    }
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CACHEALLOC_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// `call=NAME rc=N …` lines as NAME -> (rc, the rest of the line).
fn answers(stdout: &str) -> BTreeMap<String, (i32, String)> {
    stdout
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("call=")?;
            let (name, rest) = rest.split_once(" rc=")?;
            let (rc, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            Some((name.to_string(), (rc.parse().ok()?, tail.to_string())))
        })
        .collect()
}

/// True (after a note) when a driver is loadable: then the no-driver answers do not apply.
fn driver_present(stdout: &str) -> bool {
    let present = stdout.lines().any(|l| l == "driver present");
    if present {
        eprintln!("skipping: libcuda.so.1 is present, this test checks a machine without a driver");
    }
    present
}

#[test]
fn real_runtime_without_a_driver_answers_35_and_leaves_outputs_alone() {
    let Some((_, program)) = check_program() else {
        return;
    };
    let stdout = String::from_utf8(run_ok(&mut command(&program)).stdout).unwrap();
    if driver_present(&stdout) {
        return;
    }
    let answers = answers(&stdout);
    for call in [
        "cudaMalloc(1048576)",
        "cudaMalloc(0)",
        "cudaFree(NULL)",
        "cudaMemGetInfo",
        "cudaIpcGetMemHandle",
        "cudaDeviceEnablePeerAccess",
        "cudaFreeAsync",
        "cudaFreeAsync_ptsz",
    ] {
        let (rc, tail) = answers
            .get(call)
            .unwrap_or_else(|| panic!("no answer for {call}:\n{stdout}"));
        assert!(
            NO_GPU_CODES.contains(rc),
            "{call} answered {rc} ({tail}), expected one of {NO_GPU_CODES:?}:\n{stdout}"
        );
        if call.starts_with("cudaMalloc") {
            assert!(
                tail.contains("out=untouched"),
                "{call} wrote its out-pointer on failure:\n{stdout}"
            );
        }
    }
    assert!(
        stdout.contains("name=cudaErrorInsufficientDriver")
            || stdout.contains("name=cudaErrorNoDevice"),
        "error names missing:\n{stdout}"
    );
}

#[test]
fn real_runtime_exports_default_versioned_symbols_that_programs_reference() {
    let Some((library, program)) = check_program() else {
        return;
    };
    let syms = readelf(&["--dyn-syms", "-W"], &library);
    for name in [
        "cudaMalloc",
        "cudaFree",
        "cudaMemGetInfo",
        "cudaDeviceSynchronize",
        "cudaDeviceEnablePeerAccess",
        "cudaIpcGetMemHandle",
        "cudaFreeAsync",
        "cudaFreeAsync_ptsz",
    ] {
        let versioned = format!(" {name}@@libcudart.so.12");
        assert!(
            syms.lines()
                .any(|l| l.ends_with(&versioned) && !l.contains(" UND ")),
            "{name}@@libcudart.so.12 not defined by {}",
            library.display()
        );
    }
    let dynamic = readelf(&["-d", "-W"], &library);
    assert!(
        dynamic.contains("Library soname: [libcudart.so.12]"),
        "{dynamic}"
    );
    let program_syms = readelf(&["--dyn-syms", "-W"], &program);
    assert!(
        program_syms
            .lines()
            .any(|l| l.contains(" UND ") && l.contains(" cudaMalloc@libcudart.so.12")),
        "the program does not reference cudaMalloc@libcudart.so.12:\n{program_syms}"
    );
}

/// The shim against the real runtime: the call reaches libcachealloc.so (the loader binds the
/// program's `cudaMalloc@libcudart.so.12` to it), the runtime's error comes back unchanged, and
/// nothing crashes. Runs as soon as libcachealloc.so exports `cudaMalloc`; until then it says
/// it skipped.
#[test]
fn shim_intercepts_the_real_runtime_and_passes_its_errors_through() {
    let shim = support::shim::library();
    let exports = tool("nm", &["-D", "--defined-only"], &shim);
    let exports_cuda_malloc = exports
        .lines()
        .any(|l| l.split_whitespace().last() == Some("cudaMalloc"));
    if !exports_cuda_malloc {
        eprintln!(
            "skipping: {} exports no cudaMalloc (the interposer is not built in)",
            shim.display()
        );
        return;
    }
    let Some((_, program)) = check_program() else {
        return;
    };
    let plain = String::from_utf8(run_ok(&mut command(&program)).stdout).unwrap();
    if driver_present(&plain) {
        return;
    }
    let preloaded = run_ok(
        command(&program)
            .env("LD_PRELOAD", &shim)
            .env("LD_DEBUG", "bindings")
            .env("CACHEALLOC_LOG", "debug"),
    );
    let stdout = String::from_utf8_lossy(&preloaded.stdout);
    let stderr = String::from_utf8_lossy(&preloaded.stderr);

    // Same answers, codes and out-pointer states alike, as without the shim.
    assert_eq!(
        answers(&stdout),
        answers(&plain),
        "the shim changed the runtime's answers:\nwith shim:\n{stdout}\nwithout:\n{plain}\nstderr:\n{stderr}"
    );
    // The program's cudaMalloc@libcudart.so.12 bound to the shim, not to the runtime.
    let program_name = program.file_name().unwrap().to_string_lossy().into_owned();
    // "binding file PROGRAM [0] to …/libcachealloc.so [0]: normal symbol `cudaMalloc' [libcudart.so.12]"
    let bound_to_shim = stderr.lines().any(|l| {
        l.split_once("binding file ")
            .and_then(|(_, rest)| rest.split_once(" to "))
            .is_some_and(|(from, to)| {
                from.contains(&program_name)
                    && to.contains("libcachealloc.so")
                    && to.contains("`cudaMalloc'")
            })
    });
    assert!(
        bound_to_shim,
        "no LD_DEBUG line binding the program's cudaMalloc to libcachealloc.so:\n{stderr}"
    );
}

fn readelf(args: &[&str], file: &Path) -> String {
    tool("readelf", args, file)
}

/// Output of a binutils tool; binutils is a test dependency (scripts/setup-test-deps.sh).
fn tool(name: &str, args: &[&str], file: &Path) -> String {
    let out = Command::new(name)
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {name} (install binutils: scripts/setup-test-deps.sh): {e}")
        });
    assert!(
        out.status.success(),
        "{name} {args:?} {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
