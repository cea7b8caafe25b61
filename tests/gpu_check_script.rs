//! `scripts/gpu-check.sh --dry-run`: without a GPU every helper is still built and run against
//! the fake runtime, and the table it prints is honest — no row claims a GPU figure, every row
//! is a figure measured on the fake runtime or says why it was not run.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the dry run may take, in seconds (it takes a few on this machine).
const WALL_LIMIT_S: u64 = 45;
/// What every row's last column must say without a GPU.
const FAKE_LABEL: &str = "fake runtime (not a GPU measurement)";

fn available(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs the dry run with a time budget of `budget_s` and returns (success, stdout, stderr),
/// killing it past the limit.
fn dry_run(budget_s: u64) -> (bool, String, String) {
    // One at a time: both write the script's work folder (target/gpu-check).
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shim = support::shim::library();
    let mut child = Command::new("bash")
        .arg(root.join("scripts").join("gpu-check.sh"))
        .arg("--dry-run")
        .arg("--lib")
        .arg(&shim)
        .current_dir(root)
        .env("CACHEALLOC_CLI", env!("CARGO_BIN_EXE_cachealloc"))
        .env("GPU_CHECK_BUDGET", budget_s.to_string())
        .env_remove("LD_PRELOAD")
        .env_remove("CACHEALLOC_CONF")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run bash");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for gpu-check.sh") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(WALL_LIMIT_S) {
            let _ = child.kill();
            panic!("gpu-check.sh --dry-run ran past {WALL_LIMIT_S}s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child
        .wait_with_output()
        .expect("reading gpu-check.sh output");
    (
        status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The table's rows, split into their four columns; each check (a)–(m) has at least one.
fn every_row(stdout: &str) -> Vec<Vec<&str>> {
    let table: Vec<&str> = stdout.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(
        table.first().copied(),
        Some("| check | variant | result | measured on |"),
        "{stdout}"
    );
    let rows: Vec<Vec<&str>> = table[2..]
        .iter()
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    for check in [
        "(a)", "(b)", "(c)", "(d)", "(e)", "(f)", "(g)", "(h)", "(i)", "(j)", "(k)", "(l)", "(m)",
    ] {
        assert!(
            rows.iter().any(|r| r[0].starts_with(check)),
            "no {check} row:\n{stdout}"
        );
    }
    rows
}

/// Each tool the dry run's helpers need, or a note that the test is skipped.
fn tools_available() -> bool {
    for tool in ["python3", "gcc", "g++"] {
        if !available(tool) {
            eprintln!("skipping: {tool} not found (scripts/setup-test-deps.sh installs it)");
            return false;
        }
    }
    true
}

#[test]
fn a_spent_time_budget_leaves_every_row_not_run_and_none_failed() {
    if !tools_available() {
        return;
    }
    // Below the five seconds the script keeps in hand after each helper: none runs.
    let (ok, stdout, stderr) = dry_run(1);
    assert!(ok, "gpu-check.sh --dry-run failed:\n{stdout}\n{stderr}");
    for row in every_row(&stdout) {
        assert!(row[2].starts_with("not run: "), "{row:?}");
    }
}

#[test]
fn dry_run_prints_one_honest_table() {
    if !tools_available() {
        return;
    }
    let (ok, stdout, stderr) = dry_run(WALL_LIMIT_S - 5);
    assert!(ok, "gpu-check.sh --dry-run failed:\n{stdout}\n{stderr}");
    let rows = every_row(&stdout);
    for row in &rows {
        assert_eq!(row.len(), 4, "malformed row {row:?}");
        assert_eq!(row[3], FAKE_LABEL, "a row claims a GPU figure: {row:?}");
        let result = row[2];
        assert!(
            result.starts_with("not run: ") || result.chars().any(|c| c.is_ascii_digit()),
            "a row is neither a figure nor a reason: {row:?}"
        );
        assert!(!result.contains("FAILED"), "{row:?}\n{stderr}");
    }
    // The plumbing that needs no shim ran: the fake runtime, the C loop, the Python loop.
    let figure = |check: &str, variant: &str, unit: &str| {
        rows.iter()
            .any(|r| r[0].starts_with(check) && r[1].starts_with(variant) && r[2].contains(unit))
    };
    assert!(
        figure("(a) cudaMalloc+cudaFree 1 MiB", "no shim", "µs per pair"),
        "{stdout}"
    );
    assert!(
        figure(
            "(g)",
            "device 1's block copied to and from the host with device 0 current, fixed",
            "to host: 0 (first byte 0x33"
        ),
        "{stdout}"
    );
    // The fake opens expandable pages to their own device only, and fails the copy as a
    // device without access to them would.
    assert!(
        figure(
            "(g)",
            "device 1's block copied to and from the host with device 0 current, expandable",
            "to host: 700"
        ),
        "{stdout}"
    );
    assert!(
        figure(
            "(b)",
            "PYTORCH_NO_CUDA_MEMORY_CACHING=1, no shim",
            "ms (median)"
        ),
        "{stdout}"
    );
    // The recording names the device's memory; the capacity the replay infers leaves out the
    // fake context's 300 MiB. Every allocation lands at its recorded address.
    assert!(
        figure(
            "(h)",
            "the run of (e)",
            "device memory 1024.0 MiB, capacity 724.0 MiB"
        ),
        "{stdout}"
    );
    // A quarter of the fake's 1 GiB: four chunks of 64 MiB, the fifth refused.
    assert!(
        figure(
            "(i)",
            "cachealloc_set_memory_fraction(0, 0.25)",
            "after 4 × 64.0 MiB, within the limit of 256.0 MiB"
        ),
        "{stdout}"
    );
    // The hooks called as PyTorch calls them: the fraction stops the fifth 64 MiB tensor with
    // cachealloc's report, and the empty-cache hook gives the four back (the fake's free memory
    // counts what is allocated).
    assert!(
        figure(
            "(j)",
            "pluggable allocator with its hooks: fraction 0.25",
            "refused after 4 × 64.0 MiB: 256.0 MiB, 0.250 of 1024.0 MiB (limit 256.0 MiB), \
             \"CUDA out of memory.\"; empty_cache: free 768.0 → 1024.0 MiB (+256.0 MiB)"
        ),
        "{stdout}"
    );
    // The fake's reset leaves the driver's pages alone, as the real one: the free memory is
    // back only because cachealloc released them before it.
    assert!(
        figure(
            "(k)",
            "8 × 64.0 MiB written",
            "free 1024.0 MiB at the start, 1024.0 MiB after the reset;"
        ) && figure(
            "(k)",
            "8 × 64.0 MiB written",
            "no cudaMalloc; allocated and written again: ok"
        ),
        "{stdout}"
    );
    // The fake runtime ends a capture as the real one does: with the shim, the capture-time
    // cudaMalloc calls, the second after a free made during the capture, must not have ended it.
    assert!(
        figure(
            "(l)",
            "64.0 MiB freed",
            "without the shim and with it: cudaStreamBeginCapture 0, cudaMalloc 0 (with the shim \
             twice), cudaStreamEndCapture 0 with a graph: ok"
        ) && figure("(l)", "torch.cuda.graph", "not run: needs torch on a GPU"),
        "{stdout}"
    );
    // The shim takes back its own memory freed with cudaFreeAsync: the block beside it, in the
    // same segment, still holds its bytes; on a capturing stream the free is refused.
    assert!(
        figure(
            "(m)",
            "two 1.0 MiB blocks",
            "with the shim: free_rc=0 sync_rc=0 read_rc=0 intact=1 capture_free_rc=1 end_rc=0 \
             graph=1 after_rc=0: ok; the runtime alone: free_rc=0"
        ),
        "{stdout}"
    );
    let replayed = rows
        .iter()
        .find(|r| r[0].starts_with("(h)"))
        .map(|r| r[2])
        .unwrap_or_default();
    let counts: Vec<u64> = replayed
        .split(" allocations at their recorded address")
        .next()
        .unwrap_or_default()
        .split(" of ")
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    assert!(
        counts.len() == 2 && counts[0] == counts[1] && counts[0] > 0,
        "{replayed}"
    );
}
