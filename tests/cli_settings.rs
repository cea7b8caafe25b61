//! The settings a replay runs with: `--conf` alone (the variables that configure the preloaded
//! library are named, not followed), as the summary names them, and options that change
//! nothing in a replay warned about.

mod support;

use support::cli::{cachealloc, cachealloc_with, json};
use support::snapshot_pickle::{Segment, write_snapshot};
use support::trace_lines::{
    MAPPED_AT, NATIVE_AT, write_native_then_expandable, write_trace, write_trace_with_settings,
};

#[test]
fn max_split_size_changes_the_outcome_of_a_synthetic_run() {
    let base = json(&cachealloc(&["synth", "--capacity", "7GiB", "--json"]));
    let tuned = json(&cachealloc(&[
        "synth",
        "--capacity",
        "7GiB",
        "--conf",
        "max_split_size_mb:64",
        "--json",
    ]));
    assert_eq!(tuned["settings"], "max_split_size_mb:64");
    assert_ne!(base["num_device_alloc"], tuned["num_device_alloc"]);
}

/// The summary names the settings the replay ran with: a key given twice takes its last value
/// (as in PyTorch), and a PyTorch-only key, ignored by a replay, is not named.
/// A faithful replay names the settings it runs with: the recording's, or those of `--conf`,
/// which replace them (the defaults when it names none), said to be in their place.
#[test]
fn a_faithful_replay_names_whose_settings_it_runs_with() {
    let (a, mib) = (0x7f00_0000_0000u64, 1u64 << 20);
    let events = [
        ("segment_alloc", a, 20 * mib, 0),
        ("alloc", a, 4 * mib, 0),
        ("free_completed", a, 4 * mib, 0),
    ];
    let path = write_trace_with_settings("faithful-settings", "max_split_size_mb:128", &events);
    let p = path.to_str().unwrap();
    let settings = |extra: &[&str]| {
        let out = cachealloc(&[&["replay", p, "--faithful", "--json"], extra].concat());
        json(&out)["settings"].as_str().unwrap().to_string()
    };
    assert_eq!(settings(&[]), "as recorded: max_split_size_mb:128");
    assert_eq!(
        settings(&["--conf", "max_split_size_mb:64"]),
        "max_split_size_mb:64 (from --conf, in place of the recording's)"
    );
    assert_eq!(
        settings(&["--conf", ""]),
        "defaults (from --conf, in place of the recording's)"
    );
    std::fs::remove_file(path).unwrap();
}

/// A snapshot from a PyTorch that recorded no allocator settings, whose segments are
/// expandable: a faithful replay runs with expandable segments, as the recording shows them,
/// mapping pages as the recording did.
#[test]
fn a_faithful_replay_of_expandable_segments_named_nowhere_uses_them() {
    let (a, mib) = (0x7f00_0000_0000u64, 1u64 << 20);
    let segment = Segment {
        address: a,
        stream: 0,
        expandable: true,
        pool_id: (0, 0),
        blocks: vec![(20 * mib, 20 * mib, "active_allocated")],
    };
    let entries = [("segment_map", a, 20 * mib), ("alloc", a, 20 * mib)];
    let path = write_snapshot("expandable-unnamed.pickle", &[segment], &entries, None);
    let j = json(&cachealloc(&[
        "replay",
        path.to_str().unwrap(),
        "--faithful",
        "--json",
    ]));
    assert_eq!(
        j["settings"], "as the recording shows them: expandable_segments:True",
        "{j}"
    );
    assert_eq!(j["expandable_segments"], true);
    assert_eq!(j["num_device_alloc"], j["recorded_segment_maps"]);
    assert_eq!(j["recorded_both_segment_kinds"], false);
    std::fs::remove_file(path).unwrap();
}

/// The summary names the segment placement when it is not the default (top-down), and the
/// JSON always.
#[test]
fn the_summary_names_a_placement_other_than_top_down() {
    let run = |extra: &[&str]| {
        let out = cachealloc(&[&["synth", "loguniform:ops=200"], extra].concat());
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = run(&["--placement", "bottom-up"]);
    assert!(
        text.contains("\n  segment placement: bottom-up\n"),
        "{text}"
    );
    for default in [&[][..], &["--placement", "top-down"]] {
        let text = run(default);
        assert!(!text.contains("segment placement"), "{default:?}: {text}");
    }
    let j = json(&cachealloc(&[
        "synth",
        "loguniform:ops=200",
        "--placement",
        "bottom-up",
        "--json",
    ]));
    assert_eq!(j["placement"], "bottom-up");
}

#[test]
fn the_summary_names_the_settings_in_effect_not_the_text_given() {
    let out = cachealloc(&[
        "synth",
        "transformer:steps=1",
        "--conf",
        "max_split_size_mb:128, max_split_size_mb:256,pinned_use_cuda_host_register:True",
        "--json",
    ]);
    assert_eq!(json(&out)["settings"], "max_split_size_mb:256");
    let out = cachealloc(&[
        "synth",
        "transformer:steps=1",
        "--conf",
        "pinned_use_cuda_host_register:True",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  settings: defaults\n"), "{text}");
}

/// A replay reads its settings from --conf only: a variable set for the preloaded library is
/// named, with the --conf that would replay with it, and not followed.
#[test]
fn a_replay_names_the_library_variables_it_does_not_read() {
    let out = cachealloc_with(
        &["synth", "transformer:steps=1"],
        &[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")],
    );
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "cachealloc: note: PYTORCH_CUDA_ALLOC_CONF is set, but a replay reads its settings from \
         --conf only (the variable configures the preloaded library); to replay with its \
         allocator settings, give --conf expandable_segments:True\n"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  settings: defaults\n"), "{text}");
    // Only the variable the library would read is named: CACHEALLOC_CONF comes first.
    let out = cachealloc_with(
        &["synth", "transformer:steps=1"],
        &[
            ("CACHEALLOC_CONF", "max_split_size_mb:128"),
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("cachealloc: note: CACHEALLOC_CONF is set") && err.lines().count() == 1,
        "{err}"
    );
    // Given --conf, the variable is not mentioned.
    let out = cachealloc_with(
        &[
            "synth",
            "transformer:steps=1",
            "--conf",
            "max_split_size_mb:64",
        ],
        &[("CACHEALLOC_CONF", "max_split_size_mb:128")],
    );
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The --conf offered holds the allocator's settings only (the library's own keys and
    // PyTorch's would be warned about or refused there); a variable with none needs no note.
    let note = |value: &str| {
        let out = cachealloc_with(
            &["synth", "transformer:steps=1"],
            &[("CACHEALLOC_CONF", value)],
        );
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = note("max_split_size_mb:128,stats:text");
    assert!(
        err.ends_with("give --conf max_split_size_mb:128\n"),
        "{err}"
    );
    assert_eq!(note("stats:text"), "");
    // One the library would refuse is said to be so, with its error.
    let err = note("bogus:1");
    assert!(
        err.contains(
            "the preloaded library would refuse its configuration: CACHEALLOC_CONF: unknown \
             key 'bogus'"
        ),
        "{err}"
    );
}

/// Options that cannot act on a replay are named in a warning, and the replay still runs.
#[test]
fn options_without_effect_on_a_replay_are_warned_about() {
    let out = cachealloc(&[
        "synth",
        "transformer:steps=1",
        "--conf",
        "free_sync:none,trace:/tmp/unused.jsonl,per_process_memory_fraction:0.5",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "--conf free_sync, trace: configure the preloaded library, not the pool, and have \
             no effect on cachealloc synth"
        ),
        "{err}"
    );
    // The warning names the command that runs.
    let recorded = write_trace(
        "library-keys.trace",
        &[
            ("segment_alloc", 0x7f00_0000_0000, 2 << 20, 0),
            ("alloc", 0x7f00_0000_0000, 1024, 0),
        ],
    );
    let replayed = cachealloc(&["replay", recorded.to_str().unwrap(), "--conf", "stats:json"]);
    let replay_err = String::from_utf8_lossy(&replayed.stderr);
    assert!(replayed.status.success(), "{replay_err}");
    assert!(
        replay_err.contains(
            "--conf stats: configures the preloaded library, not the pool, and has no effect on \
             cachealloc replay"
        ),
        "{replay_err}"
    );
    std::fs::remove_file(recorded).unwrap();
    assert!(
        err.contains("per_process_memory_fraction limits a fraction of the device's memory"),
        "{err}"
    );
    let quiet = cachealloc(&[
        "synth",
        "transformer:steps=1",
        "--capacity",
        "8GiB",
        "--conf",
        "per_process_memory_fraction:0.5",
    ]);
    assert!(quiet.status.success());
    assert!(
        quiet.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&quiet.stderr)
    );
    // A garbage-collection threshold acts only under a fraction limit; a fraction of 0
    // refuses everything.
    let stderr_of = |conf: &str| {
        let out = cachealloc(&[
            "synth",
            "transformer:steps=1",
            "--capacity",
            "8GiB",
            "--conf",
            conf,
        ]);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = stderr_of("garbage_collection_threshold:0.5");
    assert!(
        err.contains("without one, no cached block is collected until the program sets one"),
        "{err}"
    );
    assert!(
        stderr_of("garbage_collection_threshold:0.5,per_process_memory_fraction:0.9").is_empty()
    );
    let err = stderr_of("per_process_memory_fraction:0");
    assert!(err.contains("allows no memory at all"), "{err}");
}

/// A recording that holds native segments and expandable ones (the setting changed while it
/// ran, or PyTorch kept a CUDA graph's private pool on native segments) cannot be reproduced by a
/// replay, which uses one kind for all: the summary and the JSON say so, where they once showed
/// a silent mismatch (2 segment maps against 1 cudaMalloc and 2 maps, no allocation at its
/// address). Recordings of one kind say nothing of it.
#[test]
fn a_replay_says_when_the_recording_holds_both_kinds_of_segment() {
    let (native, grown, mib) = (NATIVE_AT, MAPPED_AT, 1u64 << 20);
    let line = "the recording holds both native segments (cudaMalloc) and expandable ones (page \
                maps): the setting changed while it ran, or PyTorch kept private pools (CUDA \
                graphs') on native segments; the trace does not say which segment was made \
                under which setting, and this replay used expandable segments for all of them, \
                so its device calls and addresses cannot all match the recording's\n";
    let toggled = write_native_then_expandable("both-kinds");
    // A 20 MiB segment holding one 4 MiB allocation.
    let segment = |address, expandable, pool_id| Segment {
        address,
        stream: 0,
        expandable,
        pool_id,
        blocks: vec![
            (4 * mib, 4 * mib, "active_allocated"),
            (16 * mib, 0, "inactive"),
        ],
    };
    let graph_pool = write_snapshot(
        "both-kinds.pickle",
        &[segment(native, false, (1, 2)), segment(grown, true, (0, 0))],
        &[
            ("segment_map", grown, 20 * mib),
            ("alloc", grown, 4 * mib),
            ("segment_alloc", native, 20 * mib),
            ("alloc", native, 4 * mib),
        ],
        None,
    );
    for path in [&toggled, &graph_pool] {
        let path = path.to_str().unwrap();
        let j = json(&cachealloc(&["replay", path, "--faithful", "--json"]));
        assert_eq!(j["recorded_both_segment_kinds"], true, "{path}: {j}");
        assert_eq!(j["expandable_segments"], true, "{path}: {j}");
        let out = cachealloc(&["replay", path, "--faithful"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(line), "{path}: {text}");
    }
    let native_only = write_trace(
        "native-kind-only",
        &[
            ("segment_alloc", native, 20 * mib, 0),
            ("alloc", native, 4 * mib, 0),
        ],
    );
    let j = json(&cachealloc(&[
        "replay",
        native_only.to_str().unwrap(),
        "--faithful",
        "--json",
    ]));
    assert_eq!(j["recorded_both_segment_kinds"], false, "{j}");
    for path in [toggled, graph_pool, native_only] {
        std::fs::remove_file(path).unwrap();
    }
}
