//! The settings a snapshot records, as `cachealloc state` and a faithful replay read them: the
//! fields of `allocator_settings`, and its recorded `PYTORCH_CUDA_ALLOC_CONF` string for the
//! settings PyTorch records no field for (`per_process_memory_fraction`,
//! `max_non_split_rounding_mb`); a string that cannot be read is left out with a warning.

mod support;

use support::cli::{cachealloc, json, state};
use support::snapshot_pickle::{Segment, write_snapshot, write_state_snapshot};

const MIB: u64 = 1 << 20;
const SEG: u64 = 0x7f00_0000_0000;

/// One segment of the large pool on the default stream, with `blocks`.
fn segment(blocks: Vec<(u64, u64, &'static str)>) -> Segment {
    Segment {
        address: SEG,
        stream: 0,
        expandable: false,
        pool_id: (0, 0),
        blocks,
    }
}

/// A 600 MiB segment wholly free, under max_split_size_mb:512 and `conf`.
fn free_600_mib(name: &str, conf: &str) -> std::path::PathBuf {
    write_state_snapshot(
        name,
        &[segment(vec![(600 * MIB, 0, "inactive")])],
        Some((conf, Some(512 * MIB))),
    )
}

/// `per_process_memory_fraction` is in the recorded string only: the request is tried under
/// it, as under `--conf` with it (50 MiB of the 100 MiB device allowed, 20 MiB reserved).
#[test]
fn a_memory_fraction_named_only_in_the_recorded_string_limits_the_request() {
    let path = write_state_snapshot(
        "recorded-fraction.pickle",
        &[segment(vec![
            (10 * MIB, 10 * MIB, "active_allocated"),
            (10 * MIB, 0, "inactive"),
        ])],
        Some(("per_process_memory_fraction:0.5", None)),
    );
    let request = [
        "--request",
        "40MiB",
        "--device-free",
        "80MiB",
        "--device-memory",
        "100MiB",
        "--json",
    ];
    let recorded = json(&state(&path, &request));
    let given = json(&state(
        &path,
        &[&request[..], &["--conf", "per_process_memory_fraction:0.5"]].concat(),
    ));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        recorded["settings"], "as recorded: per_process_memory_fraction:0.5",
        "{recorded}"
    );
    assert_eq!(
        recorded["request"]["outcome"], "out_of_memory",
        "{recorded}"
    );
    assert_eq!(recorded["request"], given["request"]);
}

/// `max_non_split_rounding_mb` is in the recorded string only: a 580 MiB request takes the
/// whole 600 MiB cached block (600 < 580 + 100), as PyTorch does, not a new segment.
#[test]
fn a_non_split_rounding_named_only_in_the_recorded_string_serves_from_the_cache() {
    let conf = "max_split_size_mb:512,max_non_split_rounding_mb:100";
    let path = free_600_mib("recorded-rounding.pickle", conf);
    let j = json(&state(
        &path,
        &["--request", "580MiB", "--device-free", "1GiB", "--json"],
    ));
    let text = String::from_utf8(state(&path, &[]).stdout).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(j["settings"], format!("as recorded: {conf}"), "{j}");
    assert_eq!(j["request"]["outcome"], "cached", "{j}");
    assert!(
        text.contains(&format!("Settings: as recorded: {conf}\n")),
        "{text}"
    );
}

/// A recorded string cachealloc cannot read leaves the snapshot readable: a warning names the
/// file, the key and value and why, and the report goes on with the fields' settings.
#[test]
fn an_unreadable_recorded_string_is_warned_about_and_the_fields_apply() {
    let path = free_600_mib(
        "recorded-unreadable.pickle",
        "max_split_size_mb:512,per_process_memory_fraction:1.5",
    );
    let out = state(&path, &["--json"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(json(&out)["settings"], "as recorded: max_split_size_mb:512");
    assert!(
        err.starts_with(&format!(
            "cachealloc: warning: {}: allocator_settings: recorded PYTORCH_CUDA_ALLOC_CONF: \
             per_process_memory_fraction:1.5: must be in [0.0, 1.0]; the string is left out",
            path.display()
        )),
        "{err}"
    );
}

/// A faithful replay runs with the recorded string's settings too: PyTorch served the second
/// request (580 MiB) from the first's freed 600 MiB block under max_non_split_rounding_mb:100,
/// and so does the replay, with the recording's one cudaMalloc; without the string (one that
/// cannot be read, warned about) it takes a new segment.
#[test]
fn a_faithful_replay_follows_the_recorded_string() {
    let replay = |name: &str, conf: &str| {
        let path = write_snapshot(
            name,
            &[segment(vec![(600 * MIB, 580 * MIB, "active_allocated")])],
            &[
                ("segment_alloc", SEG, 600 * MIB),
                ("alloc", SEG, 600 * MIB),
                ("free_requested", SEG, 600 * MIB),
                ("free_completed", SEG, 600 * MIB),
                ("alloc", SEG, 580 * MIB),
            ],
            Some((conf, Some(512 * MIB))),
        );
        let p = path.to_str().unwrap();
        let out = cachealloc(&["replay", p, "--faithful", "--json"]);
        std::fs::remove_file(&path).unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (json(&out), err)
    };
    let conf = "max_split_size_mb:512,max_non_split_rounding_mb:100";
    let (v, err) = replay("faithful-rounding.pickle", conf);
    assert_eq!(v["settings"], format!("as recorded: {conf}"), "{v}");
    assert_eq!(v["num_device_alloc"], 1, "{v}");
    assert_eq!(v["num_device_alloc"], v["recorded_segment_allocs"], "{v}");
    assert_eq!(v["allocs_at_recorded_addr"], 2, "{v}");
    assert!(!err.contains("warning"), "{err}");

    let (v, err) = replay("faithful-unreadable.pickle", &format!("{conf},typo:1"));
    assert_eq!(v["settings"], "as recorded: max_split_size_mb:512", "{v}");
    assert_eq!(v["num_device_alloc"], 2, "{v}");
    assert!(
        err.contains("allocator_settings: recorded PYTORCH_CUDA_ALLOC_CONF: unknown key 'typo'"),
        "{err}"
    );
}
