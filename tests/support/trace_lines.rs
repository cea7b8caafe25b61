//! Writing and editing the lines of a cachealloc trace file: small recordings written event by
//! event, and a recording with some kinds of line taken out, which reads as one whose writer
//! never wrote them (an older version, or a PyTorch snapshot's vocabulary).

use std::path::{Path, PathBuf};

/// Write `trace` to `copy` without the event lines whose action is one of `actions`.
pub fn copy_without(trace: &Path, actions: &[&str], copy: &Path) {
    let text = std::fs::read_to_string(trace).expect("the trace is readable");
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| {
            !actions
                .iter()
                .any(|a| l.contains(&format!("\"action\":\"{a}\"")))
        })
        .collect();
    std::fs::write(copy, kept.join("\n") + "\n").expect("the copy is writable");
}

/// A cachealloc trace file of device 0 in the temporary directory, one event per
/// (action, address, size, stream), a microsecond apart.
pub fn write_trace(name: &str, events: &[(&str, u64, u64, u32)]) -> PathBuf {
    write_trace_with_settings(name, "", events)
}

/// `write_trace` of a recording made under `settings`.
pub fn write_trace_with_settings(
    name: &str,
    settings: &str,
    events: &[(&str, u64, u64, u32)],
) -> PathBuf {
    write_trace_of_version(name, 1, settings, events)
}

/// `write_trace_with_settings` of a recording in format `version` (from 6 it may hold
/// `capture` lines: the next request of the stream was made during a CUDA graph capture).
pub fn write_trace_of_version(
    name: &str,
    version: u32,
    settings: &str,
    events: &[(&str, u64, u64, u32)],
) -> PathBuf {
    let header = format!(
        r#"{{"format":"cachealloc-trace","version":{version},"pid":1,"devices":[0],"settings":"{settings}","free_sync":"device"}}"#
    );
    let mut lines = vec![header];
    for (t, (action, addr, size, stream)) in events.iter().enumerate() {
        lines.push(format!(
            r#"{{"t_us":{},"device":0,"action":"{action}","addr":{addr},"size":{size},"stream":{stream}}}"#,
            t + 1
        ));
    }
    let file = format!("cachealloc-{name}-{}.jsonl", std::process::id());
    let path = std::env::temp_dir().join(file);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// `write_trace` of a recording under `expandable_segments:True` that holds a native segment
/// too (the setting turned on while it ran): a cudaMalloc of 20 MiB at `NATIVE_AT` holding a
/// 4 MiB allocation, then two 20 MiB page maps at `MAPPED_AT` holding a 40 MiB one.
pub fn write_native_then_expandable(name: &str) -> PathBuf {
    let mib = 1u64 << 20;
    write_trace_with_settings(
        name,
        "expandable_segments:True",
        &[
            ("segment_alloc", NATIVE_AT, 20 * mib, 0),
            ("alloc", NATIVE_AT, 4 * mib, 0),
            ("segment_map", MAPPED_AT, 20 * mib, 0),
            ("segment_map", MAPPED_AT + 20 * mib, 20 * mib, 0),
            ("alloc", MAPPED_AT, 40 * mib, 0),
        ],
    )
}

/// Where `write_native_then_expandable` puts its native segment and its mapped pages.
pub const NATIVE_AT: u64 = 0x7f00_0000_0000;
pub const MAPPED_AT: u64 = 0x7f10_0000_0000;

/// `write_trace` of a run on a device of 1 GiB (its `device_memory` line) that released a
/// cached 600 MiB segment and retried to fit an 800 MiB request: its capacity is inferred from
/// the retry (the middle of what it brackets, 1,100 MiB) and held to the device's memory.
pub fn write_retry_on_1_gib_device(name: &str) -> PathBuf {
    let (a, b, mib) = (0x7f00_0000_0000u64, 0x7f10_0000_0000u64, 1u64 << 20);
    write_trace(
        name,
        &[
            ("device_memory", 0, 1024 * mib, 0),
            ("segment_alloc", a, 600 * mib, 0),
            ("alloc", a, 600 * mib, 0),
            ("free_completed", a, 600 * mib, 0),
            // The allocator's release before a retry: 600 + 800 MiB did not fit.
            ("segment_free", a, 600 * mib, 0),
            ("segment_alloc", b, 800 * mib, 0),
            ("alloc", b, 800 * mib, 0),
        ],
    )
}
