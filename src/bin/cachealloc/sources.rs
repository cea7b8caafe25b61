//! Loading a recorded trace for replay: a PyTorch memory snapshot here, a cachealloc trace in
//! `recorded` (told apart by the file's first line).

use crate::outcome::{Recorded, RecordedOomJson};
use crate::recorded;
use crate::state::{state_command, state_command_on};
use cachealloc::backend::sim::Placement;
use cachealloc::pool::{Settings, format_size};
use cachealloc::trace::ranges::RangeChange;
use cachealloc::trace::recording::RecordedSettings;
use cachealloc::trace::{DeviceRecording, Op, RecordedFigures, StartLayout, TraceFile, Workload};
use std::path::Path;

/// A trace ready to replay.
pub struct Loaded {
    pub device: i32,
    pub workload: Workload,
    pub start: Option<StartLayout>,
    pub capacity: Option<u64>,
    pub address_hints: Vec<(u64, u64)>,
    /// The recording's range reservations and releases, page maps, unmaps and device resets
    /// (faithful mode), from which the replay finds where it reserved the ranges of expandable
    /// segments.
    pub range_changes: Vec<RangeChange>,
    /// The device's total memory, when the recording says it (a cachealloc trace's
    /// `device_memory` line; faithful mode).
    pub device_memory: Option<u64>,
    pub recorded: Recorded,
    /// The allocator settings the recording ran with, when the file says or shows them.
    pub recorded_settings: Option<Settings>,
    /// The settings were read from what the recording did (its expandable segments), not
    /// named by the file.
    pub settings_inferred: bool,
    /// What a faithful replay changed of the recorded settings, and why (said with them).
    pub settings_remark: Option<String>,
    /// Warnings from reading the recorded settings (a recorded `PYTORCH_CUDA_ALLOC_CONF` that
    /// cannot be read, or keys in it that cachealloc does not follow), for when a replay runs
    /// with them.
    pub settings_warnings: Vec<String>,
    /// A faithful replay rebuilds the state the recording began with (a PyTorch snapshot's;
    /// a cachealloc trace begins with the process).
    pub start_rebuildable: bool,
    /// Where the recording's driver placed segments, when the file says (a saved replay).
    pub placement: Option<Placement>,
    /// What the replay cannot keep as the recording had it (private pools), and the devices
    /// left out when none was chosen, said once the replay is sure to run.
    pub notes: Vec<String>,
}

/// Read `path` and prepare device `device` (default: the first device whose trace allocates
/// or frees, else the first device with a trace). `device_memory` (`--device-memory`) sizes the
/// ranges of expandable segments that a snapshot's faithful replay begins with; `assumed`
/// (`--conf`) are the settings under which it rebuilds the start of a snapshot that names none
/// (else the defaults': the walk back needs the rules that cut the blocks it rebuilds).
pub fn load(
    path: &Path,
    device: Option<i32>,
    faithful: bool,
    device_memory: Option<u64>,
    assumed: Option<&Settings>,
) -> Result<Loaded, String> {
    let file = TraceFile::open(path).map_err(|e| e.to_string())?;
    if file.is_recorded_trace() {
        return recorded::load(path, file, device, faithful);
    }
    let snapshot = file.read_snapshot().map_err(|e| e.to_string())?;
    let traced: Vec<&DeviceRecording> = snapshot.traced_devices().collect();
    let rec = match device {
        Some(d) => traced
            .iter()
            .find(|r| r.device.0 == d)
            .copied()
            .ok_or_else(|| {
                let have: Vec<String> = traced.iter().map(|r| r.device.0.to_string()).collect();
                format!(
                    "{}: device {d} has no trace (devices with a trace: {})",
                    path.display(),
                    if have.is_empty() {
                        "none".to_string()
                    } else {
                        have.join(", ")
                    }
                )
            })?,
        None => traced
            .iter()
            .find(|r| r.has_block_events())
            .or(traced.first())
            .copied()
            .ok_or_else(|| {
                let what = if snapshot.segments_only {
                    "no allocation trace (torch.cuda.memory_snapshot() writes the segments \
                     alone; a trace needs torch.cuda.memory._record_memory_history and \
                     _dump_snapshot)"
                } else if snapshot.host_memory {
                    "host (pinned) memory only and no CUDA device's trace \
                     (_record_memory_history(record_cuda=False) records the host's alone; \
                     record_cuda=True, the default, records the devices')"
                } else {
                    "no allocation trace (it was saved without \
                     torch.cuda.memory._record_memory_history)"
                };
                // `state` reads the devices' segments: pointed to only where there are some.
                let state = if snapshot.devices.iter().any(|d| !d.segments.is_empty()) {
                    format!(
                        "; {} reports the memory state it records",
                        state_command(path)
                    )
                } else {
                    ", nor a device's memory state".to_string()
                };
                format!(
                    "{}: the snapshot holds {what}, nothing to replay{state}",
                    path.display()
                )
            })?,
    };
    let traced_devices: Vec<i32> = traced.iter().map(|r| r.device.0).collect();
    let notes: Vec<String> = private_pools_note(path, rec, faithful)
        .into_iter()
        .chain(other_devices_note(
            path,
            device,
            rec.device.0,
            &traced_devices,
        ))
        .collect();
    let recorded = Recorded {
        both_segment_kinds: rec.mixes_segment_kinds(),
        ..recorded_figures(&rec.figures(), rec.is_expandable())
    };
    let recorded_settings =
        (rec.settings.is_some() || rec.is_expandable()).then(|| rec.replay_settings());
    let settings_warnings = rec
        .settings
        .as_ref()
        .map(|s| s.conf_warnings.clone())
        .unwrap_or_default();
    if faithful {
        let named_or_assumed;
        let walked = match (&rec.settings, assumed) {
            (None, Some(settings)) => {
                named_or_assumed = DeviceRecording {
                    settings: Some(RecordedSettings::assumed(settings)),
                    ..rec.clone()
                };
                &named_or_assumed
            }
            _ => rec,
        };
        let f = walked.faithful_on(device_memory).map_err(|e| {
            // Walked back under --conf's settings: say so where the defaults' walk succeeds, as
            // the recording is then not at fault.
            let under_conf = !std::ptr::eq(walked, rec) && rec.faithful_on(device_memory).is_ok();
            let advice = if under_conf {
                " (the recording names no settings, and its start state, walked back under \
                 --conf's, cannot be rebuilt, as it can under the defaults; for a what-if replay \
                 under other settings, drop --faithful)"
            } else {
                ""
            };
            format!("{e}{advice}")
        })?;
        if !f
            .workload
            .ops
            .iter()
            .any(|op| matches!(op, Op::Alloc { .. } | Op::Oom { .. }) || op.freed_id().is_some())
        {
            return Err(nothing_to_replay(path, rec, 0, &snapshot.devices));
        }
        Ok(Loaded {
            device: rec.device.0,
            workload: f.workload,
            start: Some(f.start.layout()),
            capacity: f.capacity,
            address_hints: rec.segment_addresses(),
            range_changes: f.range_changes,
            device_memory: None,
            recorded,
            recorded_settings,
            settings_inferred: rec.settings.is_none(),
            settings_remark: None,
            settings_warnings,
            start_rebuildable: true,
            placement: None,
            notes: notes.clone(),
        })
    } else {
        let workload = rec.plain();
        if !workload
            .ops
            .iter()
            .any(|op| matches!(op, Op::Alloc { .. } | Op::Oom { .. }))
        {
            return Err(nothing_to_replay(
                path,
                rec,
                rec.figures().orphan_frees,
                &snapshot.devices,
            ));
        }
        Ok(Loaded {
            device: rec.device.0,
            workload,
            start: None,
            capacity: None,
            address_hints: Vec::new(),
            range_changes: Vec::new(),
            device_memory: None,
            recorded,
            recorded_settings,
            settings_inferred: rec.settings.is_none(),
            settings_remark: None,
            settings_warnings,
            start_rebuildable: true,
            placement: None,
            notes: notes.clone(),
        })
    }
}

/// The note, when no device was chosen and the file traces several, that the others are left
/// out and how to replay one.
pub fn other_devices_note(
    path: &Path,
    chosen: Option<i32>,
    replayed: i32,
    traced: &[i32],
) -> Option<String> {
    let others: Vec<String> = traced
        .iter()
        .filter(|&&d| d != replayed)
        .map(|d| d.to_string())
        .collect();
    if chosen.is_some() || others.is_empty() {
        return None;
    }
    Some(format!(
        "{}: replaying device {replayed}; the file also traces device{} {} (--device N replays \
         another)",
        path.display(),
        if others.len() == 1 { "" } else { "s" },
        others.join(", ")
    ))
}

/// The note that the recording's private pools (CUDA graphs', MemPools') are not kept apart: a
/// replay serves their requests from the default pools.
fn private_pools_note(path: &Path, rec: &DeviceRecording, faithful: bool) -> Option<String> {
    let private: Vec<_> = rec
        .segments
        .iter()
        .filter(|s| s.private_pool.is_some())
        .collect();
    if private.is_empty() {
        return None;
    }
    let bytes = private
        .iter()
        .map(|s| s.total_size)
        .fold(0u64, u64::saturating_add);
    let start = if faithful {
        ", and the start state holds their segments in the default pools, so the recorded \
         figures may not be reproduced"
    } else {
        ""
    };
    Some(format!(
        "{}: device {}: {} of the {} segments at the end ({}) belong to private pools (CUDA \
         graphs' or torch.cuda.MemPools'); cachealloc keeps no private pools, so the replay \
         serves the requests made in them from the default pools{start}",
        path.display(),
        rec.device.0,
        private.len(),
        rec.segments.len(),
        format_size(bytes)
    ))
}

/// The error for device `rec` of the snapshot at `file` (whose devices are `devices`) when its
/// trace lacks the allocations a replay needs, and what reports what it has; `orphan_frees`
/// counts its frees of memory allocated before it began (which only a faithful replay can
/// apply).
fn nothing_to_replay(
    file: &Path,
    rec: &DeviceRecording,
    orphan_frees: usize,
    devices: &[DeviceRecording],
) -> String {
    let (path, device) = (file.display(), rec.device.0);
    let state = state_command_on(file, rec, devices);
    let entries = match rec.entries.len() {
        1 => "1 entry".to_string(),
        n => format!("{n} entries"),
    };
    if orphan_frees > 0 {
        let (frees, them) = if orphan_frees == 1 {
            ("free", "it")
        } else {
            ("frees", "them")
        };
        format!(
            "{path}: device {device}'s trace ({entries}) holds no allocation, only \
             {orphan_frees} {frees} of memory allocated before it began: replay it with \
             --faithful, which applies {them} to the snapshot's state; {state} reports that \
             state"
        )
    } else if rec.segments.is_empty() {
        let others: Vec<String> = devices
            .iter()
            .filter(|d| !d.segments.is_empty())
            .map(|d| {
                format!(
                    "device {}: {}",
                    d.device.0,
                    state_command_on(file, d, devices)
                )
            })
            .collect();
        let others = match others.as_slice() {
            [] => "nor on any other device".to_string(),
            _ => format!("memory reserved on {}", others.join("; ")),
        };
        format!(
            "{path}: device {device}'s trace ({entries}) holds no allocation or free, and the \
             snapshot records no memory reserved on it: nothing to replay or report ({others})"
        )
    } else {
        format!(
            "{path}: device {device}'s trace ({entries}) holds no allocation or free: nothing to \
             replay (the snapshot records the memory state alone, which {state} reports; an \
             allocation trace needs torch.cuda.memory._record_memory_history)"
        )
    }
}

/// What the recording itself did, for the comparison; `expandable_segments` when it used them.
pub(crate) fn recorded_figures(f: &RecordedFigures, expandable_segments: bool) -> Recorded {
    Recorded {
        peak_reserved_bytes: Some(f.recorded_peak_reserved_bytes),
        segment_allocs: Some(f.recorded_segment_allocs as u64),
        segment_frees: Some(f.recorded_segment_frees as u64),
        segment_maps: Some(f.recorded_segment_maps as u64),
        segment_unmaps: Some(f.recorded_segment_unmaps as u64),
        expandable_segments,
        both_segment_kinds: (f.recorded_segment_allocs + f.recorded_segment_frees > 0)
            && (f.recorded_segment_maps + f.recorded_segment_unmaps > 0),
        retries: Some(f.recorded_retries as u64),
        retries_upper_bound: f.retries_upper_bound,
        oom: f.recorded_oom.as_ref().map(|o| RecordedOomJson {
            event_index: o.event_index,
            size: o.size,
            device_free: o.device_free,
        }),
        orphan_frees: f.orphan_frees as u64,
        missing_frees: f.missing_frees as u64,
        pending_frees: f.pending_frees as u64,
    }
}
