//! `--device-memory`: the simulated device's total memory, given apart from the capacity the
//! allocator may take (a CUDA context and other processes hold the rest). It is what a memory
//! fraction takes its share of, what the out-of-memory report calls the total, and what the
//! ranges of expandable segments are sized from.

mod support;

use support::cli::{cachealloc, json};
use support::trace_lines::{
    copy_without, write_retry_on_1_gib_device, write_trace, write_trace_with_settings,
};
use support::traces::trace;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Two transformer steps (peak reserved 4.81 GiB) as JSON, with `extra` options.
fn two_steps(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["synth", "transformer:steps=2", "--json"];
    args.extend_from_slice(extra);
    json(&cachealloc(&args))
}

#[test]
fn a_memory_fraction_is_a_share_of_the_device_memory_not_of_the_capacity() {
    let fraction = ["--conf", "per_process_memory_fraction:0.5"];
    // Half of a 7 GiB device is 3.5 GiB: the workload runs out.
    let on_capacity = two_steps(&[&fraction[..], &["--capacity", "7GiB"]].concat());
    assert!(
        on_capacity["num_ooms"].as_u64().unwrap() > 0,
        "{on_capacity}"
    );
    assert_eq!(on_capacity["device_memory_bytes"].as_u64(), Some(7 * GIB));
    // Half of 10 GiB, of which 7 GiB are free to the allocator: 5 GiB, and it fits.
    let on_memory = two_steps(
        &[
            &fraction[..],
            &["--capacity", "7GiB", "--device-memory", "10GiB"],
        ]
        .concat(),
    );
    assert_eq!(on_memory["num_ooms"], 0, "{on_memory}");
    assert_eq!(on_memory["capacity_bytes"].as_u64(), Some(7 * GIB));
    assert_eq!(on_memory["device_memory_bytes"].as_u64(), Some(10 * GIB));
    let peak = on_memory["peak_reserved_bytes"].as_u64().unwrap();
    assert!(peak > 7 * GIB / 2 && peak <= 5 * GIB, "{peak}");
    // A device of unknown memory has no share to take.
    let out = cachealloc(&[
        "synth",
        "transformer:steps=1",
        "--json",
        fraction[0],
        fraction[1],
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("this replay's device is unlimited: give --device-memory (or --capacity)"),
        "{err}"
    );
}

#[test]
fn the_oom_report_counts_the_memory_beyond_the_capacity_as_not_tracked() {
    let out = cachealloc(&[
        "synth",
        "transformer:steps=2",
        "--capacity",
        "3GiB",
        "--device-memory",
        "10GiB",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("device capacity: 3.00 GiB"), "{text}");
    assert!(text.contains("device memory: 10.00 GiB"), "{text}");
    assert!(
        text.contains("GPU 0 has a total capacity of 10.00 GiB"),
        "{text}"
    );
    assert!(
        text.contains("Memory not tracked by cachealloc (other processes, CUDA contexts, other allocators): 7.00 GiB"),
        "{text}"
    );
}

#[test]
fn device_memory_alone_is_all_available() {
    let v = two_steps(&["--device-memory", "4GiB"]);
    assert_eq!(v["capacity_bytes"].as_u64(), Some(4 * GIB), "{v}");
    assert_eq!(v["device_memory_bytes"].as_u64(), Some(4 * GIB), "{v}");
    assert!(v["num_ooms"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn a_capacity_beyond_the_device_memory_is_refused() {
    for (args, expected) in [
        (
            vec!["--capacity", "8GiB", "--device-memory", "7GiB"],
            "--capacity 8.00 GiB is more than --device-memory 7.00 GiB: the capacity is the part \
             of the device's memory the allocator can have",
        ),
        (
            vec!["--device-memory", "0"],
            "invalid device memory \"0\": a device needs more than 0 bytes (omit \
             --device-memory for an unlimited one)",
        ),
        (vec!["--device-memory", "80"], "for gibibytes write 80GiB"),
    ] {
        let out = cachealloc(&[&["synth", "transformer:steps=1"][..], &args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    // All of the device's memory is a capacity it can have.
    let out = cachealloc(&[
        "synth",
        "transformer:steps=1",
        "--capacity",
        "8GiB",
        "--device-memory",
        "8GiB",
        "--json",
    ]);
    let j = json(&out);
    assert_eq!(j["capacity_bytes"], 8u64 << 30, "{j}");
    assert_eq!(j["device_memory_bytes"], 8u64 << 30, "{j}");
    // Sizes that read the same are told apart by their bytes.
    let out = cachealloc(&["synth", "--capacity", "8.001GiB", "--device-memory", "8GiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "--capacity 8.00 GiB (8591008334 bytes) is more than --device-memory 8.00 GiB \
             (8589934592 bytes)"
        ),
        "{err}"
    );
    // A replay, plain or faithful, refuses it too.
    let path = two_ranges_9_gib_apart("refused");
    let p = path.to_str().unwrap();
    for mode in [&[][..], &["--faithful"][..]] {
        let args = [
            &["replay", p, "--capacity", "8GiB", "--device-memory", "7GiB"][..],
            mode,
        ]
        .concat();
        let out = cachealloc(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is more than --device-memory 7.00 GiB"),
            "{err}"
        );
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_plain_replay_of_a_trace_runs_on_the_device_memory_given() {
    let path = two_ranges_9_gib_apart("plain");
    let v = json(&cachealloc(&[
        "replay",
        path.to_str().unwrap(),
        "--device-memory",
        "4GiB",
        "--json",
    ]));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(v["capacity_bytes"].as_u64(), Some(4 * GIB), "{v}");
    assert_eq!(v["device_memory_bytes"].as_u64(), Some(4 * GIB), "{v}");
    assert_eq!(v["mode"], "plain");
}

/// A cachealloc trace of device 0 without range lines (as PyTorch's snapshots have none): a
/// 20 MiB page mapped for stream 0, and one 9 GiB above it for stream 1, each allocated.
/// `name` keeps the file of each test apart (they run at once).
fn two_ranges_9_gib_apart(name: &str) -> std::path::PathBuf {
    let (a, b, page) = (0x7f00_0000_0000u64, 0x7f00_0000_0000u64 + 9 * GIB, 20 * MIB);
    write_trace_with_settings(
        &format!("device-memory-ranges-{name}"),
        "expandable_segments:True",
        &[
            ("segment_map", a, page, 0),
            ("alloc", a, page, 0),
            ("segment_map", b, page, 1),
            ("alloc", b, page, 1),
        ],
    )
}

/// Ranges are 1⅛ of the device's memory in whole 20 MiB pages: ranges 9 GiB apart fit a device
/// of just under 8 GiB. Given less, a faithful replay reserves them where the recording did;
/// given more, it warns that they cannot lie there, and names the most.
#[test]
fn a_faithful_replay_sizes_the_recorded_ranges_with_the_device_memory() {
    let path = two_ranges_9_gib_apart("sized");
    let p = path.to_str().unwrap();
    let fits = cachealloc(&[
        "replay",
        p,
        "--faithful",
        "--device-memory",
        "7GiB",
        "--json",
    ]);
    let v = json(&fits);
    assert_eq!(v["device_memory_bytes"].as_u64(), Some(7 * GIB), "{v}");
    assert_eq!(v["allocs_at_recorded_addr"], 2, "{v}");
    assert!(
        !String::from_utf8_lossy(&fits.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&fits.stderr)
    );

    let too_large = cachealloc(&[
        "replay",
        p,
        "--faithful",
        "--device-memory",
        "16GiB",
        "--json",
    ]);
    let v = json(&too_large);
    assert_eq!(v["device_memory_bytes"].as_u64(), Some(16 * GIB), "{v}");
    assert_eq!(v["allocs_at_recorded_addr"], 1, "{v}");
    let err = String::from_utf8_lossy(&too_large.stderr);
    let warning = "warning: a device of 16.00 GiB reserves larger ranges for expandable segments \
                   than the recording's, which fit a device of at most 7.99 GiB";
    assert!(err.contains(warning), "{err}");

    // A capacity given beyond that memory makes a device as large, with the same warning
    // (the device had reported less memory than its capacity).
    let out = cachealloc(&["replay", p, "--faithful", "--capacity", "16GiB", "--json"]);
    let v = json(&out);
    assert_eq!(v["capacity_bytes"].as_u64(), Some(16 * GIB), "{v}");
    assert_eq!(v["device_memory_bytes"].as_u64(), Some(16 * GIB), "{v}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(warning),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Without expandable segments the ranges do not matter, and nothing is said of them.
    let out = cachealloc(&[
        "replay",
        p,
        "--faithful",
        "--device-memory",
        "16GiB",
        "--conf",
        "expandable_segments:False",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("warning:"), "{err}");
    std::fs::remove_file(&path).unwrap();
}

/// A faithful replay on less memory than the recording reserved, or on another memory than it
/// names, says that its device is not the recording's.
#[test]
fn a_device_memory_unlike_the_recordings_is_noted() {
    let path = two_ranges_9_gib_apart("noted");
    for option in ["--device-memory", "--capacity"] {
        let out = cachealloc(&[
            "replay",
            path.to_str().unwrap(),
            "--faithful",
            option,
            "30MiB",
            "--json",
        ]);
        let v = json(&out);
        assert!(v["num_ooms"].as_u64().unwrap() > 0, "{v}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "note: the recording reserved up to 40.00 MiB, more than {option} 30.00 MiB: \
                 this replay's device is smaller than the recording's"
            )),
            "{err}"
        );
    }
    std::fs::remove_file(&path).unwrap();

    let saved = std::env::temp_dir().join(format!(
        "cachealloc-device-memory-saved-{}.jsonl",
        std::process::id()
    ));
    let s = saved.to_str().unwrap();
    let out = cachealloc(&[
        "synth",
        "transformer:steps=1",
        "--capacity",
        "6GiB",
        "--device-memory",
        "8GiB",
        "--save",
        s,
    ]);
    assert!(out.status.success());
    for (option, size) in [("--device-memory", "7GiB"), ("--capacity", "9GiB")] {
        let out = cachealloc(&["replay", s, "--faithful", option, size]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "note: the recording names its device's memory, 8.00 GiB; this replay's device \
                 has {}.00 GiB, from {option}",
                &size[..1]
            )),
            "{err}"
        );
    }
    // As recorded, nothing to note.
    let out = cachealloc(&["replay", s, "--faithful"]);
    std::fs::remove_file(&saved).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("note:"), "{err}");
}

/// A capacity inferred from a retry (the middle of what the retry brackets) can exceed the
/// memory that the recording's ranges imply, which a device cannot: it is held to that memory,
/// and the replay still lands every allocation where the recording did, with its retry.
#[test]
fn an_inferred_capacity_is_held_to_the_memory_the_ranges_imply() {
    let (a, b, mib) = (0x7f00_0000_0000u64, 0x7f00_0000_0000u64 + 9 * GIB, MIB);
    let path = write_trace_with_settings(
        "device-memory-held",
        "expandable_segments:True",
        &[
            ("segment_map", a, 400 * mib, 0),
            ("alloc", a, 400 * mib, 0),
            ("free_completed", a, 400 * mib, 0),
            ("segment_map", b, 7000 * mib, 1),
            ("alloc", b, 7000 * mib, 1),
            // Released for a retry: the next map did not fit beside it.
            ("segment_unmap", a, 400 * mib, 0),
            ("segment_map", b + 7000 * mib, 1160 * mib, 1),
            ("alloc", b + 7000 * mib, 1160 * mib, 1),
        ],
    );
    let v = json(&cachealloc(&[
        "replay",
        path.to_str().unwrap(),
        "--faithful",
        "--json",
    ]));
    std::fs::remove_file(&path).unwrap();
    let (capacity, memory) = (
        v["capacity_bytes"].as_u64().unwrap(),
        v["device_memory_bytes"].as_u64().unwrap(),
    );
    assert_eq!(capacity, memory, "{v}");
    assert!(memory < 8 * GIB, "{v}");
    assert_eq!(v["num_alloc_retries"], 1, "{v}");
    assert_eq!(v["allocs_at_recorded_addr"], 3, "{v}");
}

/// A recording whose file does not name its device's memory, as a PyTorch snapshot does not:
/// a run of expandable segments under a memory fraction, on a device whose context holds
/// 300 MiB, saved with its range and `device_memory` lines taken out. Given the device's
/// memory, a faithful replay reproduces the run; without it, the fraction's limit and the
/// ranges are taken from the capacity, and it does not.
#[test]
fn a_recording_without_its_memory_replays_faithfully_when_given_it() {
    let dir = std::env::temp_dir();
    let id = std::process::id();
    let saved = dir.join(format!("cachealloc-device-memory-run-{id}.jsonl"));
    let stripped = dir.join(format!("cachealloc-device-memory-stripped-{id}.jsonl"));
    let synth = json(&cachealloc(&[
        "synth",
        "transformer:steps=2",
        "--conf",
        "expandable_segments:True,per_process_memory_fraction:0.7",
        "--capacity",
        "5GiB",
        "--device-memory",
        "5420MiB",
        "--json",
        "--save",
        saved.to_str().unwrap(),
    ]));
    assert!(synth["num_alloc_retries"].as_u64().unwrap() > 0, "{synth}");
    copy_without(
        &saved,
        &["range_reserve", "range_release", "device_memory"],
        &stripped,
    );
    let s = stripped.to_str().unwrap();
    let given = json(&cachealloc(&[
        "replay",
        s,
        "--faithful",
        "--device-memory",
        "5420MiB",
        "--json",
    ]));
    let guessed = json(&cachealloc(&["replay", s, "--faithful", "--json"]));
    std::fs::remove_file(&saved).unwrap();
    std::fs::remove_file(&stripped).unwrap();
    for key in [
        "peak_reserved_bytes",
        "num_device_alloc",
        "num_device_free",
        "num_alloc_retries",
        "num_ooms",
        "device_memory_bytes",
    ] {
        assert_eq!(given[key], synth[key], "{key}");
    }
    assert_eq!(given["allocs_at_recorded_addr"], given["allocs"]);
    assert_ne!(guessed["device_memory_bytes"], synth["device_memory_bytes"]);
    assert!(
        guessed["num_alloc_retries"] != synth["num_alloc_retries"]
            || guessed["allocs_at_recorded_addr"] != guessed["allocs"],
        "{guessed}"
    );
}

/// A PyTorch snapshot's start state that the device memory given cannot hold is refused, naming
/// the option to change.
#[test]
fn a_start_state_beyond_the_device_memory_names_the_option() {
    let Some(snapshot) = trace("cs336-magma27/15883f2/memory_snapshot.pickle") else {
        return;
    };
    let out = cachealloc(&[
        "replay",
        snapshot.to_str().unwrap(),
        "--faithful",
        "--device-memory",
        "20MiB",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "the segments live at the start of the recording hold 13.21 GiB (14180941824 bytes), \
             more than --device-memory 20.00 MiB gives the allocator; give --device-memory of at \
             least that"
        ),
        "{err}"
    );
    // The refusal alone: no note on the device's size, as if the replay went on.
    assert!(!err.contains("note:"), "{err}");
}

/// A recording's capacity beyond the device memory given: the device has the memory given,
/// all of it available, and a note says the replay departs from the recording.
#[test]
fn a_smaller_device_memory_holds_the_recorded_capacity() {
    let path = two_ranges_9_gib_apart("smaller");
    let p = path.to_str().unwrap();
    // No OOM: the recording's capacity is unknown, and the device memory given is all of it.
    let v = json(&cachealloc(&[
        "replay",
        p,
        "--faithful",
        "--device-memory",
        "6GiB",
        "--json",
    ]));
    assert_eq!(v["capacity_bytes"].as_u64(), Some(6 * GIB), "{v}");
    std::fs::remove_file(&path).unwrap();

    // The capacity of a run that released a cached segment to fit a request (600 MiB, then
    // 800 MiB) on a device of 1 GiB: inferred from the retry, and held to the device's memory.
    let path = write_retry_on_1_gib_device("device-memory-smaller");
    let out = cachealloc(&[
        "replay",
        path.to_str().unwrap(),
        "--faithful",
        "--device-memory",
        "900MiB",
        "--json",
    ]);
    std::fs::remove_file(&path).unwrap();
    let v = json(&out);
    assert_eq!(v["capacity_bytes"].as_u64(), Some(900 * MIB), "{v}");
    assert_eq!(v["device_memory_bytes"].as_u64(), Some(900 * MIB), "{v}");
    assert_eq!(v["num_alloc_retries"], 1, "{v}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "note: the capacity found for the recording, 1024.00 MiB, is more than \
             --device-memory 900.00 MiB: the replay's device has 900.00 MiB"
        ),
        "{err}"
    );
}

/// A cachealloc recording on a 1 GiB device (its `device_memory` line) that neither ran out of
/// memory nor retried: nothing brackets its capacity, but a faithful what-if under other
/// settings still runs on no more than the device's memory. Three 300 MiB requests, rounded to
/// 384 MiB under roundup_power2_divisions:2, do not all fit there.
#[test]
fn a_faithful_what_if_keeps_the_recorded_device_memory() {
    let base = 0x7f00_0000_0000u64;
    let mib = MIB;
    let mut events = vec![("device_memory", 0, 1024 * mib, 0)];
    for i in 0..3 {
        let addr = base + i * 0x1000_0000;
        events.push(("segment_alloc", addr, 300 * mib, 0));
        events.push(("alloc", addr, 300 * mib, 0));
    }
    let path = write_trace("three-on-1-gib", &events);
    let p = path.to_str().unwrap();
    let as_recorded = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
    assert_eq!(as_recorded["capacity_bytes"], 1024 * mib);
    assert_eq!(as_recorded["capacity_is_device_memory"], true);
    assert_eq!(as_recorded["num_ooms"], 0);
    let what_if = json(&cachealloc(&[
        "replay",
        p,
        "--faithful",
        "--conf",
        "roundup_power2_divisions:2",
        "--json",
    ]));
    assert_eq!(what_if["capacity_bytes"], 1024 * mib, "{what_if}");
    assert_eq!(what_if["num_ooms"], 1, "{what_if}");
    let text = cachealloc(&["replay", p, "--faithful"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(
            "device capacity: 1024.00 MiB (the device's whole memory: nothing in the recording \
             brackets less)"
        ),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}
