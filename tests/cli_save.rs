//! `cachealloc synth --save FILE`: a generated workload kept as a cachealloc trace, which
//! `cachealloc replay FILE` replays to the figures of the run that wrote it — plainly under the
//! same options, and with `--faithful` from the file alone.

mod support;

use cachealloc::trace::record::FORMAT_VERSION;
use cachealloc::trace::rng::SplitMix64;
use serde_json::Value;
use std::path::PathBuf;
use support::cli::{cachealloc, json};
use support::trace_lines::copy_without;

/// A path in the temporary directory for this test process.
fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("cachealloc-{name}-{}.trace", std::process::id()))
}

/// Run `synth SPEC --save PATH --json` with `options`; the JSON and the file's bytes.
fn synth_saved(name: &str, spec: &str, options: &[&str]) -> (Value, Vec<u8>, PathBuf) {
    let path = temp_path(name);
    let mut args = vec!["synth", spec, "--json", "--save", path.to_str().unwrap()];
    args.extend_from_slice(options);
    let out = cachealloc(&args);
    let synth = json(&out);
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(
        note.contains("saved the run as a trace") && note.contains("cachealloc replay"),
        "{note}"
    );
    let bytes = std::fs::read(&path).expect("the trace was written");
    (synth, bytes, path)
}

/// The figures a replay of the saved trace must share with the run that saved it.
const SHARED: [&str; 8] = [
    "peak_allocated_bytes",
    "peak_requested_bytes",
    "peak_reserved_bytes",
    "final_reserved_bytes",
    "num_device_alloc",
    "num_device_free",
    "num_alloc_retries",
    "num_ooms",
];

fn assert_same_figures(what: &str, synth: &Value, replayed: &Value) {
    for key in SHARED {
        assert_eq!(replayed[key], synth[key], "{what}: {key}");
    }
}

#[test]
fn a_saved_synthetic_run_replays_to_the_same_figures() {
    // A capacity the workload outgrows (retries and refused requests), under non-default
    // settings, so that the file has to carry them.
    let options = [
        "--capacity",
        "1GiB",
        "--conf",
        "max_split_size_mb:64,roundup_power2_divisions:4",
    ];
    let (synth, _, path) = synth_saved("settings", "transformer:steps=6", &options);
    let p = path.to_str().unwrap();
    assert!(synth["num_ooms"].as_u64().unwrap() > 0, "{synth}");
    assert!(synth["num_alloc_retries"].as_u64().unwrap() > 0, "{synth}");

    let mut args = vec!["replay", p, "--json"];
    args.extend_from_slice(&options);
    let plain = json(&cachealloc(&args));
    assert_same_figures("plain replay with the same options", &synth, &plain);
    // The file's own figures are the run's.
    assert_eq!(
        plain["recorded_peak_reserved_bytes"],
        synth["peak_reserved_bytes"]
    );
    assert_eq!(plain["recorded_segment_allocs"], synth["num_device_alloc"]);
    assert_eq!(plain["recorded_segment_frees"], synth["num_device_free"]);
    assert_eq!(plain["recorded_retries"], synth["num_alloc_retries"]);
    // The run's first refused request is the file's first oom line.
    let oom = &synth["first_oom_report"];
    assert_eq!(plain["recorded_oom"]["size"], oom["rounded_bytes"], "{oom}");
    assert_eq!(
        plain["recorded_oom"]["device_free"], oom["device_free_bytes"],
        "{oom}"
    );

    // A complete file: no warning of a recording stopped early.
    let out = cachealloc(&["replay", p, "--json"]);
    let warned = String::from_utf8_lossy(&out.stderr);
    assert!(!warned.contains("no end line"), "{warned}");

    // Faithful: settings and capacity from the file alone, every allocation where it was.
    let faithful = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
    assert_same_figures("faithful replay", &synth, &faithful);
    assert_eq!(
        faithful["settings"],
        "as recorded: max_split_size_mb:64,roundup_power2_divisions:4"
    );
    assert_eq!(faithful["capacity_bytes"].as_u64(), Some(1 << 30));
    assert_eq!(faithful["allocs_at_recorded_addr"], faithful["allocs"]);
    // The refused request is asked for again as the program asked, not as its settings rounded
    // it (roundup_power2_divisions:4 rounds it up here): a replay under other settings must
    // round it its own way.
    let again = &faithful["first_oom_report"];
    assert_ne!(oom["requested_bytes"], oom["rounded_bytes"], "{oom}");
    assert_eq!(again["requested_bytes"], oom["requested_bytes"], "{again}");
    assert_eq!(again["rounded_bytes"], oom["rounded_bytes"], "{again}");
    std::fs::remove_file(&path).unwrap();
}

/// Under max_split_size_mb, the pool often returns its oversize cached segments and then gets a
/// new one without a retry; the saved file marks each counted retry with a `retry` line, so its
/// recorded retries are the run's (counted from the releases, they read 74 against 5).
#[test]
fn retries_are_recorded_exactly_under_max_split_size() {
    let options = ["--capacity", "5.6GiB", "--conf", "max_split_size_mb:128"];
    let (synth, bytes, path) = synth_saved("oversize", "transformer", &options);
    let retries = synth["num_alloc_retries"].as_u64().unwrap();
    assert!(retries > 0, "{synth}");
    let text = String::from_utf8(bytes).unwrap();
    let lines = text.lines().filter(|l| l.contains(r#""action":"retry""#));
    assert_eq!(lines.count() as u64, retries);
    let faithful = json(&cachealloc(&[
        "replay",
        path.to_str().unwrap(),
        "--faithful",
        "--json",
    ]));
    assert_eq!(faithful["recorded_retries"], retries, "{faithful}");
    assert_eq!(faithful["num_alloc_retries"], retries, "{faithful}");
    assert_eq!(faithful["recorded_retries_upper_bound"], false);
    // More segments were returned before new ones than there were retries: the releases alone
    // would not tell them apart.
    let no_markers = temp_path("oversize-v2");
    copy_without(&path, &["retry"], &no_markers);
    let v2 = std::fs::read_to_string(&no_markers).unwrap().replacen(
        &format!(r#""version":{FORMAT_VERSION}"#),
        r#""version":2"#,
        1,
    );
    std::fs::write(&no_markers, v2).unwrap();
    let counted = json(&cachealloc(&[
        "replay",
        no_markers.to_str().unwrap(),
        "--json",
    ]));
    assert!(
        counted["recorded_retries"].as_u64().unwrap() > retries,
        "{counted}"
    );
    // ... and the summary says that the count is a bound.
    assert_eq!(counted["recorded_retries_upper_bound"], true);
    let text = cachealloc(&["replay", no_markers.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("| retries at most "), "{text}");
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&no_markers).unwrap();
}

/// With expandable segments a retry unmaps free pages and maps new ones: its line comes before
/// the maps (one of the two retries here succeeds, the other ends in an out-of-memory error).
#[test]
fn retries_are_recorded_exactly_with_expandable_segments() {
    let options = ["--capacity", "5.3GiB", "--conf", "expandable_segments:True"];
    let (synth, bytes, path) = synth_saved("expandable-retry", "transformer", &options);
    assert_eq!(synth["num_alloc_retries"], 2, "{synth}");
    assert_eq!(synth["num_ooms"], 1, "{synth}");
    let text = String::from_utf8(bytes).unwrap();
    assert_eq!(text.matches(r#""action":"retry""#).count(), 2);
    let faithful = json(&cachealloc(&[
        "replay",
        path.to_str().unwrap(),
        "--faithful",
        "--json",
    ]));
    assert_same_figures("faithful replay", &synth, &faithful);
    assert_eq!(faithful["recorded_retries"], 2, "{faithful}");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_saved_expandable_run_replays_faithfully() {
    let options = ["--conf", "expandable_segments:True"];
    let (synth, _, path) = synth_saved("expandable", "transformer:steps=4", &options);
    let p = path.to_str().unwrap();
    let faithful = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
    assert_same_figures("faithful replay", &synth, &faithful);
    assert_eq!(faithful["recorded_expandable_segments"], true);
    assert_eq!(faithful["allocs_at_recorded_addr"], faithful["allocs"]);
    std::fs::remove_file(&path).unwrap();
}

/// A run of expandable segments, bottom-up, that outgrows its device: the large pool reserves
/// a second range above the small pool's, and the faithful replay must place both where the
/// run did. The header's capacity is then taken out, as a program's recording has none: the
/// replay infers it from the `oom` lines and still lands every allocation.
#[test]
fn a_saved_run_with_two_ranges_of_one_pool_replays_faithfully() {
    let options = [
        "--conf",
        "expandable_segments:True",
        "--capacity",
        "5GiB",
        "--placement",
        "bottom-up",
    ];
    let spec = "transformer:steps=3,seq=128-4096";
    let (synth, bytes, path) = synth_saved("two-ranges", spec, &options);
    let p = path.to_str().unwrap();
    assert!(synth["num_ooms"].as_u64().unwrap() > 0, "{synth}");
    let faithful = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
    assert_same_figures("faithful replay", &synth, &faithful);
    assert_eq!(faithful["allocs_at_recorded_addr"], faithful["allocs"]);

    let text = String::from_utf8(bytes).unwrap();
    let (header, events) = text.split_once('\n').unwrap();
    let mut header: Value = serde_json::from_str(header).unwrap();
    assert_eq!(header["capacity"].as_u64(), Some(5 << 30));
    header.as_object_mut().unwrap().remove("capacity");
    std::fs::write(&path, format!("{header}\n{events}")).unwrap();
    let inferred = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
    assert_same_figures("faithful replay, capacity inferred", &synth, &inferred);
    assert_eq!(inferred["allocs_at_recorded_addr"], inferred["allocs"]);
    std::fs::remove_file(&path).unwrap();
}

/// Runs of expandable segments that outgrow a small device, each of which once had its
/// allocations placed elsewhere by a faithful replay: a range given back and a later one
/// reserved across its place (the two were taken to coexist, which sized the replay's ranges
/// for a 480 MiB device); and bottom-up, a second large range reserved right after the first,
/// fully mapped one (read as the first range growing: the replay had to place it itself, and
/// placed it top-down).
#[test]
fn faithful_replays_of_runs_that_reserve_ranges_again_land_every_allocation() {
    for (spec, conf, placement) in [
        (
            "transformer:steps=3,seq=128-4096",
            "expandable_segments:True",
            "top-down",
        ),
        (
            "loguniform:ops=5000",
            "roundup_power2_divisions:4,expandable_segments:True",
            "bottom-up",
        ),
    ] {
        let options = [
            "--conf",
            conf,
            "--capacity",
            "1.5GiB",
            "--placement",
            placement,
        ];
        let (synth, _, path) = synth_saved("ranges-again", spec, &options);
        let p = path.to_str().unwrap();
        let faithful = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
        assert_same_figures(spec, &synth, &faithful);
        assert_eq!(
            faithful["allocs_at_recorded_addr"], faithful["allocs"],
            "{spec}"
        );
        assert_eq!(
            faithful["placement"], placement,
            "the run's, from the header"
        );
        // A placement given on the command line wins over the header's.
        let other = ["bottom-up", "top-down"][usize::from(placement == "bottom-up")];
        let told = json(&cachealloc(&[
            "replay",
            p,
            "--faithful",
            "--placement",
            other,
            "--json",
        ]));
        assert_eq!(told["placement"], other, "{spec}");
        std::fs::remove_file(&path).unwrap();
    }
}

/// A run that never failed a request leaves nothing to infer a capacity from; the header keeps
/// it, so that a faithful replay of a garbage-collecting run releases what the run released.
#[test]
fn a_faithful_replay_takes_the_capacity_from_the_header() {
    let options = [
        "--conf",
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
        "--capacity",
        "1.5GiB",
    ];
    let (synth, _, path) = synth_saved("gc", "loguniform:ops=5000,free_p=0.6", &options);
    let p = path.to_str().unwrap();
    assert_eq!(synth["num_ooms"], 0, "{synth}");
    assert!(synth["num_device_free"].as_u64().unwrap() > 0, "{synth}");
    let faithful = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
    assert_eq!(faithful["capacity_bytes"].as_u64(), Some(3 << 29));
    assert_same_figures("faithful replay", &synth, &faithful);
    assert_eq!(faithful["allocs_at_recorded_addr"], faithful["allocs"]);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_same_workload_saves_the_same_bytes() {
    let (_, first, path) = synth_saved("again", "loguniform:ops=2000", &[]);
    let (_, second, _) = synth_saved("again", "loguniform:ops=2000", &[]);
    assert_eq!(
        first, second,
        "timestamps number the events: no clock in the file"
    );
    let (_, other, _) = synth_saved("again", "loguniform:ops=2000", &["--seed", "2"]);
    assert_ne!(first, other, "another seed, another workload");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_notes_say_how_to_replay_and_what_a_failed_run_keeps() {
    let (_, _, path) = synth_saved("notes", "transformer:steps=2", &["--capacity", "2GiB"]);
    let out = cachealloc(&[
        "synth",
        "transformer:steps=2",
        "--capacity",
        "2GiB",
        "--save",
        path.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--faithful replays this run again"), "{err}");
    assert!(
        err.contains("ran out of memory") && err.contains("save it without --capacity"),
        "{err}"
    );
    let fits = cachealloc(&[
        "synth",
        "transformer:steps=2",
        "--save",
        path.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&fits.stderr);
    assert!(!err.contains("ran out of memory"), "{err}");
    // A run that allocated nothing says so, also when the file names the device's memory.
    let nothing = cachealloc(&[
        "synth",
        "loguniform:ops=0",
        "--capacity",
        "1GiB",
        "--save",
        path.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&nothing.stderr);
    assert!(
        err.contains("the run allocated nothing") && !err.contains("replays this run"),
        "{err}"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text.lines().count(),
        3,
        "the header, device_memory and end: {text}"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn saving_to_standard_output_is_refused() {
    let out = cachealloc(&["synth", "loguniform:ops=100", "--save", "-"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--save -") && err.contains("name a file"),
        "{err}"
    );
    assert!(!std::path::Path::new("-").exists(), "no file named -");
}

#[test]
fn an_unwritable_save_path_is_named_and_nothing_else_is_printed() {
    let dir = temp_path("missing-dir");
    let path = dir.join("run.trace");
    let out = cachealloc(&[
        "synth",
        "loguniform:ops=100",
        "--save",
        path.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--save")
            && err.contains(path.to_str().unwrap())
            && err.contains("cannot write"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no summary after a failed save");
}

/// Saved runs drawn at random — workload, settings, capacity, memory held by a context,
/// placement, seed — each replayed faithfully from its file alone to the run's figures, every
/// allocation at its address; a run of expandable segments also with its range and
/// `device_memory` lines taken out, so that its ranges are inferred, and the device's memory
/// given with `--device-memory` as a PyTorch snapshot's replay takes it.
/// `CACHEALLOC_SAVE_CASES` sets how many (`scripts/save-sweep.sh` runs hundreds) and
/// `CACHEALLOC_SAVE_SEED` which; a failure names the case's command.
#[test]
fn random_saved_runs_replay_faithfully() {
    const SPECS: [&str; 4] = [
        "transformer:steps=2",
        "transformer:steps=2,seq=128-4096",
        "loguniform:ops=3000",
        "loguniform:ops=3000,free_p=0.6",
    ];
    const CONFS: [&str; 8] = [
        "",
        "expandable_segments:True",
        "max_split_size_mb:128,max_non_split_rounding_mb:64",
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
        "roundup_power2_divisions:4,expandable_segments:True",
        "expandable_segments:True,per_process_memory_fraction:0.7",
        "max_split_size_mb:40,garbage_collection_threshold:0.5,per_process_memory_fraction:0.9",
        "roundup_power2_divisions:[256:1,512:2,>:8],max_split_size_mb:256",
    ];
    // In MiB.
    const CAPACITIES: [Option<u64>; 5] = [None, Some(1536), Some(3072), Some(5120), Some(8192)];
    const CONTEXTS: [u64; 3] = [0, 300, 1024];
    let cases: u64 = env_number("CACHEALLOC_SAVE_CASES", 12);
    let seed: u64 = env_number("CACHEALLOC_SAVE_SEED", 1);
    let mut rng = SplitMix64::new(seed);
    let path = temp_path("random");
    let p = path.to_str().unwrap();
    let inferred_path = temp_path("random-inferred");
    let ip = inferred_path.to_str().unwrap();
    for case in 0..cases {
        let pick = |rng: &mut SplitMix64, n: usize| rng.below(n as u64) as usize;
        let spec = SPECS[pick(&mut rng, SPECS.len())];
        let conf = CONFS[pick(&mut rng, CONFS.len())];
        let capacity = CAPACITIES[pick(&mut rng, CAPACITIES.len())];
        let context = CONTEXTS[pick(&mut rng, CONTEXTS.len())];
        let placement = ["top-down", "bottom-up"][pick(&mut rng, 2)];
        let run_seed = rng.below(1000).to_string();
        let mut args = vec!["synth", spec, "--seed", &run_seed, "--placement", placement];
        args.extend(["--conf", conf]);
        // A device whose context holds some of its memory: the capacity is the rest.
        let capacity_arg = capacity.map(|c| format!("{c}MiB"));
        let memory_arg = capacity
            .filter(|_| context > 0)
            .map(|c| format!("{}MiB", c + context));
        if let Some(c) = &capacity_arg {
            args.extend(["--capacity", c]);
        }
        if let Some(m) = &memory_arg {
            args.extend(["--device-memory", m]);
        }
        args.extend(["--json", "--save", p]);
        let what = format!("case {case}: cachealloc {}", args.join(" "));
        let synth = json(&cachealloc(&args));
        let faithful = json(&cachealloc(&["replay", p, "--faithful", "--json"]));
        assert_same_figures(&what, &synth, &faithful);
        assert_eq!(
            faithful["allocs_at_recorded_addr"], faithful["allocs"],
            "{what}"
        );
        assert_eq!(
            faithful["device_memory_bytes"], synth["device_memory_bytes"],
            "{what}"
        );
        // Without the range and device_memory lines (a PyTorch snapshot has none), the ranges
        // are inferred from the page maps, to the same result.
        if std::fs::read_to_string(&path)
            .unwrap()
            .contains("\"range_reserve\"")
        {
            copy_without(
                &path,
                &["range_reserve", "range_release", "device_memory"],
                &inferred_path,
            );
            let memory = synth["device_memory_bytes"].as_u64().map(|m| m.to_string());
            let mut replay = vec!["replay", ip, "--faithful", "--json"];
            if let Some(m) = &memory {
                replay.extend(["--device-memory", m]);
            }
            let inferred = json(&cachealloc(&replay));
            let what = format!("{what} (ranges inferred)");
            assert_same_figures(&what, &synth, &inferred);
            assert_eq!(
                inferred["allocs_at_recorded_addr"], inferred["allocs"],
                "{what}"
            );
        }
    }
    std::fs::remove_file(&path).ok();
    std::fs::remove_file(&inferred_path).ok();
}

/// A run saved without a capacity keeps the workload itself: replayed under a capacity and
/// settings, it gives what `synth` gives under them (the README's example).
#[test]
fn a_run_saved_without_a_capacity_replays_as_synth_runs_under_any() {
    let spec = "transformer:steps=3";
    let (_, _, path) = synth_saved("workload", spec, &[]);
    let p = path.to_str().unwrap();
    let mut ooms = 0;
    for capacity in ["1.5GiB", "3GiB"] {
        for conf in ["", "expandable_segments:True", "max_split_size_mb:64"] {
            let options = ["--capacity", capacity, "--conf", conf, "--json"];
            let mut synth_args = vec!["synth", spec];
            synth_args.extend(options);
            let synth = json(&cachealloc(&synth_args));
            let mut replay_args = vec!["replay", p];
            replay_args.extend(options);
            let replayed = json(&cachealloc(&replay_args));
            assert_same_figures(&format!("{capacity} {conf:?}"), &synth, &replayed);
            assert_eq!(replayed["allocs"], synth["allocs"], "{capacity} {conf:?}");
            ooms += synth["num_ooms"].as_u64().unwrap();
        }
    }
    assert!(ooms > 0, "some of the cases run out of memory");
    std::fs::remove_file(&path).unwrap();
}

fn env_number(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{var} takes a number, not {v:?}")),
        Err(_) => default,
    }
}

/// The transformer workload saved on a device of `capacity`, with a `memory_fraction` line of
/// `fraction` before its first event (the program set it before its first allocation).
fn saved_with_fraction(name: &str, capacity: &str, fraction: f64) -> PathBuf {
    let (_, bytes, path) = synth_saved(name, "transformer", &["--capacity", capacity]);
    let text = String::from_utf8(bytes).unwrap();
    let (header, events) = text.split_once('\n').unwrap();
    let set = format!(
        r#"{{"t_us":0,"device":0,"action":"memory_fraction","addr":0,"size":0,"stream":0,"fraction":{fraction:?}}}"#
    );
    std::fs::write(&path, format!("{header}\n{set}\n{events}")).unwrap();
    path
}

/// A recording whose program set its memory fraction before its first allocation is judged
/// as one configured with it: the settings that fit are those of `--conf` with that fraction,
/// marked the same where they fill it.
#[test]
fn a_fraction_set_before_the_first_allocation_is_the_limit_fits_are_judged_against() {
    let path = saved_with_fraction("fraction-first", "8GiB", 0.7);
    let replayed = json(&cachealloc(&[
        "replay",
        path.to_str().unwrap(),
        "--capacity",
        "8GiB",
        "--json",
    ]));
    std::fs::remove_file(&path).unwrap();
    let configured = json(&cachealloc(&[
        "synth",
        "transformer",
        "--capacity",
        "8GiB",
        "--conf",
        "per_process_memory_fraction:0.7",
        "--json",
    ]));
    let fits = &replayed["fitting_settings"];
    assert!(fits.as_array().is_some_and(|f| !f.is_empty()), "{replayed}");
    let marked = |fits: &Value| -> Vec<(Value, Value)> {
        fits.as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["max_split_size_mb"].clone(),
                    f["fills_memory_limit"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(marked(fits), marked(&configured["fitting_settings"]));
    assert!(
        marked(fits).iter().any(|(_, fills)| fills == true),
        "{replayed}"
    );
}

/// A recording whose program lifts its memory fraction as it starts (a `memory_fraction` line
/// of 1) replays without the fraction `--conf` names, and the settings that fit are judged
/// against the device, not against a fraction no longer in force: marked as filling the
/// device where their peak does.
#[test]
fn fits_are_judged_against_the_device_when_the_program_sets_its_fraction() {
    let path = saved_with_fraction("fraction-lifted", "5800MiB", 1.0);
    let args = [
        "replay",
        path.to_str().unwrap(),
        "--capacity",
        "5800MiB",
        "--conf",
        "per_process_memory_fraction:0.9",
    ];
    let v = json(&cachealloc(&[&args[..], &["--json"]].concat()));
    let summary = String::from_utf8(cachealloc(&args).stdout).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(v["memory_fraction_calls"], 1);
    let full = v["fitting_settings"]
        .as_array()
        .expect("the device alone makes the default settings run out")
        .iter()
        .filter(|f| {
            let fills = (5800u64 << 20) - f["peak_reserved_bytes"].as_u64().unwrap() < 20 << 20;
            assert_eq!(f["fills_memory_limit"], fills, "{f}");
            fills
        })
        .count();
    assert!(full > 0, "{v}");
    assert_eq!(
        summary.matches("(fills the device)").count(),
        full,
        "{summary}"
    );
    assert!(
        !summary.contains("(fills its memory fraction)"),
        "{summary}"
    );
}

/// A recording whose program set a memory fraction that binds (0.6 of an 8 GiB device, which
/// holds the run without it): the search tries the replay without the program's calls and
/// says that limit binds, not that the workload needs more memory, naming the program's
/// fraction (in force from before its first allocation, whatever `--conf` said) and one that
/// fits in its place. Both are checked here by replaying the recording with its line edited.
#[test]
fn a_binding_fraction_the_program_set_is_named_not_more_memory() {
    let path = saved_with_fraction("fraction-binds", "8GiB", 0.6);
    let replay = |path: &std::path::Path, extra: &[&str]| {
        let args = [
            &["replay", path.to_str().unwrap(), "--capacity", "8GiB"],
            extra,
        ]
        .concat();
        (
            String::from_utf8(cachealloc(&args).stdout).unwrap(),
            json(&cachealloc(&[&args[..], &["--json"]].concat())),
        )
    };
    let conf = ["--conf", "per_process_memory_fraction:0.9"];
    let (text, v) = replay(&path, &conf);
    assert!(v["num_ooms"].as_u64() > Some(0), "{v}");
    assert!(!text.contains("needs more memory"), "{text}");
    assert!(
        text.contains(
            "within the per_process_memory_fraction:0.6 limit in force (the program set its \
             fraction as it ran): that limit binds, not the device. Without the program's calls \
             (which --conf does not override), with --conf '', it runs without an out-of-memory \
             on this device: peak reserved "
        ),
        "{text}"
    );
    let trial = &v["fraction_trial"];
    assert_eq!(
        (&trial["fraction"], &trial["set_by_program"], &trial["fits"]),
        (&0.6.into(), &true.into(), &true.into()),
        "{v}"
    );
    assert!(trial["enough_conf"].is_null(), "{v}");
    let enough = trial["enough_fraction"].as_f64().unwrap();
    assert!(
        text.contains(&format!(
            "A fraction of {enough} set by the program in their place was replayed and fits too"
        )),
        "{text}"
    );
    // The recording with the program's fraction lifted, and with the one named in its place.
    let edited = |fraction: f64| {
        let text = std::fs::read_to_string(&path).unwrap();
        let copy = temp_path(&format!("fraction-binds-{fraction}"));
        std::fs::write(
            &copy,
            text.replace(
                r#""fraction":0.6}"#,
                &format!(r#""fraction":{fraction:?}}}"#),
            ),
        )
        .unwrap();
        let (_, v) = replay(&copy, &conf);
        std::fs::remove_file(&copy).unwrap();
        v
    };
    let lifted = edited(1.0);
    assert_eq!(
        (&lifted["num_ooms"], &lifted["peak_reserved_bytes"]),
        (&0.into(), &trial["peak_reserved_bytes"]),
        "{lifted}"
    );
    assert_eq!(edited(enough)["num_ooms"], 0);
    std::fs::remove_file(&path).unwrap();
}

/// A trace saved under a name that is not UTF-8: the note's replay command, pasted into bash,
/// replays that very file (a lossy name would be another, missing file).
#[test]
fn the_saved_note_names_a_non_utf8_file_exactly() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let mut name = b"caf\xe9 run's ".to_vec();
    name.extend_from_slice(b"trace");
    let path = dir.path().join(std::ffi::OsStr::from_bytes(&name));
    let out = support::cli::command()
        .args(["synth", "transformer:steps=2", "--save"])
        .arg(&path)
        .output()
        .expect("binary runs");
    assert!(out.status.success(), "{out:?}");
    let note = String::from_utf8_lossy(&out.stderr);
    let word = note
        .split_once("; cachealloc replay ")
        .and_then(|(_, rest)| rest.split_once(" --faithful"))
        .map(|(word, _)| word)
        .unwrap_or_else(|| panic!("no replay command in {note:?}"));
    let replay = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("\"$0\" replay {word} --faithful --json"))
        .arg(env!("CARGO_BIN_EXE_cachealloc"))
        .env_remove("CACHEALLOC_CONF")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("PYTORCH_ALLOC_CONF")
        .output()
        .expect("bash runs");
    assert!(replay.status.success(), "{word}: {replay:?}");
    assert!(json(&replay)["events"].as_u64().unwrap() > 0);
}
