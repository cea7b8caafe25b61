//! `cachealloc replay` and `cachealloc state` on snapshots shaped as particular PyTorch versions
//! write them, where the shape differs from what the other tests write.

mod support;

use serde_pickle::Value as V;
use support::cli::{cachealloc, json};
use support::snapshot_pickle::{dict, int, write};

const MIB: u64 = 1 << 20;
const SEG: u64 = 0x7f00_0000_0000;
/// A request and its block: 3,000,000 bytes round up to 3,000,320 (a multiple of 512).
const KEPT: (u64, u64) = (3_000_000, 3_000_320);
/// A request freed during the trace, and its block.
const FREED: (u64, u64) = (2_000_000, 2_000_384);

fn s(text: &str) -> V {
    V::String(text.into())
}

/// A trace entry with the fields every version writes.
fn entry(action: &str, addr: u64, size: u64) -> V {
    dict(vec![
        ("action", s(action)),
        ("addr", int(addr)),
        ("size", int(size)),
        ("stream", int(0)),
    ])
}

/// The trace of device `SEG`'s 20 MiB segment: it is created, `KEPT` is allocated and kept,
/// `FREED` is allocated and freed.
fn trace() -> Vec<V> {
    vec![
        entry("segment_alloc", SEG, 20 * MIB),
        entry("alloc", SEG, KEPT.0),
        entry("alloc", SEG + KEPT.1, FREED.0),
        entry("free_requested", SEG + KEPT.1, FREED.0),
        entry("free_completed", SEG + KEPT.1, FREED.0),
    ]
}

/// The end state of that trace: one 20 MiB large segment on `device` holding `blocks`.
fn segment(device: u64, blocks: Vec<V>) -> V {
    dict(vec![
        ("device", int(device)),
        ("address", int(SEG)),
        ("total_size", int(20 * MIB)),
        ("allocated_size", int(KEPT.1)),
        ("active_size", int(KEPT.1)),
        ("stream", int(0)),
        ("segment_type", s("large")),
        ("blocks", V::List(blocks)),
    ])
}

/// A `record_function` range's start or end as PyTorch nightlies of mid-2024 recorded it in
/// the device traces (`TraceEntry::USER_DEFINED`, PR #129072, moved to `external_annotations`
/// by PR #130964): no address, no size, the range's name as the frame's name and `START` or
/// `END` as its file name.
fn user_defined(name: &str, edge: &str) -> V {
    let frame = dict(vec![
        ("name", s(name)),
        ("filename", s(edge)),
        ("line", int(0)),
    ]);
    dict(vec![
        ("action", s("user_defined")),
        ("addr", int(0)),
        ("size", int(0)),
        ("stream", int(0)),
        ("time_us", int(1_719_000_000_000_000)),
        ("frames", V::List(vec![frame])),
    ])
}

/// A snapshot of those nightlies: the trace on device 1 with annotations inside it, and
/// device 0, which the program never allocated on, holding annotations alone (threads without
/// a device set recorded theirs there). The annotations are no memory events: the trace
/// replays exactly, on the device that allocated, and the state is reported.
#[test]
fn user_defined_annotations_of_2024_nightlies_are_read_as_annotations() {
    let mut device1 = trace();
    device1.insert(1, user_defined("## forward ##", "START"));
    device1.push(user_defined("## forward ##", "END"));
    let device0 = vec![
        user_defined("gloo:broadcast", "START"),
        user_defined("gloo:broadcast", "END"),
    ];
    let blocks = vec![
        dict(vec![
            ("address", int(SEG)),
            ("size", int(KEPT.1)),
            ("requested_size", int(KEPT.0)),
            ("state", s("active_allocated")),
        ]),
        dict(vec![
            ("address", int(SEG + KEPT.1)),
            ("size", int(20 * MIB - KEPT.1)),
            ("requested_size", int(0)),
            ("state", s("inactive")),
        ]),
    ];
    let path = write(
        "user-defined.pickle",
        &dict(vec![
            ("segments", V::List(vec![segment(1, blocks)])),
            (
                "device_traces",
                V::List(vec![V::List(device0), V::List(device1)]),
            ),
        ]),
    );
    let file = path.to_str().unwrap();
    let replay = json(&cachealloc(&["replay", "--faithful", file, "--json"]));
    assert_eq!(replay["device"], 1, "{replay}");
    assert_eq!(replay["allocs"], 2, "{replay}");
    assert_eq!(replay["allocs_at_recorded_addr"], 2, "{replay}");
    assert_eq!(replay["frees"], 1, "{replay}");
    let state = json(&cachealloc(&["state", file, "--json"]));
    assert_eq!(state["device"], 1, "{state}");
    assert_eq!(state["trace_entries"], 7, "{state}");
    std::fs::remove_file(path).unwrap();
}

/// A snapshot as PyTorch 1.13 wrote it (`THCPModule_memorySnapshot` in
/// torch/csrc/cuda/Module.cpp): no `requested_size` in segments or blocks, no block address, no
/// pool id; each block's allocations in `history` (latest first, `real_size` the request), the
/// trace entries' C++ stacks as one string. The kept block's request is its history's, so the
/// trace's allocation of it matches the end state: the replay rebuilds the start and the state
/// reports what was requested.
#[test]
fn pytorch_1_13_blocks_take_their_request_from_their_history() {
    let frames = |name: &str| {
        V::List(vec![dict(vec![
            ("filename", s("train.py")),
            ("name", s(name)),
            ("line", int(7)),
        ])])
    };
    let history = |addr: u64, real_size: u64| {
        V::List(vec![dict(vec![
            ("addr", int(addr)),
            ("real_size", int(real_size)),
            ("frames", frames("forward")),
            ("cpp_frames", s("c10::cuda::CUDACachingAllocator::malloc\n")),
        ])])
    };
    let blocks = vec![
        dict(vec![
            ("size", int(KEPT.1)),
            ("state", s("active_allocated")),
            ("history", history(SEG, KEPT.0)),
        ]),
        // Free, its history the allocation freed in the trace.
        dict(vec![
            ("size", int(20 * MIB - KEPT.1)),
            ("state", s("inactive")),
            ("history", history(SEG + KEPT.1, FREED.0)),
        ]),
    ];
    let trace: Vec<V> = trace()
        .into_iter()
        .map(|mut e| {
            if let V::Dict(d) = &mut e {
                d.insert(
                    serde_pickle::HashableValue::String("frames".into()),
                    frames("step"),
                );
            }
            e
        })
        .collect();
    let path = write(
        "pytorch-1.13.pickle",
        &dict(vec![
            ("segments", V::List(vec![segment(0, blocks)])),
            ("device_traces", V::List(vec![V::List(trace)])),
        ]),
    );
    let file = path.to_str().unwrap();
    let replay = json(&cachealloc(&["replay", "--faithful", file, "--json"]));
    assert_eq!(replay["allocs_at_recorded_addr"], 2, "{replay}");
    assert_eq!(replay["peak_requested_bytes"], KEPT.0 + FREED.0, "{replay}");
    let state = json(&cachealloc(&["state", file, "--json"]));
    assert_eq!(state["pools"]["all"]["requested_bytes"], KEPT.0, "{state}");
    assert_eq!(state["pools"]["all"]["allocated_bytes"], KEPT.1, "{state}");
    std::fs::remove_file(path).unwrap();
}
