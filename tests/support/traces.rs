//! Where the real recorded traces are: `$CACHEALLOC_TRACES`, else `<crate root>/../shared/
//! traces/real` (CI has that folder). Shared by the tests and the benchmark.
//!
//! A test that needs a trace it cannot find says so and returns, except under CI, where the
//! traces are always beside the checkout: there a missing trace fails the test, so that a moved
//! folder cannot turn the parity tests into silent passes.

use super::ci::running_under_ci;
use std::path::{Path, PathBuf};

/// Skip with `why`, or fail under CI.
fn skip(why: String) {
    if running_under_ci() {
        panic!("the real traces are required under CI: {why}");
    }
    eprintln!("skipping: {why}");
}

/// The traces folder, if it exists (silent).
pub fn traces_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("CACHEALLOC_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/real"));
    dir.is_dir().then_some(dir)
}

/// The traces folder, or `None` after saying clearly that the caller skips (a failure under CI).
pub fn traces_dir_or_skip() -> Option<PathBuf> {
    let dir = traces_dir();
    if dir.is_none() {
        skip("traces not found (set CACHEALLOC_TRACES or place ../shared/traces/real)".into());
    }
    dir
}

/// One trace file by its path inside the folder, or `None` after saying the caller skips (a
/// failure under CI).
pub fn trace(rel: &str) -> Option<PathBuf> {
    let path = traces_dir().map(|d| d.join(rel)).filter(|p| p.is_file());
    if path.is_none() {
        skip(format!("trace {rel} not found (set CACHEALLOC_TRACES)"));
    }
    path
}

/// Every file under `dir` that may be a snapshot pickle (by extension), sorted.
pub fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("readable traces folder") {
            let path = entry.expect("readable entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path
                .extension()
                .is_some_and(|e| e == "pickle" || e == "pkl" || e == "json")
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}
