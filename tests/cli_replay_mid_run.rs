//! `cachealloc replay --faithful` of an expandable-segments recording that begins with pages
//! mapped, as a user meets one: a long run's history buffer wrapped, so its snapshot's trace
//! begins mid-run. Made here from code_location's snapshot, its devices' first halves cut off
//! with Python's pickle module (the file PyTorch would have written had the buffer held half).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::ci::running_under_ci;
use support::cli::{cachealloc, json};
use support::traces::trace;

const CUT: &str = r#"
import pickle, sys
with open(sys.argv[1], "rb") as f:
    snapshot = pickle.load(f)
snapshot["device_traces"] = [t[len(t) // 2:] for t in snapshot["device_traces"]]
with open(sys.argv[2], "wb") as f:
    pickle.dump(snapshot, f)
"#;

/// code_location's snapshot with each device's first half of the trace cut off, or `None`
/// after saying why the test skips.
fn wrapped_recording(dir: &Path) -> Option<PathBuf> {
    let source = trace("code_location/52e52b2/memory_snapshot.pickle")?;
    let cut = dir.join("wrapped.pickle");
    match Command::new("python3")
        .args(["-c", CUT])
        .arg(&source)
        .arg(&cut)
        .output()
    {
        Ok(out) if out.status.success() => Some(cut),
        Ok(out) => panic!(
            "python3 could not cut the snapshot: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            // CI installs python3 (scripts/setup-test-deps.sh): there a missing one fails.
            assert!(!running_under_ci(), "python3 is required under CI: {e}");
            eprintln!("skipping: python3 not found ({e})");
            None
        }
    }
}

/// Each device replays to the recording's own figures, every allocation at its recorded
/// address, from the state rebuilt at its start; device 1's out-of-memory error too.
#[test]
fn a_wrapped_expandable_recording_replays_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let Some(path) = wrapped_recording(dir.path()) else {
        return;
    };
    let path = path.to_str().unwrap();
    let whole = trace("code_location/52e52b2/memory_snapshot.pickle").unwrap();
    for device in ["0", "1", "2"] {
        let faithful = ["replay", path, "--device", device, "--faithful", "--json"];
        // The device's memory, as the whole recording implies it: given with
        // --device-memory, it sizes the ranges the cut recording begins with, and the replay
        // stays exact.
        let memory = json(&cachealloc(&[
            "replay",
            whole.to_str().unwrap(),
            "--device",
            device,
            "--faithful",
            "--json",
        ]))["device_memory_bytes"]
            .to_string();
        let told = [&faithful[..], &["--device-memory", &memory]].concat();
        let (plain, told) = (json(&cachealloc(&faithful)), json(&cachealloc(&told)));
        assert_eq!(told["device_memory_bytes"].to_string(), memory);
        for j in [plain, told] {
            check_device(&j, device);
        }
    }
    // The summary says where the frees of memory from before the trace went.
    let out = cachealloc(&["replay", path, "--device", "1", "--faithful"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("of memory from before the trace, freed from the rebuilt start state"),
        "{text}"
    );
}

/// A faithful replay of device `device` matches the recording's own figures.
fn check_device(j: &serde_json::Value, device: &str) {
    let same = |ours: &str, recorded: &str| {
        assert_eq!(
            j[ours], j[recorded],
            "device {device}: {ours} against {recorded}"
        );
    };
    same("peak_reserved_bytes", "recorded_peak_reserved_bytes");
    same("num_device_alloc", "recorded_segment_maps");
    same("num_device_free", "recorded_segment_unmaps");
    same("num_alloc_retries", "recorded_retries");
    same("allocs_at_recorded_addr", "allocs");
    assert!(j["allocs"].as_u64().unwrap() > 50, "device {device}");
    // It frees memory allocated before it, which the rebuilt start state holds.
    assert!(j["orphan_frees"].as_u64().unwrap() > 0, "device {device}");
    assert_eq!(j["missing_frees"], 0, "device {device}");
    assert_eq!(j["recorded_expandable_segments"], true);
    let oom = &j["recorded_oom"];
    if device == "1" {
        assert_eq!(j["first_oom_event_index"], oom["event_index"]);
        assert_eq!(j["num_ooms"], 1);
    } else {
        assert!(oom.is_null() && j["num_ooms"] == 0, "device {device}");
    }
}
