//! End to end: an unmodified C program linked against `libcudart.so.12` (the fake) runs with
//! `LD_PRELOAD=libcachealloc.so`. Scenarios live in `tests/preload/shim_check.c`; each runs in
//! its own process (the library and the fake read their environment once per process).

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;
use support::fake_cudart;
use support::shim::{
    assert_in_order, held_file, library, number_after, preloaded, run_ok, run_scenario, stderr,
    stdout, word_after,
};

fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/shim_check.c")
}

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| fake_cudart::compile_c_program(&source(), "shim_check", &[]))
}

/// Run `scenario` under the shim with `env` and require its "ok" line.
fn check(scenario: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = preloaded(program());
    cmd.arg(scenario).envs(env.iter().copied());
    run_scenario(&mut cmd, scenario)
}

#[test]
fn a_hundred_thousand_calls_reach_the_runtime_as_a_few_segments() {
    let out = check("churn", &[]);
    let text = stdout(&out);
    let mallocs = number_after(&text, "fake mallocs");
    assert!(
        (1..=40).contains(&mallocs),
        "10^5 cudaMalloc calls became {mallocs} runtime allocations"
    );
    assert_eq!(
        number_after(&text, "frees"),
        0,
        "the pool keeps its segments until exit"
    );
    assert!(stderr(&out).is_empty(), "unexpected log: {}", stderr(&out));
}

#[test]
fn without_the_shim_every_call_reaches_the_runtime() {
    // The same program without LD_PRELOAD: the counters are the runtime's own (a baseline that
    // shows the churn test measures the shim).
    let mut cmd = fake_cudart::command(program());
    cmd.arg("churn").env("SHIM_CHECK_ITERATIONS", "2000");
    let out = run_ok(&mut cmd);
    assert_eq!(number_after(&stdout(&out), "fake mallocs"), 1000);
}

/// cudaGetLastError and cudaPeekAtLastError (interposed) answer an out-of-memory the same way
/// whether the library serves the calls or passes them through.
#[test]
fn the_last_error_after_an_oom_is_the_same_served_or_passed_through() {
    check("last_error", &[("FAKECUDART_CAPACITY", "64MiB")]);
    let out = check(
        "last_error",
        &[
            ("FAKECUDART_CAPACITY", "64MiB"),
            ("CACHEALLOC_DISABLE", "1"),
        ],
    );
    assert!(
        stderr(&out).is_empty(),
        "pass-through is silent: {}",
        stderr(&out)
    );
}

#[test]
fn disabled_library_passes_every_call_through() {
    let out = check(
        "churn",
        &[
            ("CACHEALLOC_DISABLE", "1"),
            ("SHIM_CHECK_ITERATIONS", "2000"),
        ],
    );
    let text = stdout(&out);
    assert_eq!(number_after(&text, "fake mallocs"), 1000);
    assert_eq!(number_after(&text, "frees"), 1000);
}

/// A program that meets out-of-memory errors again and again gets the first three reports in
/// full, then a line counting them at the 4th, 8th and 16th; each report in full at debug.
#[test]
fn repeated_out_of_memory_errors_are_counted_after_the_first_reports() {
    let capacity = ("FAKECUDART_CAPACITY", "64MiB");
    let log = stderr(&check("oom_loop", &[capacity]));
    assert_eq!(log.matches("CUDA out of memory").count(), 3, "{log}");
    assert!(
        log.contains("3 out-of-memory errors: later ones are counted here now and then"),
        "{log}"
    );
    for n in [4, 8, 16] {
        assert!(
            log.contains(&format!(
                "{n} out-of-memory errors so far; the latest asked for 40.00 MiB on device 0"
            )),
            "{log}"
        );
    }
    assert_eq!(
        log.matches("out-of-memory errors so far").count(),
        3,
        "{log}"
    );
    let all = stderr(&check("oom_loop", &[capacity, ("CACHEALLOC_LOG", "debug")]));
    assert_eq!(all.matches("CUDA out of memory").count(), 20, "{all}");
}

/// A program that repeats a refused call (here a double free, 40 times) gets the first ten
/// errors at warn, then a line counting them at the 16th and 32nd; each one at debug.
#[test]
fn repeated_bad_pointers_are_counted_after_the_first_ten() {
    let log = stderr(&check("double_free_loop", &[]));
    let each = "cudaFree: invalid device pointer";
    assert_eq!(log.matches(each).count(), 10, "{log}");
    assert!(
        log.contains("10 bad-pointer errors: later ones are counted here now and then"),
        "{log}"
    );
    for n in [16, 32] {
        assert!(
            log.contains(&format!(
                "{n} bad-pointer errors so far; the latest: invalid device pointer"
            )),
            "{log}"
        );
    }
    assert_eq!(log.matches("bad-pointer errors so far").count(), 2, "{log}");
    let all = stderr(&check("double_free_loop", &[("CACHEALLOC_LOG", "debug")]));
    assert_eq!(all.matches(each).count(), 40, "{all}");
}

#[test]
fn out_of_memory_answers_2_and_the_program_goes_on() {
    let out = check("oom", &[("FAKECUDART_CAPACITY", "64MiB")]);
    let log = stderr(&out);
    assert_eq!(
        log.matches("CUDA out of memory").count(),
        1,
        "one OOM report, at warn level:\n{log}"
    );
    assert!(log.contains("WARN"), "{log}");
    // Live memory alone exceeds the device: the report says no setting helps, and so does not
    // go on to advise recording the run to find one.
    assert!(log.contains("Hint: Not fragmentation"), "{log}");
    assert!(!log.contains("To replay this run offline"), "{log}");
    assert!(!log.contains("cachealloc replay"), "{log}");
}

/// CUDA calls made at exit (an atexit handler, a C++ static destructor) are served as at any
/// other time, whatever the log level: the log's formatter cannot run once the thread's
/// thread-local storage is gone, and its lines are then dropped instead of aborting the process
/// (or failing the call with 999, the block leaked).
#[test]
fn cuda_calls_at_exit_are_served_whatever_the_log_level() {
    for log in ["warn", "debug", "cachealloc::device=debug"] {
        let out = check(
            "at_exit",
            &[("FAKECUDART_CAPACITY", "64MiB"), ("CACHEALLOC_LOG", log)],
        );
        let text = stdout(&out);
        assert!(
            text.contains("at exit: malloc 0 free 0 oom 2"),
            "{log}: {text}\n{}",
            stderr(&out)
        );
    }
}

/// A fresh scratch folder for one test's files, and the `CACHEALLOC_CONF` that records the
/// trace and the JSON statistics of every process into it (`trace-PID.jsonl`,
/// `stats-PID.json`).
fn recording_dir(name: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("cachealloc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let conf = format!(
        "trace:{0}/trace-%p.jsonl,stats:json,stats_file:{0}/stats-%p.json",
        dir.display()
    );
    (dir, conf)
}

/// A free the program has synchronized (its own `cudaDeviceSynchronize`) is complete when the run
/// ends there: the exit statistics show nothing active and the trace has its `free_completed`.
#[test]
fn a_free_the_program_synchronized_is_complete_in_the_exit_statistics_and_trace() {
    let (dir, conf) = recording_dir("sync-exit");
    let out = check("sync_then_exit", &[("CACHEALLOC_CONF", conf.as_str())]);
    let pid = number_after(&stdout(&out), "pid ");
    let trace = std::fs::read_to_string(dir.join(format!("trace-{pid}.jsonl"))).unwrap();
    assert_eq!(
        trace
            .lines()
            .filter(|l| l.contains("\"action\":\"free_completed\""))
            .count(),
        1,
        "{trace}"
    );
    let stats = std::fs::read_to_string(dir.join(format!("stats-{pid}.json"))).unwrap();
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let device = &stats["devices"][0]["stats"];
    assert_eq!(device["active_bytes.all.current"], 0, "{stats}");
    assert_eq!(device["allocated_bytes.all.current"], 0, "{stats}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child forked after cachealloc became active steps aside: its CUDA calls go to the runtime,
/// and its exit writes neither the parent's buffered trace events a second time nor a
/// statistics file of the parent's pools under its own process id.
#[test]
fn a_forked_child_leaves_the_parents_pools_trace_and_statistics_alone() {
    let (dir, conf) = recording_dir("fork");
    check("fork", &[("CACHEALLOC_CONF", conf.as_str())]);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names.len(),
        2,
        "one trace and one statistics file: {names:?}"
    );
    let pid = names[0]
        .trim_start_matches("stats-")
        .trim_end_matches(".json");
    assert_eq!(names[1], format!("trace-{pid}.jsonl"), "{names:?}");
    let trace = std::fs::read_to_string(dir.join(&names[1])).unwrap();
    let count = |needle: &str| trace.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("\"format\":\"cachealloc-trace\""), 1, "{trace}");
    assert_eq!(count("\"action\":\"alloc\""), 2, "{trace}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A parent that has made no pool yet forks a child that uses CUDA: the child keeps
/// cachealloc, with its own trace and statistics files; the parent, which allocated nothing,
/// writes no trace and a statistics file of its own.
#[test]
fn a_child_forked_before_any_pool_keeps_cachealloc_and_names_its_own_files() {
    let (dir, conf) = recording_dir("fork-early");
    let out = check("fork_before_pools", &[("CACHEALLOC_CONF", conf.as_str())]);
    let child = number_after(&stdout(&out), "child ");
    assert!(
        dir.join(format!("trace-{child}.jsonl")).is_file(),
        "the child's trace is named with its pid: {:?}",
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>()
    );
    let stats: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("stats-{child}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(
        stats["devices"][0]["stats"]["num_device_alloc"], 1,
        "{stats}"
    );
    let traces = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("trace-")
        })
        .count();
    assert_eq!(
        traces, 1,
        "the parent allocated nothing and records nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Processes given one statistics file without `%p` each keep their report: the parent holds
/// the file from its first CUDA call, so the child it forks, which uses CUDA, writes beside it.
#[test]
fn a_statistics_file_shared_without_pid_keeps_every_processs_report() {
    let dir = tempfile::tempdir().unwrap();
    let asked = dir.path().join("stats.json");
    let conf = format!("stats:json,stats_file:{}", asked.display());
    let out = check("fork_before_pools", &[("CACHEALLOC_CONF", conf.as_str())]);
    let child = number_after(&stdout(&out), "child ");
    let beside = dir.path().join(format!("stats.{child}.json"));
    let log = stderr(&out);
    assert!(
        log.contains(&format!(
            "another process holds the statistics file {}; this one writes its statistics to {}",
            asked.display(),
            beside.display()
        )),
        "{log}"
    );
    let read = |path: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let (parent, child) = (read(&asked), read(&beside));
    assert_eq!(parent["devices"], serde_json::json!([]), "{parent}");
    assert_eq!(
        child["devices"][0]["stats"]["num_device_alloc"], 1,
        "{child}"
    );
}

/// A forked child that outlives its parent (an orphaned worker) does not keep the parent's trace
/// and statistics files locked: the next run takes those names instead of writing beside them.
#[test]
fn a_child_that_outlives_its_parent_leaves_its_files_free_for_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, stats) = (
        dir.path().join("trace.jsonl"),
        dir.path().join("stats.json"),
    );
    let conf = format!(
        "trace:{},stats:json,stats_file:{}",
        trace.display(),
        stats.display()
    );
    let out = check("fork_outlived", &[("CACHEALLOC_CONF", conf.as_str())]);
    let child = number_after(&stdout(&out), "child ");
    let _end_child = EndProcess(child);
    for path in [&trace, &stats] {
        let file = std::fs::File::open(path).unwrap();
        assert!(
            file.try_lock().is_ok(),
            "{} is still locked after its process ended, while its forked child lives",
            path.display()
        );
    }
}

/// Kills a process when dropped (a test's lingering child, even when the test fails).
struct EndProcess(u64);

impl Drop for EndProcess {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .status();
    }
}

/// A statistics file another running process holds is left to it, its content kept.
#[test]
fn a_held_statistics_file_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let asked = dir.path().join("stats.json");
    let _theirs = held_file(&asked, "theirs\n");
    let conf = format!("stats:json,stats_file:{}", asked.display());
    let out = check("churn", &[("CACHEALLOC_CONF", conf.as_str())]);
    let log = stderr(&out);
    let beside = word_after(&log, "this one writes its statistics to ");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(beside).unwrap()).unwrap();
    assert!(report["devices"][0]["stats"]["num_device_alloc"].as_u64() > Some(0));
    assert_eq!(std::fs::read_to_string(&asked).unwrap(), "theirs\n");
}

/// `stats_file:/dev/stdout` while the program's output goes to a file (a batch job's log,
/// `>> job.log`): the report goes into that log after what was there, through the program's own
/// descriptor, and what the program printed stays whole. Before, `/dev/stdout` was opened anew
/// as the regular file it names: emptied at the first CUDA call, then written from its start,
/// where the program's own output, written at its offset, overwrote part of the report.
#[test]
fn statistics_sent_to_a_redirected_stdout_are_added_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("job.log");
    std::fs::write(&log, "written before the program\n").unwrap();
    let appended = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    let out = preloaded(program())
        .arg("stats")
        .env("CACHEALLOC_CONF", "stats:json,stats_file:/dev/stdout")
        .stdout(appended)
        .output()
        .expect("shim_check runs");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"written before the program"), "{text}");
    assert!(lines.contains(&"ok stats"), "{text}");
    let reports: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(reports.len(), 1, "{text}");
    assert_eq!(
        reports[0]["devices"][0]["stats"]["num_device_alloc"], 2,
        "{text}"
    );
}

/// A program that calls `exit` while another thread is still in its first CUDA call, after that
/// call claimed the statistics file (here beside one another process holds, and then held up in
/// saying so on a full stderr pipe), leaves that file with its report, not empty: the exit
/// handler is registered before the claim, and waits for it. Before, the file was claimed first
/// and the handler not yet registered, and the file stayed empty.
#[test]
fn exit_during_the_first_call_leaves_the_claimed_statistics_file_its_report() {
    let program = threaded_program("exit_first_call", &[]);
    let dir = tempfile::tempdir().unwrap();
    let asked = dir.path().join("stats.txt");
    let _theirs = held_file(&asked, "theirs\n");
    let out = preloaded(&program)
        .arg(dir.path())
        .env(
            "CACHEALLOC_CONF",
            format!("stats:text,stats_file:{}", asked.display()),
        )
        .output()
        .expect("exit_first_call runs");
    assert!(out.status.success(), "{:?}", out.status);
    // The file beside the held one (`stats.PID.txt`): the only other file there.
    let beside: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| *p != asked)
        .collect();
    assert_eq!(beside.len(), 1, "{beside:?}");
    assert_eq!(
        std::fs::read_to_string(&beside[0]).unwrap(),
        "cachealloc: no device memory was allocated through cachealloc\n",
        "{}",
        beside[0].display()
    );
    assert_eq!(std::fs::read_to_string(&asked).unwrap(), "theirs\n");
}

/// The exit report of a process that exits while another thread holds device 1's pool lock for
/// longer than the exit handler waits (a cudaMalloc of the pool's taking thirty seconds), in
/// `format`: (stderr, the seconds it took).
fn exit_with_busy_pool(format: &str) -> (String, f64) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let slow = fake_cudart::compile_c_program(
        &root.join("tests/preload/slow_malloc.c"),
        "libslow_malloc.so",
        &["-shared", "-fPIC", "-ldl"],
    );
    let program = threaded_program("exit_busy_pool", &["-ldl"]);
    let slow_bytes = (256u64 << 20).to_string();
    let start = std::time::Instant::now();
    let out = preloaded(&program)
        .arg(&slow_bytes)
        .env(
            "LD_PRELOAD",
            format!("{} {}", library().display(), slow.display()),
        )
        .env("SLOW_MALLOC_BYTES", &slow_bytes)
        .env("CACHEALLOC_CONF", format!("stats:{format}"))
        .output()
        .expect("exit_busy_pool runs");
    let took = start.elapsed().as_secs_f64();
    assert!(out.status.success(), "{:?}: {}", out.status, stderr(&out));
    (stderr(&out), took)
}

/// A device whose pool lock another thread holds for longer than the exit handler waits is left
/// out of the exit report with a line that says so, not silently.
#[test]
fn a_device_left_out_of_the_exit_report_is_named_with_why() {
    let (text, took) = exit_with_busy_pool("text");
    // About a second; far below the slow cudaMalloc's thirty, which a handler that waited for
    // the lock would take, so that a loaded machine's slow start cannot fail it.
    assert!(took < 15.0, "the exit waited {took:.1} s, not a second");
    assert!(text.contains("device ID 0"), "{text}");
    assert!(
        text.contains(
            "cachealloc: device 1 is left out of this report: another thread held its pool for \
             more than 1 s at exit"
        ),
        "{text}"
    );
    let (json, _) = exit_with_busy_pool("json");
    let report: serde_json::Value = serde_json::from_str(json.trim()).expect(&json);
    assert_eq!(
        report["devices"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert_eq!(report["devices"][0]["device"], 0, "{report}");
    assert_eq!(
        report["skipped"],
        serde_json::json!([{
            "device": 1,
            "reason": "another thread held its pool for more than 1 s at exit"
        }]),
        "{report}"
    );
}

fn preload_source(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/preload/{name}.c"))
}

/// The test program `tests/preload/NAME.c`, built with threads (and the `extra` flags).
fn threaded_program(name: &str, extra: &[&str]) -> PathBuf {
    let flags: Vec<&str> = ["-pthread"].iter().chain(extra).copied().collect();
    fake_cudart::compile_c_program(&preload_source(name), name, &flags)
}

/// The test program `tests/preload/NAME.c`, built with threads and without a runtime (it finds
/// the library's exports with dlsym).
fn threaded_program_without_runtime(name: &str) -> PathBuf {
    fake_cudart::compile_c_without_runtime(&preload_source(name), name, &["-pthread", "-ldl"])
}

/// A child forked while another thread makes the process's first CUDA call (the mode being
/// decided, the panic hook installed) does not hang on the parent's unfinished initialisation.
/// Each run is a fresh process; before the fix about one run in fifty hung.
#[test]
fn a_child_forked_during_the_first_call_does_not_hang() {
    let race = threaded_program("fork_race", &[]);
    let mut hung = 0;
    for _ in 0..300 {
        let out = preloaded(&race)
            .env("CACHEALLOC_CONF", "stats:json,stats_file:/dev/null")
            .output()
            .expect("fork_race runs");
        match out.status.code() {
            Some(0) => {}
            Some(2) => hung += 1,
            _ => panic!("fork_race failed: {out:?}"),
        }
    }
    assert_eq!(hung, 0, "children hung in {hung} of 300 runs");
}

/// A child forked while another thread of a parent with no pool yet held a pool slot's lock
/// (`cudaMemGetInfo` with `count_cached_as_free:True` looks at its device's slot) or the trace
/// file's (every flush of a recording takes it) does not wait for ever on that lock in its first
/// cudaMalloc. Before the fix a child hung within the first hundred forks in most runs, and
/// within a few with `trace:`.
#[test]
fn a_child_forked_while_a_lock_is_held_does_not_hang() {
    let program = threaded_program("fork_locks", &[]);
    let dir = tempfile::tempdir().expect("temporary directory");
    let trace = format!(
        "count_cached_as_free:True,trace:{}",
        dir.path().join("trace-%p.jsonl").display()
    );
    for (conf, forks) in [
        ("count_cached_as_free:True", "2000"),
        (trace.as_str(), "500"),
    ] {
        let out = preloaded(&program)
            .arg(forks)
            .env("CACHEALLOC_CONF", conf)
            .output()
            .expect("fork_locks runs");
        assert!(
            out.status.success(),
            "CACHEALLOC_CONF={conf}: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
}

/// A child forked while another thread of the parent was writing a log line does not wait for
/// ever on the writer's lock when it logs a line itself. Before the fix a child hung within the
/// first few hundred forks in every run.
#[test]
fn a_child_forked_while_a_line_is_logged_does_not_hang() {
    let program = threaded_program("fork_log", &["-ldl"]);
    let out = preloaded(&program)
        .arg("1000")
        .env("CACHEALLOC_LOG", "debug")
        .output()
        .expect("fork_log runs");
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("0x20 was not allocated by cachealloc"),
        "the parent logged its refusals"
    );
}

/// A child forked while another thread of the parent was inside one of the library's own writes
/// to stderr (here the configuration error, to a pipe nobody reads) does not wait for ever when
/// it writes there itself (here the warning that no runtime was found: the program links none).
/// Before every such write went to fd 2 directly, the first child hung on Rust's stderr lock.
#[test]
fn a_child_forked_while_stderr_is_written_does_not_hang() {
    let program = threaded_program_without_runtime("fork_stderr");
    let out = preloaded(&program)
        .arg("3")
        .env("CACHEALLOC_CONF", "stats:bogus")
        .output()
        .expect("fork_stderr runs");
    assert!(out.status.success(), "{:?}: {}", out.status, stdout(&out));
    assert_eq!(stdout(&out).trim(), "forks 3 hung 0");
}

/// A child forked while another thread of the parent was looking the runtime up through the
/// dynamic loader does not crash in its own lookup. The program loads no runtime, so that every
/// call looks it up again; before the fork handler waited for a lookup under way, 4 to 26 of
/// 2,000 children died of SIGSEGV in `_dl_load_cache_lookup` (6 runs of 6).
#[test]
fn a_child_forked_during_a_runtime_lookup_does_not_crash() {
    let program = threaded_program_without_runtime("fork_lookup");
    let out = preloaded(&program)
        .arg("2000")
        .output()
        .expect("fork_lookup runs");
    assert!(out.status.success(), "{:?}: {}", out.status, stdout(&out));
    assert_eq!(stdout(&out).trim(), "forks 2000 crashed 0 hung 0");
}

/// A tuning PyTorch accepts with a number not written plainly keeps the program running: the
/// number is read as PyTorch reads it, and a warning says so.
#[test]
fn a_number_pytorch_reads_loosely_is_read_its_way_with_a_warning() {
    let out = check(
        "churn",
        &[
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128MB"),
            ("SHIM_CHECK_ITERATIONS", "20"),
        ],
    );
    let log = stderr(&out);
    assert!(
        log.contains(
            "PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb:128MB: '128MB' is read as 128, as \
             PyTorch reads it"
        ),
        "{log}"
    );
}

/// `CACHEALLOC_LOG=cachealloc::device=debug` shows the pool's own device calls in order: the
/// segment it obtained, the failed request, the release of the cached segment that let the
/// next request fit, and that request's segment — and the default log shows none of them.
#[test]
fn the_debug_log_shows_the_pools_device_calls() {
    let capacity = ("FAKECUDART_CAPACITY", "64MiB");
    let log = stderr(&check(
        "oom",
        &[capacity, ("CACHEALLOC_LOG", "cachealloc::device=debug")],
    ));
    let expected = [
        "device 0: cudaMalloc 40.00 MiB at 0x",
        "device 0: out of memory: 40.00 MiB requested (rounded), 24.00 MiB free on the device",
        "device 0: cudaFree 40.00 MiB at 0x",
        "device 0: cudaMalloc 50.00 MiB at 0x",
        "device 0: cudaFree 50.00 MiB at 0x",
        "device 0: cudaMalloc 60.00 MiB at 0x",
    ];
    assert_in_order(&log, &expected);
    // The last 40 MiB request is served from the cached 60 MiB segment: no fourth cudaMalloc.
    assert_eq!(log.matches("cudaMalloc ").count(), 3, "{log}");
    // A filter naming only the device lines keeps the default warnings: the OOM report too.
    assert_eq!(log.matches("CUDA out of memory").count(), 1, "{log}");
    assert!(
        !log.contains("DEBUG cachealloc::global"),
        "only device debug lines:\n{log}"
    );

    let quiet = stderr(&check("oom", &[capacity]));
    assert!(!quiet.contains("device 0: cudaMalloc"), "{quiet}");
}

/// The user's path through a fragmentation OOM: the report names a `max_split_size_mb`, and the
/// same program run again with it gets its memory.
#[test]
fn a_fragmentation_oom_names_a_setting_that_avoids_it() {
    let capacity = ("FAKECUDART_CAPACITY", "256MiB");
    let out = check("fragmentation", &[capacity]);
    let log = stderr(&out);
    assert_eq!(number_after(&stdout(&out), "last request:"), 2, "{log}");
    assert!(log.contains("Hint: Fragmentation:"), "{log}");
    let key = "A value to try: max_split_size_mb:";
    let at = log
        .find(key)
        .unwrap_or_else(|| panic!("no suggestion in:\n{log}"))
        + key.len();
    let mb: String = log[at..].chars().take_while(char::is_ascii_digit).collect();
    assert_eq!(
        mb, "32",
        "the largest standard value within the 40 MiB free pieces"
    );
    let conf = format!("max_split_size_mb:{mb}");
    let again = check("fragmentation", &[capacity, ("CACHEALLOC_CONF", &conf)]);
    assert_eq!(number_after(&stdout(&again), "last request:"), 0, "{conf}");
    assert!(
        !stderr(&again).contains("out of memory"),
        "{}",
        stderr(&again)
    );
    // Not recorded: the report says how to record the run, with its settings, to replay it.
    assert!(
        log.contains("run it again with CACHEALLOC_CONF=trace:/tmp/cachealloc-%p.jsonl "),
        "{log}"
    );
    assert!(
        log.contains(
            "and replay the file with `cachealloc replay /tmp/cachealloc-PID.jsonl --device 0 \
             --faithful`."
        ),
        "the command names a file, not the pattern: {log}"
    );
    // A trace file that could not be created: the suggested setting records to the default
    // path in its place, not to both.
    let unwritable = check(
        "fragmentation",
        &[
            capacity,
            (
                "CACHEALLOC_CONF",
                "trace:/nonexistent-cachealloc-dir/run.jsonl",
            ),
        ],
    );
    let log = stderr(&unwritable);
    assert!(
        log.contains("run it again with CACHEALLOC_CONF=trace:/tmp/cachealloc-%p.jsonl "),
        "{log}"
    );
    let tuned = check(
        "fragmentation",
        &[
            capacity,
            ("PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:4"),
        ],
    );
    let log = stderr(&tuned);
    assert!(
        log.contains("CACHEALLOC_CONF=roundup_power2_divisions:4,trace:/tmp/cachealloc-%p.jsonl"),
        "the settings in force carry over:\n{log}"
    );
    // A list value's '[', ']' and '>' would be a glob and a redirection in a shell: the
    // assignment the report prints, pasted into one, sets exactly the settings.
    let listed = check(
        "fragmentation",
        &[
            capacity,
            (
                "PYTORCH_CUDA_ALLOC_CONF",
                "roundup_power2_divisions:[256:1,>:4]",
            ),
        ],
    );
    let log = stderr(&listed);
    let start = log
        .find("CACHEALLOC_CONF=")
        .unwrap_or_else(|| panic!("no command in:\n{log}"));
    let assignment = &log[start..start + log[start..].find(" (%p").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let shell = std::process::Command::new("sh")
        .current_dir(dir.path())
        .arg("-c")
        .arg(format!("{assignment}; printf %s \"$CACHEALLOC_CONF\""))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&shell.stdout),
        "roundup_power2_divisions:[256:1,>:4],trace:/tmp/cachealloc-%p.jsonl",
        "{assignment}"
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "the shell created no file"
    );
}

/// A run whose trace path another process holds records beside it, and its OOM report's
/// replay command names the file it wrote.
#[test]
fn a_recorded_oom_names_the_file_written_beside_a_held_one() {
    let dir = tempfile::tempdir().unwrap();
    let asked = dir.path().join("run.jsonl");
    let _theirs = held_file(&asked, "");
    let conf = format!("trace:{}", asked.display());
    let out = check(
        "fragmentation",
        &[
            ("FAKECUDART_CAPACITY", "256MiB"),
            ("CACHEALLOC_CONF", &conf),
        ],
    );
    let log = stderr(&out);
    let beside = word_after(&log, "this one records to ");
    assert_ne!(beside, asked.to_str().unwrap());
    assert!(
        log.contains(&format!("This run is recorded to {beside}: ")),
        "{log}"
    );
    assert!(std::fs::metadata(beside).unwrap().len() > 0);
    assert_eq!(std::fs::metadata(&asked).unwrap().len(), 0, "left alone");
}

/// A recorded run's OOM report names the replay command, and that command, run after the
/// program has ended, lists the values that avoid the OOM — the report's among them.
#[test]
fn a_recorded_oom_names_the_replay_that_finds_the_settings_that_fit() {
    let dir = tempfile::tempdir().unwrap();
    let conf = format!("trace:{}/run-%p.jsonl", dir.path().display());
    let out = check(
        "fragmentation",
        &[
            ("FAKECUDART_CAPACITY", "256MiB"),
            ("CACHEALLOC_CONF", &conf),
        ],
    );
    let log = stderr(&out);
    let start = log
        .find("`cachealloc replay ")
        .unwrap_or_else(|| panic!("no replay command in:\n{log}"))
        + 1;
    let command = &log[start..start + log[start..].find('`').unwrap()];
    assert!(
        log.contains(
            "under which the whole run has no out-of-memory error (else the one that gets \
             furthest past this one), and whether expandable segments avoid them."
        ),
        "the replay also tries the other kind of segment: {log}"
    );
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    assert!(
        args[0] == "replay"
            && args[1].starts_with(&dir.path().display().to_string())
            && args.contains(&"--faithful"),
        "{command}"
    );
    let replayed = std::process::Command::new(env!("CARGO_BIN_EXE_cachealloc"))
        .args(&args)
        .arg("--json")
        .output()
        .expect("cachealloc runs");
    let v: serde_json::Value = serde_json::from_slice(&replayed.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&replayed.stderr)));
    assert_eq!(v["num_ooms"], 1, "the replay meets the recorded OOM");
    assert_eq!(v["report_suggestion"]["conf"], "max_split_size_mb:32");
    assert_eq!(v["report_suggestion"]["fits"], true);
}

#[test]
fn foreign_pointers_and_null_are_forwarded_untouched() {
    check("foreign", &[]);
}

#[test]
fn double_free_and_interior_pointers_answer_1_with_the_pool_intact() {
    let out = check("double_free", &[]);
    let log = stderr(&out);
    assert!(log.contains("double free"), "{log}");
    // The warning names the allocation an interior pointer lies in.
    assert!(
        log.lines()
            .any(|line| line.contains("cudaFree: invalid device pointer 0x")
                && line.contains(": 512 bytes inside the live allocation at 0x")
                && line.ends_with(
                    " of 4096 bytes (an interior pointer: free the pointer the allocation returned)"
                )),
        "{log}"
    );
}

#[test]
fn an_ipc_handle_is_refused_for_a_pointer_inside_a_shared_segment() {
    let out = check("ipc", &[]);
    let log = stderr(&out);
    assert!(
        log.contains("cudaIpcGetMemHandle")
            && log.contains("into a 2.00 MiB segment that cachealloc shares")
            && log.contains("opens at its start"),
        "{log}"
    );
}

#[test]
fn device_reset_drops_the_pool() {
    check("reset", &[]);
}

#[test]
fn a_failed_device_reset_leaves_the_allocations_intact() {
    let out = check("reset_fails", &[]);
    assert!(
        stderr(&out).contains("cudaDeviceReset failed with CUDA error 999"),
        "{}",
        stderr(&out)
    );
}

/// The exit statistics cover the whole run, the pool a `cudaDeviceReset()` ended too (CUDA
/// programs often end with one): its allocations and segment counted, what was live then freed
/// by the reset.
#[test]
fn the_exit_statistics_span_a_device_reset() {
    let (stats, text) = device_0_exit_stats("reset");
    // 1 MiB, again from the cache (live at the reset), then 1 MiB in a new segment.
    assert_eq!(stats["allocation.all.allocated"], 3, "{text}");
    assert_eq!(stats["allocation.all.freed"], 3, "{text}");
    assert_eq!(stats["allocation.all.current"], 0, "{text}");
    assert_eq!(stats["num_device_alloc"], 2, "{text}");
    assert_eq!(stats["reserved_bytes.all.current"], 2 << 20, "{text}");
    assert_eq!(stats["reserved_bytes.all.peak"], 2 << 20, "{text}");
    assert_eq!(stats["reserved_bytes.all.freed"], 2 << 20, "{text}");
    assert_eq!(stats["num_device_free"], 0, "{text}");
}

/// Each reset's pool is in them, not only the last one's: three pools of one 1 MiB allocation
/// and one 2 MiB segment each.
#[test]
fn the_exit_statistics_span_every_device_reset() {
    let (stats, text) = device_0_exit_stats("reset_twice");
    assert_eq!(stats["allocation.all.allocated"], 3, "{text}");
    assert_eq!(stats["allocation.all.freed"], 3, "{text}");
    assert_eq!(stats["num_device_alloc"], 3, "{text}");
    assert_eq!(
        stats["reserved_bytes.all.allocated"],
        3 * (2 << 20),
        "{text}"
    );
    assert_eq!(stats["reserved_bytes.all.current"], 2 << 20, "{text}");
}

#[test]
fn a_reset_forgets_the_streams_recorded_for_its_pools_allocations() {
    check("reset_forgets_records", &[]);
}

/// `cachealloc_reset_peak_stats` after a reset leaves out the ended pool's peaks too: from the
/// call on, the peaks are the pool's now (30 MiB reserved before the reset, 2 MiB after).
#[test]
fn a_peak_reset_after_a_device_reset_forgets_the_ended_pools_peaks() {
    let (stats, text) = device_0_exit_stats("reset_peak_after_reset");
    assert_eq!(stats["reserved_bytes.all.peak"], 2 << 20, "{text}");
    assert_eq!(stats["allocated_bytes.all.peak"], 1 << 20, "{text}");
    assert_eq!(stats["segment.large_pool.peak"], 0, "{text}");
    // Totals still span the reset.
    assert_eq!(stats["reserved_bytes.all.allocated"], 32 << 20, "{text}");
    assert_eq!(stats["num_device_alloc"], 2, "{text}");
}

/// `cachealloc_reset_accumulated_stats` after a reset leaves out the ended pool's totals and
/// counts, its live 30 MiB freed by the reset included: from the call on they are the pool's
/// now (one 1 MiB allocation freed, from the cache); the peaks still span the reset.
#[test]
fn a_totals_reset_after_a_device_reset_forgets_the_ended_pools_totals() {
    let (stats, text) = device_0_exit_stats("reset_totals_after_reset");
    assert_eq!(stats["allocation.all.allocated"], 1, "{text}");
    assert_eq!(stats["allocation.all.freed"], 2, "{text}");
    assert_eq!(stats["allocated_bytes.all.freed"], 2 << 20, "{text}");
    assert_eq!(stats["reserved_bytes.all.allocated"], 0, "{text}");
    assert_eq!(stats["reserved_bytes.all.freed"], 0, "{text}");
    assert_eq!(stats["num_device_alloc"], 0, "{text}");
    assert_eq!(stats["reserved_bytes.all.current"], 2 << 20, "{text}");
    assert_eq!(stats["reserved_bytes.all.peak"], 30 << 20, "{text}");
}

#[test]
fn a_pointer_is_freed_to_its_owner_device() {
    check("cross_device", &[]);
}

/// (reused, busy, device_syncs) of a reuse scenario.
fn reuse(scenario: &str, free_sync: &str) -> (u64, u64, u64) {
    let conf = format!("free_sync:{free_sync}");
    let out = check(scenario, &[("CACHEALLOC_CONF", &conf)]);
    let text = stdout(&out);
    (
        number_after(&text, "reused"),
        number_after(&text, "busy"),
        number_after(&text, "device_syncs"),
    )
}

#[test]
fn free_sync_device_never_hands_out_a_block_with_work_in_flight() {
    // Work on a non-blocking stream: the pool synchronizes the device before reusing the block.
    assert_eq!(reuse("reuse_nonblocking", "device"), (1, 0, 1));
    // The program's own cudaDeviceSynchronize makes the block ready: no extra sync by the pool.
    assert_eq!(reuse("reuse_after_program_sync", "device"), (1, 0, 1));
    // One that failed waited for nothing: the pool still synchronizes before reusing the block.
    assert_eq!(reuse("reuse_after_failed_sync", "device"), (1, 0, 2));
    // Nor does a synchronization of another device.
    assert_eq!(reuse("reuse_after_other_device_sync", "device"), (1, 0, 2));
    // It is also the default policy.
    let out = check("reuse_nonblocking", &[]);
    assert!(stdout(&out).contains("reused 1 busy 0"), "{}", stdout(&out));
}

#[test]
fn free_sync_event_reuses_after_the_event_without_a_device_sync() {
    // Work still running on the legacy stream: the event is not done, the pool synchronizes.
    assert_eq!(reuse("reuse_legacy", "event"), (1, 0, 1));
    // Work finished: the event is done and the block is reused without any synchronization.
    assert_eq!(reuse("reuse_legacy_done", "event"), (1, 0, 0));
}

#[test]
fn free_sync_none_reuses_at_once_even_while_work_runs() {
    // What `none` allows (PyTorch's single-stream semantics): the block comes back while work
    // issued before its free still runs on another stream.
    assert_eq!(reuse("reuse_nonblocking", "none"), (1, 1, 0));
}

#[test]
fn runtime_errors_pass_through_unchanged() {
    check("runtime_error", &[("FAKECUDART_FAIL", "35")]);
}

#[test]
fn a_cuda_malloc_error_other_than_out_of_memory_reaches_the_program_unchanged() {
    check("malloc_error", &[]);
}

#[test]
fn free_sync_event_reuses_its_events() {
    let out = check("event_reuse", &[("CACHEALLOC_CONF", "free_sync:event")]);
    let created = number_after(&stdout(&out), "events created");
    assert!(
        created <= 2,
        "100 frees, each waited for by a device synchronization, created {created} events"
    );
}

#[test]
fn a_configuration_error_is_reported_once_and_allocations_fail_with_3() {
    let out = check(
        "config_error",
        &[("CACHEALLOC_CONF", "max_split_size_mb:5")],
    );
    let log = stderr(&out);
    assert_eq!(
        log.matches("cachealloc: configuration error").count(),
        1,
        "{log}"
    );
    assert!(log.contains("max_split_size_mb"), "names the key: {log}");
    assert_eq!(log.lines().count(), 1, "one message: {log}");
}

/// A log filter that cannot be read changes no allocation: a warning, and the pool serves.
#[test]
fn a_bad_log_filter_is_a_warning_and_the_pool_serves() {
    let out = check("churn", &[("CACHEALLOC_LOG", "verbose")]);
    let log = stderr(&out);
    assert!(
        log.contains("CACHEALLOC_LOG=verbose: 'verbose' is neither a level")
            && log.contains("logging stays at the default, warn"),
        "{log}"
    );
    assert_eq!(log.lines().count(), 1, "one message: {log}");
}

/// A PyTorch tuning that `CACHEALLOC_CONF` shadows is named in a warning when the pool starts.
#[test]
fn a_shadowed_pytorch_tuning_is_warned_about() {
    let out = check(
        "churn",
        &[
            ("CACHEALLOC_CONF", "free_sync:none"),
            ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128"),
        ],
    );
    let log = stderr(&out);
    assert!(
        log.contains(
            "CACHEALLOC_CONF is set, so PYTORCH_CUDA_ALLOC_CONF is not read: its \
             max_split_size_mb:128 is not in force"
        ),
        "{log}"
    );
    assert_eq!(log.lines().count(), 1, "one message: {log}");
}

#[test]
fn a_process_that_never_calls_cuda_is_untouched() {
    // A broken configuration must not matter to a program that never calls CUDA.
    let mut cmd = preloaded(Path::new("/bin/echo"));
    cmd.arg("hello").env("CACHEALLOC_CONF", "no_such_key:1");
    let out = run_ok(&mut cmd);
    assert_eq!(stdout(&out), "hello\n");
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}

fn stats_file_run(format: &str) -> (String, String) {
    stats_file_run_of("stats", format)
}

/// (the statistics file, stderr) of `scenario` run with `stats:FORMAT` to a file.
/// Device 0's statistics in the JSON exit report of `scenario`, and the report's text.
fn device_0_exit_stats(scenario: &str) -> (serde_json::Value, String) {
    let (text, _) = stats_file_run_of(scenario, "json");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    (doc["devices"][0]["stats"].clone(), text)
}

fn stats_file_run_of(scenario: &str, format: &str) -> (String, String) {
    let dir = tempfile::Builder::new()
        .prefix("cachealloc-stats-")
        .tempdir()
        .unwrap();
    let dir = dir.path();
    let template = dir.join(format!("stats-{scenario}-{format}-%p.out"));
    let conf = format!("stats:{format},stats_file:{}", template.display());
    let out = check(scenario, &[("CACHEALLOC_CONF", &conf)]);
    let pid = number_after(&stdout(&out), "pid");
    let path = dir.join(format!("stats-{scenario}-{format}-{pid}.out"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} not written: {e}", path.display()));
    (text, stderr(&out))
}

#[test]
fn stats_text_at_exit_go_to_the_file_named_with_the_pid() {
    let (text, log) = stats_file_run("text");
    assert!(text.contains("cachealloc memory summary"), "{text}");
    assert!(text.contains("Allocated memory"), "{text}");
    assert!(
        text.contains("3072 KiB") || text.contains("3 MiB"),
        "{text}"
    );
    assert!(log.is_empty(), "{log}");
}

#[test]
fn stats_json_at_exit_hold_pytorch_keys_per_device() {
    let (text, _) = stats_file_run("json");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let devices = doc["devices"].as_array().expect("devices array");
    assert_eq!(devices.len(), 1, "{text}");
    let stats = &devices[0]["stats"];
    assert_eq!(devices[0]["device"], 0);
    assert_eq!(stats["allocated_bytes.all.current"], 3 << 20);
    assert_eq!(stats["allocation.all.current"], 1);
    assert_eq!(
        stats["num_device_alloc"], 2,
        "one large and one small segment"
    );
}

/// A `stats_file` that cannot be written loses nothing: the report goes to stderr, after a
/// line that says why; the first call already says the file cannot be opened.
#[test]
fn stats_for_a_file_that_cannot_be_written_go_to_stderr() {
    let conf = "stats:text,stats_file:/nonexistent-dir/stats-%p.txt";
    let out = check("stats", &[("CACHEALLOC_CONF", conf)]);
    let log = stderr(&out);
    assert!(
        log.contains("cannot write statistics to /nonexistent-dir/stats-"),
        "{log}"
    );
    // Said at the first call too, before the report written at exit.
    let early = log
        .find("cannot open the statistics file /nonexistent-dir/stats-")
        .expect(&log);
    assert!(
        log[early..].contains("No such file or directory")
            && early < log.find("cachealloc memory summary").expect(&log),
        "{log}"
    );
}

#[test]
fn stats_text_at_exit_go_to_stderr_by_default() {
    let out = check("stats", &[("CACHEALLOC_CONF", "stats:text")]);
    assert!(
        stderr(&out).contains("cachealloc memory summary"),
        "{}",
        stderr(&out)
    );
    // The 1000-byte block freed last, with no synchronization after it, is active, not leaked.
    assert!(
        stderr(&out).contains(
            "Frees still waiting at exit for the work that may use their blocks hold 1024 bytes of \
             the active memory"
        ),
        "{}",
        stderr(&out)
    );
}

/// Frees the program synchronized are complete at exit: no pending line under the summary.
#[test]
fn synchronized_frees_leave_no_pending_line_at_exit() {
    let out = check("sync_then_exit", &[("CACHEALLOC_CONF", "stats:text")]);
    let err = stderr(&out);
    assert!(err.contains("cachealloc memory summary"), "{err}");
    assert!(!err.contains("Frees still waiting at exit"), "{err}");
}

#[test]
fn a_linked_runtime_is_found_through_rtld_next() {
    let out = check(
        "churn",
        &[
            ("SHIM_CHECK_ITERATIONS", "200"),
            ("CACHEALLOC_LOG", "cachealloc=debug"),
        ],
    );
    assert!(
        stderr(&out).contains("found the CUDA runtime through dlsym(RTLD_NEXT)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn mem_get_info_can_count_cached_blocks_as_free() {
    let plain = stdout(&check("mem_info", &[]));
    let counted = stdout(&check(
        "mem_info",
        &[("CACHEALLOC_CONF", "count_cached_as_free:True")],
    ));
    let (free_plain, free_counted) = (number_after(&plain, "free"), number_after(&counted, "free"));
    assert_eq!(
        number_after(&plain, "total"),
        number_after(&counted, "total")
    );
    assert_eq!(
        free_counted,
        free_plain + (20 << 20),
        "the cached 20 MiB segment counts as free"
    );
    // Without the program's synchronization: a block whose free is pending does not count
    // (free_sync:device waits for a synchronization), one whose fence has completed does
    // (free_sync:event, no work on the block).
    let free_of = |conf: &str| {
        number_after(
            &stdout(&check("mem_info_unsynced", &[("CACHEALLOC_CONF", conf)])),
            "free",
        )
    };
    assert_eq!(free_of("count_cached_as_free:True"), free_plain);
    assert_eq!(
        free_of("count_cached_as_free:True,free_sync:event"),
        free_plain + (20 << 20)
    );
}

#[test]
fn threads_allocate_concurrently_without_sharing_memory() {
    check("threads", &[]);
}
