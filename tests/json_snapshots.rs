//! Memory snapshots written as JSON (`json.dump(torch.cuda.memory._snapshot(), f)`): real
//! snapshots, written again as JSON by Python, read as their pickles do, and `cachealloc
//! replay` and `state` print the same for both; malformed ones are refused, saying what is
//! wrong.
//!
//! Traces come from `$CACHEALLOC_TRACES`, else `<crate root>/../shared/traces/real`; a test
//! without them, or without `python3` to write the JSON, says so and returns.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use cachealloc::global::panics::catch;
use cachealloc::trace::{RecordedSnapshot, parse_snapshot, read_snapshot};
use support::cli::{cachealloc, command};
use support::json_copy::{Layout, json_copies, json_copies_as};
use support::traces::{snapshot_files, trace, traces_dir_or_skip};

/// The snapshots small enough to write again as JSON in a test (some JSON copies are 50 times
/// their pickle, which shares repeated stack frames): tens of MB in all.
const MAX_PICKLE_BYTES: u64 = 512 << 10;

/// `snapshot` as if read from `source`.
fn named(mut snapshot: RecordedSnapshot, source: &str) -> RecordedSnapshot {
    snapshot.source = source.to_owned();
    for device in &mut snapshot.devices {
        device.source = source.to_owned();
    }
    snapshot
}

/// Every real snapshot up to `MAX_PICKLE_BYTES` (recordings of several PyTorch versions, one
/// of them `torch.cuda.memory_snapshot()`'s list of segments) reads from its JSON copy as
/// from the pickle: the same entries, segments, blocks and settings; written in the dict's
/// own key order and with `sort_keys=True, indent=1`.
#[test]
fn real_snapshots_read_from_json_as_from_their_pickles() {
    let Some(dir) = traces_dir_or_skip() else {
        return;
    };
    let pickles: Vec<PathBuf> = snapshot_files(&dir)
        .into_iter()
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() <= MAX_PICKLE_BYTES))
        .collect();
    assert!(pickles.len() >= 10, "{pickles:?}");
    let tmp = tempfile::tempdir().unwrap();
    for layout in [Layout::Plain, Layout::SortedIndented] {
        let Some(copies) = json_copies_as(&pickles, tmp.path(), layout) else {
            return;
        };
        let mut segments_only = 0;
        for (pickle, copy) in pickles.iter().zip(&copies) {
            let name = pickle.display().to_string();
            let from_pickle = read_snapshot(pickle).unwrap_or_else(|e| panic!("{e}"));
            let from_json =
                read_snapshot(copy).unwrap_or_else(|e| panic!("{name} as JSON ({layout:?}): {e}"));
            assert!(
                from_json == named(from_pickle.clone(), &copy.display().to_string()),
                "{name}: its JSON copy ({layout:?}) reads differently"
            );
            segments_only += usize::from(from_pickle.segments_only);
        }
        assert_eq!(segments_only, 1, "the list of segments is among them");
    }
}

/// Run the binary with `args`, `-` standing for `path` given on standard input when `stdin`.
fn run(args: &[&str], path: &Path, stdin: bool) -> Output {
    let path_arg = if stdin { "-" } else { path.to_str().unwrap() };
    let mut all = args.to_vec();
    all.insert(1, path_arg);
    if !stdin {
        return cachealloc(&all);
    }
    command()
        .args(&all)
        .stdin(Stdio::from(std::fs::File::open(path).unwrap()))
        .output()
        .expect("binary runs")
}

/// `cachealloc replay` (plain and faithful) and `cachealloc state` print, to the byte, what
/// they print for the pickle, and exit the same, for a file and on standard input.
#[test]
fn replay_and_state_print_the_same_for_json_as_for_the_pickle() {
    let files = [
        // Out-of-memory errors, retries and a GC threshold.
        "octree-nca/3e8aa21/mem_snapshots/inference2_peso_oct.pickle",
        // Blocks without addresses (PyTorch 2.0): only a state, no trace to replay.
        "flexgen-llm-inference/41810ba/oom_snapshot.pickle",
        // `torch.cuda.memory_snapshot()`'s list of segments.
        "layout-editing/413b2eb/memory_snapshot.pkl",
    ];
    let Some(pickles) = files.iter().map(|f| trace(f)).collect::<Option<Vec<_>>>() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let Some(copies) = json_copies(&pickles, tmp.path()) else {
        return;
    };
    let commands: [&[&str]; 4] = [
        &["replay", "--json"],
        &["replay", "--faithful", "--json"],
        &["state"],
        &["state", "--json"],
    ];
    for (pickle, copy) in pickles.iter().zip(&copies) {
        let (pickle_name, copy_name) = (pickle.to_str().unwrap(), copy.to_str().unwrap());
        for args in commands {
            for stdin in [false, true] {
                let expected = run(args, pickle, stdin);
                let got = run(args, copy, stdin);
                let what = format!("{args:?} {pickle_name} (standard input: {stdin})");
                let text =
                    |bytes: &[u8]| String::from_utf8_lossy(bytes).replace(copy_name, pickle_name);
                assert_eq!(got.status.code(), expected.status.code(), "{what}");
                assert_eq!(text(&got.stdout), text(&expected.stdout), "{what}");
                assert_eq!(text(&got.stderr), text(&expected.stderr), "{what}");
            }
        }
    }
}

/// A malformed JSON snapshot is refused with exit code 2 and a message naming what is wrong:
/// broken text where it breaks, a bad field where it is and what is allowed, as for a pickle.
#[test]
fn malformed_json_snapshots_are_refused_naming_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let entry = |fields: &str| {
        format!(
            r#"{{"segments": [], "device_traces": [[{{"action": "alloc", "stream": 0, {fields}}}]]}}"#
        )
    };
    let cases = [
        (
            entry(r#""addr": 18446744073709551616, "size": 512"#),
            "unsupported memory snapshot content: device_traces[0][0]: 'addr' must be a \
             non-negative integer below 2^64, found a number too large for a 64-bit field \
             (about 1.8446744073709552e19)",
        ),
        (
            entry(r#""addr": 1, "size": 512.0"#),
            "device_traces[0][0]: 'size' must be a non-negative integer below 2^64, found float \
             512.0",
        ),
        (
            entry(r#""addr": 1"#),
            "device_traces[0][0]: 'size' is missing",
        ),
        (
            entry(r#""addr": 1, "size": NaN"#),
            "not readable JSON: expected value at line 1 column 89",
        ),
        (
            r#"{"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 512"#
                .to_owned(),
            "begins as a memory snapshot written as JSON, but is not readable JSON: truncated: \
             EOF while parsing an object at line 1 column 78",
        ),
        (
            r#"{"segments": [], "device_traces": [[]], }"#.to_owned(),
            "not readable JSON: trailing comma at line 1 column 41",
        ),
        (
            r#"{"segments": [{"device": 0}]}"#.to_owned(),
            "not a PyTorch memory snapshot: the top-level dict has no 'device_traces' key",
        ),
        (
            r#"{"traceEvents": [], "segments": []}"#.to_owned(),
            "it is JSON text, but not a memory snapshot (a profiler trace perhaps)",
        ),
    ];
    for (i, (text, says)) in cases.iter().enumerate() {
        let path = tmp.path().join(format!("bad-{i}.json"));
        std::fs::write(&path, text).unwrap();
        for subcommand in ["replay", "state"] {
            let out = cachealloc(&[subcommand, path.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{subcommand} {text}: {err}");
            assert!(
                err.starts_with(&format!("cachealloc: error: {}: ", path.display()))
                    && err.contains(says),
                "{subcommand} {text}: {err:?} should say {says:?}"
            );
            assert!(!err.contains("panicked"), "{err}");
        }
    }
}

/// The bytes written into a JSON snapshot to damage it: JSON's own.
const JSON_BYTES: &[u8] = b"{}[]\",:0123456789.-eE \\u";

/// A JSON snapshot cut short never loads, and one with bytes changed loads or gives an error:
/// never a panic.
#[test]
fn damaged_json_snapshots_load_or_give_an_error() {
    let Some(pickle) = trace("octree-nca/3e8aa21/mem_snapshots/traditional_single_step.pickle")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let Some(copies) = json_copies(&[pickle], tmp.path()) else {
        return;
    };
    let text = std::fs::read(&copies[0]).unwrap();
    assert!(parse_snapshot(&text, "whole.json").is_ok());
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..100 {
        let cut = (next() % text.len() as u64) as usize;
        let loaded = catch(|| parse_snapshot(&text[..cut], "cut.json"))
            .unwrap_or_else(|panic| panic!("panicked on a cut at byte {cut}: {panic}"));
        assert!(loaded.is_err(), "a JSON snapshot cut at byte {cut} loaded");
        let mut damaged = text.clone();
        let places: Vec<usize> = (0..1 + next() % 4)
            .map(|_| {
                let at = (next() % text.len() as u64) as usize;
                damaged[at] = JSON_BYTES[(next() % JSON_BYTES.len() as u64) as usize];
                at
            })
            .collect();
        let _ = catch(|| parse_snapshot(&damaged, "damaged.json"))
            .unwrap_or_else(|panic| panic!("panicked on bytes changed at {places:?}: {panic}"));
    }
}
