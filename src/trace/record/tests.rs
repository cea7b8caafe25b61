//! Round trip: a pool on the simulated device records into an `EventBuffer`, the events are
//! written, read back and replayed, and the replay reproduces the recording.

use super::buffer::EventBuffer;
use super::convert::RecordedDevice;
use super::read::{RecordedTrace, parse_recorded_trace};
use super::{Action, Event, Header, setting_text, settings_text, write_events, write_header};
use crate::backend::sim::{Placement, SimDevice};
use crate::config::Config;
use crate::pool::{DeviceAllocator, DevicePtr, Error, Settings, StreamId};
use crate::trace::capacity::CapacityEstimate;
use crate::trace::error::TraceError;
use crate::trace::replay::{ReplayConfig, replay};
use crate::trace::rng::SplitMix64;
use crate::trace::workload::Op;

const MIB: u64 = 1 << 20;

/// A recording pool: bottom-up addresses and asynchronous work, so frees stay pending until
/// the device catches up (the shim's `free_sync:device` situation).
fn recording_pool(capacity: u64, settings: &Settings) -> DeviceAllocator<SimDevice> {
    let sim = SimDevice::new(capacity)
        .with_placement(Placement::BottomUp)
        .with_pending_work();
    DeviceAllocator::new(sim, settings.clone())
}

/// Drive a seeded mix of small and large allocations, deferred frees, device progress,
/// `empty_cache` calls and (near `capacity`) out-of-memory failures.
fn record_mix(
    seed: u64,
    capacity: u64,
    settings: &Settings,
) -> (Vec<u8>, DeviceAllocator<SimDevice>) {
    let buffer = EventBuffer::new();
    let mut pool = recording_pool(capacity, settings);
    pool.set_event_sink(Some(Box::new(buffer.sink(0))));
    let mut rng = SplitMix64::new(seed);
    let mut live: Vec<DevicePtr> = Vec::new();
    for step in 0..600 {
        let roll = rng.below(100);
        if roll < 55 {
            let size = if rng.chance(0.5) {
                rng.between(1, MIB)
            } else {
                rng.between(MIB, 40 * MIB)
            };
            match pool.malloc(size, StreamId(0)) {
                Ok(ptr) => live.push(ptr),
                Err(Error::OutOfMemory(_)) => {}
                Err(e) => panic!("step {step}: {e}"),
            }
        } else if roll < 92 && !live.is_empty() {
            let ptr = live.swap_remove(rng.below(live.len() as u64) as usize);
            pool.free_deferred(ptr).unwrap();
        } else if roll < 98 {
            pool.backend_mut().complete_work();
        } else {
            pool.empty_cache().unwrap();
        }
    }
    let mut bytes = Vec::new();
    write_header(
        &mut bytes,
        &Header::new(77, vec![0], settings_text(settings), "device"),
    );
    write_events(&mut bytes, &buffer.take());
    (bytes, pool)
}

fn read_back(bytes: &[u8]) -> RecordedTrace {
    parse_recorded_trace(bytes, "mix.trace").expect("a written trace reads back")
}

fn device0(trace: &RecordedTrace) -> RecordedDevice {
    trace.convert(&trace.devices[0])
}

#[test]
fn a_replay_of_the_written_trace_reproduces_the_recording() {
    for (seed, conf) in [(1, ""), (2, "max_split_size_mb:64"), (3, "")] {
        let settings = Config::parse_conf_str(conf).unwrap().settings;
        let (bytes, pool) = record_mix(seed, 300 * MIB, &settings);
        let trace = read_back(&bytes);
        assert_eq!(trace.settings, settings, "settings survive the header");
        let rec = device0(&trace);
        let recorded = pool.stats();
        assert_eq!(
            rec.figures.recorded_segment_allocs as u64,
            recorded.counts.num_device_alloc
        );
        assert_eq!(
            rec.figures.recorded_segment_frees as u64,
            recorded.counts.num_device_free
        );
        assert_eq!(
            rec.figures.recorded_peak_reserved_bytes as i64,
            recorded.reserved_bytes.all.peak
        );
        // Marked by their lines: exact under max_split_size_mb too.
        assert_eq!(
            rec.figures.recorded_retries as u64, recorded.counts.num_alloc_retries,
            "seed {seed}"
        );
        let capacity = rec.capacity.and_then(|c| c.replay_capacity());
        assert!(
            rec.figures.recorded_oom.is_none() || capacity == Some(300 * MIB),
            "an oom gives the exact capacity, got {capacity:?}"
        );
        // Top-down placement: only the recorded addresses can put segments where they were.
        let config = ReplayConfig {
            settings: trace.settings.clone(),
            capacity: Some(300 * MIB),
            address_hints: rec.segment_addresses.clone(),
            check_invariants: true,
            ..ReplayConfig::default()
        };
        let out = replay(&rec.workload, &config, None).unwrap();
        assert_eq!(
            out.stats.counts.num_device_alloc, recorded.counts.num_device_alloc,
            "seed {seed}"
        );
        assert_eq!(
            out.stats.counts.num_device_free, recorded.counts.num_device_free,
            "seed {seed}"
        );
        assert_eq!(
            out.stats.reserved_bytes.all.peak, recorded.reserved_bytes.all.peak,
            "seed {seed}"
        );
        assert_eq!(
            out.stats.counts.num_ooms, recorded.counts.num_ooms,
            "seed {seed}"
        );
        assert_eq!(out.allocs_with_recorded_addr, out.allocs);
        assert_eq!(out.allocs_at_recorded_addr, out.allocs, "seed {seed}");
        // The statistics too: a free that waited for the device left `allocation` when the
        // program made it, in the replay as in the recording.
        for ((name, replayed), (_, recorded)) in
            out.stats.arrays().into_iter().zip(recorded.arrays())
        {
            assert_eq!(replayed, recorded, "{name}, seed {seed}");
        }
        assert_eq!(
            out.stats.oversize_allocations, recorded.oversize_allocations,
            "seed {seed}"
        );
        assert_eq!(
            out.empty_cache_calls as usize,
            rec.figures.empty_cache_calls
        );
    }
}

#[test]
fn the_mix_exercises_every_action() {
    let (bytes, pool) = record_mix(1, 300 * MIB, &Settings::default());
    let trace = read_back(&bytes);
    let events = &trace.devices[0].events;
    for action in [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::Oom,
        Action::EmptyCache,
    ] {
        assert!(
            events.iter().any(|e| e.action == action),
            "{action:?} missing from the recording"
        );
    }
    assert!(pool.stats().counts.num_ooms > 0);
    let rec = device0(&trace);
    let oom = rec.figures.recorded_oom.unwrap();
    assert_eq!(events[oom.event_index].action, Action::Oom);
}

/// With expandable segments the recording names its ranges: each `range_reserve` with its
/// pool's page size, before the range's first map; each `range_release` after its last unmap
/// (here the large range, emptied by `empty_cache`, and then reserved again). They come back
/// as the ranges a faithful replay reserves.
#[test]
fn an_expandable_recording_names_its_ranges() {
    let settings = Settings {
        expandable_segments: true,
        ..Settings::default()
    };
    let buffer = EventBuffer::new();
    let mut pool = recording_pool(300 * MIB, &settings);
    pool.set_event_sink(Some(Box::new(buffer.sink(0))));
    let _small = pool.malloc(1000, StreamId(0)).unwrap();
    let large = pool.malloc(30 * MIB, StreamId(0)).unwrap();
    pool.free_deferred(large).unwrap();
    pool.backend_mut().complete_work();
    pool.empty_cache().unwrap();
    let _again = pool.malloc(30 * MIB, StreamId(0)).unwrap();
    let events = buffer.take();
    let seen: Vec<(Action, Option<u64>)> = events
        .iter()
        .filter(|e| e.action != Action::Alloc && e.action != Action::FreeRequested)
        .filter(|e| e.action != Action::FreeCompleted)
        .map(|e| (e.action, e.page))
        .collect();
    let large_page = Some(20 * MIB);
    assert_eq!(
        seen,
        [
            (Action::RangeReserve, Some(2 * MIB)),
            (Action::SegmentMap, None),
            (Action::RangeReserve, large_page),
            (Action::SegmentMap, None),
            (Action::EmptyCache, None),
            (Action::SegmentUnmap, None),
            (Action::RangeRelease, None),
            (Action::RangeReserve, large_page),
            (Action::SegmentMap, None),
        ]
    );
    let mut bytes = Vec::new();
    write_header(
        &mut bytes,
        &Header::new(1, vec![0], settings_text(&settings), "none"),
    );
    write_events(&mut bytes, &events);
    let rec = device0(&read_back(&bytes));
    let hints = crate::trace::ranges::range_hints(&rec.range_changes, None);
    let reserved: Vec<u64> = events
        .iter()
        .filter(|e| e.action == Action::RangeReserve)
        .map(|e| e.addr)
        .collect();
    assert_eq!(hints.addresses(), reserved);
    assert_eq!(hints.reservations[1].given_back, Some(5));
}

/// An event line of device 0 on the default stream (a `range_reserve` of 20 MiB pages, an `oom`
/// with nothing free on the device).
fn line(t_us: u64, action: Action, addr: u64, size: u64) -> Event {
    Event {
        device_free: (action == Action::Oom).then_some(0),
        page: (action == Action::RangeReserve).then_some(20 * MIB),
        ..Event::plain(t_us, 0, action, addr, size)
    }
}

/// Range and device_memory lines hold no memory: a malloc's release, a range given back and
/// another reserved, then its map, is one retry as without them (in a version 2 file, whose
/// retries are told by their releases); unmaps after an `empty_cache` with a range given back
/// among them stay the call's (no retry); and the device's memory comes back from its line.
#[test]
fn range_lines_pass_by_retries_and_empty_cache_runs() {
    let (a, b) = (0x7f00_0000_0000u64, 0x7e00_0000_0000u64);
    let range = 100 * 20 * MIB;
    let events = [
        Event::device_memory(0, 8 << 30, 0),
        line(1, Action::RangeReserve, a, range),
        line(2, Action::SegmentMap, a, 40 * MIB),
        line(3, Action::Alloc, a, 30 * MIB),
        line(4, Action::FreeCompleted, a, 30 * MIB),
        // A malloc's release, then its new segment in a new range.
        line(5, Action::SegmentUnmap, a, 40 * MIB),
        line(6, Action::RangeRelease, a, range),
        line(7, Action::RangeReserve, b, range),
        line(8, Action::SegmentMap, b, 60 * MIB),
        line(9, Action::Alloc, b, 60 * MIB),
        line(10, Action::FreeCompleted, b, 60 * MIB),
        // empty_cache's release, the range given back between its unmaps.
        line(11, Action::EmptyCache, 0, 0),
        line(12, Action::SegmentUnmap, b, 20 * MIB),
        line(13, Action::RangeRelease, b, range),
        line(14, Action::SegmentUnmap, b + 20 * MIB, 40 * MIB),
        line(15, Action::RangeReserve, a, range),
        line(16, Action::SegmentMap, a, 20 * MIB),
        line(17, Action::Alloc, a, 20 * MIB),
    ];
    let read = |events: &[Event]| {
        let mut bytes = Vec::new();
        let header = Header {
            version: 2,
            ..Header::new(1, vec![0], String::new(), "none")
        };
        write_header(&mut bytes, &header);
        write_events(&mut bytes, events);
        device0(&read_back(&bytes))
    };
    let with = read(&events);
    assert_eq!(with.figures.recorded_retries, 1);
    assert_eq!(with.device_memory, Some(8 << 30));
    let without: Vec<Event> = events
        .iter()
        .filter(|e| {
            !matches!(
                e.action,
                Action::RangeReserve | Action::RangeRelease | Action::DeviceMemory
            )
        })
        .copied()
        .collect();
    let without = read(&without);
    // The same figures but for the count of lines.
    let mut figures = with.figures.clone();
    figures.entries = without.figures.entries;
    assert_eq!(without.figures, figures);
    assert_eq!(without.capacity, with.capacity);
    assert_eq!(without.device_memory, None);
}

/// From version 3 a file marks each counted retry with a `retry` line, and the retries are
/// those lines: a release followed by a new segment without one (the oversize release of
/// `max_split_size`, or a garbage collection) is no retry, and an `oom` counts only with its
/// `retry`.
#[test]
fn marked_retries_are_counted_by_their_lines() {
    let (a, b, c) = (
        0x7f00_0000_0000u64,
        0x7e00_0000_0000u64,
        0x7d00_0000_0000u64,
    );
    let events = [
        line(1, Action::SegmentAlloc, a, 200 * MIB),
        line(2, Action::Alloc, a, 200 * MIB),
        line(3, Action::FreeCompleted, a, 200 * MIB),
        // An oversize release: no retry.
        line(4, Action::SegmentFree, a, 200 * MIB),
        line(5, Action::SegmentAlloc, b, 300 * MIB),
        line(6, Action::Alloc, b, 300 * MIB),
        line(7, Action::FreeCompleted, b, 300 * MIB),
        // The full release, then the retry.
        line(8, Action::SegmentFree, b, 300 * MIB),
        line(9, Action::Retry, 0, 400 * MIB),
        line(10, Action::SegmentAlloc, c, 400 * MIB),
        line(11, Action::Alloc, c, 400 * MIB),
        // A failed retry.
        line(12, Action::Retry, 0, 800 * MIB),
        line(13, Action::Oom, 0, 800 * MIB),
    ];
    let read = |version| {
        let mut bytes = Vec::new();
        let header = Header {
            version,
            ..Header::new(1, vec![0], "max_split_size_mb:128".to_string(), "none")
        };
        write_header(&mut bytes, &header);
        write_events(&mut bytes, &events);
        device0(&read_back(&bytes)).figures.recorded_retries
    };
    assert_eq!(read(3), 2);
    // Version 2 lines under a version 2 header: every release before a new segment counts.
    assert_eq!(read(2), 3);
}

#[test]
fn settings_text_names_only_changed_keys_and_parses_back() {
    assert_eq!(settings_text(&Settings::default()), "");
    let conf = "max_split_size_mb:128,roundup_power2_divisions:[256:1,>:4],\
                garbage_collection_threshold:0.7";
    let settings = Config::parse_conf_str(conf).unwrap().settings;
    let text = settings_text(&settings);
    assert!(text.contains("max_split_size_mb:128"), "{text}");
    assert_eq!(Config::parse_conf_str(&text).unwrap().settings, settings);
    // One key alone, a list value whole (its commas and colons included).
    let divisions = setting_text(&settings, "roundup_power2_divisions").unwrap();
    assert!(divisions.starts_with("roundup_power2_divisions:[") && divisions.ends_with(":4]"));
    assert!(text.contains(&divisions), "{text}");
    let alone = Config::parse_conf_str(&divisions).unwrap().settings;
    assert_eq!(
        alone.roundup_power2_divisions,
        settings.roundup_power2_divisions
    );
    assert_eq!(setting_text(&settings, "expandable_segments"), None);
}

#[test]
fn device_reset_frees_what_was_live_and_resets_reserved() {
    let ev = |t_us, action, addr, size| Event::plain(t_us, 1, action, addr, size);
    let mut bytes = Vec::new();
    write_header(&mut bytes, &Header::new(1, vec![], String::new(), "none"));
    write_events(
        &mut bytes,
        &[
            ev(1, Action::SegmentAlloc, 0x1000_0000, 20 * MIB),
            ev(2, Action::Alloc, 0x1000_0000, 5 * MIB),
            Event::device_reset(1, 3),
            ev(4, Action::SegmentAlloc, 0x1000_0000, 2 * MIB),
            ev(5, Action::Alloc, 0x1000_0000, 512),
        ],
    );
    let trace = read_back(&bytes);
    assert_eq!(trace.devices.len(), 1, "devices come from the events too");
    assert_eq!(trace.devices[0].device.0, 1);
    let rec = device0(&trace);
    assert_eq!(rec.figures.recorded_peak_reserved_bytes, 20 * MIB);
    assert_eq!(rec.figures.end_reserved_bytes, 2 * MIB);
    let out = replay(&rec.workload, &ReplayConfig::default(), None).unwrap();
    assert_eq!(out.frees, 1, "the reset frees the live allocation");
    assert_eq!(out.stats.reserved_bytes.all.current, 2 * MIB as i64);
}

/// A complete recording ends with its `end` line, which the reader notes and keeps out of the
/// events; a synth --save file has one too.
#[test]
fn the_end_line_marks_a_complete_recording() {
    let mut bytes = Vec::new();
    write_header(&mut bytes, &Header::new(1, vec![0], String::new(), "none"));
    write_events(&mut bytes, &[Event::device_memory(0, 1 << 30, 1)]);
    let unended = read_back(&bytes);
    assert!(!unended.ended);
    write_events(&mut bytes, &[Event::end(2)]);
    let ended = read_back(&bytes);
    assert!(ended.ended);
    assert_eq!(
        ended.devices[0].events.len(),
        1,
        "the end line is no event of a device"
    );
}

/// A process killed while its trace was written leaves a last line cut off: the complete
/// lines replay, and the cut line is reported rather than refusing the whole file.
#[test]
fn a_cut_off_last_line_is_left_out_and_reported() {
    let event = |t: u64, action: &str, addr: u64| {
        format!(
            "{{\"t_us\":{t},\"device\":0,\"action\":\"{action}\",\"addr\":{addr},\"size\":1024,\"stream\":0}}\n"
        )
    };
    let whole = format!(
        "{HEADER}\n{}{}{}",
        event(1, "alloc", 1 << 21),
        event(2, "alloc", 1 << 22),
        event(3, "free_completed", 1 << 21)
    );
    let cut = &whole[..whole.len() - 20];
    let trace = parse_recorded_trace(cut.as_bytes(), "cut.trace").expect("complete lines read");
    assert_eq!(trace.cut_off_line, Some(4));
    assert_eq!(trace.devices[0].events.len(), 2, "the two whole events");
    let full = parse_recorded_trace(whole.as_bytes(), "whole.trace").unwrap();
    assert_eq!(full.cut_off_line, None);
    assert_eq!(full.devices[0].events.len(), 3);
    // A tail of bytes that are not text, as a crash can leave: cut off too; inside the file,
    // refused.
    let mut garbage = whole.as_bytes().to_vec();
    garbage.extend_from_slice(b"{\"t_us\":4,\xff\xfe");
    let trace = parse_recorded_trace(&garbage[..], "garbage.trace").expect("whole lines read");
    assert_eq!(
        (trace.cut_off_line, trace.devices[0].events.len()),
        (Some(5), 3)
    );
    garbage.push(b'\n');
    let err = parse_recorded_trace(&garbage[..], "garbage.trace").unwrap_err();
    assert!(err.to_string().contains("line 5") && err.to_string().contains("not UTF-8"));
    // A last line without its newline that is a whole event is kept.
    let unterminated = parse_recorded_trace(whole.trim_end().as_bytes(), "t.trace").unwrap();
    assert_eq!(unterminated.cut_off_line, None);
    assert_eq!(unterminated.devices[0].events.len(), 3);
}

fn error_of(text: &str) -> String {
    match parse_recorded_trace(text.as_bytes(), "bad.trace") {
        Err(e @ TraceError::BadLine { .. }) => e.to_string(),
        Err(e) => panic!("unexpected error kind: {e}"),
        Ok(_) => panic!("accepted a broken trace:\n{text}"),
    }
}

const HEADER: &str = r#"{"format":"cachealloc-trace","version":1,"pid":1,"devices":[0],"settings":"","free_sync":"device"}"#;

#[test]
fn broken_files_name_the_line_and_what_was_wrong() {
    let cases: &[(String, &str, &str)] = &[
        (String::new(), "line 1", "empty"),
        (
            "{\"format\":\"other\"}\n".into(),
            "line 1",
            "format 'other'",
        ),
        ("{\"pid\":1}\n".into(), "line 1", "header"),
        (
            HEADER.replace("cachealloc-trace", "rmm-log") + "\n",
            "line 1",
            "format 'rmm-log'",
        ),
        (
            HEADER.replace("\"version\":1", "\"version\":9") + "\n",
            "line 1",
            "version 9 is not supported (this cachealloc reads versions 1 to 7)",
        ),
        (
            HEADER.replace("\"settings\":\"\"", "\"settings\":\"max_split_size_mb:5\"") + "\n",
            "line 1",
            "max_split_size_mb",
        ),
        (
            HEADER.replace("\"devices\"", "\"placement\":\"sideways\",\"devices\"") + "\n",
            "line 1",
            "placement 'sideways'; it must be one of top-down, bottom-up",
        ),
        (
            format!(
                "{HEADER}\n\n{{\"t_us\":1,\"device\":0,\"action\":\"explode\",\"addr\":1,\"size\":1,\"stream\":0}}\n"
            ),
            "line 3",
            "explode",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"oom\",\"addr\":0,\"size\":1,\"stream\":0}}\n"
            ),
            "line 2",
            "device_free",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"alloc\",\"addr\":0,\"size\":1,\"stream\":0}}\n"
            ),
            "line 2",
            "address 0",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"range_reserve\",\"addr\":4096,\"size\":4194304,\"stream\":0}}\n"
            ),
            "line 2",
            "a range_reserve event without page; a range's pages are 2097152 bytes (small pool) or 20971520 bytes (large pool)",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"range_reserve\",\"addr\":4096,\"size\":4096,\"stream\":0,\"page\":4096}}\n"
            ),
            "line 2",
            "a range_reserve in pages of 4096 bytes; a range's pages are",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"device_memory\",\"addr\":0,\"size\":0,\"stream\":0}}\n"
            ),
            "line 2",
            "a device_memory event of 0 bytes; it holds the device's total memory",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"range_reserve\",\"addr\":4096,\"size\":5000000,\"stream\":0,\"page\":2097152}}\n"
            ),
            "line 2",
            "a range_reserve of 5000000 bytes in pages of 2097152 bytes; a range is one or more whole pages",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"range_release\",\"addr\":0,\"size\":0,\"stream\":0}}\n"
            ),
            "line 2",
            "range_release at address 0; it must name its block, segment or range",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"alloc\",\"size\":1,\"stream\":0}}\n"
            ),
            "line 2",
            "addr",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":9,\"device\":0,\"action\":\"empty_cache\",\"addr\":0,\"size\":0,\"stream\":0}}\n\
                 {{\"t_us\":3,\"device\":0,\"action\":\"empty_cache\",\"addr\":0,\"size\":0,\"stream\":0}}\n"
            ),
            "line 3",
            "backwards",
        ),
        (
            // Two recordings pasted together: named as such, not as an event without `t_us`.
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"empty_cache\",\"addr\":0,\"size\":0,\"stream\":0}}\n{HEADER}\n"
            ),
            "line 3",
            "a second header: a trace file holds one recording",
        ),
        (
            HEADER.replace("\"free_sync\":\"device\"", "\"free_sync\":\"sometimes\"") + "\n",
            "line 1",
            "the header names free_sync 'sometimes'; it must be one of device, event, none",
        ),
        (
            HEADER.replace("\"devices\":[0]", "\"devices\":[0,-1]") + "\n",
            "line 1",
            "the header lists device -1; ordinals are >= 0",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":-2,\"action\":\"empty_cache\",\"addr\":0,\"size\":0,\"stream\":0}}\n"
            ),
            "line 2",
            "device -2 is negative",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"range_reserve\",\"addr\":4096,\"size\":0,\"stream\":0,\"page\":2097152}}\n"
            ),
            "line 2",
            "a range_reserve of 0 bytes in pages of 2097152 bytes; a range is one or more whole pages",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"memory_fraction\",\"addr\":0,\"size\":0,\"stream\":0}}\n"
            ),
            "line 2",
            "a memory_fraction event without fraction (within [0, 1], 1 = no limit)",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"memory_fraction\",\"addr\":0,\"size\":0,\"stream\":0,\"fraction\":1.5}}\n"
            ),
            "line 2",
            "a memory_fraction event of 1.5; a fraction is within [0, 1] (1 = no limit)",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"free_requested\",\"addr\":4096,\"size\":1,\"stream\":0,\"waits\":\"godot\"}}\n"
            ),
            "line 2",
            "unknown variant `godot`, expected one of `nothing`, `device`, `streams`, \
             `device_then_streams`",
        ),
        (
            format!(
                "{HEADER}\n{{\"t_us\":1,\"device\":0,\"action\":\"alloc\",\"addr\":4096,\"size\":1,\"stream\":0,\"waits\":\"device\"}}\n"
            ),
            "line 2",
            "alloc with waits; only a free_requested names what its free waits for",
        ),
        (
            // Broken inside the file (the line has its newline): refused.
            format!("{HEADER}\n{{\"t_us\":1,\"dev\n"),
            "line 2",
            "not an event",
        ),
    ];
    for (text, line, what) in cases {
        let message = error_of(text);
        assert!(
            message.starts_with(&format!("bad.trace, {line}:")) && message.contains(what),
            "for {text:?}: {message}"
        );
    }
}

/// A header after a byte-order mark (an editor's UTF-8 save) is read; devices come in ordinal
/// order whatever order their events came in; a device whose only event is a failed request has
/// something to replay.
#[test]
fn devices_are_read_in_ordinal_order_after_a_byte_order_mark() {
    let header = HEADER.replace("\"devices\":[0]", "\"devices\":[]");
    let text = format!(
        "\u{feff}{header}\n\
         {{\"t_us\":1,\"device\":2,\"action\":\"oom\",\"addr\":0,\"size\":2097152,\"stream\":0,\"device_free\":0}}\n\
         {{\"t_us\":2,\"device\":1,\"action\":\"empty_cache\",\"addr\":0,\"size\":0,\"stream\":0}}\n"
    );
    let trace = parse_recorded_trace(text.as_bytes(), "bom.trace").unwrap();
    let devices: Vec<_> = trace.devices.iter().map(|d| d.device.0).collect();
    assert_eq!(devices, [1, 2]);
    assert!(!trace.devices[0].has_block_events());
    assert!(trace.devices[1].has_block_events());
}

/// Device 0 of a trace of `events` recorded with `settings`.
fn recorded_with(settings: &str, events: &[Event]) -> RecordedDevice {
    let mut bytes = Vec::new();
    let header = Header::new(1, vec![0], settings.to_string(), "none");
    write_header(&mut bytes, &header);
    write_events(&mut bytes, events);
    device0(&read_back(&bytes))
}

/// A `memory_fraction` line becomes `Op::MemoryFraction` where it stood, and from there a
/// release before a new segment may be a garbage collection (the header's threshold acts under
/// the fraction), which bounds no capacity: before the line the same release does.
#[test]
fn a_memory_fraction_line_is_replayed_in_place_and_turns_collection_on() {
    let (a, b) = (0x7f00_0000_0000u64, 0x7e00_0000_0000u64);
    let fraction = Event::memory_fraction(0, 0.5, 2);
    let release_then_grow = |t: u64| {
        [
            line(t, Action::SegmentAlloc, a, 40 * MIB),
            line(t + 1, Action::Alloc, a, 40 * MIB),
            line(t + 2, Action::FreeCompleted, a, 40 * MIB),
            line(t + 3, Action::SegmentFree, a, 40 * MIB),
            line(t + 4, Action::SegmentAlloc, b, 60 * MIB),
            line(t + 5, Action::Alloc, b, 60 * MIB),
        ]
    };
    let read = |events: &[Event]| recorded_with("garbage_collection_threshold:0.5", events);
    let mut after: Vec<Event> = vec![fraction];
    after.extend(release_then_grow(3));
    let collected = read(&after);
    assert_eq!(
        collected.workload.ops[0],
        Op::MemoryFraction { fraction: 0.5 }
    );
    assert_eq!(collected.capacity, None);
    let mut before: Vec<Event> = release_then_grow(3).to_vec();
    before.push(Event {
        t_us: 9,
        ..fraction
    });
    let bounded = read(&before);
    assert_eq!(
        bounded.workload.ops.last(),
        Some(&Op::MemoryFraction { fraction: 0.5 })
    );
    assert!(bounded.capacity.is_some(), "{:?}", bounded.capacity);
}

/// A release before a new segment that the memory fraction in force explains (the new segment
/// would have taken the pool past the fraction of the recorded device memory) is the limit's
/// refusal, not the device's: it bounds no capacity, whether the program set the fraction or
/// the header's settings name it. One within the limit is the device's and still bounds it.
#[test]
fn a_release_the_memory_fraction_explains_bounds_no_capacity() {
    let (a, b) = (0x7f00_0000_0000u64, 0x7e00_0000_0000u64);
    let fraction = |t: u64, f: f64| Event::memory_fraction(0, f, t);
    // 100 MiB cached, then 200 MiB: 300 MiB is past a quarter of 1 GiB, so the pool releases
    // the cached segment and takes the new one; then the program lifts the limit.
    let release_then_grow = [
        line(3, Action::SegmentAlloc, a, 100 * MIB),
        line(4, Action::Alloc, a, 100 * MIB),
        line(5, Action::FreeCompleted, a, 100 * MIB),
        line(6, Action::Retry, 0, 200 * MIB),
        line(7, Action::SegmentFree, a, 100 * MIB),
        line(8, Action::SegmentAlloc, b, 200 * MIB),
        line(9, Action::Alloc, b, 200 * MIB),
    ];
    let mut set = vec![Event::device_memory(0, 1 << 30, 1), fraction(2, 0.25)];
    set.extend(release_then_grow);
    set.push(fraction(10, 1.0));
    assert_eq!(recorded_with("", &set).capacity, None);
    let mut configured = vec![Event::device_memory(0, 1 << 30, 1)];
    configured.extend(release_then_grow);
    assert_eq!(
        recorded_with("per_process_memory_fraction:0.25", &configured).capacity,
        None
    );
    // Under half of 1 GiB the same 300 MiB was within the limit: the device refused it.
    set[1] = fraction(2, 0.5);
    assert!(matches!(
        recorded_with("", &set).capacity,
        Some(CapacityEstimate::Bracket { high, .. }) if high == 300 * MIB
    ));
    // As it is with the limit lifted before it.
    set[1] = fraction(2, 1.0);
    assert!(recorded_with("", &set).capacity.is_some());
}

/// With expandable segments the limit is checked against the segment the request needs, and
/// the device refuses the pages mapped for it, which may be more: under a quarter of 1 GiB
/// (256 MiB), with 240 MiB mapped, a 12 MiB request is within the limit (252 MiB), so its
/// release and retry are the device's refusal of one 20 MiB page, bounding the capacity at
/// 260 MiB, though that page would pass the limit.
#[test]
fn an_expandable_retry_is_judged_by_the_segment_the_limit_checks() {
    let a = 0x7f00_0000_0000u64;
    let events = [
        Event::device_memory(0, 1 << 30, 1),
        Event::memory_fraction(0, 0.25, 2),
        line(3, Action::RangeReserve, a, 60 * 20 * MIB),
        line(4, Action::SegmentMap, a, 240 * MIB),
        line(5, Action::Alloc, a, 240 * MIB),
        line(6, Action::FreeCompleted, a, 240 * MIB),
        line(7, Action::SegmentUnmap, a, 240 * MIB),
        line(8, Action::Retry, 0, 12 * MIB),
        line(9, Action::SegmentMap, a, 20 * MIB),
        line(10, Action::Alloc, a, 12 * MIB),
    ];
    let rec = recorded_with("expandable_segments:True", &events);
    assert!(
        matches!(
            rec.capacity,
            Some(CapacityEstimate::Bracket { high, .. }) if high == 260 * MIB
        ),
        "{:?}",
        rec.capacity
    );
}
