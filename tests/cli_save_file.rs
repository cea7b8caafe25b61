//! `cachealloc synth --save FILE` writes a trace whole or not at all: a save that fails loses
//! nothing that was at the path, and a complete save replaces a file keeping its permissions.

mod support;

use std::fs;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use support::cli::cachealloc;

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_save_that_fails_leaves_the_file_there_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kept.trace");
    fs::write(&path, "a trace kept from an earlier run\n").unwrap();
    // A file-size limit of 1 KiB makes the write fail part way (EFBIG; the signal that would
    // end the process is ignored, as a shell's `trap` leaves it for the program it runs).
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"ulimit -f 1; trap "" XFSZ; exec "$@""#)
        .arg("bash")
        .arg(env!("CARGO_BIN_EXE_cachealloc"))
        .args(["synth", "transformer:steps=2", "--save"])
        .arg(&path)
        .output()
        .expect("bash runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot write the trace: File too large")
            && err.contains("the file there is left as it was"),
        "{err}"
    );
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "a trace kept from an earlier run\n"
    );
    // No temporary file is left beside it.
    assert_eq!(names(dir.path()), ["kept.trace"]);
}

#[test]
fn a_save_to_a_named_pipe_that_fails_leaves_the_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let pipe = dir.path().join("pipe");
    let made = Command::new("mkfifo")
        .arg(&pipe)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let child = support::cli::command()
        .args(["synth", "transformer:steps=2", "--save"])
        .arg(&pipe)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    // Read the start of the trace, then close the pipe: the writer's next write fails.
    let mut start = [0u8; 64];
    fs::File::open(&pipe)
        .unwrap()
        .read_exact(&mut start)
        .unwrap();
    assert!(start.starts_with(b"{\"format\":\"cachealloc-trace\""));
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot write the trace: Broken pipe"), "{err}");
    // Written in place, and never removed.
    assert!(fs::metadata(&pipe).unwrap().file_type().is_fifo());
}

#[test]
fn a_complete_save_replaces_the_file_and_keeps_its_permissions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.trace");
    fs::write(&path, "an older trace\n").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
    let out = cachealloc(&[
        "synth",
        "transformer:steps=2",
        "--save",
        path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let trace = fs::read_to_string(&path).unwrap();
    assert!(trace.starts_with("{\"format\":\"cachealloc-trace\""));
    assert!(
        trace.lines().count() > 100,
        "{} lines",
        trace.lines().count()
    );
    let mode = fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o640);
    assert_eq!(names(dir.path()), ["run.trace"]);

    // Through a link, the file it names is replaced and the link stays a link.
    let link = dir.path().join("link.trace");
    std::os::unix::fs::symlink("run.trace", &link).unwrap();
    let out = cachealloc(&[
        "synth",
        "transformer:steps=3",
        "--save",
        link.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(fs::symlink_metadata(&link).unwrap().is_symlink());
    assert!(fs::read_to_string(&path).unwrap().len() > trace.len());
    assert_eq!(names(dir.path()), ["link.trace", "run.trace"]);
}

#[test]
fn a_save_into_a_missing_folder_is_refused_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("run.trace");
    let out = cachealloc(&[
        "synth",
        "transformer:steps=2",
        "--save",
        path.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "cachealloc: error: --save {}: cannot write the trace: No such file or directory \
             (os error 2)",
            path.display()
        )
    );
}

#[test]
fn a_save_to_a_device_is_written_without_suggesting_a_replay_of_it() {
    let out = cachealloc(&["synth", "transformer:steps=2", "--save", "/dev/null"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        err.trim_end(),
        "cachealloc: note: wrote the run's trace to /dev/null"
    );
    assert!(
        fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );
}

#[test]
fn a_save_to_standard_output_or_error_is_refused_however_spelled() {
    // Through a pipe, as the tests capture the streams.
    for (path, stream) in [
        ("/dev/stdout", "standard output, where the summary goes"),
        ("/proc/self/fd/1", "standard output, where the summary goes"),
        ("/dev/stderr", "standard error, where the notes go"),
    ] {
        let out = cachealloc(&["synth", "transformer:steps=1", "--save", path]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path}: {err}");
        assert_eq!(
            err.trim_end(),
            format!(
                "cachealloc: error: --save {path}: that is {stream}; name a file for the trace"
            )
        );
        assert!(out.stdout.is_empty(), "{path}");
    }
    // Standard output redirected to a file, named by its own path: the trace would replace the
    // file the summary is written to.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("summary.txt");
    fs::write(&path, "kept\n").unwrap();
    let out = support::cli::command()
        .args(["synth", "transformer:steps=1", "--save"])
        .arg(&path)
        .stdout(fs::OpenOptions::new().append(true).open(&path).unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("that is standard output"), "{err}");
    assert_eq!(fs::read_to_string(&path).unwrap(), "kept\n");
}
