//! Writing PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot` pickles) by hand, for
//! tests that need a state no real file has.

use cachealloc::pool::PoolKind;
use cachealloc::trace::recording::{
    Action, BlockState, CallSite, DeviceRecording, RecordedSettings,
};
use serde_pickle::{HashableValue as H, SerOptions, Value as V};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One block: `(size, requested, state)`, the state as PyTorch names it (`active_allocated`,
/// `active_pending_free`, `inactive`).
pub type Block = (u64, u64, &'static str);

/// One segment: its address, stream and blocks in address order (the segment's size is their
/// sum; 2 MiB segments are small-pool ones).
pub struct Segment {
    pub address: u64,
    pub stream: u64,
    pub expandable: bool,
    /// `segment_pool_id`: (0, 0) for the default pools, else a private pool's (a CUDA graph's or
    /// a `torch.cuda.MemPool`'s).
    pub pool_id: (u64, u64),
    pub blocks: Vec<Block>,
}

/// A dict of string keys, as Python writes a snapshot's dicts.
pub fn dict(items: Vec<(&str, V)>) -> V {
    V::Dict(
        items
            .into_iter()
            .map(|(k, v)| (H::String(k.into()), v))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// A Python int.
pub fn int(n: u64) -> V {
    V::I64(i64::try_from(n).expect("fits a Python int here"))
}

fn segment(s: &Segment, device: u64) -> V {
    let total: u64 = s.blocks.iter().map(|b| b.0).sum();
    let mut at = s.address;
    let blocks = s
        .blocks
        .iter()
        .map(|&(size, requested, state)| {
            let b = dict(vec![
                ("address", int(at)),
                ("size", int(size)),
                ("requested_size", int(requested)),
                ("state", V::String(state.into())),
            ]);
            at += size;
            b
        })
        .collect();
    dict(vec![
        ("device", int(device)),
        ("address", int(s.address)),
        ("total_size", int(total)),
        ("stream", int(s.stream)),
        (
            "segment_type",
            V::String(if total == 2 << 20 { "small" } else { "large" }.into()),
        ),
        (
            "segment_pool_id",
            V::Tuple(vec![int(s.pool_id.0), int(s.pool_id.1)]),
        ),
        ("is_expandable", V::Bool(s.expandable)),
        ("blocks", V::List(blocks)),
    ])
}

/// Write a snapshot of device 0's `segments` with an empty trace (as `_snapshot()` without
/// `_record_memory_history` gives) under `name` in the temporary folder; `conf` is the
/// `allocator_settings`' PYTORCH_CUDA_ALLOC_CONF and max_split_size, when the file names them.
pub fn write_state_snapshot(
    name: &str,
    segments: &[Segment],
    settings: Option<(&str, Option<u64>)>,
) -> PathBuf {
    write_snapshot(name, segments, &[], settings)
}

/// One trace entry: `(action, addr, size)` on the default stream.
pub type Entry = (&'static str, u64, u64);

/// Write a snapshot of device 0's `segments` and its trace of `entries` (as `_dump_snapshot()`
/// after `_record_memory_history` gives), as `write_state_snapshot` does.
pub fn write_snapshot(
    name: &str,
    segments: &[Segment],
    entries: &[Entry],
    settings: Option<(&str, Option<u64>)>,
) -> PathBuf {
    let trace = entries
        .iter()
        .map(|&(action, addr, size)| {
            dict(vec![
                ("action", V::String(action.into())),
                ("addr", int(addr)),
                ("size", int(size)),
                ("stream", int(0)),
            ])
        })
        .collect();
    let mut top = vec![
        (
            "segments",
            V::List(segments.iter().map(|s| segment(s, 0)).collect()),
        ),
        ("device_traces", V::List(vec![V::List(trace)])),
    ];
    if let Some((conf, max_split)) = settings {
        top.push((
            "allocator_settings",
            dict(vec![
                ("PYTORCH_CUDA_ALLOC_CONF", V::String(conf.into())),
                ("max_split_size", max_split.map_or(V::I64(-1), int)),
                ("garbage_collection_threshold", V::F64(0.0)),
                ("expandable_segments", V::Bool(false)),
                ("roundup_power2_divisions", V::Dict(BTreeMap::new())),
            ]),
        ));
    }
    write(name, &dict(top))
}

/// Write `torch.cuda.memory_snapshot()`'s form of device 0's `segments`: the list alone.
pub fn write_segment_list(name: &str, segments: &[Segment]) -> PathBuf {
    write(
        name,
        &V::List(segments.iter().map(|s| segment(s, 0)).collect()),
    )
}

/// Write `rec` (device 0) as the snapshot PyTorch would have dumped: its trace (each entry's
/// call site as a stack frame's name), its segments and its settings (none when it names none).
pub fn write_recording(name: &str, rec: &DeviceRecording) -> PathBuf {
    let trace = rec
        .entries
        .iter()
        .map(|e| {
            let action = match e.action {
                Action::Alloc => "alloc",
                Action::FreeRequested => "free_requested",
                Action::FreeCompleted => "free_completed",
                Action::SegmentAlloc => "segment_alloc",
                Action::SegmentFree => "segment_free",
                Action::SegmentMap => "segment_map",
                Action::SegmentUnmap => "segment_unmap",
                Action::Snapshot => "snapshot",
                Action::Oom => "oom",
                Action::Annotate => "user_defined",
            };
            let mut items = vec![
                ("action", V::String(action.into())),
                ("addr", int(e.addr)),
                ("size", int(e.size)),
                ("stream", int(e.stream.0)),
            ];
            let frame = match e.call_site {
                CallSite::EmptyCache => Some("emptyCache"),
                CallSite::Malloc => Some("malloc"),
                CallSite::Other => Some("forward"),
                CallSite::Unrecorded => None,
            };
            if let Some(frame) = frame {
                let frame = dict(vec![("name", V::String(frame.into()))]);
                items.push(("frames", V::List(vec![frame])));
            }
            if let Some(free) = e.device_free {
                items.push(("device_free", int(free)));
            }
            dict(items)
        })
        .collect();
    let segments = rec
        .segments
        .iter()
        .map(|s| {
            let blocks = s
                .blocks
                .iter()
                .map(|b| {
                    let state = match b.state {
                        BlockState::Allocated => "active_allocated",
                        BlockState::PendingFree => "active_pending_free",
                        BlockState::Inactive => "inactive",
                    };
                    dict(vec![
                        ("address", int(b.address)),
                        ("size", int(b.size)),
                        ("requested_size", int(b.requested_size)),
                        ("state", V::String(state.into())),
                    ])
                })
                .collect();
            let pool = match s.pool {
                PoolKind::Small => "small",
                PoolKind::Large => "large",
            };
            dict(vec![
                ("device", int(0)),
                ("address", int(s.address)),
                ("total_size", int(s.total_size)),
                ("stream", int(s.stream.0)),
                ("segment_type", V::String(pool.into())),
                ("segment_pool_id", V::Tuple(vec![int(0), int(0)])),
                ("is_expandable", V::Bool(s.is_expandable)),
                ("blocks", V::List(blocks)),
            ])
        })
        .collect();
    let mut top = vec![
        ("segments", V::List(segments)),
        ("device_traces", V::List(vec![V::List(trace)])),
    ];
    if let Some(settings) = &rec.settings {
        top.push(("allocator_settings", recorded_settings(settings)));
    }
    write(name, &dict(top))
}

/// `settings` as PyTorch writes a snapshot's `allocator_settings`.
fn recorded_settings(settings: &RecordedSettings) -> V {
    let divisions = settings
        .roundup_power2_divisions
        .iter()
        .enumerate()
        .map(|(interval, &d)| (H::String((1u64 << interval).to_string()), int(d)))
        .collect();
    dict(vec![
        (
            "PYTORCH_CUDA_ALLOC_CONF",
            V::String(settings.conf.clone().unwrap_or_default()),
        ),
        (
            "max_split_size",
            settings.max_split_size.map_or(V::I64(-1), int),
        ),
        (
            "garbage_collection_threshold",
            V::F64(settings.garbage_collection_threshold),
        ),
        ("expandable_segments", V::Bool(settings.expandable_segments)),
        ("roundup_power2_divisions", V::Dict(divisions)),
    ])
}

/// Pickle `value` to `name` in the temporary folder (the name is made this process's own): a
/// snapshot of whatever shape a test needs.
pub fn write(name: &str, value: &V) -> PathBuf {
    let bytes = serde_pickle::value_to_vec(value, SerOptions::new()).expect("pickles");
    let path = std::env::temp_dir().join(format!("cachealloc-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).expect("temporary file written");
    path
}
