//! The fake CUDA runtime used by the end-to-end tests: it must look like the real
//! `libcudart.so.12` to the dynamic linker (SONAME, default-versioned symbols, `-Bsymbolic`) and
//! behave like it where the shim depends on it (OOM code 2 and the sticky last error, cudaFree
//! semantics, stream and event ordering including the legacy default stream rule).
//!
//! The fake CUDA driver `libcuda.so.1` built beside it must look like the real one too (SONAME,
//! unversioned `cu*` exports) and be loaded by the runtime at its first call, as the real runtime
//! loads the real driver, so that a preloaded library finds it with `RTLD_NOLOAD`.
//!
//! The behaviour checks live in `tests/fake-cudart/checks/fake_cudart_check.c` (the runtime) and
//! `tests/fake-cudart/checks/vmm_check.c` (the driver, linked with `-l:libcuda.so.1`), one scenario
//! per command-line argument; each test here runs one scenario in its own process (the fake reads
//! its environment once per process) and requires its "ok" line.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use support::fake_cudart::{self, DRIVER_SONAME, SONAME};

/// Functions every caller of the real runtime may bind to; all must be exported as defaults of
/// the `libcudart.so.12` version.
const REQUIRED_EXPORTS: &[&str] = &[
    "cudaMalloc",
    "cudaFree",
    "cudaMallocManaged",
    "cudaMallocPitch",
    "cudaMallocHost",
    "cudaFreeHost",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cudaMallocAsync_ptsz",
    "cudaFreeAsync_ptsz",
    "cudaMemGetInfo",
    "cudaGetDeviceCount",
    "cudaGetDevice",
    "cudaSetDevice",
    "cudaDeviceSynchronize",
    "cudaDeviceReset",
    "cudaStreamCreate",
    "cudaStreamCreateWithFlags",
    "cudaStreamDestroy",
    "cudaStreamSynchronize",
    "cudaEventCreate",
    "cudaEventCreateWithFlags",
    "cudaEventRecord",
    "cudaEventQuery",
    "cudaEventSynchronize",
    "cudaEventDestroy",
    "cudaMemcpy",
    "cudaMemset",
    "cudaGetLastError",
    "cudaPeekAtLastError",
    "cudaGetErrorString",
    "cudaGetErrorName",
    "cudaRuntimeGetVersion",
    "cudaDriverGetVersion",
    "cudaPointerGetAttributes",
    "cudaDeviceCanAccessPeer",
    "cudaDeviceEnablePeerAccess",
    "cudaDeviceDisablePeerAccess",
    "cudaIpcGetMemHandle",
    "cudaStreamBeginCapture",
    "cudaStreamEndCapture",
    "cudaStreamIsCapturing",
    "cudaThreadExchangeStreamCaptureMode",
    "cudaGraphDestroy",
    "fakecudart_ipc_handle_base",
    "fakecudart_launch",
    "fakecudart_advance",
    "fakecudart_range_busy",
    "fakecudart_counter",
    "fakecudart_get_counters",
    "fakecudart_reset_counters",
    "fakecudart_driver_cuInit",
    "fakecudart_driver_cuMemCreate",
];

/// The driver functions `libcuda.so.1` exports (cuda.h), and nothing else.
const DRIVER_EXPORTS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

fn check_program() -> &'static PathBuf {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let source = fake_cudart::source_dir()
            .join("checks")
            .join("fake_cudart_check.c");
        fake_cudart::compile_c_program(&source, "fake_cudart_check", &["-ldl"])
    })
}

/// The driver's checks, linked against `libcuda.so.1` (besides `libcudart.so.12`).
fn vmm_program() -> &'static PathBuf {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let source = fake_cudart::source_dir().join("checks").join("vmm_check.c");
        fake_cudart::compile_c_program(&source, "vmm_check", &["-l:libcuda.so.1"])
    })
}

fn run_program(program: &std::path::Path, scenario: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = fake_cudart::command(program);
    cmd.arg(scenario).envs(env.iter().copied());
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()))
}

fn run_scenario(scenario: &str, env: &[(&str, &str)]) -> Output {
    run_program(check_program(), scenario, env)
}

fn assert_scenario_passes(scenario: &str, env: &[(&str, &str)]) {
    assert_passes(run_scenario(scenario, env), scenario, env);
}

fn assert_vmm_scenario_passes(scenario: &str, env: &[(&str, &str)]) {
    assert_passes(run_program(vmm_program(), scenario, env), scenario, env);
}

fn assert_passes(out: Output, scenario: &str, env: &[(&str, &str)]) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("ok {scenario}")),
        "scenario {scenario} with {env:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Output of a binutils tool, or None (with a note) when it is not installed.
fn tool_output(tool: &str, args: &[&str], file: &std::path::Path) -> Option<String> {
    match Command::new(tool).args(args).arg(file).output() {
        Ok(out) => {
            assert!(
                out.status.success(),
                "{tool} {args:?} {} failed",
                file.display()
            );
            Some(String::from_utf8_lossy(&out.stdout).into_owned())
        }
        Err(e) => {
            eprintln!("skipping: {tool} not available ({e})");
            None
        }
    }
}

#[test]
fn library_has_the_real_runtimes_soname_and_symbolic_binding() {
    let lib = fake_cudart::fake_cudart().library();
    let Some(dynamic) = tool_output("readelf", &["-d", "-W"], &lib) else {
        return;
    };
    assert!(
        dynamic.contains("Library soname: [libcudart.so.12]"),
        "SONAME missing:\n{dynamic}"
    );
    assert!(
        dynamic.contains("(SYMBOLIC)") || dynamic.contains("FLAGS") && dynamic.contains("SYMBOLIC"),
        "DT_SYMBOLIC missing:\n{dynamic}"
    );
    let link = fake_cudart::fake_cudart().lib_dir.join("libcudart.so");
    assert_eq!(std::fs::read_link(&link).unwrap(), PathBuf::from(SONAME));
}

#[test]
fn every_export_is_a_default_version_of_libcudart_so_12() {
    let lib = fake_cudart::fake_cudart().library();
    let Some(syms) = tool_output("readelf", &["--dyn-syms", "-W"], &lib) else {
        return;
    };
    for name in REQUIRED_EXPORTS {
        let versioned = format!(" {name}@@libcudart.so.12");
        assert!(
            syms.lines()
                .any(|l| l.ends_with(&versioned) && !l.contains(" UND ")),
            "{name}@@libcudart.so.12 not exported:\n{syms}"
        );
    }
    // Nothing else leaks: every defined function is cuda* or fakecudart_*.
    for line in syms
        .lines()
        .filter(|l| l.contains(" FUNC ") && !l.contains(" UND "))
    {
        let name = line.split_whitespace().last().unwrap();
        assert!(
            name.starts_with("cuda") || name.starts_with("fakecudart_"),
            "unexpected export {name}"
        );
        assert!(
            name.ends_with("@@libcudart.so.12"),
            "unversioned export {name}"
        );
    }
}

#[test]
fn programs_bind_to_the_versioned_runtime() {
    let Some(dynamic) = tool_output("readelf", &["-d", "-W"], check_program()) else {
        return;
    };
    assert!(
        dynamic.contains("Shared library: [libcudart.so.12]"),
        "NEEDED libcudart.so.12 missing:\n{dynamic}"
    );
    let Some(syms) = tool_output("readelf", &["--dyn-syms", "-W"], check_program()) else {
        return;
    };
    assert!(
        syms.lines()
            .any(|l| l.contains(" UND ") && l.contains(" cudaMalloc@libcudart.so.12")),
        "the program does not reference cudaMalloc@libcudart.so.12:\n{syms}"
    );
}

#[test]
fn allocation_copies_frees_and_counters() {
    assert_scenario_passes("alloc", &[]);
}

#[test]
fn out_of_memory_returns_2_and_stays_until_cuda_get_last_error() {
    assert_scenario_passes("oom", &[("FAKECUDART_CAPACITY", "1MiB")]);
}

#[test]
fn the_context_holds_part_of_the_total_and_never_frees_it() {
    assert_scenario_passes(
        "context",
        &[
            ("FAKECUDART_CAPACITY", "1MiB"),
            ("FAKECUDART_CONTEXT", "256KiB"),
        ],
    );
}

#[test]
fn devices_are_per_thread_and_reset_frees_the_current_one() {
    assert_scenario_passes("devices", &[("FAKECUDART_DEVICES", "3")]);
}

#[test]
fn peer_access_answers_as_the_real_runtime_and_ends_with_a_reset() {
    assert_scenario_passes("peer", &[("FAKECUDART_DEVICES", "3")]);
}

#[test]
fn an_ipc_handle_names_the_whole_allocation_even_for_a_pointer_inside_it() {
    assert_scenario_passes("ipc", &[]);
}

/// Captures fail as the real runtime's do: a device synchronization or a `cudaFree` ends any
/// capture, a `cudaMalloc` one in global mode, not in relaxed mode; an event recorded on a
/// capturing stream answers no query, and one recorded on the legacy stream ends a blocking
/// stream's capture.
#[test]
fn captures_end_invalidated_on_the_calls_the_runtime_forbids() {
    assert_scenario_passes("capture", &[]);
}

#[test]
fn streams_events_and_the_clock_follow_cuda_ordering() {
    assert_scenario_passes("clock", &[]);
}

#[test]
fn legacy_stream_waits_for_blocking_streams_only() {
    assert_scenario_passes("legacy", &[]);
}

#[test]
fn threads_share_the_counters_but_not_the_last_error() {
    assert_scenario_passes("threads", &[("FAKECUDART_CAPACITY", "64MiB")]);
}

#[test]
fn fail_35_mimics_a_machine_without_a_driver() {
    assert_scenario_passes("no-driver", &[("FAKECUDART_FAIL", "35")]);
}

#[test]
fn zero_devices_answer_no_device() {
    assert_scenario_passes("no-device", &[("FAKECUDART_DEVICES", "0")]);
}

#[test]
fn capacity_accepts_bytes_and_unit_suffixes() {
    let cases: &[(&str, u64)] = &[
        ("4096", 4096),
        ("1500KB", 1_500_000),
        ("3MiB", 3 << 20),
        ("2G", 2 << 30),
        ("1TiB", 1 << 40),
    ];
    for (text, bytes) in cases {
        let out = run_scenario("total", &[("FAKECUDART_CAPACITY", text)]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!("total {bytes}\n")),
            "FAKECUDART_CAPACITY={text}: {stdout}"
        );
    }
    let out = run_scenario("total", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("total {}\n", 16u64 << 30)),
        "default capacity: {stdout}"
    );
}

#[test]
fn malformed_environment_is_reported_and_fails_every_call() {
    for (var, value) in [
        ("FAKECUDART_CAPACITY", "lots"),
        ("FAKECUDART_CAPACITY", "1.5GiB"),
        ("FAKECUDART_CONTEXT", "lots"),
        ("FAKECUDART_DEVICES", "65"),
        ("FAKECUDART_FAIL", "x"),
        ("FAKECUDART_VMM_GRANULARITY", "3MiB"),
        ("FAKECUDART_VMM_GRANULARITY", "2KiB"),
        ("FAKECUDART_VMM_RDMA_GRANULARITY", "2GiB"),
    ] {
        let out = run_scenario("total", &[(var, value)]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stdout.contains("error 3\n"), "{var}={value}: {stdout}");
        assert!(
            stderr.contains(&format!("{var}='{value}' is not valid")),
            "{var}={value}: {stderr}"
        );
    }
}

#[test]
fn concurrent_builds_agree_on_one_library() {
    let root = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fake-cudart-race-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dirs: Vec<PathBuf> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| fake_cudart::build_fake_cudart_in(&root)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    assert!(dirs.iter().all(|d| d == &dirs[0]), "{dirs:?}");
    assert!(dirs[0].join(SONAME).is_file());
    assert!(dirs[0].join(DRIVER_SONAME).is_file());
    // Only the published build is left: no temporary directories.
    let leftovers: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn runtime_finds_the_driver_through_its_runpath() {
    let lib = fake_cudart::fake_cudart().library();
    let Some(dynamic) = tool_output("readelf", &["-d", "-W"], &lib) else {
        return;
    };
    assert!(
        dynamic.contains("(RUNPATH)") && dynamic.contains("Library runpath: [$ORIGIN]"),
        "RUNPATH $ORIGIN missing:\n{dynamic}"
    );
}

#[test]
fn driver_library_has_the_real_drivers_soname_and_exports_only_cu_functions() {
    let fake = fake_cudart::fake_cudart();
    let lib = fake.driver_library();
    assert_eq!(lib.file_name().unwrap(), DRIVER_SONAME);
    let Some(dynamic) = tool_output("readelf", &["-d", "-W"], &lib) else {
        return;
    };
    assert!(
        dynamic.contains("Library soname: [libcuda.so.1]"),
        "SONAME missing:\n{dynamic}"
    );
    assert!(
        dynamic.contains("Shared library: [libcudart.so.12]"),
        "NEEDED libcudart.so.12 missing:\n{dynamic}"
    );
    assert!(
        dynamic.contains("Library runpath: [$ORIGIN]"),
        "RUNPATH $ORIGIN missing:\n{dynamic}"
    );
    let Some(syms) = tool_output("readelf", &["--dyn-syms", "-W"], &lib) else {
        return;
    };
    let defined: Vec<&str> = syms
        .lines()
        .filter(|l| l.contains(" FUNC ") && !l.contains(" UND "))
        .map(|l| l.split_whitespace().last().unwrap())
        .collect();
    let mut expected: Vec<&str> = DRIVER_EXPORTS.to_vec();
    let mut found = defined;
    expected.sort_unstable();
    found.sort_unstable();
    // Unversioned, like the real driver's: no `@` in the names.
    assert_eq!(found, expected, "libcuda.so.1 exports:\n{syms}");
}

#[test]
fn runtime_loads_the_driver_at_its_first_call() {
    assert_scenario_passes("driver-load", &[]);
}

#[test]
fn runtime_without_a_driver_loads_none() {
    assert_scenario_passes("driver-load", &[("FAKECUDART_FAIL", "35")]);
}

#[test]
fn driver_devices_attributes_granularity_and_errors() {
    assert_vmm_scenario_passes("basics", &[]);
}

#[test]
fn driver_memory_is_charged_mapped_usable_and_given_back() {
    assert_vmm_scenario_passes("cycle", &[]);
}

#[test]
fn driver_misuse_answers_invalid_value() {
    assert_vmm_scenario_passes("misuse", &[]);
}

#[test]
fn driver_and_runtime_share_the_capacity() {
    assert_vmm_scenario_passes("oom", &[("FAKECUDART_CAPACITY", "8MiB")]);
}

#[test]
fn driver_memory_belongs_to_its_device_and_survives_a_runtime_reset() {
    assert_vmm_scenario_passes("devices", &[("FAKECUDART_DEVICES", "3")]);
}

#[test]
fn driver_memory_is_usable_only_by_devices_given_access() {
    assert_vmm_scenario_passes("access", &[]);
}

#[test]
fn the_gpudirect_rdma_flag_is_taken_only_where_the_device_reports_it() {
    assert_vmm_scenario_passes("rdma", &[]);
    assert_vmm_scenario_passes("rdma", &[("FAKECUDART_VMM_RDMA", "0")]);
}

#[test]
fn the_granularity_is_the_answer_for_the_properties_asked_about() {
    assert_vmm_scenario_passes(
        "granularity",
        &[
            ("FAKECUDART_VMM_GRANULARITY", "64KiB"),
            ("FAKECUDART_VMM_RDMA_GRANULARITY", "4MiB"),
        ],
    );
}

#[test]
fn driver_without_vmm_answers_not_supported() {
    assert_vmm_scenario_passes("vmm-off", &[("FAKECUDART_VMM", "0")]);
}

#[test]
fn driver_answers_not_initialized_when_the_fake_fails() {
    assert_vmm_scenario_passes("fail", &[("FAKECUDART_FAIL", "35")]);
    assert_vmm_scenario_passes("fail", &[("FAKECUDART_FAIL", "999")]);
    assert_vmm_scenario_passes("fail", &[("FAKECUDART_VMM", "maybe")]);
}

#[test]
fn driver_without_devices_answers_no_device() {
    assert_vmm_scenario_passes("no-device", &[("FAKECUDART_DEVICES", "0")]);
}

#[test]
fn driver_calls_from_many_threads() {
    assert_vmm_scenario_passes("threads", &[]);
}

#[test]
fn driver_maps_thousands_of_pages() {
    assert_vmm_scenario_passes("many-pages", &[]);
}

#[test]
fn driver_memory_of_a_forked_child_stays_apart_from_the_parents() {
    assert_vmm_scenario_passes("fork", &[]);
}
