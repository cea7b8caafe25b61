//! Real snapshots written again as JSON, as a user does to feed other tools:
//! `json.dump(pickle.load(f), out)` with Python's own `json` (tuples become lists, `None`
//! `null`, non-ASCII characters `\uXXXX` escapes).

use super::ci::running_under_ci;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Python's script: each pair of arguments is a pickle and the JSON file to write.
const TO_JSON: &str = "\
import json, pickle, sys
args = sys.argv[1:]
for source, target in zip(args[0::2], args[1::2]):
    with open(source, 'rb') as f:
        value = pickle.load(f)
    with open(target, 'w') as f:
        json.dump(value, f)
";

/// A JSON copy of each of `pickles` in `dir` (same order), or `None` after saying the caller
/// skips because `python3` is not installed (under CI, which installs it, that fails instead).
pub fn json_copies(pickles: &[PathBuf], dir: &Path) -> Option<Vec<PathBuf>> {
    let copies: Vec<PathBuf> = (0..pickles.len())
        .map(|i| dir.join(format!("snapshot-{i}.json")))
        .collect();
    let mut command = Command::new("python3");
    command.arg("-c").arg(TO_JSON);
    for (pickle, copy) in pickles.iter().zip(&copies) {
        command.arg(pickle).arg(copy);
    }
    match command.output() {
        Ok(out) => {
            assert!(
                out.status.success(),
                "python3 could not write the JSON copies: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(copies)
        }
        Err(e) => {
            // CI installs python3 (scripts/setup-test-deps.sh): there a missing one fails.
            assert!(!running_under_ci(), "python3 is required under CI: {e}");
            eprintln!("skipping: python3 not found ({e})");
            None
        }
    }
}
