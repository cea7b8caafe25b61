//! The fake CUDA runtime for tests: builds `tests/fake-cudart` (C sources, a version script) with
//! the system C compiler into `target/fake-cudart/<hash>/libcudart.so.12` (plus a `libcudart.so`
//! link for `-lcudart`) and the fake driver `libcuda.so.1` next to it, and compiles C test
//! programs against them.
//!
//! The driver's code is part of `libcudart.so.12` (sharing its state); `libcuda.so.1`, from
//! `tests/fake-cudart/driver`, only forwards its `cu*` functions there. The runtime loads it at its
//! first call with `dlopen("libcuda.so.1")`, found through the runtime's RUNPATH `$ORIGIN`.
//!
//! The build happens at most once per content: the directory name is a hash of the sources, the
//! compiler and the flags, so an edited source gets a fresh build and an unchanged one is reused
//! across test binaries and runs. Concurrent builders (threads or test processes) each compile
//! into a private temporary directory and `rename` it into place; the rename of a directory onto
//! an existing non-empty one fails, so exactly one wins and the others discard their copy.
//!
//! Use from an integration test:
//! ```ignore
//! mod support;
//! let fake = support::fake_cudart::fake_cudart();
//! let prog = support::fake_cudart::compile_c_program(&src, "my_check", &[]);
//! let out = support::fake_cudart::command(&prog).env("FAKECUDART_CAPACITY", "1GiB").output();
//! ```
//! The C compiler is `$CC` when set, else `gcc`.

use std::ffi::OsString;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// File name of the fake runtime, its SONAME.
pub const SONAME: &str = "libcudart.so.12";

/// File name of the fake driver, its SONAME.
pub const DRIVER_SONAME: &str = "libcuda.so.1";

/// Flags of both shared libraries (the runtime's and the driver's).
const SHARED_FLAGS: &[&str] = &[
    "-shared",
    "-fPIC",
    "-O2",
    "-g",
    "-std=c11",
    "-D_GNU_SOURCE",
    "-Wall",
    "-Wextra",
    "-Wl,--enable-new-dtags",
    "-Wl,-rpath,$ORIGIN",
];

/// The runtime's own flags, besides sources and output. `-Bsymbolic` like the real runtime
/// (which carries `DT_SYMBOLIC`); every export gets the default version `libcudart.so.12` from
/// the version script. RUNPATH `$ORIGIN` (`SHARED_FLAGS`; a literal `$ORIGIN`: no shell runs the
/// compiler) lets its `dlopen("libcuda.so.1")` find the fake driver built beside it.
const LIBRARY_FLAGS: &[&str] = &["-pthread", "-Wl,-soname,libcudart.so.12", "-Wl,-Bsymbolic"];

/// Libraries the runtime links, after its sources (`dlopen` is in libc from glibc 2.34 on).
const LIBRARY_LIBS: &[&str] = &["-ldl"];

/// The driver library's own flags, besides its source, the runtime it links and the output:
/// NEEDED `libcudart.so.12`, found through RUNPATH `$ORIGIN`; exports unversioned, as the real
/// driver's, from the version script `driver/libcuda.map`.
const DRIVER_FLAGS: &[&str] = &["-Wl,-soname,libcuda.so.1"];

/// Where the fake runtime was built.
#[derive(Debug, Clone)]
pub struct FakeCudart {
    /// Holds `libcudart.so.12`, the `libcudart.so` link and `libcuda.so.1`: pass to `-L` and
    /// `-rpath`.
    pub lib_dir: PathBuf,
    /// Holds `cuda_runtime_api.h`, `cuda_runtime.h`, `cuda.h` and `fakecudart.h`.
    pub include_dir: PathBuf,
}

impl FakeCudart {
    /// Path of `libcudart.so.12` (for `dlopen`, ctypes or readelf).
    pub fn library(&self) -> PathBuf {
        self.lib_dir.join(SONAME)
    }

    /// Path of the fake driver `libcuda.so.1` (link with `-l:libcuda.so.1`, or let the runtime
    /// load it).
    pub fn driver_library(&self) -> PathBuf {
        self.lib_dir.join(DRIVER_SONAME)
    }
}

/// `tests/fake-cudart` in the source tree.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fake-cudart")
}

/// `target/fake-cudart`: where builds and compiled test programs go.
pub fn build_root() -> PathBuf {
    let target = match option_env!("CARGO_TARGET_TMPDIR") {
        Some(tmp) => Path::new(tmp)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from(tmp)),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
    };
    target.join("fake-cudart")
}

/// The fake runtime, built on first use. Panics with the compiler's output if the build fails.
pub fn fake_cudart() -> &'static FakeCudart {
    static BUILT: OnceLock<FakeCudart> = OnceLock::new();
    BUILT.get_or_init(|| {
        let lib_dir = build_fake_cudart_in(&build_root())
            .unwrap_or_else(|e| panic!("building the fake libcudart.so.12 failed: {e}"));
        FakeCudart {
            lib_dir,
            include_dir: source_dir().join("include"),
        }
    })
}

/// Builds the fake runtime and driver under `root` (unless a build of the same content is there
/// already) and returns the directory holding `libcudart.so.12`, `libcudart.so` and
/// `libcuda.so.1`. Safe to call from several threads and processes at once.
pub fn build_fake_cudart_in(root: &Path) -> Result<PathBuf, String> {
    let src = source_dir();
    let sources = c_sources(&src.join("src"))?;
    let driver_sources = c_sources(&src.join("driver"))?;
    let compiler = c_compiler();
    let version_script = src.join("libcudart.map");
    let driver_version_script = src.join("driver").join("libcuda.map");

    let mut hasher = DefaultHasher::new();
    compiler.hash(&mut hasher);
    SHARED_FLAGS.hash(&mut hasher);
    LIBRARY_FLAGS.hash(&mut hasher);
    LIBRARY_LIBS.hash(&mut hasher);
    DRIVER_FLAGS.hash(&mut hasher);
    let headers = [
        header_files(&src.join("src"))?,
        header_files(&src.join("include"))?,
        header_files(&src.join("driver"))?,
    ];
    for file in sources
        .iter()
        .chain(driver_sources.iter())
        .chain(headers.iter().flatten())
        .chain([&version_script, &driver_version_script])
    {
        // The folder too: a file moved between src/ and driver/ changes the build.
        file.strip_prefix(&src)
            .unwrap_or(file.as_path())
            .hash(&mut hasher);
        read(file)?.hash(&mut hasher);
    }
    let dir = root.join(format!("{:016x}", hasher.finish()));
    if is_complete(&dir) {
        return Ok(dir);
    }

    std::fs::create_dir_all(root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let tmp = root.join(format!(".build-{}", unique_suffix()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let result = compile_library(&compiler, &src, &sources, &version_script, &tmp)
        .and_then(|()| {
            compile_driver(
                &compiler,
                &src,
                &driver_sources,
                &driver_version_script,
                &tmp,
            )
        })
        .and_then(|()| publish(&tmp, &dir));
    // Whatever happened, the temporary copy is no longer needed (absent once published).
    let _ = std::fs::remove_dir_all(&tmp);
    result.map(|()| dir)
}

/// Compiles one shared library of the fake into `output`: `flags`, its version script, the
/// include folders, then `inputs` (sources, and what it links against, in order).
fn compile_shared(
    compiler: &OsString,
    flags: &[&str],
    version_script: &Path,
    includes: &[PathBuf],
    output: &Path,
    inputs: &[OsString],
) -> Result<(), String> {
    let mut cmd = Command::new(compiler);
    cmd.args(SHARED_FLAGS)
        .args(flags)
        .arg(format!("-Wl,--version-script={}", version_script.display()));
    for dir in includes {
        cmd.arg("-I").arg(dir);
    }
    cmd.arg("-o").arg(output).args(inputs);
    run_compiler(&mut cmd)
}

/// Builds `libcudart.so.12` and its `libcudart.so` link in `out_dir`.
fn compile_library(
    compiler: &OsString,
    src: &Path,
    sources: &[PathBuf],
    version_script: &Path,
    out_dir: &Path,
) -> Result<(), String> {
    let inputs: Vec<OsString> = sources
        .iter()
        .map(|s| s.as_os_str().to_owned())
        .chain(LIBRARY_LIBS.iter().map(OsString::from))
        .collect();
    let includes = [src.join("include")];
    let output = out_dir.join(SONAME);
    compile_shared(
        compiler,
        LIBRARY_FLAGS,
        version_script,
        &includes,
        &output,
        &inputs,
    )?;
    std::os::unix::fs::symlink(SONAME, out_dir.join("libcudart.so"))
        .map_err(|e| format!("cannot link libcudart.so in {}: {e}", out_dir.display()))
}

/// Builds `libcuda.so.1` in `out_dir`, linked against the `libcudart.so.12` already there.
fn compile_driver(
    compiler: &OsString,
    src: &Path,
    sources: &[PathBuf],
    version_script: &Path,
    out_dir: &Path,
) -> Result<(), String> {
    let inputs: Vec<OsString> = sources
        .iter()
        .chain([&out_dir.join(SONAME)])
        .map(|s| s.as_os_str().to_owned())
        .collect();
    let includes = [src.join("include"), src.join("src")];
    let output = out_dir.join(DRIVER_SONAME);
    compile_shared(
        compiler,
        DRIVER_FLAGS,
        version_script,
        &includes,
        &output,
        &inputs,
    )
}

/// Whether `dir` holds a finished build (both libraries).
fn is_complete(dir: &Path) -> bool {
    dir.join(SONAME).is_file() && dir.join(DRIVER_SONAME).is_file()
}

/// Renames the finished `tmp` build to `dir`; losing the race to another builder is success.
fn publish(tmp: &Path, dir: &Path) -> Result<(), String> {
    match std::fs::rename(tmp, dir) {
        Ok(()) => Ok(()),
        Err(_) if is_complete(dir) => Ok(()),
        Err(e) => Err(format!(
            "cannot move {} to {}: {e}",
            tmp.display(),
            dir.display()
        )),
    }
}

/// Compiles the C program `source` against the fake runtime into `target/fake-cudart/programs/
/// <name>` (with `-rpath` to the fake, so it runs without `LD_LIBRARY_PATH`) and returns its path.
/// `extra_args` go after the source (for example `["-ldl"]`). Panics with the compiler's output
/// on failure.
pub fn compile_c_program(source: &Path, name: &str, extra_args: &[&str]) -> PathBuf {
    compile(source, name, extra_args, true)
}

/// [`compile_c_program`] without the fake runtime: nothing linked but libc (and `extra_args`),
/// as a program whose CUDA runtime is linked statically, or a stand-in library
/// (`extra_args` `-shared -fPIC`).
pub fn compile_c_without_runtime(source: &Path, name: &str, extra_args: &[&str]) -> PathBuf {
    compile(source, name, extra_args, false)
}

fn compile(source: &Path, name: &str, extra_args: &[&str], with_runtime: bool) -> PathBuf {
    let fake = fake_cudart();
    let dir = build_root().join("programs");
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let out = dir.join(name);
    let tmp = dir.join(format!(".{name}-{}", unique_suffix()));
    let mut cmd = Command::new(c_compiler());
    cmd.args(["-std=gnu11", "-g", "-Wall", "-Wextra", "-pthread", "-I"])
        .arg(&fake.include_dir)
        .arg("-o")
        .arg(&tmp)
        .arg(source)
        .args(extra_args);
    if with_runtime {
        cmd.arg("-L")
            .arg(&fake.lib_dir)
            .arg("-lcudart")
            .arg(format!("-Wl,-rpath,{}", fake.lib_dir.display()));
    }
    if let Err(e) = run_compiler(&mut cmd) {
        let _ = std::fs::remove_file(&tmp);
        panic!("compiling {} failed: {e}", source.display());
    }
    // Replacing a file by rename is atomic, so a concurrent compile of the same program is fine.
    std::fs::rename(&tmp, &out)
        .unwrap_or_else(|e| panic!("cannot move {} to {}: {e}", tmp.display(), out.display()));
    out
}

/// A command for `program` with every `FAKECUDART_*` variable of the test's own environment
/// removed, so each run starts from the documented defaults.
pub fn command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    // cargo runs tests with target/<profile> on LD_LIBRARY_PATH, which outranks the programs'
    // run paths: a libcachealloc.so left there by an earlier `cargo build` would be loaded
    // instead of the one this test run built.
    cmd.env_remove("LD_LIBRARY_PATH");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("FAKECUDART_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn c_compiler() -> OsString {
    std::env::var_os("CC")
        .filter(|cc| !cc.is_empty())
        .unwrap_or_else(|| "gcc".into())
}

fn run_compiler(cmd: &mut Command) -> Result<(), String> {
    let output = cmd
        .output()
        .map_err(|e| format!("cannot run {:?} (is a C compiler installed?): {e}", cmd))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} exited with {}:\n{}{}",
            cmd,
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn c_sources(dir: &Path) -> Result<Vec<PathBuf>, String> {
    files_with_extension(dir, "c")
}

fn header_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    files_with_extension(dir, "h")
}

/// Files of `dir` ending in `.ext`, sorted so that the hash does not depend on directory order.
fn files_with_extension(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
            .path();
        if path.extension().is_some_and(|x| x == ext) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn read(file: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

/// A name part no other thread or process uses at the same time.
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}
