//! A trace handed to `cachealloc` through a pipe (`replay <(zcat snapshot.pickle.gz)`,
//! `... | cachealloc replay -` or `/dev/stdin`): read once, it replays as from its file; an endless
//! stream that is no trace is refused from its first bytes instead of read until memory runs
//! out.

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use support::cli::{cachealloc, command, json};
use support::traces::trace;

/// Run the binary with `args`, its standard input a pipe fed by `feed` from another thread;
/// the binary's output and what `feed` returned.
fn with_piped_stdin<T: Send + 'static>(
    args: &[&str],
    feed: impl FnOnce(&mut dyn Write) -> T + Send + 'static,
) -> (Output, T) {
    let mut child = command()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let feeder = std::thread::spawn(move || feed(&mut stdin));
    let out = child.wait_with_output().expect("binary ends");
    (out, feeder.join().expect("feeder ends"))
}

/// `replay FILE --json`, and `replay /dev/stdin --json` or `replay - --json` with the file's
/// bytes piped in, give the same figures (but for the trace's name).
fn assert_replays_through_a_pipe(file: &Path) {
    let mut from_file = json(&cachealloc(&["replay", file.to_str().unwrap(), "--json"]));
    from_file.as_object_mut().unwrap().remove("trace");
    for stdin in ["/dev/stdin", "-"] {
        let bytes = std::fs::read(file).unwrap();
        let (out, ()) = with_piped_stdin(&["replay", stdin, "--json"], move |w| {
            w.write_all(&bytes)
                .expect("the binary reads the whole trace");
        });
        let mut piped = json(&out);
        assert_eq!(piped["trace"], stdin);
        piped.as_object_mut().unwrap().remove("trace");
        assert_eq!(piped, from_file, "{} as {stdin}", file.display());
    }
}

#[test]
fn a_snapshot_through_a_pipe_replays_as_from_its_file() {
    let Some(t) = trace("discrete_diffusion/657e3e3/memory_snapshot.json") else {
        return;
    };
    assert_replays_through_a_pipe(&t);
}

#[test]
fn a_recorded_trace_through_a_pipe_replays_as_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("run.trace");
    let out = cachealloc(&[
        "synth",
        "transformer:steps=2",
        "--save",
        saved.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_replays_through_a_pipe(&saved);
}

#[test]
fn an_endless_stream_that_is_no_trace_is_refused_from_its_first_bytes() {
    // Far more than the first bytes: a binary that read on would take all of it.
    const OFFERED: usize = 256 << 20;
    for command in ["replay", "state"] {
        let (out, written) = with_piped_stdin(&[command, "/dev/stdin"], |w| {
            // Pseudo-random bytes, until the binary closes the pipe (a write fails) or all
            // are offered.
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let mut block = [0u8; 4096];
            let mut written = 0;
            while written < OFFERED {
                for b in block.iter_mut() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *b = x as u8;
                }
                if w.write_all(&block).is_err() {
                    break;
                }
                written += block.len();
            }
            written
        });
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {err}");
        assert!(
            err.contains("/dev/stdin: not a readable Python pickle: ")
                && err.contains("a stream that is not a regular file is judged by its first bytes"),
            "{command}: {err}"
        );
        // What a pipe buffers beyond the bytes read is at most 1 MiB on Linux.
        assert!(
            written <= 4 << 20,
            "{command} read {written} bytes of the stream before refusing it"
        );
    }
}
