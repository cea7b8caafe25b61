//! Reading a cachealloc trace file: the header is checked (format, version, settings), then
//! every event line, and the events are split by device. Every readable version's lines are
//! read whatever the header's version (a version 1 header over version 2 lines reads as they
//! are).
//!
//! A broken file fails at its first bad line with the file name, the line number and what was
//! wrong. Blank lines are skipped. Times must not go backwards (a file is one process's
//! recording; two files pasted together are refused, at the second header, rather than replayed
//! as one). One thing is forgiven: a last line that is cut off (no newline, not a whole event),
//! which is what a process killed while its trace was being written leaves; it is left out and
//! reported (`RecordedTrace::cut_off_line`), and the complete lines are replayed.

use super::convert::{RecordedDevice, WrittenAs, convert_device};
use super::{
    Action, Event, FORMAT_NAME, Header, READABLE_VERSIONS, RETRIES_MARKED_FROM, WAITS_NAMED_FROM,
    looks_like_header,
};
use crate::backend::sim::Placement;
use crate::config::{Config, FreeSync};
use crate::pool::rounding::{LARGE_BUFFER, SMALL_BUFFER};
use crate::pool::{DeviceId, Settings, check_fraction, pool_with_page};
use crate::trace::error::TraceError;
use crate::trace::input::TraceFile;
use std::io::BufRead;
use std::path::Path;

/// The events of one device, in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceEvents {
    pub device: DeviceId,
    pub events: Vec<Event>,
}

impl DeviceEvents {
    /// True when the device allocated or freed blocks (not only markers such as `empty_cache`
    /// and `device_reset`): what a replay needs.
    pub fn has_block_events(&self) -> bool {
        self.events.iter().any(|e| {
            matches!(
                e.action,
                Action::Alloc | Action::FreeRequested | Action::FreeCompleted | Action::Oom
            )
        })
    }
}

/// A whole trace file.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedTrace {
    /// The file name (for workload names and messages).
    pub source: String,
    pub header: Header,
    /// The header's settings, parsed.
    pub settings: Settings,
    /// Every device named by the header or by an event, by ordinal.
    pub devices: Vec<DeviceEvents>,
    /// The number of the last line when it was cut off (no newline, not a whole event) and left
    /// out.
    pub cut_off_line: Option<usize>,
    /// The file has its `end` line (version 4 on): the recording is complete.
    pub ended: bool,
}

impl RecordedTrace {
    /// The workload and figures of `device`'s events (one of `devices`), converted under what
    /// the file says of its recording: its settings, whether it marks retries, whether the
    /// program's frees waited.
    pub fn convert(&self, device: &DeviceEvents) -> RecordedDevice {
        convert_device(&self.source, device, &self.settings, self.written_as())
    }

    /// What the header says of the lines: whether the file marks each counted retry with a
    /// `retry` line, whether the program's `cudaFree` waited for a device synchronization or
    /// an event (`free_sync:device` or `event`), not for nothing, and whether its
    /// `free_requested` lines name what their frees wait for.
    fn written_as(&self) -> WrittenAs {
        WrittenAs {
            retries_marked: self.header.version >= RETRIES_MARKED_FROM,
            frees_deferred: self.header.free_sync != FreeSync::None.name(),
            waits_named: self.header.version >= WAITS_NAMED_FROM,
        }
    }

    /// Devices with at least one event.
    pub fn traced_devices(&self) -> impl Iterator<Item = &DeviceEvents> {
        self.devices.iter().filter(|d| !d.events.is_empty())
    }
}

/// Read the trace at `path`.
pub fn read_recorded_trace(path: &Path) -> Result<RecordedTrace, TraceError> {
    TraceFile::open(path)?.read_recorded_trace()
}

/// What a line that is not text is told.
const NOT_TEXT: &str = "not UTF-8 text";

/// Parse a trace from `reader`; `source` names it in messages.
pub fn parse_recorded_trace(
    mut reader: impl BufRead,
    source: &str,
) -> Result<RecordedTrace, TraceError> {
    let bad = |line: usize, detail: String| TraceError::bad_line(source, line, detail);
    // One line (`None` when it is not UTF-8 text), with whether it ended with a newline; `None`
    // at the end of the file.
    type Line = (Option<String>, bool);
    let mut read_line = |line: usize| -> Result<Option<Line>, TraceError> {
        let mut bytes = Vec::new();
        match reader.read_until(b'\n', &mut bytes) {
            Ok(0) => Ok(None),
            Ok(_) => {
                let complete = bytes.ends_with(b"\n");
                while bytes.last().is_some_and(|&b| b == b'\n' || b == b'\r') {
                    bytes.pop();
                }
                Ok(Some((String::from_utf8(bytes).ok(), complete)))
            }
            Err(e) => Err(bad(line, format!("cannot read the line: {e}"))),
        }
    };
    let (header, settings) = match read_line(1)? {
        None => {
            return Err(bad(
                1,
                format!("the file is empty; the first line must be a {FORMAT_NAME} header"),
            ));
        }
        Some((text, _)) => {
            let text = text.ok_or_else(|| bad(1, NOT_TEXT.to_string()))?;
            parse_header(text.trim_start_matches('\u{feff}')).map_err(|d| bad(1, d))?
        }
    };
    let mut devices: Vec<DeviceEvents> = Vec::new();
    for &d in &header.devices {
        device_entry(&mut devices, d);
    }
    let mut last_t = 0u64;
    let mut cut_off_line = None;
    let mut ended = false;
    let mut line = 1;
    while let Some((text, complete)) = read_line(line + 1)? {
        line += 1;
        let parsed = match text {
            Some(text) if text.trim().is_empty() => continue,
            Some(text) => parse_event(&text),
            None => Err(NOT_TEXT.to_string()),
        };
        let event = match parsed {
            Ok(event) => event,
            // Only the file's last line can lack its newline: the writer stopped mid-line (maybe
            // inside a multi-byte character).
            Err(_) if !complete => {
                cut_off_line = Some(line);
                break;
            }
            Err(d) => return Err(bad(line, d)),
        };
        if event.t_us < last_t {
            return Err(bad(
                line,
                format!(
                    "time goes backwards ({} µs after {} µs); a trace file holds one recording",
                    event.t_us, last_t
                ),
            ));
        }
        last_t = event.t_us;
        if event.action == Action::End {
            ended = true;
            continue;
        }
        device_entry(&mut devices, event.device).push(event);
    }
    devices.sort_by_key(|d| d.device.0);
    Ok(RecordedTrace {
        source: source.to_string(),
        header,
        settings,
        devices,
        cut_off_line,
        ended,
    })
}

fn device_entry(devices: &mut Vec<DeviceEvents>, device: i32) -> &mut Vec<Event> {
    let pos = match devices.iter().position(|d| d.device.0 == device) {
        Some(pos) => pos,
        None => {
            devices.push(DeviceEvents {
                device: DeviceId(device),
                events: Vec::new(),
            });
            devices.len() - 1
        }
    };
    &mut devices[pos].events
}

fn parse_header(text: &str) -> Result<(Header, Settings), String> {
    // The format's name first: a file of another format is named as such, not as a broken
    // header of ours.
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_str(text)
        && let Some(format) = fields.get("format")
        && format != FORMAT_NAME
    {
        let named = match format.as_str() {
            Some(name) => format!("'{name}'"),
            None => format.to_string(),
        };
        return Err(format!(
            "the header names format {named}, expected '{FORMAT_NAME}'"
        ));
    }
    let header: Header = serde_json::from_str(text).map_err(|e| {
        format!(
            "the first line is not a {FORMAT_NAME} header ({e}); it must hold format, version, \
             pid, devices, settings and free_sync"
        )
    })?;
    if !READABLE_VERSIONS.contains(&header.version) {
        return Err(format!(
            "format version {} is not supported (this cachealloc reads versions {} to {})",
            header.version,
            READABLE_VERSIONS[0],
            READABLE_VERSIONS[READABLE_VERSIONS.len() - 1]
        ));
    }
    if let Some(p) = &header.placement
        && Placement::from_name(p).is_none()
    {
        let allowed: Vec<&str> = Placement::CHOICES.iter().map(|(n, _)| *n).collect();
        return Err(format!(
            "the header names placement '{p}'; it must be one of {}",
            allowed.join(", ")
        ));
    }
    let free_syncs: Vec<&str> = FreeSync::CHOICES.iter().map(|(n, _)| *n).collect();
    if !free_syncs.contains(&header.free_sync.as_str()) {
        return Err(format!(
            "the header names free_sync '{}'; it must be one of {}",
            header.free_sync,
            free_syncs.join(", ")
        ));
    }
    if let Some(d) = header.devices.iter().find(|&&d| d < 0) {
        return Err(format!("the header lists device {d}; ordinals are >= 0"));
    }
    let settings = Config::parse_conf_str(&header.settings)
        .map_err(|e| {
            format!(
                "the header's settings '{}' are invalid: {e}",
                header.settings
            )
        })?
        .settings;
    Ok((header, settings))
}

fn parse_event(text: &str) -> Result<Event, String> {
    if looks_like_header(text.as_bytes()) {
        return Err(
            "a second header: a trace file holds one recording (replay recordings pasted \
             together one at a time, each from its own header)"
                .to_string(),
        );
    }
    let event: Event = serde_json::from_str(text).map_err(|e| {
        format!(
            "not an event ({e}); an event holds t_us, device, action, addr, size and stream \
             (device_free for oom, page for range_reserve, fraction for memory_fraction, waits \
             for free_requested: nothing, device, streams or device_then_streams)"
        )
    })?;
    if event.device < 0 {
        return Err(format!("device {} is negative", event.device));
    }
    let has_address = matches!(
        event.action,
        Action::Alloc
            | Action::FreeRequested
            | Action::FreeCompleted
            | Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap
            | Action::RangeReserve
            | Action::RangeRelease
    );
    if has_address && event.addr == 0 {
        return Err(format!(
            "{} at address 0; it must name its block, segment or range",
            event.action.name()
        ));
    }
    if event.waits.is_some() && event.action != Action::FreeRequested {
        return Err(format!(
            "{} with waits; only a free_requested names what its free waits for",
            event.action.name()
        ));
    }
    if event.action == Action::Oom && event.device_free.is_none() {
        return Err("an oom event without device_free".to_string());
    }
    if event.action == Action::MemoryFraction {
        match event.fraction {
            Some(f) if check_fraction(f).is_ok() => {}
            Some(f) => {
                return Err(format!(
                    "a memory_fraction event of {f}; a fraction is within [0, 1] (1 = no limit)"
                ));
            }
            None => {
                return Err(
                    "a memory_fraction event without fraction (within [0, 1], 1 = no limit)"
                        .to_string(),
                );
            }
        }
    }
    if event.action == Action::DeviceMemory && event.size == 0 {
        return Err("a device_memory event of 0 bytes; it holds the device's total memory".into());
    }
    if event.action == Action::RangeReserve {
        let pages = format!(
            "a range's pages are {SMALL_BUFFER} bytes (small pool) or {LARGE_BUFFER} bytes \
             (large pool)"
        );
        let page = event
            .page
            .ok_or_else(|| format!("a range_reserve event without page; {pages}"))?;
        if pool_with_page(page).is_none() {
            return Err(format!("a range_reserve in pages of {page} bytes; {pages}"));
        }
        if event.size == 0 || !event.size.is_multiple_of(page) {
            return Err(format!(
                "a range_reserve of {} bytes in pages of {page} bytes; a range is one or more \
                 whole pages",
                event.size
            ));
        }
    }
    Ok(event)
}
