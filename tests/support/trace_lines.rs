//! Writing and editing the lines of a cachealloc trace file: small recordings written event by
//! event, and a recording with some kinds of line taken out, which reads as one whose writer
//! never wrote them (an older version, or a PyTorch snapshot's vocabulary).

use std::path::Path;

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
pub fn write_trace(name: &str, events: &[(&str, u64, u64, u32)]) -> std::path::PathBuf {
    write_trace_with_settings(name, "", events)
}

/// `write_trace` of a recording made under `settings`.
pub fn write_trace_with_settings(
    name: &str,
    settings: &str,
    events: &[(&str, u64, u64, u32)],
) -> std::path::PathBuf {
    let header = format!(
        r#"{{"format":"cachealloc-trace","version":1,"pid":1,"devices":[0],"settings":"{settings}","free_sync":"device"}}"#
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
