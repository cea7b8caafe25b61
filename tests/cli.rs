//! The `cachealloc` command line as a user meets it: synthetic demo, replay of real snapshots
//! (plain, with a capacity, faithful), and clear errors with exit code 2 for bad input.

mod support;

use std::process::Command;
use support::cli::{cachealloc, cachealloc_with, json};
use support::trace_lines::{
    write_native_then_expandable, write_retry_on_1_gib_device, write_trace, write_trace_of_version,
    write_trace_with_settings,
};
use support::traces::trace;

#[test]
fn synth_demo_prints_the_summary_table() {
    let out = cachealloc(&["synth", "transformer:steps=4", "--capacity", "8GiB"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("cachealloc memory summary, device ID 0"),
        "{text}"
    );
    assert!(text.contains("GPU reserved memory"));
    assert!(text.contains("cudaMalloc"));
}

#[test]
fn synth_json_is_deterministic_and_complete() {
    let a = json(&cachealloc(&[
        "synth",
        "transformer:steps=3",
        "--seed",
        "7",
        "--json",
    ]));
    let b = json(&cachealloc(&[
        "synth",
        "transformer:steps=3",
        "--seed",
        "7",
        "--json",
    ]));
    assert_eq!(a, b);
    for key in [
        "trace",
        "device",
        "events",
        "orphan_frees",
        "frees_of_failed_allocs",
        "requests_too_large",
        "peak_allocated_bytes",
        "peak_requested_bytes",
        "peak_reserved_bytes",
        "final_reserved_bytes",
        "num_device_alloc",
        "num_device_free",
        "num_alloc_retries",
        "num_ooms",
        "first_oom_event_index",
        "recorded_peak_reserved_bytes",
        "recorded_segment_allocs",
        "recorded_oom",
        "fitting_settings",
        "report_suggestion",
        "first_oom_report",
        "memory_stats",
    ] {
        assert!(a.get(key).is_some(), "missing {key}");
    }
    // PyTorch's flattened statistics: 9 stat arrays and 2 oversize stats, 4 figures each, over
    // all / large_pool / small_pool for the arrays, plus 6 counters.
    let stats = a["memory_stats"].as_object().unwrap();
    assert_eq!(stats.len(), 9 * 3 * 4 + 2 * 4 + 6);
    assert_eq!(stats["allocated_bytes.all.peak"], a["peak_allocated_bytes"]);
    assert_eq!(
        stats["reserved_bytes.all.current"],
        a["final_reserved_bytes"]
    );
    assert_eq!(stats["num_device_alloc"], a["num_device_alloc"]);
    assert_eq!(stats["max_split_size"], -1);
    assert!(
        a["peak_reserved_bytes"].as_u64().unwrap() >= a["peak_allocated_bytes"].as_u64().unwrap()
    );
}

#[test]
fn discrete_diffusion_with_its_capacity_reproduces_the_recorded_oom() {
    let Some(t) = trace("discrete_diffusion/657e3e3/memory_snapshot.json") else {
        return;
    };
    // Reserved at the OOM (22,218 MiB) + device free (252.38 MiB).
    let v = json(&cachealloc(&[
        "replay",
        t.to_str().unwrap(),
        "--capacity",
        "22470.375MiB",
        "--json",
    ]));
    assert_eq!(v["num_ooms"], 1);
    assert_eq!(v["num_alloc_retries"], 1, "one counted retry");
    assert_eq!(v["first_oom_event_index"], 1117);
    assert_eq!(v["recorded_oom"]["event_index"], 1117);
    assert_eq!(v["num_device_alloc"], v["recorded_segment_allocs"]);
    assert_eq!(v["num_device_free"], v["recorded_segment_frees"]);
    assert_eq!(v["peak_reserved_bytes"], v["recorded_peak_reserved_bytes"]);
    let text = String::from_utf8(
        cachealloc(&["replay", t.to_str().unwrap(), "--capacity", "22470.375MiB"]).stdout,
    )
    .unwrap();
    assert!(
        text.contains("First out-of-memory at trace entry 1117:"),
        "{text}"
    );
    // The recording's own failed request is one of the events, and named.
    assert_eq!(v["recorded_oom_requests"], 1);
    assert!(
        text.contains("1 failed request of the recording, requested again"),
        "{text}"
    );
    // A faithful replay of a recording that names no settings says so.
    let text = String::from_utf8(cachealloc(&["replay", t.to_str().unwrap(), "--faithful"]).stdout)
        .unwrap();
    assert!(
        text.contains("  settings: defaults (the recording names none)\n"),
        "{text}"
    );
    // Without a capacity the same trace fits: the what-if default is an unlimited device.
    let free = json(&cachealloc(&["replay", t.to_str().unwrap(), "--json"]));
    assert_eq!(free["num_ooms"], 0);
    // The reserved memory at the end is below the peak: the run gave some back.
    assert_eq!(free["peak_reserved_bytes"], 23_397_924_864u64);
    assert_eq!(free["final_reserved_bytes"], 22_571_646_976u64);
    let text = String::from_utf8(cachealloc(&["replay", t.to_str().unwrap()]).stdout).unwrap();
    assert!(text.contains("not requested again (no capacity)"), "{text}");
    // The recording's figures beside the replay's, its out-of-memory error among them.
    assert!(
        text.contains(
            "  recorded: peak reserved 21.79 GiB | 126 cudaMalloc, 6 cudaFree | retries 1 | OOM at \
             trace entry 1117 (384.00 MiB requested)\n"
        ),
        "{text}"
    );
}

/// Slips a user makes on the command line are named with the fix: a key joined to its value
/// by '=', a capacity without its unit, a key given twice, a library option.
#[test]
fn command_line_slips_are_named_with_the_fix() {
    let stderr = |args: &[&str]| {
        let out = cachealloc(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(
        stderr(&["synth", "--conf", "max_split_size_mb=128"]),
        (
            Some(2),
            "cachealloc: error: --conf: 'max_split_size_mb=128': a key and its value are joined \
             by ':', not '=' (write max_split_size_mb:128)\n"
                .to_string()
        )
    );
    for option in ["--device", "--faithful"] {
        let (code, err) = stderr(&["synth", "transformer", option]);
        assert_eq!(code, Some(2));
        assert!(
            err.starts_with(&format!(
                "cachealloc: error: synth: {option} applies to a recorded trace"
            )),
            "{err}"
        );
    }
    let (code, err) = stderr(&["synth", "--capacity", "24"]);
    assert_eq!(code, Some(2));
    // Refused by the argument parser, said in the same form as the rest.
    assert!(
        err.starts_with("cachealloc: error: invalid value '24' for '--capacity <CAPACITY>'"),
        "{err}"
    );
    assert!(
        err.contains(
            "invalid capacity \"24\": 24 bytes cannot hold a single segment (the smallest is \
             2 MiB) (a number without a unit is bytes: for gibibytes write 24GiB)"
        ),
        "{err}"
    );
    for slip in [&["replay", "--bogus"][..], &["bogus"], &["replay"]] {
        let (code, err) = stderr(slip);
        assert_eq!(code, Some(2), "{slip:?}");
        assert!(err.starts_with("cachealloc: error: "), "{slip:?}: {err}");
    }
    // Help asked for by giving no command is help, not an error.
    let (code, err) = stderr(&[]);
    assert_eq!(code, Some(2));
    assert!(err.starts_with("A caching CUDA allocator"), "{err}");
    let (code, err) = stderr(&[
        "synth",
        "transformer:steps=1",
        "--conf",
        "max_split_size_mb:128,stats:text,max_split_size_mb:256",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(
        err,
        "cachealloc: warning: --conf: max_split_size_mb is given more than once: \
         max_split_size_mb:256 replaces max_split_size_mb:128, as in PyTorch\ncachealloc: warning: --conf stats: configures the preloaded library, not the \
         pool, and has no effect on cachealloc synth\n"
    );
}

/// The out-of-memory report names the device that was replayed, not device 0.
#[test]
fn an_oom_report_names_the_replayed_device() {
    let Some(t) = trace("code_location/52e52b2/memory_snapshot.pickle") else {
        return;
    };
    let out = cachealloc(&[
        "replay",
        t.to_str().unwrap(),
        "--device",
        "2",
        "--capacity",
        "12GiB",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("device ID 2"), "{text}");
    assert!(text.contains("GPU 2 has a total capacity"), "{text}");
}

/// Snapshots of the memory state alone (no allocation in their trace) and a capacity below
/// what a faithful replay starts with are refused with exit code 2, not replayed as nothing.
#[test]
fn nothing_to_replay_and_a_capacity_below_the_start_state_are_refused() {
    let cases = [
        (
            "flexgen-llm-inference/41810ba/oom_snapshot.pickle",
            &[][..],
            "holds no allocation or free: nothing to replay",
        ),
        (
            "flexgen-llm-inference/41810ba/oom_snapshot.pickle",
            &["--faithful"][..],
            "holds no allocation or free: nothing to replay",
        ),
        (
            "sketchkv2/b118ae0/my_snapshot.pickle",
            &[][..],
            "only 1 free of memory allocated before it began: replay it with --faithful",
        ),
        (
            "cs336-magma27/15883f2/memory_snapshot.pickle",
            &["--faithful", "--capacity", "1GiB"][..],
            "more than the device capacity of 1024.00 MiB",
        ),
    ];
    for (rel, extra, needle) in cases {
        let Some(t) = trace(rel) else {
            continue;
        };
        let mut args = vec!["replay", t.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = cachealloc(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        // The refusal says enough: no note on the device's size before it.
        assert!(!err.contains("note:"), "{args:?}: {err}");
        // It names the command that reports the state instead: the device is the one `state`
        // takes by itself, so without --device.
        if needle.contains("nothing to replay") {
            let command = format!("which cachealloc state {} reports", t.display());
            assert!(err.contains(&command), "{args:?}: {err}");
        }
    }
}

/// Without `--device`, a replay takes the first device whose trace allocates or frees, not a
/// device whose trace holds only the snapshot marker (layout-editing: device 0 holds the
/// marker, device 1 the trace's one free).
#[test]
fn the_default_device_is_the_first_with_allocations_or_frees() {
    let Some(t) = trace("layout-editing/413b2eb/dump_snapshot.pickle") else {
        return;
    };
    let path = t.to_str().unwrap();
    let out = cachealloc(&["replay", path]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("device 1's trace (1 entry) holds no allocation, only 1 free"),
        "{err}"
    );
    let out = cachealloc(&["replay", path, "--faithful", "--json"]);
    let j = json(&out);
    assert_eq!(j["device"], 1);
    assert_eq!(j["events"], 1);
    // The device left out is named, with how to replay it.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "cachealloc: note: {path}: replaying device 1; the file also traces device 0 \
             (--device N replays another)"
        )),
        "{err}"
    );
    // Asked for, device 0 is still replayed (and has nothing to replay). Nor has it memory
    // for `state` to report: the message points to the device that has, with the command that
    // reports it (which takes device 1 by itself).
    let out = cachealloc(&["replay", path, "--device", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("device 0's trace (1 entry) holds no allocation or free")
            && err.contains("records no memory reserved on it")
            && err.contains(&format!(
                "memory reserved on device 1: cachealloc state {path})"
            )),
        "{err}"
    );
    let state = cachealloc(&["state", path]);
    assert!(state.status.success());
    let text = String::from_utf8_lossy(&state.stdout);
    assert!(text.contains(", device 1:"), "{text}");
}

/// The same for a cachealloc trace: a device whose only events are markers (a device reset)
/// is passed over for the device that allocated.
#[test]
fn a_recorded_trace_defaults_to_the_device_that_allocated() {
    let header = r#"{"format":"cachealloc-trace","version":1,"pid":1,"devices":[0,1],"settings":"","free_sync":"device"}"#;
    let lines = [
        header,
        r#"{"t_us":1,"device":0,"action":"device_reset","addr":0,"size":0,"stream":0}"#,
        r#"{"t_us":2,"device":1,"action":"segment_alloc","addr":139637976727552,"size":2097152,"stream":0}"#,
        r#"{"t_us":3,"device":1,"action":"alloc","addr":139637976727552,"size":512,"stream":0}"#,
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("markers-first.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let out = cachealloc(&["replay", path.to_str().unwrap(), "--json"]);
    let j = json(&out);
    assert_eq!(j["device"], 1, "{j}");
    assert_eq!(j["allocs"], 1, "{j}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("replaying device 1; the file also traces device 0 (--device N"),
        "{err}"
    );
    // Asked for by number, no note.
    let out = cachealloc(&["replay", path.to_str().unwrap(), "--device", "1", "--json"]);
    assert_eq!(json(&out)["device"], 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("also traces"), "{err}");
}

/// A faithful replay's search names the values under which the recorded start state cannot
/// exist instead of counting them as tried, and every value it lists as fitting, passed back
/// as `--conf`, replays without an out-of-memory.
#[test]
fn a_faithful_search_names_the_values_it_cannot_replay() {
    let Some(t) =
        trace("cs336-wedsonlin/8630bcf/results/medium_512_training_memory_snapshot.pickle")
    else {
        return;
    };
    let args = [
        "replay",
        t.to_str().unwrap(),
        "--faithful",
        "--capacity",
        "11.75GiB",
    ];
    let v = json(&cachealloc(&[&args[..], &["--json"]].concat()));
    assert!(v["num_ooms"].as_u64().unwrap() > 0, "{v}");
    // Its start state's split segments hold blocks, free ones included, of 64 MiB and more:
    // none of those values could have led to it, and no other fits.
    assert_eq!(
        v["max_split_sizes_not_replayable"],
        serde_json::json!([64, 48, 32, 20])
    );
    assert_eq!(v["fitting_settings"], serde_json::json!([]), "{v}");
    let suggestion = &v["report_suggestion"];
    assert_eq!(suggestion["conf"], "max_split_size_mb:32", "{suggestion}");
    assert_eq!(suggestion["tried"], false, "{suggestion}");
    let text = String::from_utf8(cachealloc(&args).stdout).unwrap();
    assert!(
        text.contains("(max_split_size_mb:32, the report's suggestion, cannot be replayed"),
        "{text}"
    );
    assert!(
        text.contains("(max_split_size_mb values 64, 48, 32, 20 were not tried: ")
            && text.contains("could not exist under them.)"),
        "{text}"
    );
    // The values the search did try are the others.
    assert!(
        text.contains(
            "No max_split_size_mb value tried (1024, 512, 256, 128; other settings as in this \
             replay) lets this workload run"
        ),
        "{text}"
    );
    // Every value listed as fitting fits when given.
    let Some(t) = trace("sqattn/126d2e6/cuda_memory_snapshot.pickle") else {
        return;
    };
    let args = [
        "replay",
        t.to_str().unwrap(),
        "--faithful",
        "--capacity",
        "5.1GiB",
    ];
    let v = json(&cachealloc(&[&args[..], &["--json"]].concat()));
    assert!(v["num_ooms"].as_u64().unwrap() > 0, "{v}");
    let fits = v["fitting_settings"].as_array().unwrap();
    assert!(!fits.is_empty());
    for fit in fits {
        let conf = fit["conf"].as_str().unwrap();
        let again = json(&cachealloc(
            &[&args[..], &["--conf", conf, "--json"]].concat(),
        ));
        assert_eq!(again["num_ooms"], 0, "{conf}");
        assert_eq!(
            again["peak_reserved_bytes"], fit["peak_reserved_bytes"],
            "{conf}"
        );
    }
    // One value: in the singular.
    let Some(t) = trace("octree-nca/e67173f/my_snapshot.pickle") else {
        return;
    };
    let path = t.to_str().unwrap();
    let args = ["replay", path, "--faithful", "--capacity", "2GiB"];
    let text = String::from_utf8(cachealloc(&args).stdout).unwrap();
    assert!(
        text.contains("(max_split_size_mb value 20 was not tried: ")
            && text.contains("could not exist under it.)"),
        "{text}"
    );
}

#[test]
fn faithful_replay_lands_every_allocation_at_its_recorded_address() {
    let Some(t) = trace("sqattn/126d2e6/cuda_memory_snapshot.pickle") else {
        return;
    };
    let v = json(&cachealloc(&[
        "replay",
        t.to_str().unwrap(),
        "--faithful",
        "--json",
    ]));
    assert_eq!(v["mode"], "faithful");
    assert_eq!(v["allocs_at_recorded_addr"], v["allocs"]);
    assert_eq!(v["num_device_alloc"], 420);
    // A faithful replay takes the recording's settings: a variable set for the library is not
    // mentioned, as it could not apply.
    let out = cachealloc_with(
        &["replay", t.to_str().unwrap(), "--faithful"],
        &[("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")],
    );
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(v["num_device_free"], 420);
    assert_eq!(v["peak_reserved_bytes"], v["recorded_peak_reserved_bytes"]);
    // Plain replay starts empty: frees of memory allocated before recording are counted, skipped.
    let text = String::from_utf8(cachealloc(&["replay", t.to_str().unwrap()]).stdout).unwrap();
    assert!(
        text.contains(
            "events: 5851 (2912 allocations, 2911 frees, 28 empty_cache calls)\n  not \
             replayed: 1 free of memory from before the trace (the recording began with \
             memory allocated, which this replay starts without: --faithful rebuilds it)\n"
        ),
        "{text}"
    );
}

/// Frees of memory allocated before recording began are counted from the trace (438 of the
/// 7,370 `free_completed` entries of this one, counted independently with Python's pickle),
/// apart from frees of allocations that failed in the replay itself.
#[test]
fn orphan_frees_count_the_traces_frees_of_earlier_memory() {
    let Some(t) =
        trace("cs336-wedsonlin/8630bcf/results/medium_1024_training_memory_snapshot.pickle")
    else {
        return;
    };
    let v = json(&cachealloc(&["replay", t.to_str().unwrap(), "--json"]));
    assert_eq!(v["orphan_frees"], 438);
    assert_eq!(v["frees_of_failed_allocs"], 0);
    assert_eq!(v["frees"].as_u64().unwrap() + 438, 7370);
    let Some(d) = trace("decomfl/edd30e0/memory.pickle") else {
        return;
    };
    // Recorded from process start: no orphans. On a small device, allocations fail, and
    // their frees are skipped and counted apart.
    let v = json(&cachealloc(&[
        "replay",
        d.to_str().unwrap(),
        "--capacity",
        "512MiB",
        "--json",
    ]));
    assert_eq!(v["orphan_frees"], 0);
    assert!(v["num_ooms"].as_u64().unwrap() > 0);
    assert!(v["frees_of_failed_allocs"].as_u64().unwrap() > 0);
    assert_eq!(
        v["frees"].as_u64().unwrap() + v["frees_of_failed_allocs"].as_u64().unwrap(),
        json(&cachealloc(&["replay", d.to_str().unwrap(), "--json"]))["frees"]
            .as_u64()
            .unwrap()
    );
}

/// A faithful replay of the expandable-segments recording reproduces it: its page maps and
/// unmaps, retries, its OOM, and every allocation's address.
#[test]
fn faithful_replay_of_an_expandable_trace_reproduces_it() {
    let Some(t) = trace("code_location/52e52b2/memory_snapshot.pickle") else {
        return;
    };
    let path = t.to_str().unwrap();
    let j = json(&cachealloc(&[
        "replay",
        path,
        "--device",
        "1",
        "--faithful",
        "--json",
    ]));
    // The recording's settings: expandable segments, which count no segments.
    assert_eq!(j["settings"], "as recorded: expandable_segments:True");
    assert_eq!(j["expandable_segments"], true);
    assert_eq!(j["memory_stats"]["segment.all.peak"], 0);
    assert_eq!(j["num_device_alloc"], 40);
    assert_eq!(j["num_device_free"], 6);
    assert_eq!(j["num_alloc_retries"], 2);
    assert_eq!(j["first_oom_event_index"], 421);
    assert_eq!(j["recorded_oom"]["event_index"], 421);
    assert_eq!(j["peak_reserved_bytes"], j["recorded_peak_reserved_bytes"]);
    assert_eq!(j["allocs_at_recorded_addr"], 199);
    let out = cachealloc(&["replay", path, "--device", "1", "--faithful"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("device calls: 40 segment maps, 6 unmaps | retries 2 | OOMs 1"),
        "{text}"
    );
    assert!(!text.contains("this replay did not"), "{text}");
}

/// A plain replay of an expandable-segments recording compares with what the recording did
/// (pages mapped and unmapped, no cudaMalloc), and says that the replay used native segments.
#[test]
fn an_expandable_recording_is_compared_by_its_maps_and_unmaps() {
    let Some(t) = trace("code_location/52e52b2/memory_snapshot.pickle") else {
        return;
    };
    let path = t.to_str().unwrap();
    let j = json(&cachealloc(&["replay", path, "--device", "1", "--json"]));
    assert_eq!(j["recorded_expandable_segments"], true);
    assert_eq!(
        j["expandable_segments"], false,
        "a plain replay uses --conf's settings"
    );
    assert_eq!(j["recorded_segment_maps"], 40);
    assert_eq!(j["recorded_segment_unmaps"], 6);
    assert_eq!(j["recorded_segment_allocs"], 0);
    let out = cachealloc(&["replay", path, "--device", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "recorded (expandable segments): peak reserved 78.42 GiB | 40 segment maps, 6 unmaps"
        ),
        "{text}"
    );
    assert!(
        text.contains("the recording used expandable_segments:True and this replay did not"),
        "{text}"
    );
    assert!(
        text.contains("(--conf expandable_segments:True or --faithful replays them)"),
        "{text}"
    );
    // A faithful what-if under --conf without them: --faithful is there already.
    let out = cachealloc(&[
        "replay",
        path,
        "--device",
        "1",
        "--faithful",
        "--conf",
        "max_split_size_mb:256",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(add expandable_segments:True to --conf, which replaces the recording's"),
        "{text}"
    );
    // A native recording keeps its cudaMalloc line and no such note.
    let Some(native) = trace("decomfl/edd30e0/memory.pickle") else {
        return;
    };
    let j = json(&cachealloc(&["replay", native.to_str().unwrap(), "--json"]));
    assert_eq!(j["recorded_expandable_segments"], false);
    let out = cachealloc(&["replay", native.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("recorded: peak reserved 1.77 GiB | 61 cudaMalloc, 0 cudaFree"));
    assert!(!text.contains("this replay did not"), "{text}");
}

/// A recording that made a native segment before expandable segments were turned on counts
/// both kinds of device call.
#[test]
fn a_recording_of_native_and_expandable_segments_counts_both() {
    let path = write_native_then_expandable("native-then-expandable");
    let out = cachealloc(&["replay", path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "  recorded (expandable segments): peak reserved 60.00 MiB | 1 cudaMalloc, 0 cudaFree, \
             2 segment maps, 0 unmaps | retries 0\n"
        ),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn bad_input_exits_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pickle");
    std::fs::write(&garbage, b"\x80\x04this is not a pickle at all").unwrap();
    let text = dir.path().join("notes.json");
    std::fs::write(&text, b"{\"segments\": []}").unwrap();
    let plain = dir.path().join("run.log");
    std::fs::write(&plain, b"step 1: loss 2.31\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["replay".into(), "/nonexistent/snap.pickle".into()],
            "/nonexistent/snap.pickle",
        ),
        (
            vec!["replay".into(), garbage.display().to_string()],
            "garbage.pickle",
        ),
        (
            vec!["replay".into(), text.display().to_string()],
            "notes.json",
        ),
        (
            vec!["replay".into(), plain.display().to_string()],
            "or a trace cachealloc recorded (CACHEALLOC_CONF=trace:PATH)",
        ),
        (
            vec!["synth".into(), "--capacity".into(), "12 parsecs".into()],
            "invalid size",
        ),
        (
            vec!["synth".into(), "--capacity".into(), "-5GiB".into()],
            "invalid size \"-5GiB\"",
        ),
        (
            vec!["synth".into(), "--capacity".into(), "0".into()],
            "a device needs more than 0 bytes",
        ),
        (
            vec![
                "synth".into(),
                "--capacity".into(),
                "99999999999999999999999".into(),
            ],
            "the simulated device has 140733191290880 bytes of address space",
        ),
        (
            vec!["synth".into(), "loguniform:ops=99999999999".into()],
            "at most 10000000",
        ),
        (
            vec![
                "synth".into(),
                "loguniform:budget_gib=1,min=2147483648,max=4294967296,ops=1000".into(),
            ],
            "loguniform min=2147483648 is more than budget_gib=1 (1073741824 bytes)",
        ),
        (
            vec!["synth".into(), "transformer:seq=-5".into()],
            "parameter seq=\"-5\" is not LO-HI (two whole numbers, such as 128-1024)",
        ),
        (
            vec![
                "synth".into(),
                "--conf".into(),
                "max_split_size_mb:10".into(),
            ],
            "max_split_size_mb",
        ),
        (
            vec!["synth".into(), "resnet".into()],
            "allowed: transformer, loguniform",
        ),
        (
            vec![
                "replay".into(),
                "x.pickle".into(),
                "--device".into(),
                "-1".into(),
            ],
            "not a device ordinal: expected a whole number from 0 to 2147483647",
        ),
        (
            vec![
                "replay".into(),
                "x.pickle".into(),
                "--device".into(),
                "gpu0".into(),
            ],
            "not a device ordinal: expected a whole number from 0 to 2147483647",
        ),
        (
            vec![
                "replay".into(),
                "x.pickle".into(),
                "--conf".into(),
                "roundup_power2_divisions:[256:1,512]".into(),
            ],
            "allowed: power of 2, or list [MB:div,...,>:div]",
        ),
        (
            vec![
                "replay".into(),
                "x.pickle".into(),
                "--conf".into(),
                "max_split_size_mb:[128]".into(),
            ],
            "max_split_size_mb:[128]: expects a single value, not a list",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = cachealloc(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(needle),
            "{args:?}: message {err:?} should name {needle:?}"
        );
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

/// `loguniform:ops=3000`'s JSON on a device of `capacity`.
fn synth_loguniform(capacity: &str) -> serde_json::Value {
    json(&cachealloc(&[
        "synth",
        "loguniform:ops=3000",
        "--capacity",
        capacity,
        "--json",
    ]))
}

/// The transformer workload's JSON on a device of `capacity`, with extra options.
fn synth(capacity: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["synth", "transformer", "--capacity", capacity, "--json"];
    args.extend_from_slice(extra);
    json(&cachealloc(&args))
}

/// The transformer workload's summary on a device of `capacity`, with extra options.
fn synth_text(capacity: &str, extra: &[&str]) -> String {
    let mut args = vec!["synth", "transformer", "--capacity", capacity];
    args.extend_from_slice(extra);
    String::from_utf8(cachealloc(&args).stdout).unwrap()
}

/// A value that fits with a single retry says so in the singular (four training steps on a
/// 5.5 GiB device).
#[test]
fn a_fit_with_one_retry_says_so() {
    let args = ["synth", "transformer:steps=4", "--capacity", "5.5GiB"];
    let v = json(&cachealloc(&[&args[..], &["--json"]].concat()));
    let fits = v["fitting_settings"].as_array().unwrap();
    let once = fits.iter().filter(|f| f["num_alloc_retries"] == 1).count();
    assert!(once > 0, "{v}");
    let text = String::from_utf8(cachealloc(&args).stdout).unwrap();
    assert_eq!(text.matches(" cudaMalloc, 1 retry").count(), once, "{text}");
    assert!(!text.contains("1 retries"), "{text}");
}

/// The summary's events add up, with the frees of allocations that ran out of memory (skipped)
/// named apart, and its peaks are each the figure it names.
#[test]
fn the_events_and_peaks_lines_after_an_oom() {
    let out = cachealloc(&["synth", "--capacity", "5800MiB"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(
            "\n  events: 51324 (25884 allocations, 25439 frees, 1 free of allocations that ran \
             out of memory, skipped, 0 empty_cache calls)\n"
        ),
        "{text}"
    );
    // The peaks, each under its own name (the JSON: 5730675712, 5721158712, 6029312000).
    assert!(
        text.contains(
            "\n  peak allocated 5.34 GiB | peak requested 5.33 GiB | peak reserved 5.62 GiB | final \
             reserved 5.62 GiB\n"
        ),
        "{text}"
    );
    // The statistics table in full, with each pool's rows, as memory_summary() prints it.
    assert!(
        text.contains("\n|       from large pool |")
            && text.contains("\n|       from small pool |"),
        "{text}"
    );
    let j = json(&cachealloc(&["synth", "--capacity", "5800MiB", "--json"]));
    assert_eq!(j["peak_allocated_bytes"], 5_730_675_712u64, "{j}");
    assert_eq!(j["peak_requested_bytes"], 5_721_158_712u64, "{j}");
    assert_eq!(j["peak_reserved_bytes"], 6_029_312_000u64, "{j}");
}

/// A request of 1 EB or more is refused as PyTorch refuses it (no OOM counted), and the summary
/// says how many were.
#[test]
fn requests_of_an_exabyte_are_refused_and_counted() {
    let (a, eb) = (0x7f00_0000_0000u64, 1u64 << 60);
    let path = write_trace(
        "exabyte",
        &[
            ("alloc", a, eb, 0),
            ("free_completed", a, eb, 0),
            ("alloc", a, 1 << 20, 0),
        ],
    );
    let p = path.to_str().unwrap();
    let j = json(&cachealloc(&["replay", p, "--json"]));
    assert_eq!(j["requests_too_large"], 1, "{j}");
    assert_eq!(j["frees_of_failed_allocs"], 1, "{j}");
    assert_eq!(j["num_ooms"], 0, "{j}");
    let text = String::from_utf8_lossy(&cachealloc(&["replay", p]).stdout).into_owned();
    assert!(
        text.contains("\n  refused: 1 request of 1 EB or more (as PyTorch refuses them)\n"),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

/// A free the program requested that had not completed when the recording ended is counted
/// and said: its block is still active at the end.
#[test]
fn a_free_still_pending_at_the_end_is_said() {
    let a = 0x7f00_0000_0000u64;
    let path = write_trace(
        "pending-at-end",
        &[("alloc", a, 1 << 20, 0), ("free_requested", a, 1 << 20, 0)],
    );
    let p = path.to_str().unwrap();
    let j = json(&cachealloc(&["replay", p, "--json"]));
    assert_eq!(j["pending_frees"], 1, "{j}");
    assert_eq!(
        j["memory_stats"]["active_bytes.all.current"],
        1 << 20,
        "{j}"
    );
    let text = String::from_utf8_lossy(&cachealloc(&["replay", p]).stdout).into_owned();
    assert!(
        text.contains(
            "\n  still pending at the end: 1 allocation whose free was waiting for device work \
             when the recording ended (freed, still active: their blocks are not reusable yet)\n"
        ),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

/// A free that waited for device work (its `free_completed` comes later than its
/// `free_requested`) is one event, its free: the allocation leaves the allocation statistics
/// at the request, and its block stays active, not reusable, until the completion.
#[test]
fn a_free_completed_later_is_one_event() {
    let (a, mib) = (0x7f00_0000_0000u64, 1u64 << 20);
    let (v, text) = replay_written_trace(
        "completed-later",
        &[
            ("segment_alloc", a, 20 * mib, 0),
            ("alloc", a, 4 * mib, 0),
            ("alloc", a + 4 * mib, 4 * mib, 0),
            ("free_requested", a, 4 * mib, 0),
            ("alloc", a + 8 * mib, 4 * mib, 0),
            ("free_completed", a, 4 * mib, 0),
        ],
    );
    assert_eq!(
        (&v["events"], &v["allocs"], &v["frees"]),
        (&4.into(), &3.into(), &1.into()),
        "{v}"
    );
    assert_eq!(v["peak_allocated_bytes"], 8 * mib, "{v}");
    let stats = &v["memory_stats"];
    assert_eq!(stats["active_bytes.all.peak"], 12 * mib, "{v}");
    assert_eq!(stats["active_bytes.all.current"], 8 * mib, "{v}");
    assert_eq!(v["pending_frees"], 0, "{v}");
    assert!(
        text.contains("\n  events: 4 (3 allocations, 1 free, 0 empty_cache calls)\n"),
        "{text}"
    );
}

/// The program's synchronizations of the device (`device_synchronize` lines, version 7) are
/// events of the replay: the summary names them among the parts that add up to its count
/// (`device_synchronize_calls` in the JSON).
#[test]
fn the_program_s_synchronizations_are_counted_among_the_events() {
    let (a, mib) = (0x7f00_0000_0000u64, 1u64 << 20);
    let path = write_trace_of_version(
        "device-synchronize",
        7,
        "",
        &[
            ("segment_alloc", a, 20 * mib, 0),
            ("alloc", a, 4 * mib, 0),
            ("free_requested", a, 4 * mib, 0),
            ("device_synchronize", 0, 0, 0),
            ("free_completed", a, 4 * mib, 0),
            ("device_synchronize", 0, 0, 0),
        ],
    );
    let p = path.to_str().unwrap();
    let v = json(&cachealloc(&["replay", p, "--json"]));
    let text = String::from_utf8_lossy(&cachealloc(&["replay", p]).stdout).into_owned();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        (&v["events"], &v["allocs"], &v["frees"]),
        (&4.into(), &1.into(), &1.into()),
        "{v}"
    );
    assert_eq!(v["device_synchronize_calls"], 2, "{v}");
    assert!(
        text.contains(
            "\n  events: 4 (1 allocation, 1 free, 0 empty_cache calls, 2 device \
             synchronizations (cudaDeviceSynchronize))\n"
        ),
        "{text}"
    );
}

/// An out-of-memory during a CUDA graph capture while a free still waits for device work (its
/// `free_completed` comes after the request; outside a capture the retry's synchronization
/// would complete it): its block is reserved but no room for the request, so the report does
/// not call it fragmentation: here the 10 MiB held outside cachealloc is what is missing.
#[test]
fn a_block_whose_free_is_pending_is_no_room_in_the_oom_report() {
    let (a, mib) = (0x7f00_0000_0000u64, 1u64 << 20);
    let (b, c, d) = (a + 0x1000_0000, a + 0x2000_0000, a + 0x3000_0000);
    let path = write_trace_of_version(
        "pending-at-oom",
        6,
        "",
        &[
            ("alloc", a, 30 * mib, 0),
            ("alloc", b, 30 * mib, 0),
            ("alloc", c, 30 * mib, 0),
            ("free_requested", c, 30 * mib, 0),
            ("free_completed", c, 30 * mib, 0),
            ("free_requested", b, 30 * mib, 0),
            ("capture", 0, 42 * mib, 0),
            ("alloc", d, 42 * mib, 0),
            ("free_completed", b, 30 * mib, 0),
        ],
    );
    let p = path.to_str().unwrap();
    let args = [
        "replay",
        p,
        "--capacity",
        "100MiB",
        "--device-memory",
        "110MiB",
    ];
    let v = json(&cachealloc(&[&args[..], &["--json"]].concat()));
    let report = &v["first_oom_report"];
    assert_eq!(report["kind"], "untracked", "{v}");
    let text = report["text"].as_str().unwrap();
    assert!(
        text.contains(
            "Hint: Memory outside cachealloc: 10.00 MiB of this GPU is used by other processes, \
             CUDA contexts or other allocators; the request is 2.00 MiB short"
        ) && !text.contains("would hold"),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

/// A faithful replay says how many allocations landed at their recorded address; a plain
/// replay, which does not place them there, says nothing of it.
#[test]
fn a_faithful_replay_counts_the_allocations_at_their_recorded_address() {
    let (a, mib) = (0x7f00_0000_0000u64, 1u64 << 20);
    let path = write_trace(
        "at-recorded",
        &[
            ("segment_alloc", a, 20 * mib, 0),
            ("alloc", a, 4 * mib, 0),
            ("alloc", a + 4 * mib, 4 * mib, 0),
        ],
    );
    let p = path.to_str().unwrap();
    let text =
        String::from_utf8_lossy(&cachealloc(&["replay", p, "--faithful"]).stdout).into_owned();
    assert!(
        text.contains("\n  allocations at their recorded address: 2 of 2\n"),
        "{text}"
    );
    let j = json(&cachealloc(&["replay", p, "--json"]));
    assert!(j["allocs_at_recorded_addr"].is_null(), "{j}");
    let text = String::from_utf8_lossy(&cachealloc(&["replay", p]).stdout).into_owned();
    assert!(!text.contains("recorded address"), "{text}");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn an_oom_comes_with_settings_verified_to_fit() {
    let v = synth("5800MiB", &[]);
    assert!(
        v["num_ooms"].as_u64().unwrap() > 0,
        "default settings run out of memory here"
    );
    let fits = v["fitting_settings"]
        .as_array()
        .expect("an OOM lists fitting settings");
    assert!(!fits.is_empty());
    // Each suggestion, replayed on its own, really avoids every OOM.
    let conf = fits[0]["conf"].as_str().unwrap();
    let again = synth("5800MiB", &["--conf", conf]);
    assert_eq!(again["num_ooms"], 0, "{conf}");
    assert_eq!(again["peak_reserved_bytes"], fits[0]["peak_reserved_bytes"]);
    // The report's own suggestion was replayed too, and whether it fits is what replaying it
    // alone shows.
    let suggestion = &v["report_suggestion"];
    let conf = suggestion["conf"]
        .as_str()
        .expect("a fragmentation OOM suggests a value");
    let alone = synth("5800MiB", &["--conf", conf]);
    assert_eq!(
        suggestion["fits"].as_bool(),
        Some(alone["num_ooms"] == 0),
        "{conf}"
    );
    assert_eq!(suggestion["fits"], true, "{conf} should fit this workload");
    // The report itself, with the figures its conclusion rests on.
    let report = &v["first_oom_report"];
    assert_eq!(report["kind"], "fragmentation");
    // One stream: nothing is cached for another.
    assert_eq!(report["other_streams_free_bytes"], 0);
    assert_eq!(report["other_streams_largest_free_block_bytes"], 0);
    let mb = report["suggested_max_split_size_mb"].as_u64().unwrap();
    assert_eq!(conf, format!("max_split_size_mb:{mb}"));
    let largest = report["largest_free_blocks_bytes"][0].as_u64().unwrap();
    assert!(mb << 20 <= largest && largest < report["rounded_bytes"].as_u64().unwrap());
    assert!(
        report["text"]
            .as_str()
            .unwrap()
            .contains("Hint: Fragmentation")
    );
    // Every free cached block is counted, beyond the largest few the report lists.
    assert_eq!(report["free_blocks"], 76);
    assert!(
        report["text"]
            .as_str()
            .unwrap()
            .contains("138.15 MiB, 91.19 MiB, 38.24 MiB, 20.46 MiB (and 72 more)."),
        "{report}"
    );
    assert!(v["gets_furthest"].is_null(), "settings fit: nothing to add");
    // Settings that fit only by filling the device are marked so (they live on releasing
    // cached blocks: the retries), not shown as if they needed that memory.
    let text = synth_text("5800MiB", &[]);
    let full = fits
        .iter()
        .filter(|f| (5800u64 << 20) - f["peak_reserved_bytes"].as_u64().unwrap() < 20 << 20)
        .count();
    assert!(full > 0);
    assert_eq!(text.matches("(fills the device)").count(), full, "{text}");
    // The report's suggestion is marked among them, on its own line only.
    let marked: Vec<&str> = text
        .lines()
        .filter(|l| l.ends_with(" (the report's suggestion)"))
        .collect();
    assert_eq!(marked.len(), 1, "{text}");
    assert!(
        marked[0].starts_with(&format!("  --conf {conf} ")),
        "{text}"
    );
    // The JSON marks the same settings.
    let marked = fits
        .iter()
        .filter(|f| f["fills_memory_limit"] == true)
        .count();
    assert_eq!(marked, full);
    // Under a memory fraction the limit is the fraction's (PyTorch's allowed maximum, whole
    // bytes of 0.7 × 8 GiB), and the mark says so.
    let args = ["synth", "transformer", "--capacity", "8GiB"];
    let fraction = ["--conf", "per_process_memory_fraction:0.7"];
    let text = String::from_utf8(cachealloc(&[&args[..], &fraction].concat()).stdout).unwrap();
    let v = json(&cachealloc(&[&args[..], &fraction, &["--json"]].concat()));
    let limit = (0.7 * (8u64 << 30) as f64) as u64;
    let full = v["fitting_settings"]
        .as_array()
        .expect("the fraction makes the default settings run out")
        .iter()
        .filter(|f| {
            let fills = limit - f["peak_reserved_bytes"].as_u64().unwrap() < 20 << 20;
            assert_eq!(f["fills_memory_limit"], fills, "{f}");
            fills
        })
        .count();
    assert!(full > 0);
    assert_eq!(
        text.matches("(fills its memory fraction)").count(),
        full,
        "{text}"
    );
    assert!(!text.contains("(fills the device)"), "{text}");
    // No OOM, no suggestions.
    let fine = synth("8GiB", &[]);
    assert!(fine["fitting_settings"].is_null());
    assert!(fine["report_suggestion"].is_null());
    assert!(fine["first_oom_report"].is_null());
    assert!(fine["gets_furthest"].is_null());
}

/// When no value fits, the search still says which value gets past this out-of-memory and
/// where that one runs out itself, and the figure is what replaying that value alone shows;
/// when live memory alone exceeds the device, no value gets past it.
#[test]
fn without_a_fit_the_value_that_gets_furthest_is_named() {
    let v = synth("4.7GiB", &[]);
    assert_eq!(v["fitting_settings"].as_array().map(Vec::len), Some(0));
    let further = &v["gets_furthest"];
    let conf = further["conf"]
        .as_str()
        .expect("a value gets past this OOM");
    let at = further["first_oom_event_index"].as_u64().unwrap();
    assert!(at > v["first_oom_event_index"].as_u64().unwrap());
    let alone = synth("4.7GiB", &["--conf", conf]);
    assert_eq!(alone["first_oom_event_index"], at);
    let text = synth_text("4.7GiB", &[]);
    assert!(
        text.contains(&format!(
            "it needs more memory. With --conf {conf} it gets past this out-of-memory and first \
             runs out at operation {at}."
        )),
        "{text}"
    );
    // The value the report's hint named is among those tried, and the summary says so.
    let suggested = &v["report_suggestion"];
    assert_eq!(
        (
            &suggested["tried"],
            &suggested["fits"],
            &suggested["gets_further"]
        ),
        (&true.into(), &false.into(), &false.into())
    );
    assert!(
        text.contains(&format!(
            "  ({}, the report's suggestion, was tried and does not get past this \
             out-of-memory.)\n",
            suggested["conf"].as_str().unwrap()
        )),
        "{text}"
    );
    // A suggestion that gets past the out-of-memory but not through the workload says so.
    let v = synth_loguniform("4GiB");
    let suggested = &v["report_suggestion"];
    assert_eq!(
        (&suggested["fits"], &suggested["gets_further"]),
        (&false.into(), &true.into()),
        "{v}"
    );
    let text = String::from_utf8(
        cachealloc(&["synth", "loguniform:ops=3000", "--capacity", "4GiB"]).stdout,
    )
    .unwrap();
    assert!(
        text.contains(&format!(
            "  ({}, the report's suggestion, was tried: it gets past this out-of-memory too, \
             and runs out of memory later.)\n",
            suggested["conf"].as_str().unwrap()
        )),
        "{text}"
    );
    // Live memory alone exceeds this device: no value gets anywhere.
    let v = synth("2GiB", &[]);
    assert!(v["gets_furthest"].is_null());
    let text = synth_text("2GiB", &[]);
    assert!(
        text.contains("it needs more memory. No value gets past this out-of-memory."),
        "{text}"
    );
}

/// When the requests fit but their blocks do not (a padding out-of-memory) under
/// `roundup_power2_divisions`, the search also tries each value without them, and the settings it
/// finds replay without an out-of-memory.
#[test]
fn after_a_padding_oom_the_search_also_drops_the_divisions() {
    let divided = ["--conf", "roundup_power2_divisions:2"];
    let v = synth("5.6GiB", &divided);
    assert_eq!(v["first_oom_report"]["kind"], "padding", "{v}");
    let fits = v["fitting_settings"].as_array().unwrap();
    assert!(!fits.is_empty(), "{v}");
    for f in fits {
        let conf = f["conf"].as_str().unwrap();
        let alone = synth("5.6GiB", &["--conf", conf]);
        assert!(alone["first_oom_event_index"].is_null(), "{conf}: {alone}");
    }
    let text = synth_text("5.6GiB", &divided);
    assert!(
        text.contains(
            "(max_split_size_mb values with this replay's other settings, and also without its \
             roundup_power2_divisions)"
        ),
        "{text}"
    );
    // Where nothing fits after a padding out-of-memory, the search says that the blocks, not
    // the requests, need more memory (none of it held outside cachealloc here).
    let text = synth_text("5GiB", &divided);
    assert!(
        text.contains(
            "without an out-of-memory on this device: its blocks need more memory, though the \
             requests alone would fit. With --conf"
        ),
        "{text}"
    );
    // After a fragmentation out-of-memory, the divisions stay in every value tried.
    let v = synth("6.5GiB", &divided);
    assert_eq!(v["first_oom_report"]["kind"], "fragmentation", "{v}");
    let fits = v["fitting_settings"].as_array().unwrap();
    assert!(!fits.is_empty(), "{v}");
    for f in fits {
        assert!(
            f["conf"]
                .as_str()
                .unwrap()
                .contains("roundup_power2_divisions"),
            "{v}"
        );
    }
}

/// A request whose segment is larger than the whole device is no fragmentation: the JSON names
/// it `segment_too_large` with the segment it needed (an 8 MiB request takes a 20 MiB segment,
/// more than a 16 MiB device).
#[test]
fn a_segment_larger_than_the_device_is_named_so() {
    let path = write_trace(
        "segment-too-large",
        &[("alloc", 0x7f00_0000_0000, 8 << 20, 0)],
    );
    let v = json(&cachealloc(&[
        "replay",
        path.to_str().unwrap(),
        "--capacity",
        "16MiB",
        "--json",
    ]));
    let report = &v["first_oom_report"];
    assert_eq!(report["kind"], "segment_too_large", "{v}");
    assert_eq!(report["requested_bytes"], 8 << 20);
    assert_eq!(report["segment_bytes"], 20 << 20);
    std::fs::remove_file(path).unwrap();
}

/// 21 requests of 5 MiB on 115 MiB: the 21st needs a sixth 20 MiB segment with 15 MiB free.
/// Nothing is fragmented: the report names the segment, not fragmentation (expandable
/// segments, which map 20 MiB pages, fail at the same entry).
#[test]
fn a_segment_larger_than_the_memory_left_is_named_so() {
    let events: Vec<(&str, u64, u64, u32)> = (0..21u64)
        .map(|i| ("alloc", 0x7f00_0000_0000 + i * (8 << 20), 5 << 20, 0))
        .collect();
    let path = write_trace("segment-left", &events);
    let p = path.to_str().unwrap();
    let v = json(&cachealloc(&[
        "replay",
        p,
        "--capacity",
        "115MiB",
        "--json",
    ]));
    let report = &v["first_oom_report"];
    assert_eq!(report["kind"], "segment_too_large", "{v}");
    let text = report["text"].as_str().unwrap();
    assert!(
        text.contains(
            "more than the memory left: 15.00 MiB free on the device plus 0 bytes reserved but \
             unallocated in its pool."
        ),
        "{text}"
    );
    assert!(!text.contains("Fragmentation"), "{text}");
    std::fs::remove_file(path).unwrap();
}

/// A bounded run of `scripts/oom-hint-study.py` (one workload, one device size): it reads the
/// JSON report and the fit search, and counts the report's own value as fitting.
#[test]
fn the_oom_hint_study_runs_on_one_workload() {
    let has_python = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_python {
        // CI installs python3 (scripts/setup-test-deps.sh): there a missing one fails.
        assert!(
            !support::ci::running_under_ci(),
            "python3 is required under CI"
        );
        eprintln!("skipping: python3 not found");
        return;
    }
    let out = Command::new("python3")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/oom-hint-study.py"))
        .arg("synth transformer seed 1")
        .env("CACHEALLOC_BIN", env!("CARGO_BIN_EXE_cachealloc"))
        .env("STUDY_FRACTIONS", "0.1")
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("synth transformer seed 1 at 0.10:") && text.contains("report says 128"),
        "{text}"
    );
    assert!(
        text.contains("1 fragmentation OOMs; in 1 some standard value fits"),
        "{text}"
    );
    assert!(text.contains("(the report's rule): 1 / 1;"), "{text}");
    assert!(
        text.contains("named the first rule's value in 1 of 1"),
        "{text}"
    );
}

/// The error output of a command that must be refused with exit code 2.
fn refused(args: &[&str]) -> String {
    let out = cachealloc(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A faithful replay whose start state cannot exist under --conf's settings says how to ask
/// the what-if question instead.
#[test]
fn a_faithful_start_state_refused_under_conf_points_to_a_plain_replay() {
    let Some(t) = trace("cs336-magma27/15883f2/memory_snapshot.pickle") else {
        return;
    };
    let path = t.to_str().unwrap();
    let err = refused(&[
        "replay",
        path,
        "--faithful",
        "--conf",
        "max_split_size_mb:64",
    ]);
    assert!(err.contains("cannot exist under these settings"), "{err}");
    assert!(err.contains("drop --faithful"), "{err}");
    let plain = cachealloc(&["replay", path, "--conf", "max_split_size_mb:64"]);
    assert!(plain.status.success());
    // A start state refused for another reason (the capacity) gets no such advice.
    let err = refused(&[
        "replay",
        path,
        "--faithful",
        "--conf",
        "roundup_power2_divisions:4",
        "--capacity",
        "1GiB",
    ]);
    assert!(!err.contains("drop --faithful"), "{err}");
}

/// A recording that names no settings, walked back under --conf's to rebuild its start state,
/// where those settings cannot rebuild it (ftcourse under `max_split_size_mb:20`: a free lands
/// inside a block the walk rebuilt) though the defaults can: the error names --conf as the
/// cause, not the recording, and says how to ask the what-if question instead.
#[test]
fn a_faithful_walk_back_refused_under_conf_names_the_conf() {
    let Some(t) = trace("ftcourse/9f4902c/memory_snapshot.pickle") else {
        return;
    };
    let path = t.to_str().unwrap();
    let err = refused(&[
        "replay",
        path,
        "--faithful",
        "--conf",
        "max_split_size_mb:20",
    ]);
    assert!(err.contains("inside the live block"), "{err}");
    assert!(
        err.contains(
            "(the recording names no settings, and its start state, walked back under --conf's, \
             cannot be rebuilt, as it can under the defaults; for a what-if replay under other \
             settings, drop --faithful)"
        ),
        "{err}"
    );
    for args in [&["--faithful"][..], &["--conf", "max_split_size_mb:20"]] {
        let ok = cachealloc(&[&["replay", path], args].concat());
        assert!(ok.status.success(), "{args:?}");
    }
}

/// Write a trace of `events`, replay it in plain mode as JSON and as text, and remove it.
fn replay_written_trace(
    name: &str,
    events: &[(&str, u64, u64, u32)],
) -> (serde_json::Value, String) {
    let path = write_trace(name, events);
    let p = path.to_str().unwrap();
    let v = json(&cachealloc(&["replay", p, "--json"]));
    let out = cachealloc(&["replay", p]);
    std::fs::remove_file(&path).unwrap();
    (v, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A trace that allocates twice at one address without a free between (a free is missing):
/// the plain replay frees the earlier allocation there, as the recorded program must have,
/// instead of keeping it live to the end, and says so.
#[test]
fn an_allocation_at_a_live_address_frees_the_earlier_one() {
    let base = 0x7f00_0000_0000u64;
    let (v, text) = replay_written_trace(
        "missing-free",
        &[
            ("segment_alloc", base, 20 << 20, 0),
            ("alloc", base, 4 << 20, 0),
            ("alloc", base, 4 << 20, 0),
            ("free_requested", base, 4 << 20, 0),
            ("free_completed", base, 4 << 20, 0),
        ],
    );
    assert_eq!(v["missing_frees"], 1);
    assert_eq!(v["allocs"], 2);
    assert_eq!(v["frees"], 2);
    assert_eq!(v["peak_allocated_bytes"], 4 << 20);
    assert!(
        text.contains(
            "events: 4 (2 allocations, 2 frees (1 added: the trace allocates at an address it \
             has not freed since its last allocation there, so the replay frees the earlier \
             allocation first), 0 empty_cache calls)"
        ),
        "{text}"
    );
    assert!(text.contains("0 empty_cache calls"), "{text}");
}

/// A cachealloc trace begins with the process: a free of memory from before it is skipped
/// and counted, and the summary does not send the user to --faithful, which would rebuild
/// nothing.
#[test]
fn a_recorded_trace_skips_a_free_from_before_it_without_pointing_to_faithful() {
    let base = 0x7f00_0000_0000u64;
    let (v, text) = replay_written_trace(
        "orphan-free",
        &[
            ("segment_alloc", base, 20 << 20, 0),
            ("alloc", base, 4 << 20, 0),
            ("free_requested", base + (8 << 20), 4 << 20, 0),
            ("free_completed", base + (8 << 20), 4 << 20, 0),
        ],
    );
    assert_eq!(v["orphan_frees"], 1);
    assert!(
        text.contains("  not replayed: 1 free of memory from before the trace\n"),
        "{text}"
    );
    assert!(!text.contains("--faithful"), "{text}");
}

/// A two-stream trace whose second stream runs out of memory while a free block large enough
/// is cached for the first: the report names that stream as the cause, in the text and the JSON.
#[test]
fn an_out_of_memory_beside_a_block_cached_for_another_stream_says_so() {
    let base = 0x7f00_0000_0000u64;
    let path = write_trace(
        "other-stream",
        &[
            // Stream 1 keeps 8 MiB of a 20 MiB segment: 12 MiB stay cached for it.
            ("alloc", base, 8 << 20, 1),
            // Stream 2 asks for 12 MiB on a 30 MiB device: 10 MiB are free.
            ("alloc", base + (64 << 20), 12 << 20, 2),
        ],
    );
    let p = path.to_str().unwrap();
    let v = json(&cachealloc(&["replay", p, "--capacity", "30MiB", "--json"]));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(v["num_ooms"], 1);
    let report = &v["first_oom_report"];
    assert_eq!(report["kind"], "other_stream");
    assert_eq!(report["other_streams_free_bytes"], 12 << 20);
    assert_eq!(report["other_streams_largest_free_block_bytes"], 12 << 20);
    assert_eq!(
        report["suggested_max_split_size_mb"],
        serde_json::Value::Null
    );
    let text = report["text"].as_str().unwrap();
    assert!(text.contains("it belongs to stream 0x1"), "{text}");
}

/// The trace of a program killed while writing it ends in a cut-off line: the replay warns and
/// replays the lines before it.
#[test]
fn a_trace_cut_off_mid_line_replays_its_complete_lines() {
    let base = 0x7f00_0000_0000u64;
    let path = write_trace(
        "cut-off",
        &[
            ("segment_alloc", base, 2 << 20, 0),
            ("alloc", base, 4096, 0),
            ("alloc", base + 4096, 4096, 0),
        ],
    );
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, &text[..text.len() - 25]).unwrap();
    let out = cachealloc(&["replay", path.to_str().unwrap(), "--json"]);
    std::fs::remove_file(&path).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 4 is cut off")
            && err.contains(
                "replaying the lines before it, and what the program did after them, \
                 up to 64 KiB of events, may be missing"
            ),
        "{err}"
    );
    let v = json(&out);
    assert_eq!(v["allocs"], 1, "the whole alloc line, not the cut one");
}

/// After an out-of-memory without expandable segments, the replay is tried with them too and
/// the summary says what that gave; a replay with them counts page maps in its fits.
#[test]
fn an_oom_is_replayed_with_expandable_segments_too() {
    let j = synth("5800MiB", &[]);
    let trial = &j["expandable_segments_trial"];
    assert_eq!(trial["conf"], "expandable_segments:True", "{j}");
    assert_eq!(trial["fits"], true);
    assert_eq!(trial["first_oom_event_index"], serde_json::Value::Null);
    assert!(trial["peak_reserved_bytes"].as_u64().unwrap() <= 5800 << 20);
    // The trial's claim holds: replayed with its --conf, the workload has no OOM.
    let again = synth("5800MiB", &["--conf", "expandable_segments:True"]);
    assert_eq!(again["num_ooms"], 0);
    assert_eq!(again["expandable_segments"], true);
    assert_eq!(again["peak_reserved_bytes"], trial["peak_reserved_bytes"]);
    assert_eq!(again["expandable_segments_trial"], serde_json::Value::Null);

    let out = cachealloc(&[
        "synth",
        "transformer",
        "--capacity",
        "5500MiB",
        "--conf",
        "expandable_segments:True",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("with expandable segments it splits nothing whole"),
        "{text}"
    );
    assert!(
        text.contains("--conf max_split_size_mb:64,expandable_segments:True"),
        "{text}"
    );
    assert!(text.contains(" segment maps, 4 retries"), "{text}");
    assert!(!text.contains("With expandable segments (--conf"), "{text}");
    // A replay with them is tried without them.
    assert!(
        text.contains("Without expandable segments (--conf '') it runs out of memory too"),
        "{text}"
    );
    // Where no max_split_size_mb value fits but expandable segments do, the search does not
    // say that the workload needs more memory.
    let text = synth_text("5.44GiB", &[]);
    assert!(
        text.contains(
            "lets this workload run without an out-of-memory on this device. With --conf"
        ) && text.contains(
            "With expandable segments (--conf expandable_segments:True) it runs \
                 without an out-of-memory"
        ),
        "{text}"
    );
}

/// After an out-of-memory with expandable segments, the replay is tried without them. Here a
/// 1010 MiB block mapped 51 pages of 20 MiB on a 1 GiB device; a 12 MiB request needs a page
/// more than the 4 MiB free, where a native segment of 12 MiB fits beside a 1010 MiB one. The
/// report says that pages stood in the way, and the trial that native segments fit.
#[test]
fn an_oom_with_expandable_segments_is_replayed_without_them() {
    let (base, mib) = (0x7f00_0000_0000u64, 1u64 << 20);
    let lines = [
        r#"{"format":"cachealloc-trace","version":4,"pid":1,"devices":[0],"settings":"expandable_segments:True","free_sync":"device"}"#.to_string(),
        format!(r#"{{"t_us":1,"device":0,"action":"device_memory","addr":0,"size":{},"stream":0}}"#, 1024 * mib),
        format!(r#"{{"t_us":2,"device":0,"action":"range_reserve","addr":{base},"size":{},"stream":0,"page":{}}}"#, 1160 * mib, 20 * mib),
        format!(r#"{{"t_us":3,"device":0,"action":"segment_map","addr":{base},"size":{},"stream":0}}"#, 1020 * mib),
        format!(r#"{{"t_us":4,"device":0,"action":"alloc","addr":{base},"size":{},"stream":0}}"#, 1010 * mib),
        format!(r#"{{"t_us":5,"device":0,"action":"retry","addr":0,"size":{},"stream":0}}"#, 12 * mib),
        format!(r#"{{"t_us":6,"device":0,"action":"oom","addr":0,"size":{},"stream":0,"device_free":{},"requested":{}}}"#, 12 * mib, 4 * mib, 12 * mib),
        r#"{"t_us":7,"device":0,"action":"end","addr":0,"size":0,"stream":0}"#.to_string(),
    ];
    let path = std::env::temp_dir().join(format!("cachealloc-pages-{}.jsonl", std::process::id()));
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let p = path.to_str().unwrap();
    let j = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
    assert_eq!(j["num_ooms"], 1, "{j}");
    let text = j["first_oom_report"]["text"].as_str().unwrap();
    assert!(
        text.contains(
            "Expandable segments grow by whole pages: the 20.00 MiB of pages it needed next are \
             more than the device has free."
        ) && text.contains("A setting to try: expandable_segments:False (the default)"),
        "{text}"
    );
    let trial = &j["expandable_segments_trial"];
    assert_eq!(trial["expandable_segments"], false, "{j}");
    assert_eq!(trial["conf"], "", "the defaults");
    assert_eq!(trial["fits"], true, "{j}");
    // The trial's claim holds: replayed with its --conf, the recording has no OOM.
    let again = json(&cachealloc(&[
        "replay",
        p,
        "--faithful",
        "--conf",
        "",
        "--json",
    ]));
    assert_eq!(again["num_ooms"], 0, "{again}");
    assert_eq!(again["expandable_segments"], false, "{again}");
    let out = cachealloc(&["replay", p, "--faithful"]);
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary
            .contains("Without expandable segments (--conf '') it runs without an out-of-memory"),
        "{summary}"
    );
    std::fs::remove_file(&path).unwrap();
}

/// A program that resets its device loses its expandable segments' ranges without unmaps; the
/// address reserved again after the reset is a new range, and a faithful replay lands both
/// allocations there (it landed one of two while the ranges were read as kept).
#[test]
fn a_faithful_replay_reserves_again_after_a_device_reset() {
    let (base, size) = (0x7f00_0000_0000u64, 20u64 << 20);
    let path = write_trace_with_settings(
        "reset",
        "expandable_segments:True",
        &[
            ("segment_map", base, size, 0),
            ("alloc", base, size, 0),
            ("device_reset", 0, 0, 0),
            ("segment_map", base, size, 0),
            ("alloc", base, size, 0),
        ],
    );
    let v = json(&cachealloc(&[
        "replay",
        path.to_str().unwrap(),
        "--faithful",
        "--json",
    ]));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(v["allocs"], 2);
    assert_eq!(v["allocs_at_recorded_addr"], 2);
    // The reset gave the pages back without unmaps: none counted.
    assert_eq!(
        (v["device_resets"].as_u64(), v["empty_cache_calls"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(v["num_device_free"], 0, "{v}");
}

/// A reset gives a native pool's segments back without cudaFree calls: the replay, which
/// returns them to its device to start again empty, counts none (nor the synchronization of
/// the empty_cache() that does it), names the reset and calls no empty_cache().
#[test]
fn a_device_reset_is_replayed_without_counting_its_returns_as_cudafree() {
    let (base, small) = (0x7f00_0000_0000u64, 0x7f00_4000_0000u64);
    let path = write_trace(
        "reset-native",
        &[
            ("segment_alloc", base, 60 << 20, 0),
            ("alloc", base, 50 << 20, 0),
            ("free_requested", base, 50 << 20, 0),
            ("free_completed", base, 50 << 20, 0),
            ("segment_alloc", small, 2 << 20, 0),
            ("alloc", small, 1000, 0),
            ("device_reset", 0, 0, 0),
            ("segment_alloc", base, 50 << 20, 0),
            ("alloc", base, 50 << 20, 0),
        ],
    );
    let p = path.to_str().unwrap();
    let v = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
    assert_eq!(v["device_resets"], 1, "{v}");
    assert_eq!(v["empty_cache_calls"], 0, "{v}");
    assert_eq!(v["num_device_alloc"], v["recorded_segment_allocs"], "{v}");
    assert_eq!(v["num_device_free"], 0, "{v}");
    assert_eq!(v["recorded_segment_frees"], 0, "{v}");
    // Nor a synchronization: the reset made no `synchronize_and_free_events`.
    assert_eq!(v["memory_stats"]["num_sync_all_streams"], 0, "{v}");
    assert_eq!(v["memory_stats"]["num_device_free"], 0, "{v}");
    let text = String::from_utf8(cachealloc(&["replay", p, "--faithful"]).stdout).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(
        text.contains("1 device reset: what was live freed and every segment returned"),
        "{text}"
    );
    assert!(text.contains("0 empty_cache calls"), "{text}");
}

/// A recording names its device's memory: a faithful replay's device has it, and a capacity
/// inferred without an OOM (the middle of what the retry brackets, here 1,100 MiB) is held to
/// it. A capacity given beyond it makes a device that large.
#[test]
fn a_faithful_replay_keeps_to_the_recorded_device_memory() {
    let mib = 1u64 << 20;
    let path = write_retry_on_1_gib_device("device-memory");
    let p = path.to_str().unwrap();
    let v = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
    assert_eq!(v["device_memory_bytes"].as_u64(), Some(1024 * mib), "{v}");
    assert_eq!(v["capacity_bytes"].as_u64(), Some(1024 * mib), "{v}");
    assert_eq!(v["num_alloc_retries"], 1, "{v}");
    assert_eq!(v["allocs_at_recorded_addr"], 2, "{v}");
    let larger = json(&cachealloc(&[
        "replay",
        p,
        "--faithful",
        "--capacity",
        "2GiB",
        "--json",
    ]));
    assert_eq!(larger["device_memory_bytes"].as_u64(), Some(2048 * mib));
    let text =
        String::from_utf8_lossy(&cachealloc(&["replay", p, "--faithful"]).stdout).into_owned();
    assert!(
        !text.contains("device memory:"),
        "the capacity is the memory: {text}"
    );
    std::fs::remove_file(&path).unwrap();
}

/// Output to a reader that went away (`cachealloc … | head`) ends quietly; output that cannot
/// be written (a full disk) is an error that says so. Neither is a panic.
#[test]
fn output_that_cannot_be_written_is_not_a_panic() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachealloc"))
        .args(["synth", "transformer:steps=2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    // The reader goes away before the summary is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.is_empty(), "{stderr}");

    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped the full-disk case: no /dev/full");
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_cachealloc"))
        .args(["synth", "transformer:steps=2"])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("could not write the output to stdout") && !stderr.contains("panicked"),
        "{stderr}"
    );
    // Help and version too (clap's own printing would ignore the failure and exit 0).
    for args in [&["--help"][..], &["replay", "--help"], &["--version"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_cachealloc"))
            .args(args)
            .stdout(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            )
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end(),
            "cachealloc: error: could not write the output to stdout: No space left on device \
             (os error 28)",
            "{args:?}"
        );
    }
}
