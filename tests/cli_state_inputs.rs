//! `cachealloc state` on the inputs a user copies and the files they have: states that cannot
//! exist are refused with or without a request, sizes copied from PyTorch's rounded message are
//! read as meant, and states whose memory is all in private pools or freed pending are told as
//! they are.

mod support;

use support::cli::{cachealloc, json, state};
use support::snapshot_pickle::{Segment, write_state_snapshot};

const MIB: u64 = 1 << 20;
const SEG: u64 = 0x7f00_0000_0000;

/// A native segment at `address` with `blocks` as `(size, requested, state)`.
fn native(address: u64, blocks: Vec<(u64, u64, &'static str)>) -> Segment {
    Segment {
        address,
        stream: 0,
        expandable: false,
        pool_id: (0, 0),
        blocks,
    }
}

/// A state that cannot exist is refused before it is reported, request or not.
#[test]
fn states_that_cannot_exist_are_refused_without_a_request() {
    let cases: [(&str, Vec<Segment>, &str); 3] = [
        (
            "twice.pickle",
            vec![
                native(SEG, vec![(20 * MIB, 20 * MIB, "active_allocated")]),
                native(SEG, vec![(20 * MIB, 20 * MIB, "active_allocated")]),
            ],
            "two end-state segments at 0x7f0000000000",
        ),
        (
            "over-request.pickle",
            vec![native(SEG, vec![(20 * MIB, 30 * MIB, "active_allocated")])],
            "its block at 0x7f0000000000 requests 31457280 bytes, more than its size of 20971520",
        ),
        (
            "not-pages.pickle",
            vec![Segment {
                expandable: true,
                ..native(SEG, vec![(15 * MIB, 15 * MIB, "active_allocated")])
            }],
            "the run of 15728640 bytes at 0x7f0000000000 is not whole pages of 20971520 bytes",
        ),
    ];
    for (name, segments, needle) in cases {
        let path = write_state_snapshot(name, &segments, None);
        for extra in [&[][..], &["--request", "1MiB"]] {
            let out = state(&path, extra);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} {extra:?}: {err}");
            assert!(err.contains(needle), "{name} {extra:?}: {err}");
            assert!(out.stdout.is_empty(), "{name}: no report of such a state");
        }
        std::fs::remove_file(path).unwrap();
    }
    // Settings that cannot hold the state are refused without a request too.
    let path = write_state_snapshot(
        "split-oversize.pickle",
        &[native(
            SEG,
            vec![
                (40 * MIB, 40 * MIB, "active_allocated"),
                (20 * MIB, 0, "inactive"),
            ],
        )],
        None,
    );
    let out = state(&path, &["--conf", "max_split_size_mb:40"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot exist under the settings max_split_size_mb:40 (from --conf)"),
        "{err}"
    );
    std::fs::remove_file(path).unwrap();
}

/// PyTorch prints sizes to two decimals: a total copied from its message a little below the
/// reserved memory is taken as that memory, with a note; further below, it is refused.
#[test]
fn a_total_rounded_down_by_pytorchs_message_is_taken_as_meant() {
    // 1001 MiB reserved: "0.98 GiB" in PyTorch's message is 1003.52 MiB, "0.97 GiB" 993.28.
    let path = write_state_snapshot(
        "rounded-total.pickle",
        &[native(
            SEG,
            vec![(1001 * MIB, 1001 * MIB, "active_allocated")],
        )],
        None,
    );
    let out = state(&path, &["--request", "1MiB", "--device-memory", "1000MiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(
            "--device-memory 1000.00 MiB is 1024.00 KiB less than the memory the snapshot reserves \
             plus --device-free (1001.00 MiB): taken as that"
        ),
        "{err}"
    );
    // Up to 0.5% short is taken as meant (4 MiB of 997 MiB), more is not (5 MiB of 996).
    let out = state(&path, &["--request", "1MiB", "--device-memory", "997MiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("taken as that"), "{err}");
    for short in ["996MiB", "990MiB"] {
        let out = state(&path, &["--request", "1MiB", "--device-memory", short]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{short}: {err}");
        assert!(
            err.contains("is less than the memory the snapshot reserves"),
            "{short}: {err}"
        );
    }
    // A total that is exactly the memory needs no note.
    let out = state(&path, &["--request", "1MiB", "--device-memory", "1001MiB"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    std::fs::remove_file(path).unwrap();
}

/// A state that reserves exactly what per_process_memory_fraction allows is one a program
/// reaches; a byte more is refused.
#[test]
fn a_state_at_the_memory_fraction_limit_exists() {
    let path = write_state_snapshot(
        "at-fraction.pickle",
        &[native(
            SEG,
            vec![(1000 * MIB, 1000 * MIB, "active_allocated")],
        )],
        None,
    );
    let conf = [
        "--conf",
        "per_process_memory_fraction:0.5",
        "--request",
        "1MiB",
    ];
    let out = state(
        &path,
        &[&conf[..], &["--device-memory", "2000MiB"]].concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = state(
        &path,
        &[&conf[..], &["--device-memory", "1998MiB"]].concat(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("more than per_process_memory_fraction:0.5 allows"),
        "{err}"
    );
    std::fs::remove_file(path).unwrap();
}

/// All the memory in private pools: the default pools reserve nothing, and a request goes on
/// the default stream.
#[test]
fn memory_all_in_private_pools() {
    let path = write_state_snapshot(
        "all-private.pickle",
        &[Segment {
            pool_id: (0, 4),
            ..native(
                SEG,
                vec![
                    (20 * MIB, 20 * MIB, "active_allocated"),
                    (20 * MIB, 0, "inactive"),
                ],
            )
        }],
        None,
    );
    let out = state(&path, &["--request", "30MiB", "--device-free", "40MiB"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("The default pools reserve nothing."),
        "{text}"
    );
    assert!(text.contains("on stream 0x0"), "{text}");
    assert!(
        text.contains("served by a new segment of 30.00 MiB"),
        "{text}"
    );
    let out = state(&path, &["--request", "30MiB", "--stream", "0x99"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("(the default pools hold no memory): nothing is cached for it"),
        "{err}"
    );
    std::fs::remove_file(path).unwrap();
}

/// A block freed pending completes while the request fails, after PyTorch's search: the
/// out-of-memory says so, and that the same request made again is served.
#[test]
fn a_block_freed_too_late() {
    let path = write_state_snapshot(
        "freed-late.pickle",
        &[native(
            SEG,
            vec![
                (20 * MIB, 20 * MIB, "active_allocated"),
                (50 * MIB, 50 * MIB, "active_pending_free"),
            ],
        )],
        None,
    );
    let out = state(&path, &["--request", "30MiB", "--json"]);
    let r = &json(&out)["request"];
    assert_eq!(r["outcome"], "out_of_memory", "{r}");
    assert_eq!(r["oom"]["kind"], "freed_during_request", "{r}");
    assert_eq!(r["settings_may_help"], false);
    assert_eq!(r["retried"], true);
    let text = String::from_utf8_lossy(&state(&path, &["--request", "30MiB"]).stdout).into_owned();
    assert!(
        text.contains("Freed too late: a free cached block of 50.00 MiB now holds this 30.00 MiB")
            && text.contains("The same request made again is served"),
        "{text}"
    );
    std::fs::remove_file(path).unwrap();
}

/// A snapshot whose segment names a device ordinal PyTorch cannot have (a damaged file) is
/// refused by `state` and `replay` with exit code 2 and the place, not a panic or a run out of
/// memory building a device for every ordinal below it.
#[test]
fn a_device_ordinal_beyond_pytorchs_range_exits_2() {
    use serde_pickle::{HashableValue as H, SerOptions, Value as V};
    let segment = V::Dict(
        [
            ("device", V::I64(i64::from(i32::MAX))),
            ("address", V::I64(SEG as i64)),
            ("total_size", V::I64(2 * MIB as i64)),
            ("blocks", V::List(vec![])),
        ]
        .into_iter()
        .map(|(k, v)| (H::String(k.into()), v))
        .collect(),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("device.pickle");
    let bytes = serde_pickle::value_to_vec(&V::List(vec![segment]), SerOptions::new()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    for out in [
        state(&path, &[]),
        cachealloc(&["replay", path.to_str().unwrap()]),
    ] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("segments[0]: device ordinal 2147483647 is out of range"),
            "{err}"
        );
    }
}

/// A snapshot whose `allocator_settings` holds a value PyTorch cannot have written is refused
/// by `replay --faithful` and `state` with exit code 2, naming the field, the value and what
/// is allowed, not replayed under another setting (all-zero divisions, no collection,
/// unlimited splitting, an interval left out).
#[test]
fn malformed_recorded_settings_exit_2_naming_the_field() {
    use serde_pickle::{HashableValue as H, SerOptions, Value as V};
    let dict = |items: Vec<(&str, V)>| {
        V::Dict(
            items
                .into_iter()
                .map(|(k, v)| (H::String(k.into()), v))
                .collect(),
        )
    };
    let alloc = dict(vec![
        ("action", V::String("alloc".into())),
        ("addr", V::I64(SEG as i64)),
        ("size", V::I64(MIB as i64)),
        ("stream", V::I64(0)),
    ]);
    let cases: [(&str, V, &str); 4] = [
        (
            "roundup_power2_divisions",
            V::I64(4),
            "allocator_settings.roundup_power2_divisions: found int 4; allowed: a dict",
        ),
        (
            "garbage_collection_threshold",
            V::String("0.6".into()),
            "allocator_settings.garbage_collection_threshold: found str \"0.6\"; allowed: a \
             number from 0.0 (off) up to but not including 1.0",
        ),
        (
            "max_split_size",
            V::F64(536870912.0),
            "allocator_settings.max_split_size: found float 536870912.0; allowed: a whole number \
             of bytes",
        ),
        (
            "roundup_power2_divisions",
            dict(vec![("65536", V::I64(4))]),
            "allocator_settings.roundup_power2_divisions: found key str \"65536\"; allowed: each \
             interval's start in MiB, a power of 2 from \"1\" to \"32768\"",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, value, message) in cases {
        let top = dict(vec![
            ("segments", V::List(vec![])),
            ("device_traces", V::List(vec![V::List(vec![alloc.clone()])])),
            (
                "allocator_settings",
                dict(vec![
                    ("PYTORCH_CUDA_ALLOC_CONF", V::String(String::new())),
                    (name, value),
                ]),
            ),
        ]);
        let path = dir.path().join("settings.pickle");
        std::fs::write(
            &path,
            serde_pickle::value_to_vec(&top, SerOptions::new()).unwrap(),
        )
        .unwrap();
        for out in [
            cachealloc(&["replay", path.to_str().unwrap(), "--faithful"]),
            state(&path, &[]),
        ] {
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{message}: {err}");
            assert!(err.contains(message), "{message:?} in {err}");
        }
    }
}
