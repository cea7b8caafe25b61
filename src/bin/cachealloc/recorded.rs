//! Loading a cachealloc trace (`CACHEALLOC_CONF=trace:PATH`) for replay.
//!
//! Such a recording starts with its pool, so a replay starts from an empty device in both
//! modes. `--faithful` adds what reproduces the recording address for address: the recording's
//! settings (unless `--conf` says otherwise), the driver's segment addresses as hints, and the
//! device capacity — the header's, which a saved replay (`synth --save`) writes with its
//! placement (used where the recorded addresses end, unless `--placement` is given); else exact
//! when the trace has an `oom` (reserved at the OOM + its `device_free`), else inside the
//! bracket a retried cudaMalloc gives; with none of these, the capacity is unknown and the
//! replay runs unlimited (give `--capacity` to set one).

use crate::outcome::Recorded;
use crate::sources::{Loaded, other_devices_note, recorded_figures};
use cachealloc::backend::sim::Placement;
use cachealloc::pool::Settings;
use cachealloc::trace::TraceFile;
use cachealloc::trace::ranges::RangeChange;
use cachealloc::trace::record::ENDED_FROM;
use cachealloc::trace::record::convert::RecordedDevice;
use cachealloc::trace::record::read::DeviceEvents;
use std::path::Path;

/// Read `file` (opened from `path`, a recorded trace) and prepare device `device` (default: the
/// first device that allocates or frees, else the first device with events).
pub fn load(
    path: &Path,
    file: TraceFile,
    device: Option<i32>,
    faithful: bool,
) -> Result<Loaded, String> {
    let trace = file.read_recorded_trace().map_err(|e| e.to_string())?;
    if let Some(line) = trace.cut_off_line {
        say!(
            "cachealloc: warning: {}: line {line} is cut off (the recording stopped in the \
             middle of it: the program was killed, is still running, or could not write more, \
             as on a full disk, which it said on its stderr); replaying the lines \
             before it, and what the program did after them, up to 64 KiB of events, may be \
             missing",
            path.display()
        );
    } else if trace.header.version >= ENDED_FROM && !trace.ended {
        say!(
            "cachealloc: warning: {}: the recording has no end line: the program did not reach \
             its exit (it was killed, or is still running), and what it did last, up to 64 KiB \
             of events, may be missing; replaying the lines there are",
            path.display()
        );
    }
    let traced: Vec<&DeviceEvents> = trace.traced_devices().collect();
    let traced_devices: Vec<i32> = traced.iter().map(|t| t.device.0).collect();
    let chosen = match device {
        Some(d) => traced.iter().find(|t| t.device.0 == d).copied(),
        None => traced
            .iter()
            .find(|t| t.has_block_events())
            .or(traced.first())
            .copied(),
    };
    let Some(chosen) = chosen else {
        let have: Vec<String> = traced.iter().map(|t| t.device.0.to_string()).collect();
        return Err(match device {
            Some(d) => format!(
                "{}: device {d} has no events (devices with events: {})",
                path.display(),
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            ),
            None => format!(
                "{}: the trace holds no events (the process allocated nothing through \
                 cachealloc), nothing to replay",
                path.display()
            ),
        });
    };
    let notes = other_devices_note(path, device, chosen.device.0, &traced_devices)
        .into_iter()
        .collect();
    let rec = trace.convert(chosen);
    let recorded: Recorded = recorded_figures(&rec.figures, rec.figures.recorded_segment_maps > 0);
    let (settings, settings_remark) = device_settings(&trace.settings, &rec, chosen.device.0);
    Ok(Loaded {
        device: chosen.device.0,
        workload: rec.workload,
        start: None,
        // (No more than the device's memory: a capacity inferred without an OOM is the middle
        // of a bracket, which can reach beyond it.)
        capacity: if faithful {
            trace
                .header
                .capacity
                .or_else(|| rec.capacity.and_then(|c| c.replay_capacity()))
                .map(|c| rec.device_memory.map_or(c, |m| c.min(m)))
        } else {
            None
        },
        address_hints: if faithful {
            rec.segment_addresses
        } else {
            Vec::new()
        },
        range_changes: if faithful {
            rec.range_changes
        } else {
            Vec::new()
        },
        device_memory: rec.device_memory.filter(|_| faithful),
        recorded,
        recorded_settings: Some(settings),
        settings_inferred: false,
        settings_remark,
        // Checked by the reader, which refuses a header whose settings it cannot read.
        settings_warnings: Vec::new(),
        start_rebuildable: false,
        // Checked by the reader.
        placement: trace
            .header
            .placement
            .as_deref()
            .and_then(Placement::from_name),
        // A cachealloc recording has no private pools.
        notes,
    })
}

/// The settings device `device`'s pool ran with: the header's, less expandable segments when
/// the header asks for them and the device's pool made cudaMalloc calls and mapped no page (the
/// preloaded library uses fixed segments on a device without virtual memory management, and
/// its pool makes no cudaMalloc call otherwise); with what was changed, and why.
fn device_settings(
    header: &Settings,
    rec: &RecordedDevice,
    device: i32,
) -> (Settings, Option<String>) {
    let f = &rec.figures;
    let fixed_only = f.recorded_segment_allocs > 0
        && f.recorded_segment_maps == 0
        && f.recorded_segment_unmaps == 0
        && !rec
            .range_changes
            .iter()
            .any(|c| matches!(c, RangeChange::Reserve { .. }));
    if !(header.expandable_segments && fixed_only) {
        return (header.clone(), None);
    }
    let settings = Settings {
        expandable_segments: false,
        ..header.clone()
    };
    let remark = format!(
        "the header's expandable_segments:True left out: device {device}'s pool made cudaMalloc \
         calls and mapped no page, as the preloaded library does on a device without virtual \
         memory management"
    );
    (settings, Some(remark))
}
