//! NVIDIA's real CUDA runtime (`libcudart.so.12` from PyPI's `nvidia-cuda-runtime-cu12`), for the
//! tests that prove symbol interposition and error pass-through against the real versioned
//! library rather than our fake.
//!
//! Where it is looked for, first hit wins:
//! 1. `$CACHEALLOC_REAL_CUDART`: the path of the `.so` itself;
//! 2. `<crate root>/.venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12`,
//!    where `scripts/setup-test-deps.sh` installs it.
//!
//! When it is absent a test prints a "skipping" line and returns, except under CI (`$CI` set and
//! not `false`/`0`), where a missing runtime means the setup step did not run: a failure.
//!
//! The wheel ships no unversioned `libcudart.so` link, so programs link `-l:libcudart.so.12`.

use super::ci::running_under_ci;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// The variable that names the real runtime's `.so` explicitly.
pub const PATH_VARIABLE: &str = "CACHEALLOC_REAL_CUDART";

/// Where the wheel puts the library, below a `site-packages` directory.
const WHEEL_LIBRARY: &str = "nvidia/cuda_runtime/lib/libcudart.so.12";

/// The real runtime if installed; else `None` after a "skipping" note, or a panic under CI.
pub fn real_cudart_or_skip() -> Option<PathBuf> {
    match find_real_cudart() {
        Ok(path) => Some(path),
        Err(why) if running_under_ci() => {
            panic!("the real NVIDIA runtime is required under CI: {why}")
        }
        Err(why) => {
            eprintln!(
                "skipping: real NVIDIA runtime not installed — run scripts/setup-test-deps.sh ({why})"
            );
            None
        }
    }
}

/// The real `libcudart.so.12`, or why it was not found.
pub fn find_real_cudart() -> Result<PathBuf, String> {
    if let Some(explicit) = std::env::var_os(PATH_VARIABLE).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(explicit);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("{PATH_VARIABLE}={} is not a file", path.display()))
        };
    }
    let venv_lib = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".venv")
        .join("lib");
    let pythons = std::fs::read_dir(&venv_lib).map_err(|e| {
        format!(
            "{PATH_VARIABLE} unset and {} unreadable: {e}",
            venv_lib.display()
        )
    })?;
    let mut candidates: Vec<PathBuf> = pythons
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("python3"))
        .map(|entry| entry.path().join("site-packages").join(WHEEL_LIBRARY))
        .filter(|lib| lib.is_file())
        .collect();
    candidates.sort();
    candidates.pop().ok_or_else(|| {
        format!(
            "{PATH_VARIABLE} unset and no {} under {}",
            WHEEL_LIBRARY,
            venv_lib.display()
        )
    })
}

/// Compiles the C program `source` against the real runtime at `library` (linked
/// `-l:libcudart.so.12`, with an rpath to its directory so it runs without `LD_LIBRARY_PATH`)
/// into `target/real-cudart/<name>` and returns its path. Panics with the compiler's output.
pub fn compile_c_program(library: &Path, source: &Path, name: &str) -> PathBuf {
    let lib_dir = library
        .parent()
        .unwrap_or_else(|| panic!("{} has no directory", library.display()));
    let out_dir = super::fake_cudart::build_root()
        .with_file_name("real-cudart")
        .join("programs");
    std::fs::create_dir_all(&out_dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", out_dir.display()));
    let out = out_dir.join(name);
    // Compiled privately, then renamed into place (atomic), so concurrent tests never see a
    // half-written program.
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let tmp = out_dir.join(format!(
        ".{name}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let compiler = std::env::var_os("CC")
        .filter(|cc| !cc.is_empty())
        .unwrap_or_else(|| "gcc".into());
    let output = Command::new(&compiler)
        .args(["-std=gnu11", "-g", "-Wall", "-Wextra", "-o"])
        .arg(&tmp)
        .arg(source)
        .arg("-ldl")
        .arg("-L")
        .arg(lib_dir)
        .arg("-l:libcudart.so.12")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler:?} (is a C compiler installed?): {e}"));
    assert!(
        output.status.success(),
        "compiling {} against {} failed:\n{}",
        source.display(),
        library.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(&tmp, &out)
        .unwrap_or_else(|e| panic!("cannot move {} to {}: {e}", tmp.display(), out.display()));
    out
}
