//! Running programs with `libcachealloc.so` preloaded in front of the fake runtime.
//!
//! `cargo test` compiles the library (crate types cdylib and rlib) before any integration test
//! and leaves the cdylib in `target/<profile>/deps/libcachealloc.so`, next to the test
//! executables. Only `cargo build` copies it up to `target/<profile>/`, so that copy may be
//! stale during `cargo test`: the tests always use the one in `deps/`, the library of the very
//! build under test.

use super::fake_cudart;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `target/<profile>/deps/libcachealloc.so` of the build running this test.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe
        .parent()
        .expect("test executable lives in target/<profile>/deps");
    let lib = deps.join("libcachealloc.so");
    assert!(
        lib.is_file(),
        "{} is missing: cargo test builds it with the library target",
        lib.display()
    );
    lib
}

/// A command for `program` with the shim preloaded, and with every `CACHEALLOC_*`,
/// `PYTORCH_*ALLOC_CONF` and `FAKECUDART_*` variable of the test's environment removed.
pub fn preloaded(program: &Path) -> Command {
    let mut cmd = fake_cudart::command(program);
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("CACHEALLOC_") || key_text.ends_with("ALLOC_CONF") {
            cmd.env_remove(&key);
        }
    }
    cmd.env("LD_PRELOAD", library());
    cmd
}

/// Run `cmd` and return its output, with stdout and stderr in the panic message on failure.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("program runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `cmd`, a test program's `scenario`, and require its "ok SCENARIO" line.
pub fn run_scenario(cmd: &mut Command, scenario: &str) -> Output {
    let out = run_ok(cmd);
    assert!(
        stdout(&out).contains(&format!("ok {scenario}")),
        "no ok line:\n{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    out
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Require `parts` to appear in `log` in this order (each after the end of the one before).
pub fn assert_in_order(log: &str, parts: &[&str]) {
    let mut from = 0;
    for part in parts {
        let at = log[from..]
            .find(part)
            .unwrap_or_else(|| panic!("no {part:?} after byte {from} of:\n{log}"));
        from += at + part.len();
    }
}

/// A file at `path` holding `content`, with its lock held as long as the returned handle lives:
/// another process's file in use.
pub fn held_file(path: &Path, content: &str) -> std::fs::File {
    std::fs::write(path, content).unwrap();
    let file = std::fs::File::open(path).unwrap();
    file.lock().unwrap();
    file
}

/// The word after `key` in `text`.
pub fn word_after<'a>(text: &'a str, key: &str) -> &'a str {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("'{key}' not in:\n{text}"))
        + key.len();
    text[at..].split_whitespace().next().unwrap_or_default()
}

/// The number after `key` in `text` (the word after it, read as a number).
pub fn number_after(text: &str, key: &str) -> u64 {
    word_after(text, key)
        .parse()
        .unwrap_or_else(|_| panic!("no number after '{key}' in:\n{text}"))
}
