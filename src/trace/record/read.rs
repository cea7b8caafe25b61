//! Reading a cachealloc trace file: the header is checked (format, version, settings), then
//! every event line, and the events are split by device.
//!
//! A broken file fails at its first bad line with the file name, the line number and what was
//! wrong. Blank lines are skipped. Times must not go backwards (a file is one process's
//! recording; two files pasted together are refused rather than replayed as one).

use super::{Action, Event, FORMAT_NAME, FORMAT_VERSION, Header};
use crate::config::Config;
use crate::pool::{DeviceId, Settings};
use crate::trace::error::TraceError;
use std::io::BufRead;
use std::path::Path;

/// The events of one device, in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceEvents {
    pub device: DeviceId,
    pub events: Vec<Event>,
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
}

impl RecordedTrace {
    /// Devices with at least one event.
    pub fn traced_devices(&self) -> impl Iterator<Item = &DeviceEvents> {
        self.devices.iter().filter(|d| !d.events.is_empty())
    }
}

/// Read the trace at `path`.
pub fn read_recorded_trace(path: &Path) -> Result<RecordedTrace, TraceError> {
    let name = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: name.clone(),
        source,
    })?;
    parse_recorded_trace(std::io::BufReader::new(file), &name)
}

/// Parse a trace from `reader`; `source` names it in messages.
pub fn parse_recorded_trace(
    reader: impl BufRead,
    source: &str,
) -> Result<RecordedTrace, TraceError> {
    let mut lines = reader.lines().enumerate();
    let bad = |line: usize, detail: String| TraceError::bad_line(source, line, detail);
    let (header, settings) = match lines.next() {
        None => {
            return Err(bad(
                1,
                format!("the file is empty; the first line must be a {FORMAT_NAME} header"),
            ));
        }
        Some((_, text)) => {
            let text = text.map_err(|e| bad(1, format!("cannot read the line: {e}")))?;
            parse_header(text.trim_start_matches('\u{feff}')).map_err(|d| bad(1, d))?
        }
    };
    let mut devices: Vec<DeviceEvents> = Vec::new();
    for &d in &header.devices {
        device_entry(&mut devices, d);
    }
    let mut last_t = 0u64;
    for (index, text) in lines {
        let line = index + 1;
        let text = text.map_err(|e| bad(line, format!("cannot read the line: {e}")))?;
        if text.trim().is_empty() {
            continue;
        }
        let event = parse_event(&text).map_err(|d| bad(line, d))?;
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
        device_entry(&mut devices, event.device).push(event);
    }
    devices.sort_by_key(|d| d.device.0);
    Ok(RecordedTrace {
        source: source.to_string(),
        header,
        settings,
        devices,
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
    if header.version != FORMAT_VERSION {
        return Err(format!(
            "format version {} is not supported (this cachealloc reads version {FORMAT_VERSION})",
            header.version
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
    let event: Event = serde_json::from_str(text).map_err(|e| {
        format!(
            "not an event ({e}); an event holds t_us, device, action, addr, size and stream \
             (device_free for oom)"
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
    );
    if has_address && event.addr == 0 {
        return Err(format!("{:?} at address 0", event.action));
    }
    if event.action == Action::Oom && event.device_free.is_none() {
        return Err("an oom event without device_free".to_string());
    }
    Ok(event)
}
