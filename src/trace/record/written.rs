//! Test support for the round-trip tests (`capture_tests`, `sync_tests`): events a pool
//! recorded, written as a trace file of a given format version, read back, converted, and
//! replayed faithfully as `cachealloc replay --faithful` does (capacity and recorded addresses
//! given), or on another device as `cachealloc replay --capacity` does (its capacity only).

use super::convert::RecordedDevice;
use super::read::parse_recorded_trace;
use super::{Event, Header, settings_text, write_events, write_header};
use crate::pool::Settings;
use crate::trace::replay::{ReplayConfig, ReplayOutcome, replay};

/// The default settings with expandable segments, under which each round trip runs too.
pub fn expandable() -> Settings {
    Settings {
        expandable_segments: true,
        ..Settings::default()
    }
}

/// `events` of device 0, recorded under `settings` and `free_sync`, written as a file of
/// `version` and read back, converted.
pub fn convert_written(
    settings: &Settings,
    free_sync: &str,
    version: u32,
    events: &[Event],
) -> RecordedDevice {
    let mut bytes = Vec::new();
    let header = Header {
        version,
        ..Header::new(1, vec![0], settings_text(settings), free_sync)
    };
    write_header(&mut bytes, &header);
    write_events(&mut bytes, events);
    let trace = parse_recorded_trace(&bytes[..], "written.trace").expect("the trace reads back");
    trace.convert(&trace.devices[0])
}

/// The faithful replay of `events` written as `convert_written` writes them, on `capacity`
/// bytes at the recorded segments and ranges.
pub fn replay_written(
    settings: &Settings,
    free_sync: &str,
    version: u32,
    events: &[Event],
    capacity: u64,
) -> ReplayOutcome {
    let written = (settings, free_sync, version, events);
    replay_on(written, capacity, true)
}

/// The replay of `events` written as `convert_written` writes them, on a device of `capacity`
/// bytes (not the recording's), the pool placing its segments itself.
pub fn replay_written_what_if(
    settings: &Settings,
    free_sync: &str,
    version: u32,
    events: &[Event],
    capacity: u64,
) -> ReplayOutcome {
    let written = (settings, free_sync, version, events);
    replay_on(written, capacity, false)
}

/// The replay of the written lines on `capacity` bytes, at the recorded segments and ranges
/// when `faithful`.
fn replay_on(
    (settings, free_sync, version, events): (&Settings, &str, u32, &[Event]),
    capacity: u64,
    faithful: bool,
) -> ReplayOutcome {
    let rec = convert_written(settings, free_sync, version, events);
    let mut config = ReplayConfig {
        settings: settings.clone(),
        capacity: Some(capacity),
        check_invariants: true,
        ..ReplayConfig::default()
    };
    if faithful {
        config.follow_recorded_addresses(
            rec.segment_addresses.clone(),
            &rec.range_changes,
            rec.device_memory,
        );
    }
    replay(&rec.workload, &config, None).expect("the replay runs")
}
