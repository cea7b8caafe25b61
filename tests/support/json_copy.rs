//! Real snapshots written again as JSON, as a user does to feed other tools:
//! `json.dump(pickle.load(f), out)` with Python's own `json` (tuples become lists, `None`
//! `null`, non-ASCII characters `\uXXXX` escapes).

use super::ci::running_under_ci;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How `json.dump` lays a copy out.
#[derive(Clone, Copy, Debug)]
pub enum Layout {
    /// `json.dump(value, out)`: the dict's own key order, on one line.
    Plain,
    /// `json.dump(value, out, sort_keys=True, indent=1)`: keys sorted, one per line.
    SortedIndented,
}

/// Python's script: its first argument is `json.dump`'s keyword arguments, then each pair of
/// arguments is a pickle and the JSON file to write.
const TO_JSON: &str = "\
import json, pickle, sys
options = json.loads(sys.argv[1])
args = sys.argv[2:]
for source, target in zip(args[0::2], args[1::2]):
    with open(source, 'rb') as f:
        value = pickle.load(f)
    with open(target, 'w') as f:
        json.dump(value, f, **options)
";

/// A JSON copy of each of `pickles` in `dir` (same order), or `None` after saying the caller
/// skips because `python3` is not installed (under CI, which installs it, that fails instead).
pub fn json_copies(pickles: &[PathBuf], dir: &Path) -> Option<Vec<PathBuf>> {
    json_copies_as(pickles, dir, Layout::Plain)
}

/// [`json_copies`], laid out as `layout` says.
pub fn json_copies_as(pickles: &[PathBuf], dir: &Path, layout: Layout) -> Option<Vec<PathBuf>> {
    let (options, tag) = match layout {
        Layout::Plain => ("{}", "plain"),
        Layout::SortedIndented => (r#"{"sort_keys": true, "indent": 1}"#, "sorted"),
    };
    let copies: Vec<PathBuf> = (0..pickles.len())
        .map(|i| dir.join(format!("snapshot-{i}-{tag}.json")))
        .collect();
    let mut command = Command::new("python3");
    command.arg("-c").arg(TO_JSON).arg(options);
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
