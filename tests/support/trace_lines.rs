//! Editing the lines of a cachealloc trace file: a recording with some kinds of line taken
//! out reads as one whose writer never wrote them (an older version, or a PyTorch snapshot's
//! vocabulary).

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
