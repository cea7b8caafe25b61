//! Unit tests of `super` (the snapshot module), kept in their own file.

use super::*;
use serde_pickle::{HashableValue as H, SerOptions, Value as V};
use std::collections::BTreeMap;

fn dict(items: Vec<(&str, V)>) -> V {
    V::Dict(
        items
            .into_iter()
            .map(|(k, v)| (H::String(k.into()), v))
            .collect::<BTreeMap<_, _>>(),
    )
}

fn s(text: &str) -> V {
    V::String(text.into())
}

fn frames(names: &[&str]) -> V {
    V::List(
        names
            .iter()
            .map(|n| {
                dict(vec![
                    ("name", s(n)),
                    ("filename", s("??")),
                    ("line", V::I64(0)),
                ])
            })
            .collect(),
    )
}

fn entry(action: &str, addr: i64, size: i64, extra: Vec<(&str, V)>) -> V {
    let mut items = vec![
        ("action", s(action)),
        ("addr", V::I64(addr)),
        ("size", V::I64(size)),
        ("stream", V::I64(0)),
        ("time_us", V::I64(1_700_000_000_000_000)),
    ];
    items.extend(extra);
    dict(items)
}

const SEG: i64 = 0x7f00_0000_0000;

fn snapshot(entries: Vec<V>) -> V {
    let block = |addr: Option<i64>, size: i64, req: i64, state: &str| {
        let mut items = vec![
            ("size", V::I64(size)),
            ("requested_size", V::I64(req)),
            ("state", s(state)),
        ];
        if let Some(a) = addr {
            items.push(("address", V::I64(a)));
        }
        dict(items)
    };
    let segment = dict(vec![
        ("device", V::I64(0)),
        ("address", V::I64(SEG)),
        ("total_size", V::I64(2 << 20)),
        ("stream", V::I64(0)),
        ("segment_type", s("small")),
        ("is_expandable", V::Bool(false)),
        (
            "blocks",
            V::List(vec![
                block(Some(SEG), 512, 100, "active_allocated"),
                // No address (PyTorch 2.0 files): follows the previous block.
                block(None, (2 << 20) - 512, 0, "inactive"),
            ]),
        ),
    ]);
    let mut divisions = BTreeMap::new();
    divisions.insert(H::String("1".into()), V::I64(0));
    divisions.insert(H::String("4".into()), V::I64(8));
    dict(vec![
        ("segments", V::List(vec![segment])),
        ("device_traces", V::List(vec![V::List(entries)])),
        (
            "allocator_settings",
            dict(vec![
                ("PYTORCH_CUDA_ALLOC_CONF", s("")),
                ("max_split_size", V::I64(-1)),
                ("garbage_collection_threshold", V::F64(0.0)),
                ("expandable_segments", V::Bool(false)),
                ("roundup_power2_divisions", V::Dict(divisions)),
            ]),
        ),
    ])
}

fn bytes(v: &V) -> Vec<u8> {
    serde_pickle::value_to_vec(v, SerOptions::new()).unwrap()
}

fn sample_bytes() -> Vec<u8> {
    bytes(&sample())
}

fn sample() -> V {
    snapshot(vec![
        entry("segment_alloc", SEG, 2 << 20, vec![]),
        entry(
            "alloc",
            SEG,
            100,
            vec![("frames", frames(&["c10::...::malloc(int)"]))],
        ),
        dict(vec![
            ("action", s("oom")),
            ("size", V::I64(1 << 30)),
            ("stream", V::I64(0)),
            ("device_free", V::I64(5 << 20)),
        ]),
        entry(
            "segment_free",
            SEG + (4 << 20),
            2 << 20,
            vec![("frames", frames(&["NativeCachingAllocator::emptyCache()"]))],
        ),
        entry("snapshot", 0, 100, vec![("frames", V::List(vec![]))]),
    ])
}

/// `v` as `json.dump` writes it: tuples as lists, None as null, keys as strings; `device`
/// first, as PyTorch orders a segment's keys, the others sorted (as with `sort_keys=True`,
/// which puts `allocator_settings` first at the top level).
fn json_text(v: &V) -> Vec<u8> {
    fn key(k: &H) -> String {
        match k {
            H::String(key) => key.clone(),
            H::I64(key) => key.to_string(),
            other => panic!("no such key in a snapshot: {other:?}"),
        }
    }
    fn write(v: &V, out: &mut String) {
        let items = |out: &mut String, open, close, items: Vec<(Option<String>, &V)>| {
            out.push(open);
            for (i, (k, v)) in items.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if let Some(k) = k {
                    out.push_str(&serde_json::to_string(&k).unwrap());
                    out.push_str(": ");
                }
                write(v, out);
            }
            out.push(close);
        };
        match v {
            V::None => out.push_str("null"),
            V::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            V::I64(i) => out.push_str(&i.to_string()),
            V::F64(f) => out.push_str(&format!("{f:?}")),
            V::String(text) => out.push_str(&serde_json::to_string(text).unwrap()),
            V::List(list) | V::Tuple(list) => {
                items(out, '[', ']', list.iter().map(|v| (None, v)).collect());
            }
            V::Dict(dict) => {
                let mut pairs: Vec<_> = dict.iter().map(|(k, v)| (Some(key(k)), v)).collect();
                pairs.sort_by_key(|(k, _)| (k.as_deref() != Some("device"), k.clone()));
                items(out, '{', '}', pairs);
            }
            other => panic!("no such value in a snapshot: {other:?}"),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out.into_bytes()
}

#[test]
fn reads_entries_segments_and_settings() {
    let snap = parse_snapshot(&sample_bytes(), "s.pickle").unwrap();
    assert_eq!(snap.devices.len(), 1);
    let dev = &snap.devices[0];
    let actions: Vec<_> = dev.entries.iter().map(|e| e.action).collect();
    assert_eq!(
        actions,
        vec![
            Action::SegmentAlloc,
            Action::Alloc,
            Action::Oom,
            Action::SegmentFree,
            Action::Snapshot
        ]
    );
    let sites: Vec<_> = dev.entries.iter().map(|e| e.call_site).collect();
    assert_eq!(
        sites,
        vec![
            CallSite::Unrecorded,
            CallSite::Malloc,
            CallSite::Unrecorded,
            CallSite::EmptyCache,
            CallSite::Unrecorded
        ]
    );
    assert_eq!(dev.entries[1].addr, SEG as u64);
    assert_eq!(dev.entries[2].device_free, Some(5 << 20));
    assert_eq!(dev.entries[2].size, 1 << 30);
    let seg = &dev.segments[0];
    assert_eq!(seg.pool, PoolKind::Small);
    assert_eq!(seg.blocks[1].address, SEG as u64 + 512);
    assert_eq!(seg.blocks[0].state, BlockState::Allocated);
    assert_eq!(seg.blocks[0].requested_size, 100);
    let settings = dev.settings.as_ref().unwrap();
    assert_eq!(settings.max_split_size, None);
    assert_eq!(settings.roundup_power2_divisions[2], 8);
    assert_eq!(settings.to_settings().max_split_size, u64::MAX);
    assert!(!dev.is_expandable());
}

const MIB: u64 = 1 << 20;

/// The settings read from a snapshot whose `allocator_settings` holds `items`.
fn settings_of(items: Vec<(&str, V)>) -> RecordedSettings {
    read_settings(items).unwrap()
}

fn read_settings(items: Vec<(&str, V)>) -> Result<RecordedSettings, TraceError> {
    let top = dict(vec![
        ("segments", V::List(vec![])),
        ("device_traces", V::List(vec![V::List(vec![])])),
        ("allocator_settings", dict(items)),
    ]);
    let snap = parse_snapshot(&bytes(&top), "settings.pickle")?;
    Ok(snap.settings.unwrap())
}

/// A `roundup_power2_divisions` dict with string keys, as PyTorch writes it.
fn divisions_of(items: &[(&str, V)]) -> V {
    V::Dict(
        items
            .iter()
            .map(|(k, v)| (H::String((*k).into()), v.clone()))
            .collect(),
    )
}

/// The fields PyTorch writes, as the real snapshots hold them: `max_split_size` an int
/// (-1, or bytes), `garbage_collection_threshold` a float, `expandable_segments` a bool,
/// `roundup_power2_divisions` a dict of 16 string keys "1" … "32768" to ints; the
/// largest `max_split_size_mb` PyTorch keeps (the whole MiB below 2^64) written as a
/// negative int64 is unlimited like -1; an int threshold and int keys read as the same.
#[test]
fn settings_as_pytorch_writes_them_are_read() {
    let keys: Vec<String> = (0..ROUNDUP_INTERVALS)
        .map(|i| (1u64 << i).to_string())
        .collect();
    let mut items: Vec<(&str, V)> = keys.iter().map(|k| (k.as_str(), V::I64(0))).collect();
    items[3].1 = V::I64(4);
    items[15].1 = V::I64(8);
    let recorded = settings_of(vec![
        ("PYTORCH_CUDA_ALLOC_CONF", s("max_split_size_mb:512")),
        ("max_split_size", V::I64(512 * MIB as i64)),
        ("garbage_collection_threshold", V::F64(0.6)),
        ("expandable_segments", V::Bool(true)),
        ("pinned_num_register_threads", V::I64(1)),
        ("release_lock_on_cudamalloc", V::Bool(false)),
        ("roundup_power2_divisions", divisions_of(&items)),
    ]);
    let mut divisions = [0; ROUNDUP_INTERVALS];
    divisions[3] = 4;
    divisions[15] = 8;
    assert_eq!(recorded.max_split_size, Some(512 * MIB));
    assert_eq!(recorded.garbage_collection_threshold, 0.6);
    assert!(recorded.expandable_segments);
    assert_eq!(recorded.roundup_power2_divisions, divisions);

    let clamp = -((1i64) << 20);
    for unlimited in [V::I64(-1), V::I64(clamp), V::I64(i64::MIN)] {
        let recorded = settings_of(vec![("max_split_size", unlimited.clone())]);
        assert_eq!(recorded.max_split_size, None, "{unlimited:?}");
    }
    let widest = serde_pickle::to_value(&u64::MAX).unwrap();
    let recorded = settings_of(vec![("max_split_size", widest)]);
    assert_eq!(recorded.max_split_size, Some(u64::MAX));
    assert_eq!(recorded.to_settings().max_split_size, u64::MAX);

    let mut int_keys = BTreeMap::new();
    int_keys.insert(H::I64(2), V::I64(2));
    let recorded = settings_of(vec![
        ("garbage_collection_threshold", V::I64(0)),
        ("roundup_power2_divisions", V::Dict(int_keys)),
    ]);
    assert_eq!(recorded.garbage_collection_threshold, 0.0);
    assert_eq!(recorded.roundup_power2_divisions[1], 2);
}

/// A field that is None is read as one the file lacks: from the recorded string, else
/// its default.
#[test]
fn a_none_field_is_taken_from_the_string_or_its_default() {
    let fields = || {
        [
            "max_split_size",
            "garbage_collection_threshold",
            "expandable_segments",
            "roundup_power2_divisions",
        ]
        .map(|name| (name, V::None))
    };
    let conf = "max_split_size_mb:512,garbage_collection_threshold:0.6,\
                roundup_power2_divisions:4,expandable_segments:True";
    let mut items = vec![("PYTORCH_CUDA_ALLOC_CONF", s(conf))];
    items.extend(fields());
    let recorded = settings_of(items);
    assert_eq!(recorded.max_split_size, Some(512 * MIB));
    assert_eq!(recorded.garbage_collection_threshold, 0.6);
    assert_eq!(recorded.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
    assert!(recorded.expandable_segments);

    let mut items = vec![("PYTORCH_CUDA_ALLOC_CONF", V::None)];
    items.extend(fields());
    let recorded = settings_of(items);
    assert_eq!(recorded.conf, None);
    assert_eq!(recorded.to_settings(), Settings::default());
}

/// A field holding what PyTorch cannot have written is refused, naming the field, the
/// value and what is allowed, not read as another setting (all zeros, 0, unlimited, or
/// the interval left out).
#[test]
fn malformed_settings_are_refused_naming_field_value_and_allowed() {
    let divisions = |key: &str, v: V| divisions_of(&[(key, v)]);
    let cases: Vec<(&str, V, &str)> = vec![
        (
            "roundup_power2_divisions",
            V::List(vec![V::I64(4)]),
            "allocator_settings.roundup_power2_divisions: found list; allowed: a dict of \
             divisions keyed by each interval's start in MiB (\"1\", \"2\", \"4\", …, \
             \"32768\")",
        ),
        (
            "roundup_power2_divisions",
            V::I64(4),
            "allocator_settings.roundup_power2_divisions: found int 4; allowed: a dict",
        ),
        (
            "roundup_power2_divisions",
            divisions("65536", V::I64(4)),
            "allocator_settings.roundup_power2_divisions: found key str \"65536\"; \
             allowed: each interval's start in MiB, a power of 2 from \"1\" to \"32768\"",
        ),
        (
            "roundup_power2_divisions",
            divisions("0", V::I64(4)),
            "found key str \"0\"; allowed: each interval's start",
        ),
        (
            "roundup_power2_divisions",
            divisions("+4", V::I64(4)),
            "found key str \"+4\"; allowed: each interval's start",
        ),
        (
            "roundup_power2_divisions",
            divisions("4", s("4")),
            "allocator_settings.roundup_power2_divisions[\"4\"]: found str \"4\"; \
             allowed: 0 (off) or a power of 2 (1, 2, 4, 8, …)",
        ),
        (
            "roundup_power2_divisions",
            divisions("4", V::I64(3)),
            "allocator_settings.roundup_power2_divisions[\"4\"]: found int 3; allowed",
        ),
        (
            "roundup_power2_divisions",
            divisions("4", V::I64(-2)),
            "allocator_settings.roundup_power2_divisions[\"4\"]: found int -2; allowed",
        ),
        (
            "garbage_collection_threshold",
            s("0.6"),
            "allocator_settings.garbage_collection_threshold: found str \"0.6\"; allowed: \
             a number from 0.0 (off) up to but not including 1.0",
        ),
        (
            "garbage_collection_threshold",
            V::F64(1.0),
            "allocator_settings.garbage_collection_threshold: found float 1.0; allowed",
        ),
        (
            "garbage_collection_threshold",
            V::F64(-0.5),
            "allocator_settings.garbage_collection_threshold: found float -0.5; allowed",
        ),
        (
            "garbage_collection_threshold",
            V::F64(f64::NAN),
            "allocator_settings.garbage_collection_threshold: found float NaN; allowed",
        ),
        (
            "max_split_size",
            s("512"),
            "allocator_settings.max_split_size: found str \"512\"; allowed: a whole number \
             of bytes below 2^64, or -1 (unlimited",
        ),
        (
            "max_split_size",
            V::F64(536870912.0),
            "allocator_settings.max_split_size: found float 536870912.0; allowed",
        ),
        (
            "max_split_size",
            V::Bool(true),
            "allocator_settings.max_split_size: found bool True; allowed",
        ),
        (
            "expandable_segments",
            s("True"),
            "allocator_settings.expandable_segments: found str \"True\"; allowed: True or \
             False",
        ),
        (
            "expandable_segments",
            V::I64(1),
            "allocator_settings.expandable_segments: found int 1; allowed: True or False",
        ),
        (
            "PYTORCH_CUDA_ALLOC_CONF",
            V::I64(1),
            "allocator_settings.PYTORCH_CUDA_ALLOC_CONF: found int 1; allowed: a string",
        ),
    ];
    for (name, value, message) in cases {
        let err = read_settings(vec![(name, value.clone())])
            .expect_err(&format!("{name} = {value:?} is refused"));
        assert!(matches!(err, TraceError::Unsupported { .. }), "{err}");
        let err = err.to_string();
        assert!(err.starts_with("settings.pickle: "), "{err}");
        assert!(err.contains(message), "{message:?} in {err}");
    }
}

/// `allocator_settings` as PyTorch writes it: the string `conf` and the fields, with
/// `max_split_size` (-1 for unlimited) and the other fields at their defaults.
fn recorded_fields(conf: &str, max_split_size: i64) -> Vec<(&'static str, V)> {
    vec![
        ("PYTORCH_CUDA_ALLOC_CONF", s(conf)),
        ("max_split_size", V::I64(max_split_size)),
        ("garbage_collection_threshold", V::F64(0.0)),
        ("expandable_segments", V::Bool(false)),
        ("roundup_power2_divisions", V::Dict(BTreeMap::new())),
    ]
}

/// PyTorch records no field for `per_process_memory_fraction` or
/// `max_non_split_rounding_mb`: the string names them, and they are in force.
#[test]
fn the_recorded_string_names_the_settings_without_a_field() {
    let conf = "per_process_memory_fraction:0.5,max_non_split_rounding_mb:100";
    let recorded = settings_of(recorded_fields(conf, -1));
    assert!(recorded.conf_warnings.is_empty(), "{recorded:?}");
    let settings = recorded.to_settings();
    assert_eq!(settings.per_process_memory_fraction, 0.5);
    assert_eq!(settings.max_non_split_rounding, 100 * MIB);
    assert_eq!(settings.max_split_size, u64::MAX);
}

/// Where a field and the string both name a setting, the field's value is in force (the
/// string is the last PyTorch read; the fields, what it held); a field the file lacks is
/// taken from the string.
#[test]
fn fields_win_over_the_string_and_the_string_fills_missing_fields() {
    let conf = "max_split_size_mb:512,garbage_collection_threshold:0.6,\
                roundup_power2_divisions:4,expandable_segments:True";
    let settings = settings_of(recorded_fields(conf, -1)).to_settings();
    assert_eq!(settings.max_split_size, u64::MAX);
    assert_eq!(settings.garbage_collection_threshold, 0.0);
    assert_eq!(settings.roundup_power2_divisions, [0; ROUNDUP_INTERVALS]);
    assert!(!settings.expandable_segments);

    let string_only = settings_of(vec![("PYTORCH_CUDA_ALLOC_CONF", s(conf))]);
    assert_eq!(string_only.max_split_size, Some(512 * MIB));
    assert_eq!(string_only.garbage_collection_threshold, 0.6);
    assert_eq!(string_only.roundup_power2_divisions, [4; ROUNDUP_INTERVALS]);
    assert!(string_only.expandable_segments);
}

/// A string cachealloc cannot read leaves the file readable: it is left out, with a
/// warning that names the file, the key and value, and why, and the fields still apply.
#[test]
fn an_unreadable_string_is_left_out_with_a_warning() {
    let conf = "per_process_memory_fraction:1.5,max_non_split_rounding_mb:100";
    let recorded = settings_of(recorded_fields(conf, 512 * MIB as i64));
    assert_eq!(recorded.conf_settings, None);
    assert_eq!(
        recorded.to_settings(),
        Settings {
            max_split_size: 512 * MIB,
            ..Settings::default()
        }
    );
    let [warning] = recorded.conf_warnings.as_slice() else {
        panic!("one warning: {recorded:?}");
    };
    for part in [
        "settings.pickle: allocator_settings: recorded PYTORCH_CUDA_ALLOC_CONF: ",
        "per_process_memory_fraction:1.5: must be in [0.0, 1.0]",
        "the string is left out",
    ] {
        assert!(warning.contains(part), "{part:?} in {warning}");
    }
    let unknown = settings_of(recorded_fields("max_split_size_mb:512,not_a_key:1", -1));
    assert!(
        unknown.conf_warnings[0].contains("unknown key 'not_a_key'"),
        "{unknown:?}"
    );
}

/// A recorded key that changes PyTorch's policy and that cachealloc does not follow is
/// warned about, as it is in the variable.
#[test]
fn a_recorded_policy_key_cachealloc_ignores_is_warned_about() {
    let recorded = settings_of(recorded_fields("large_segment_size_mb:40", -1));
    assert!(recorded.conf_settings.is_some());
    let [warning] = recorded.conf_warnings.as_slice() else {
        panic!("one warning: {recorded:?}");
    };
    assert!(
        warning.starts_with(
            "settings.pickle: allocator_settings: recorded PYTORCH_CUDA_ALLOC_CONF: \
             large_segment_size_mb is not supported by cachealloc yet"
        ),
        "{warning}"
    );
}

fn error_of(data: &[u8]) -> TraceError {
    parse_snapshot(data, "bad.pickle").unwrap_err()
}

#[test]
fn garbage_and_truncated_files_are_not_pickles() {
    for data in [&b""[..], b"hello world", b"\x80\x04\x95", b"{\"json\": 1}"] {
        let err = error_of(data);
        assert!(matches!(err, TraceError::NotPickle { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("bad.pickle: not a readable Python pickle")
        );
    }
    let good = sample_bytes();
    for n in (0..good.len()).step_by(7) {
        let err = error_of(&good[..n]);
        assert!(matches!(err, TraceError::NotPickle { .. }), "{n}: {err}");
    }
}

/// Files people mistake for snapshots are named for what they are.
#[test]
fn foreign_files_are_named_for_what_they_are() {
    let cases: [(&[u8], &str); 13] = [
        (b"\x80\x04", "truncated"),
        (b"\xff", "unknown opcode 0xff"),
        (
            b"\x1f\x8b\x08\x00\x00\x00",
            "gzip-compressed: a profiler trace (.json.gz) perhaps",
        ),
        (b"PK\x03\x04\x14\x00", "zip archive, as torch.save writes"),
        (
            b"BZh91AY&SY\x00\x01",
            "bzip2-compressed; a compressed snapshot must be \
         decompressed first (bunzip2)",
        ),
        (
            b"\xfd7zXZ\x00\x00\x04",
            "xz-compressed; a compressed snapshot must be \
         decompressed first (unxz)",
        ),
        (
            b"\x28\xb5\x2f\xfd\x24\x00",
            "zstd-compressed; a compressed snapshot must be \
         decompressed first (unzstd)",
        ),
        (
            b"\x04\x22\x4d\x18\x64\x40",
            "lz4-compressed; a compressed snapshot must be \
         decompressed first (unlz4)",
        ),
        // Not bzip2 without the block size's digit.
        (b"BZhx\x00\x00", "truncated"),
        (
            b"  {\"traceEvents\": []}",
            "JSON text, but not a memory snapshot (a profiler trace perhaps)",
        ),
        (
            b"[{\"device\": 0, \"address\": 1}]",
            "it is JSON text, but not a memory snapshot (a profiler trace perhaps)",
        ),
        (
            b"id,lower,upper,size\n0,1,2,3\n",
            "text, starting \"id,lower,upper,size\"",
        ),
        (b"\xa1\xff\x00garbage", "unknown opcode 0xa1 at byte 0"),
    ];
    for (data, says) in cases {
        let err = error_of(data).to_string();
        assert!(err.contains(says), "{err:?} should say {says:?}");
        assert!(
            err.starts_with("bad.pickle: not a readable Python pickle: "),
            "{err}"
        );
    }
    // A protocol-0 pickle is text too, and still read as a pickle.
    assert!(!matches!(
        error_of(b"(dp0\nVsegments\np1\n(lp2\ns."),
        TraceError::NotPickle { .. }
    ));
}

/// A snapshot written as JSON reads as the pickle it came from: the dict (its tuples as
/// lists) and `torch.cuda.memory_snapshot()`'s list of segments.
#[test]
fn a_snapshot_written_as_json_reads_as_its_pickle() {
    let mut pool_id = sample();
    if let V::Dict(top) = &mut pool_id
        && let Some(V::List(segments)) = top.get_mut(&H::String("segments".into()))
        && let Some(V::Dict(segment)) = segments.first_mut()
    {
        segment.insert(
            H::String("segment_pool_id".into()),
            V::Tuple(vec![V::I64(1), V::I64(3)]),
        );
    }
    let V::Dict(top) = sample() else {
        unreachable!("a dict")
    };
    let segments = top[&H::String("segments".into())].clone();
    for v in [sample(), pool_id, segments] {
        let from_pickle = parse_snapshot(&bytes(&v), "s").unwrap();
        let text = json_text(&v);
        let from_json = parse_snapshot(&text, "s").unwrap();
        assert_eq!(from_json, from_pickle, "{}", String::from_utf8_lossy(&text));
    }
}

/// A JSON snapshot meets the pickle's checks with the pickle's messages, integers beyond 64
/// bits included; text that is not JSON says where it breaks.
#[test]
fn a_malformed_json_snapshot_is_refused_naming_what_is_wrong() {
    let json_error = |text: &str| parse_snapshot(text.as_bytes(), "s.json").unwrap_err();
    let with_entry = |entry: &str| format!("{{\"segments\": [], \"device_traces\": [[{entry}]]}}");
    // serde_json reads an integer beyond 64 bits as a float: it is named as too large.
    for (addr, found) in [
        ("18446744073709551616", "1.8446744073709552e19"),
        ("-9223372036854775809", "-9.223372036854776e18"),
        ("1e300", "1e300"),
    ] {
        let err = json_error(&with_entry(&format!(
            r#"{{"action": "alloc", "addr": {addr}, "size": 1, "stream": 0}}"#
        )));
        assert!(matches!(err, TraceError::Unsupported { .. }), "{err}");
        assert!(
            err.to_string().ends_with(&format!(
                "device_traces[0][0]: 'addr' must be a non-negative integer below 2^64, \
                 found a number too large for a 64-bit field (about {found})"
            )),
            "{err}"
        );
    }
    // A float within the 64-bit range is a float; so is a wide one in a pickle.
    let err = json_error(&with_entry(
        r#"{"action": "alloc", "addr": 1, "size": 512.0, "stream": 0}"#,
    ));
    assert!(err.to_string().ends_with("found float 512.0"), "{err}");
    let wide = entry("alloc", SEG, 1, vec![("addr", V::F64(1e20))]);
    let err = error_of(&bytes(&snapshot(vec![wide]))).to_string();
    assert!(
        err.ends_with("found float 100000000000000000000.0"),
        "{err}"
    );
    let err = json_error(&with_entry(
        r#"{"action": "alloc", "addr": 1, "size": null}"#,
    ));
    assert!(
        err.to_string().ends_with(
            "device_traces[0][0]: 'size' must be a non-negative integer below 2^64, found None"
        ),
        "{err}"
    );
    let err = json_error(r#"{"segments": []}"#);
    assert!(matches!(err, TraceError::NotSnapshot { .. }), "{err}");
    assert!(
        err.to_string().contains(
            "not a PyTorch memory snapshot: the top-level dict has no 'device_traces' key"
        ),
        "{err}"
    );
    let err = json_error(&with_entry(r#"{"action": "alloc", "addr": 1,}"#));
    assert!(matches!(err, TraceError::NotJson { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "s.json: begins as a memory snapshot written as JSON, but is not readable JSON: \
         trailing comma at line 1 column 67"
    );
}

/// A malformed field is shown as Python writes it, not as the decoder stores it.
#[test]
fn bad_fields_show_their_python_value() {
    let err = error_of(&bytes(&snapshot(vec![entry("alloc", SEG, -5, vec![])]))).to_string();
    assert!(
        err.contains("'size' must be a non-negative integer below 2^64, found int -5"),
        "{err}"
    );
}

#[test]
fn pickles_that_are_not_snapshots_say_so() {
    let err = error_of(&bytes(&V::List(vec![V::I64(1)]))).to_string();
    assert!(
        err.contains("not a PyTorch memory snapshot") && err.contains("list"),
        "{err}"
    );
    assert!(err.contains("but of int values"), "{err}");
    let err = error_of(&bytes(&dict(vec![("segments", V::List(vec![]))]))).to_string();
    assert!(err.contains("'device_traces'"), "{err}");
    let err = error_of(&bytes(&s("just a string"))).to_string();
    assert!(err.contains("top level is a str"), "{err}");
    // torch.save(..., _use_new_zipfile_serialization=False): LONG1 of its magic number,
    // then the protocol version, system information and the object, each a pickle.
    let legacy = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03.";
    let err = error_of(legacy).to_string();
    assert!(
        err.contains("it is a file of torch.save's legacy format"),
        "{err}"
    );
}

#[test]
fn an_oom_entry_without_its_free_bytes_names_device_free() {
    let oom = dict(vec![
        ("action", s("oom")),
        ("size", V::I64(512)),
        ("stream", V::I64(0)),
    ]);
    let err = error_of(&bytes(&snapshot(vec![oom]))).to_string();
    assert!(
        err.contains(
            "device_traces[0][0]: an 'oom' entry needs 'device_free' (the device's free \
             bytes when the allocation failed), and this one has neither 'device_free' nor \
             'addr'"
        ),
        "{err}"
    );
}

/// `torch.cuda.memory_snapshot()` writes its segments alone, as a list: a state with no
/// trace and no settings, each segment on the device it names.
#[test]
fn a_list_of_segments_is_a_state_without_a_trace() {
    let V::Dict(top) = snapshot(vec![]) else {
        unreachable!()
    };
    let mut segments = top[&H::String("segments".into())].clone();
    if let V::List(list) = &mut segments {
        let mut second = list[0].clone();
        if let V::Dict(d) = &mut second {
            d.insert(H::String("device".into()), V::I64(2));
        }
        list.push(second);
    }
    let snap = parse_snapshot(&bytes(&segments), "list.pickle").unwrap();
    assert!(snap.segments_only);
    assert_eq!(snap.settings, None);
    assert_eq!(snap.devices.len(), 3);
    assert_eq!(snap.traced_devices().count(), 0);
    for d in [0, 2] {
        assert_eq!(snap.devices[d].segments.len(), 1, "device {d}");
        assert_eq!(snap.devices[d].segments[0].blocks.len(), 2);
    }
    assert!(snap.devices[1].segments.is_empty());
}

#[test]
fn malformed_entries_name_the_place() {
    let err = error_of(&bytes(&snapshot(vec![entry("teleport", 0, 0, vec![])])));
    let text = err.to_string();
    assert!(matches!(err, TraceError::Unsupported { .. }));
    assert!(
        text.contains("device_traces[0][0]") && text.contains("'teleport'"),
        "{text}"
    );
    let no_size = dict(vec![("action", s("alloc")), ("addr", V::I64(0))]);
    let text = error_of(&bytes(&snapshot(vec![no_size]))).to_string();
    assert!(text.contains("'size' is missing"), "{text}");
    let negative = entry("alloc", -4, 512, vec![]);
    let text = error_of(&bytes(&snapshot(vec![negative]))).to_string();
    assert!(
        text.contains("'addr' must be a non-negative integer"),
        "{text}"
    );
}

/// The sample snapshot with its segment's `segment_pool_id` set to `id`.
fn with_pool_id(id: V) -> Vec<u8> {
    with_segment_field("segment_pool_id", id)
}

/// The sample snapshot with its segment's field `key` set to `value`.
fn with_segment_field(key: &str, value: V) -> Vec<u8> {
    let mut snap = snapshot(vec![]);
    let V::Dict(top) = &mut snap else {
        unreachable!("a dict")
    };
    let Some(V::List(segments)) = top.get_mut(&H::String("segments".into())) else {
        unreachable!("a list of segments")
    };
    let V::Dict(segment) = &mut segments[0] else {
        unreachable!("a segment dict")
    };
    segment.insert(H::String(key.into()), value);
    bytes(&snap)
}

/// PyTorch numbers devices with an 8-bit index: a segment naming a larger ordinal is a
/// damaged file, refused with the place and the range, not read into a recording with a
/// device for every ordinal below it (which ran out of memory, or overflowed at 2^31 - 1).
#[test]
fn a_device_ordinal_beyond_pytorchs_range_is_refused() {
    let device = |n: i64| parse_snapshot(&with_segment_field("device", V::I64(n)), "s.pickle");
    let last = device(127).unwrap();
    assert_eq!(last.devices.len(), 128);
    assert_eq!(last.devices[127].segments.len(), 1);
    for n in [128, 100_000_000, i64::from(i32::MAX), 1 << 40] {
        let err = device(n).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "segments[0]: device ordinal {n} is out of range: PyTorch numbers devices 0 \
                 to 127"
            )),
            "{err}"
        );
    }
}

#[test]
fn segments_of_private_pools_are_told_apart() {
    let pool = |bytes: &[u8]| {
        parse_snapshot(bytes, "s.pickle").unwrap().devices[0].segments[0].private_pool
    };
    assert_eq!(
        pool(&sample_bytes()),
        None,
        "no field: a file from before pools were named"
    );
    let pair = |a, b| V::Tuple(vec![V::I64(a), V::I64(b)]);
    assert_eq!(
        pool(&with_pool_id(pair(0, 0))),
        None,
        "(0, 0): the default pools"
    );
    assert_eq!(pool(&with_pool_id(pair(0, 2))), Some((0, 2)));
    assert_eq!(pool(&with_pool_id(pair(3, 0))), Some((3, 0)));
    assert_eq!(pool(&with_pool_id(V::None)), None);
    let bools = with_pool_id(V::Tuple(vec![V::Bool(true), V::Bool(false)]));
    assert!(
        error_of(&bools)
            .to_string()
            .contains("'segment_pool_id' must be")
    );
    let text = error_of(&with_pool_id(pair(-1, 0))).to_string();
    assert!(
        text.contains("segments[0]: 'segment_pool_id' must be a pair of non-negative integers")
            && text.contains("found tuple"),
        "{text}"
    );
    let text = error_of(&with_pool_id(s("default"))).to_string();
    assert!(text.contains("found str \"default\""), "{text}");
}

/// Fields that older or newer files leave out take the values PyTorch means: a 2 MiB
/// segment without `segment_type` is a small-pool one, a block without `requested_size`
/// requested its size, an entry's `stream` is kept, and `snapshot` and `annotate` entries
/// need no address (nor `annotate` a size).
#[test]
fn fields_a_file_leaves_out_take_pytorchs_meaning() {
    let block = |size: i64| {
        dict(vec![
            ("size", V::I64(size)),
            ("state", s("active_allocated")),
        ])
    };
    let segment = |address: i64, size: i64| {
        dict(vec![
            ("device", V::I64(0)),
            ("address", V::I64(address)),
            ("total_size", V::I64(size)),
            ("blocks", V::List(vec![block(size)])),
        ])
    };
    let mut on_stream = entry("alloc", SEG, 512, vec![]);
    if let V::Dict(d) = &mut on_stream {
        d.insert(H::String("stream".into()), V::I64(0x5555_0000_1230));
    }
    let top = dict(vec![
        // Listed out of address order: read in address order.
        (
            "segments",
            V::List(vec![
                segment(SEG + (64 << 20), 20 << 20),
                segment(SEG, 2 << 20),
            ]),
        ),
        (
            "device_traces",
            V::List(vec![V::List(vec![
                on_stream,
                dict(vec![("action", s("snapshot")), ("size", V::I64(512))]),
                dict(vec![("action", s("annotate"))]),
            ])]),
        ),
        ("allocator_settings", V::None),
    ]);
    let snap = parse_snapshot(&bytes(&top), "old.pickle").unwrap();
    assert_eq!(snap.settings, None);
    let dev = &snap.devices[0];
    let seg = |i: usize| &dev.segments[i];
    assert_eq!((seg(0).address, seg(0).pool), (SEG as u64, PoolKind::Small));
    assert_eq!(
        (seg(1).address, seg(1).pool),
        (SEG as u64 + (64 << 20), PoolKind::Large)
    );
    assert_eq!(seg(1).blocks[0].requested_size, 20 << 20);
    assert_eq!(dev.entries[0].stream, StreamId(0x5555_0000_1230));
    let actions: Vec<_> = dev
        .entries
        .iter()
        .map(|e| (e.action, e.addr, e.size))
        .collect();
    assert_eq!(
        actions[1..],
        [(Action::Snapshot, 0, 512), (Action::Annotate, 0, 0)]
    );
}

/// A PyTorch 1.13 block's request is its latest `history` entry's `real_size` only when
/// that entry is an allocation at the block's start that fits it; otherwise (and without a
/// history) the block's size.
#[test]
fn a_history_that_does_not_describe_the_block_is_not_its_request() {
    let block = |addr: i64, real_size: i64| {
        let latest = dict(vec![
            ("addr", V::I64(addr)),
            ("real_size", V::I64(real_size)),
        ]);
        dict(vec![
            ("size", V::I64(2 << 20)),
            ("state", s("active_allocated")),
            ("history", V::List(vec![latest])),
        ])
    };
    for (addr, real_size, request) in [
        (SEG, 1000, 1000),
        (SEG + 512, 1000, 2 << 20),
        (SEG, (2 << 20) + 1, 2 << 20),
    ] {
        let blocks = V::List(vec![block(addr, real_size)]);
        let snap = parse_snapshot(&with_segment_field("blocks", blocks), "s.pickle").unwrap();
        let b = &snap.devices[0].segments[0].blocks[0];
        assert_eq!(b.requested_size, request, "history {addr:#x} {real_size}");
    }
}

/// An `oom` entry with both keys is read by `device_free`, the key Python snapshots use.
#[test]
fn an_oom_entry_is_read_by_device_free_first() {
    let oom = entry("oom", 7, 1 << 30, vec![("device_free", V::I64(5 << 20))]);
    let snap = parse_snapshot(&bytes(&snapshot(vec![oom])), "s.pickle").unwrap();
    assert_eq!(snap.devices[0].entries[0].device_free, Some(5 << 20));
}

/// Frames of Python's `torch.cuda.empty_cache` name it in snake case.
#[test]
fn a_python_empty_cache_frame_marks_an_empty_cache_call() {
    let release = entry(
        "segment_free",
        SEG,
        2 << 20,
        vec![("frames", frames(&["empty_cache"]))],
    );
    let snap = parse_snapshot(&bytes(&snapshot(vec![release])), "s.pickle").unwrap();
    assert_eq!(snap.devices[0].entries[0].call_site, CallSite::EmptyCache);
}

/// Values the reader does not know are refused, naming the place and what is allowed,
/// rather than read as something else.
#[test]
fn unknown_values_are_refused_not_guessed() {
    let err = error_of(&with_segment_field("segment_type", s("medium"))).to_string();
    assert!(
        err.contains(
            "segments[0]: 'segment_type' must be \"small\" or \"large\", found str \"medium\""
        ),
        "{err}"
    );
    let mut snap = snapshot(vec![]);
    let V::Dict(top) = &mut snap else {
        unreachable!("a dict")
    };
    let Some(V::Dict(settings)) = top.get_mut(&H::String("allocator_settings".into())) else {
        unreachable!("settings")
    };
    let mut divisions = BTreeMap::new();
    divisions.insert(H::String("3".into()), V::I64(4));
    settings.insert(
        H::String("roundup_power2_divisions".into()),
        V::Dict(divisions),
    );
    let err = error_of(&bytes(&snap)).to_string();
    assert!(
        err.contains(
            "allocator_settings.roundup_power2_divisions: found key str \"3\"; allowed: \
             each interval's start in MiB, a power of 2 from \"1\" to \"32768\""
        ),
        "{err}"
    );
    let state = dict(vec![
        ("size", V::I64(2 << 20)),
        ("state", s("active_freeing")),
    ]);
    let err = error_of(&with_segment_field("blocks", V::List(vec![state]))).to_string();
    assert!(
        err.contains("segments[0].blocks[0]: unknown block state 'active_freeing'"),
        "{err}"
    );
}

/// Files that are not snapshots are named as such: an empty file, a pickle without
/// `segments`, and binary bytes (not called text for being UTF-8).
#[test]
fn what_is_not_a_snapshot_is_named() {
    let err = error_of(b"").to_string();
    assert_eq!(
        err.split("; expected").next(),
        Some("bad.pickle: not a readable Python pickle: the file is empty")
    );
    let err = error_of(&bytes(&dict(vec![("device_traces", V::List(vec![]))])));
    assert!(matches!(err, TraceError::NotSnapshot { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("the top-level dict has no 'segments' key"),
        "{err}"
    );
    let err = error_of(b"\x05\x06binary\n").to_string();
    assert!(err.contains("unknown opcode 0x05 at byte 0"), "{err}");
}

#[test]
fn missing_files_are_io_errors_naming_the_path() {
    let err = read_snapshot("/nonexistent/dir/x.pickle").unwrap_err();
    assert!(matches!(err, TraceError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/dir/x.pickle"));
}
