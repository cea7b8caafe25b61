//! The settings search after an out-of-memory, as `cachealloc` reports it, where the settings
//! in force are the cause: the replay's own `roundup_power2_divisions` or memory fraction. It
//! names the setting to drop rather than saying the workload needs more memory, and does not
//! offer values that change nothing as the remedy.

mod support;

use serde_json::Value;
use support::cli::{cachealloc, json};

/// The text and the JSON of `cachealloc ARGS`.
fn run(args: &[&str]) -> (String, Value) {
    let text = String::from_utf8(cachealloc(args).stdout).unwrap();
    let v = json(&cachealloc(&[args, &["--json"]].concat()));
    (text, v)
}

/// Whether `cachealloc synth ARGS --conf CONF` replays without an out-of-memory.
fn fits(synth: &[&str], conf: &str) -> bool {
    let v = json(&cachealloc(
        &[&["synth"], synth, &["--conf", conf, "--json"]].concat(),
    ));
    v["num_ooms"] == 0
}

/// The transformer workload on a 5.6 GiB device under `roundup_power2_divisions:4`: its
/// `synth` arguments, and the text and JSON of its replay.
fn divided_transformer() -> ([&'static str; 3], (String, Value)) {
    let synth = ["transformer", "--capacity", "5.6GiB"];
    let args = [
        &["synth"],
        &synth[..],
        &["--conf", "roundup_power2_divisions:4"],
    ]
    .concat();
    (synth, run(&args))
}

/// A fragmentation out-of-memory under `roundup_power2_divisions:4` on a 5.6 GiB device, which
/// no value fixes with them: without them values fit, and the summary says to drop them.
#[test]
fn the_replays_divisions_are_named_as_what_to_drop() {
    let (synth, (text, v)) = divided_transformer();
    assert!(!text.contains("needs more memory"), "{text}");
    assert!(
        text.contains(
            "and also without its roundup_power2_divisions); none keeps this replay's \
             roundup_power2_divisions:4: drop it:\n"
        ),
        "{text}"
    );
    let fitting = v["fitting_settings"].as_array().unwrap();
    assert!(!fitting.is_empty(), "{v}");
    for f in fitting {
        assert_eq!(
            f["dropped_settings"],
            serde_json::json!(["roundup_power2_divisions:4"])
        );
        let conf = f["conf"].as_str().unwrap();
        assert!(fits(&synth, conf), "{conf}");
        assert!(
            text.contains(&format!("  --conf {conf} "))
                && text.contains("(without roundup_power2_divisions:4)"),
            "{text}"
        );
    }
}

/// The same replay's expandable-segments trial: with the divisions it runs out of memory too,
/// without them it fits, and the summary gives the settings that do.
#[test]
fn the_expandable_trial_names_the_divisions_to_drop() {
    let (synth, (text, v)) = divided_transformer();
    let trial = &v["expandable_segments_trial"];
    assert_eq!(trial["fits"], false, "{trial}");
    let without = &trial["fits_without"];
    assert_eq!(
        without["dropped_settings"],
        serde_json::json!(["roundup_power2_divisions:4"])
    );
    let conf = without["conf"].as_str().unwrap();
    assert_eq!(conf, "expandable_segments:True");
    assert!(fits(&synth, conf));
    assert!(!fits(&synth, trial["conf"].as_str().unwrap()));
    assert!(
        text.contains(
            "it runs out of memory too, first at operation 46791; without this replay's \
             roundup_power2_divisions:4 as well (--conf expandable_segments:True) it runs \
             without an out-of-memory: peak reserved "
        ),
        "{text}"
    );
}

/// Under `per_process_memory_fraction:0.6` of an 8 GiB device the limit binds, not the device:
/// the summary says so, and names a fraction that fits.
#[test]
fn a_binding_memory_fraction_is_named() {
    let synth = ["transformer", "--device-memory", "8GiB"];
    let args = [
        &["synth"],
        &synth[..],
        &["--conf", "per_process_memory_fraction:0.6"],
    ]
    .concat();
    let (text, v) = run(&args);
    assert!(!text.contains("needs more memory"), "{text}");
    assert!(
        text.contains(
            "lets this workload run without an out-of-memory within its \
             per_process_memory_fraction:0.6 limit: that limit binds, not the device. Without \
             it (--conf '') it runs without an out-of-memory on this device"
        ),
        "{text}"
    );
    let trial = &v["fraction_trial"];
    assert_eq!(
        (&trial["fraction"], &trial["fits"]),
        (&0.6.into(), &true.into()),
        "{v}"
    );
    let fraction = trial["enough_fraction"].as_f64().unwrap();
    let conf = trial["enough_conf"].as_str().unwrap();
    assert_eq!(conf, format!("per_process_memory_fraction:{fraction}"));
    assert!(fits(&synth, conf) && fits(&synth, ""), "{conf}");
    assert!(
        text.contains(&format!(
            "A fraction of {fraction} was replayed and fits too (--conf {conf}; "
        )),
        "{text}"
    );
    // On a 2 GiB device the run (one step, which is quicker) does not fit without the fraction
    // either.
    let args = [
        "synth",
        "transformer:steps=1",
        "--device-memory",
        "2GiB",
        "--conf",
        "per_process_memory_fraction:0.6",
    ];
    let (text, v) = run(&args);
    assert_eq!(v["fraction_trial"]["fits"], false, "{v}");
    assert!(v["fraction_trial"]["enough_fraction"].is_null(), "{v}");
    assert!(
        text.contains(
            "within its per_process_memory_fraction:0.6 limit, nor without it on this device: it \
             needs more memory."
        ),
        "{text}"
    );
    // Without a fraction there is no such trial.
    let v = json(&cachealloc(&[
        "synth",
        "transformer:steps=1",
        "--capacity",
        "2GiB",
        "--json",
    ]));
    assert!(v["fraction_trial"].is_null(), "{v}");
}

/// Small requests only: no `max_split_size_mb` value changes anything. Dropping the replay's
/// `roundup_power2_divisions:2` is what fits (the defaults), and the values with the same
/// figures are folded into it, not listed as eight remedies.
#[test]
fn values_that_change_nothing_are_not_listed_as_remedies() {
    let synth = [
        "loguniform:ops=50000,min=512,max=1048576,budget_gib=1",
        "--capacity",
        "1150MiB",
    ];
    assert!(fits(&synth, ""), "the defaults fit");
    let args = [
        &["synth"],
        &synth[..],
        &["--conf", "roundup_power2_divisions:2"],
    ]
    .concat();
    let (text, v) = run(&args);
    let fitting = v["fitting_settings"].as_array().unwrap();
    let [fit] = &fitting[..] else {
        panic!("one fit: {v}");
    };
    assert!(fit["max_split_size_mb"].is_null(), "{fit}");
    assert_eq!(fit["conf"], "");
    assert_eq!(
        fit["same_figures_max_split_size_mb"],
        serde_json::json!([1024, 512, 256, 128, 64, 48, 32, 20])
    );
    assert!(
        text.contains(
            "none keeps this replay's roundup_power2_divisions:2: drop it:\n  --conf ''  peak \
             reserved"
        ) && text.contains(
            "(without roundup_power2_divisions:2: the defaults; max_split_size_mb 1024, 512, \
             256, 128, 64, 48, 32, 20 added give the same figures)\n"
        ),
        "{text}"
    );
    assert!(!text.contains("--conf max_split_size_mb:"), "{text}");
}

/// A listed `max_split_size_mb:20` is replayed as 21 too, the smallest value PyTorch 2.9 and
/// older accept: on the transformer workload at 5.6 GiB, 20 fits and 21 does not, which a user
/// who copies the setting to such a PyTorch must learn here, not on the GPU.
#[test]
fn a_fitting_20_is_replayed_as_21_for_older_pytorch() {
    let synth = ["transformer", "--capacity", "5.6GiB"];
    let (text, v) = run(&[&["synth"], &synth[..]].concat());
    let fitting = v["fitting_settings"].as_array().unwrap();
    assert!(
        fitting.iter().any(|f| f["conf"] == "max_split_size_mb:20"),
        "{v}"
    );
    let older = &v["older_pytorch_trial"];
    assert_eq!(older["conf"], "max_split_size_mb:21");
    assert_eq!(older["fits"], false);
    assert!(fits(&synth, "max_split_size_mb:20"));
    assert!(!fits(&synth, "max_split_size_mb:21"));
    let at = older["first_oom_event_index"].as_u64().unwrap();
    assert!(
        text.contains(&format!(
            "  (PyTorch 2.9 and older refuse max_split_size_mb:20, wanting more than 20: with \
             them --conf max_split_size_mb:21 runs out of memory, first at operation {at}.)\n"
        )),
        "{text}"
    );
    // Where 20 is not listed (at 5.5 GiB only 128 fits), nothing is said of it.
    let (text, v) = run(&["synth", "transformer", "--capacity", "5.5GiB"]);
    let fitting = v["fitting_settings"].as_array().unwrap();
    assert!(!fitting.is_empty(), "{v}");
    assert!(fitting.iter().all(|f| f["max_split_size_mb"] != 20), "{v}");
    assert!(v["older_pytorch_trial"].is_null(), "{v}");
    assert!(!text.contains("PyTorch 2.9 and older refuse"), "{text}");
}
