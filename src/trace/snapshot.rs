//! Reader for `torch.cuda.memory._dump_snapshot` pickles (whatever the file is named: some are
//! `.json` but pickled), and for the same snapshot written as JSON
//! (`json.dump(torch.cuda.memory._snapshot(), f)`).
//!
//! The pickle is decoded to generic values (`pickle`, which keeps Python's sharing of objects
//! intact, unlike `serde-pickle`; see there), JSON to the same values (`json_snapshot`), and
//! they are walked by hand rather than decoded into typed structs, so a pickle's integers of
//! any width are fine (JSON's beyond 64 bits arrive as floats, named as too large), both formats
//! meet the same checks, and every error names the exact place that was wrong
//! (`device_traces[0][17]: 'size' is missing`).
//!
//! Format facts relied on (see the snapshot section of the allocator reference):
//! - top level: a dict with `segments` (list, all devices, each with `device`) and
//!   `device_traces` (list per device of entry dicts); `allocator_settings` is optional.
//!   `host_segments` and `host_traces` hold pinned host memory (`_record_memory_history`'s
//!   `record_pinned_host_memory`), which is not read; only whether they hold anything, since
//!   with `record_cuda=False` they are all there is: `device_traces` may then be left out.
//! - entries: `action`, `addr` (absent on `oom`, which carries `device_free`), `size`, `stream`,
//!   optional `frames` (list of `{name, filename, line}`).
//! - blocks: `size`, `requested_size`, `state`; `address` is absent in PyTorch 2.0 files and is
//!   then the running sum of block sizes from the segment start; `requested_size` is absent in
//!   PyTorch 1.13 files, whose blocks carry it as `history[0].real_size` instead.
//! - segments: `segment_pool_id`, a pair of integers, (0, 0) for the default pools and another
//!   pair for a private pool (a CUDA graph's or a MemPool's); absent in older files.
//! - `allocator_settings`: fields for four settings (`max_split_size`, an int of bytes, -1 for
//!   unlimited; `garbage_collection_threshold`, a float; `expandable_segments`, a bool;
//!   `roundup_power2_divisions`, a dict of ints keyed "1", "2", …, "32768", the interval's start
//!   in MiB) and `PYTORCH_CUDA_ALLOC_CONF`, the string PyTorch last read, which alone names the
//!   others (`per_process_memory_fraction`, `max_non_split_rounding_mb`).

use std::io::BufRead;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use super::error::TraceError;
use super::input::TraceFile;
use super::json_snapshot::{self, JsonError, JsonStart, json_start};
use super::pickle::{Pickle, PyValue, check_start, decode};
use super::recording::{
    Action, BlockState, CallSite, DeviceRecording, RecordedBlock, RecordedSegment,
    RecordedSettings, RecordedSnapshot, TraceEntry,
};
use crate::config::Config;
use crate::pool::rounding::{ROUNDUP_INTERVALS, SMALL_BUFFER};
use crate::pool::{DeviceId, PoolKind, Settings, StreamId};

/// The top-level keys of pinned host memory (see the module comment).
const HOST_KEYS: [&str; 2] = ["host_segments", "host_traces"];

type Dict = [(PyValue, PyValue)];

/// The highest device ordinal a snapshot can name: PyTorch's device index
/// (`c10::DeviceIndex`) is an 8-bit signed integer. The recording has a device for every
/// ordinal up to the highest a segment names, so a damaged file's larger one must not be read.
const MAX_DEVICE: i32 = i8::MAX as i32;

/// Read a snapshot file.
pub fn read_snapshot(path: impl AsRef<Path>) -> Result<RecordedSnapshot, TraceError> {
    TraceFile::open(path.as_ref())?.read_snapshot()
}

/// Parse snapshot bytes, a pickle or JSON; `source` names them in errors.
pub fn parse_snapshot(bytes: &[u8], source: &str) -> Result<RecordedSnapshot, TraceError> {
    if json_start(bytes) == Some(JsonStart::Snapshot) {
        return parse_json_snapshot(bytes, source);
    }
    let pickle = decode_pickle(bytes, source)?;
    Reader {
        source,
        p: &pickle,
        json: false,
    }
    .snapshot(pickle.root())
}

/// Parse a snapshot written as JSON, read from `text` to its end (its first bytes said it is
/// one: [`json_start`]); `source` names it in errors.
pub(super) fn parse_json_snapshot(
    text: impl BufRead,
    source: &str,
) -> Result<RecordedSnapshot, TraceError> {
    // A panic in the decoder, which would be a bug, is an error too: user input must never
    // abort the program.
    let values = match catch_unwind(AssertUnwindSafe(|| json_snapshot::decode(text))) {
        Ok(Ok(values)) => values,
        Ok(Err(JsonError::Io(e))) => {
            return Err(TraceError::Io {
                path: source.to_owned(),
                source: e,
            });
        }
        Ok(Err(JsonError::Syntax(detail))) => return Err(TraceError::not_json(source, detail)),
        Err(_) => {
            return Err(TraceError::not_json(
                source,
                "the decoder failed on this text",
            ));
        }
    };
    Reader {
        source,
        p: &values,
        json: true,
    }
    .snapshot(values.root())
}

fn not_pickle(source: &str, detail: String) -> TraceError {
    TraceError::NotPickle {
        path: source.to_owned(),
        detail,
    }
}

/// `Err` unless `head`, the first bytes of a stream that is not a regular file, begins a pickle
/// as `torch.cuda.memory._dump_snapshot` writes them: of protocol 2 or later, so starting with
/// the protocol's opcode, and decoding up to where the bytes end. (Empty is left to the whole
/// read, which says so.)
pub(super) fn check_snapshot_start(head: &[u8], source: &str) -> Result<(), TraceError> {
    let Some(&first) = head.first() else {
        return Ok(());
    };
    let kind = || foreign_kind(head);
    if first != PROTO {
        return Err(not_pickle(
            source,
            kind().unwrap_or_else(|| {
                format!(
                    "it begins with byte {first:#04x}, where the pickles PyTorch writes (protocol \
                     2 and later) begin with {PROTO:#04x}; a stream that is not a regular file is \
                     judged by its first bytes"
                )
            }),
        ));
    }
    run_decoder(head, source, || check_start(head))
}

/// The number the legacy (non-zip) `torch.save` format pickles first (`MAGIC_NUMBER` in
/// torch/serialization.py).
const TORCH_SAVE_MAGIC: i128 = 0x1950_a86a_20f9_469c_fc6c;

/// The opcode that begins a pickle of protocol 2 or later, with the protocol's number.
const PROTO: u8 = 0x80;

/// Decode any pickle, turning every failure into an error.
fn decode_pickle(bytes: &[u8], source: &str) -> Result<Pickle, TraceError> {
    if bytes.is_empty() {
        return Err(not_pickle(source, "the file is empty".into()));
    }
    run_decoder(bytes, source, || decode(bytes))
}

/// Run `decoder` over `bytes`, turning every failure into an error (a panic in the decoder,
/// which would be a bug, is caught as well: user input must never abort the program).
fn run_decoder<T>(
    bytes: &[u8],
    source: &str,
    decoder: impl FnOnce() -> Result<T, String>,
) -> Result<T, TraceError> {
    let detail = match catch_unwind(AssertUnwindSafe(decoder)) {
        Ok(Ok(decoded)) => return Ok(decoded),
        Ok(Err(detail)) => detail,
        Err(_) => "the decoder failed on these bytes".into(),
    };
    // A file of another kind is named for what it is; a damaged pickle of the binary protocols
    // PyTorch writes keeps the decoder's account of where it broke (a damaged protocol-0
    // pickle, which is text, is called text).
    Err(not_pickle(source, foreign_kind(bytes).unwrap_or(detail)))
}

/// What a file that did not decode as a pickle is, when it is a kind people mistake for a
/// snapshot: compressed (gzip, bzip2, xz, zstd, lz4), a `torch.save` archive, JSON that is not a
/// snapshot, or other text. `None` for anything else.
fn foreign_kind(bytes: &[u8]) -> Option<String> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Some(
            "it is gzip-compressed: a profiler trace (.json.gz) perhaps, which is not a memory \
             snapshot; a compressed snapshot must be decompressed first (gunzip)"
                .into(),
        );
    }
    if let Some((format, tool)) = compressed(bytes) {
        return Some(format!(
            "it is {format}-compressed; a compressed snapshot must be decompressed first \
             ({tool})"
        ));
    }
    if bytes.starts_with(b"PK\x03\x04") {
        return Some(
            "it is a zip archive, as torch.save writes; a memory snapshot is a plain pickle".into(),
        );
    }
    let head = &bytes[..bytes.len().min(4096)];
    let text = match std::str::from_utf8(head) {
        Ok(text) => text,
        // A multi-byte character cut off by the end of the head is still text.
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).ok()?,
        Err(_) => return None,
    };
    if text.trim().is_empty() {
        return None;
    }
    if text.chars().any(|c| c.is_control() && !c.is_whitespace()) {
        return None;
    }
    let trimmed = text.trim_start();
    if json_start(bytes).is_some() {
        // A memory snapshot as JSON is read before it comes here.
        return Some(
            "it is JSON text, but not a memory snapshot (a profiler trace perhaps): a snapshot \
             written as JSON is the dict json.dump writes of torch.cuda.memory._snapshot(), \
             beginning with its 'segments' key (or 'allocator_settings' or 'device_traces' with \
             sort_keys), or the list of segment dicts of torch.cuda.memory_snapshot()"
                .into(),
        );
    }
    let first_line: String = trimmed
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(60)
        .collect();
    Some(format!("it is text, starting {first_line:?}"))
}

/// The compression format `bytes` begin with, by its magic number, and the command that
/// undoes it (gzip, told apart above for profiler traces, aside).
fn compressed(bytes: &[u8]) -> Option<(&'static str, &'static str)> {
    const FORMATS: [(&[u8], &str, &str); 4] = [
        (b"\xfd7zXZ\x00", "xz", "unxz"),
        (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
        (b"\x04\x22\x4d\x18", "lz4", "unlz4"),
        (b"BZh", "bzip2", "bunzip2"),
    ];
    FORMATS
        .iter()
        .find(|(magic, _, _)| bytes.starts_with(magic))
        // bzip2's magic ends with the block size, a digit 1 to 9.
        .filter(|(magic, _, _)| *magic != b"BZh" || matches!(bytes.get(3), Some(b'1'..=b'9')))
        .map(|&(_, format, tool)| (format, tool))
}

/// A non-negative integer that fits in 64 bits.
fn as_u64(value: PyValue) -> Option<u64> {
    match value {
        PyValue::Int(v) => u64::try_from(v).ok(),
        PyValue::Bool(b) => Some(u64::from(b)),
        _ => None,
    }
}

fn as_f64(value: PyValue) -> Option<f64> {
    match value {
        PyValue::Float(v) => Some(v),
        PyValue::Int(v) => Some(v as f64),
        _ => None,
    }
}

struct Reader<'a> {
    source: &'a str,
    p: &'a Pickle,
    /// The values were read from JSON, whose integers beyond 64 bits arrive as floats.
    json: bool,
}

impl<'a> Reader<'a> {
    fn bad(&self, detail: String) -> TraceError {
        TraceError::unsupported(self.source, detail)
    }

    /// The value as an error message shows it ([`Pickle::describe`]); in JSON, a number
    /// outside the 64-bit integers' range as too large for a field, as it may have been
    /// written as an integer (`serde_json` reads an integer that wide as a float).
    fn describe(&self, value: PyValue) -> String {
        match value {
            // -2^63 too: an integer just below it is rounded to it.
            PyValue::Float(v) if self.json && (v <= -(2f64.powi(63)) || v >= 2f64.powi(64)) => {
                format!("a number too large for a 64-bit field (about {v:e})")
            }
            _ => self.p.describe(value),
        }
    }

    fn dict(&self, value: PyValue, at: &str) -> Result<&'a Dict, TraceError> {
        self.p.as_dict(value).ok_or_else(|| {
            self.bad(format!(
                "{at}: expected a dict, found {}",
                self.p.type_name(value)
            ))
        })
    }

    fn list(&self, value: PyValue, at: &str) -> Result<&'a [PyValue], TraceError> {
        self.p.as_list(value).ok_or_else(|| {
            self.bad(format!(
                "{at}: expected a list, found {}",
                self.p.type_name(value)
            ))
        })
    }

    fn get(&self, d: &Dict, name: &str) -> Option<PyValue> {
        self.p.get(d, name)
    }

    fn field(&self, d: &Dict, name: &str, at: &str) -> Result<PyValue, TraceError> {
        self.get(d, name)
            .ok_or_else(|| self.bad(format!("{at}: '{name}' is missing")))
    }

    fn u64_field(&self, d: &Dict, name: &str, at: &str) -> Result<u64, TraceError> {
        let value = self.field(d, name, at)?;
        as_u64(value).ok_or_else(|| {
            self.bad(format!(
                "{at}: '{name}' must be a non-negative integer below 2^64, found {}",
                self.describe(value)
            ))
        })
    }

    fn str_field(&self, d: &Dict, name: &str, at: &str) -> Result<&'a str, TraceError> {
        let value = self.field(d, name, at)?;
        self.p.as_str(value).ok_or_else(|| {
            self.bad(format!(
                "{at}: '{name}' must be a string, found {}",
                self.p.type_name(value)
            ))
        })
    }

    fn snapshot(&self, value: PyValue) -> Result<RecordedSnapshot, TraceError> {
        // `torch.cuda.memory_snapshot()` gives the segments alone, as a list: a state without
        // a trace or settings.
        if let Some(items) = self.p.as_list(value) {
            return self.segments_only(items);
        }
        let Some(top) = self.p.as_dict(value) else {
            let detail = if value == PyValue::Int(TORCH_SAVE_MAGIC) {
                "it is a file of torch.save's legacy format (_use_new_zipfile_serialization=False), \
                 whose first pickle is its magic number; a memory snapshot is the one pickle \
                 torch.cuda.memory._dump_snapshot writes"
                    .to_owned()
            } else {
                format!("the top level is a {}", self.p.type_name(value))
            };
            return Err(TraceError::not_snapshot(self.source, detail));
        };
        let host_keys = HOST_KEYS.map(|key| self.get(top, key));
        for required in ["segments", "device_traces"] {
            let host_only = required == "device_traces" && host_keys.iter().any(Option::is_some);
            if self.get(top, required).is_none() && !host_only {
                return Err(TraceError::not_snapshot(
                    self.source,
                    format!("the top-level dict has no '{required}' key"),
                ));
            }
        }
        let settings = match self.get(top, "allocator_settings") {
            Some(PyValue::None) | None => None,
            Some(v) => Some(self.settings(v)?),
        };
        let traces = match self.get(top, "device_traces") {
            Some(traces) => self.list(traces, "device_traces")?,
            None => &[],
        };
        let mut entries_per_device = Vec::with_capacity(traces.len());
        for (d, &trace) in traces.iter().enumerate() {
            let at = format!("device_traces[{d}]");
            let items = self.list(trace, &at)?;
            let entries = items
                .iter()
                .enumerate()
                .map(|(i, &e)| self.entry(e, &format!("{at}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            entries_per_device.push(entries);
        }
        let segments =
            self.segments(self.list(self.field(top, "segments", "top level")?, "segments")?)?;
        let mut snapshot = self.recorded(entries_per_device, segments, settings, false);
        snapshot.host_memory = host_keys.iter().flatten().any(|&v| self.holds_anything(v));
        Ok(snapshot)
    }

    /// Whether `value` (a host key's) holds an entry: a list with an item other than an empty
    /// list (a list per host, empty, holds nothing).
    fn holds_anything(&self, value: PyValue) -> bool {
        self.p.as_list(value).is_some_and(|items| {
            items
                .iter()
                .any(|&item| self.p.as_list(item).is_none_or(|inner| !inner.is_empty()))
        })
    }

    /// A snapshot of `torch.cuda.memory_snapshot()`: its list of segments.
    fn segments_only(&self, items: &[PyValue]) -> Result<RecordedSnapshot, TraceError> {
        if let Some(other) = items.iter().find(|&&v| self.p.as_dict(v).is_none()) {
            return Err(TraceError::not_snapshot(
                self.source,
                format!(
                    "the top level is a list, but of {} values, not of the segment dicts that \
                     torch.cuda.memory_snapshot() writes",
                    self.p.type_name(*other)
                ),
            ));
        }
        let segments = self.segments(items)?;
        Ok(self.recorded(Vec::new(), segments, None, true))
    }

    /// The segments, in (device, address) order.
    fn segments(&self, raw_segments: &[PyValue]) -> Result<Vec<RecordedSegment>, TraceError> {
        let mut segments = raw_segments
            .iter()
            .enumerate()
            .map(|(i, &s)| self.segment(s, &format!("segments[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        segments.sort_by_key(|s| (s.device, s.address));
        Ok(segments)
    }

    /// One recording per device that has a trace or segments.
    fn recorded(
        &self,
        mut entries_per_device: Vec<Vec<TraceEntry>>,
        segments: Vec<RecordedSegment>,
        settings: Option<RecordedSettings>,
        segments_only: bool,
    ) -> RecordedSnapshot {
        let max_segment_device = segments.iter().map(|s| s.device.0 + 1).max().unwrap_or(0);
        let num_devices = entries_per_device.len().max(max_segment_device as usize);
        entries_per_device.resize_with(num_devices, Vec::new);
        let devices = entries_per_device
            .into_iter()
            .enumerate()
            .map(|(d, entries)| DeviceRecording {
                source: self.source.to_owned(),
                device: DeviceId(d as i32),
                entries,
                segments: segments
                    .iter()
                    .filter(|s| s.device.0 as usize == d)
                    .cloned()
                    .collect(),
                settings: settings.clone(),
            })
            .collect();
        RecordedSnapshot {
            source: self.source.to_owned(),
            devices,
            settings,
            segments_only,
            host_memory: false,
        }
    }

    fn entry(&self, value: PyValue, at: &str) -> Result<TraceEntry, TraceError> {
        let d = self.dict(value, at)?;
        let text = self.str_field(d, "action", at)?;
        let action = Action::parse(text).ok_or_else(|| {
            self.bad(format!(
                "{at}: unknown action '{text}' (known: {})",
                Action::KNOWN
            ))
        })?;
        let (addr, device_free) = match action {
            Action::Oom => {
                // Python snapshots carry `device_free`; the C++ builder puts it in `addr`.
                let free = match (self.get(d, "device_free"), self.get(d, "addr")) {
                    (None, None) => {
                        return Err(self.bad(format!(
                            "{at}: an 'oom' entry needs 'device_free' (the device's free bytes \
                             when the allocation failed), and this one has neither \
                             'device_free' nor 'addr'"
                        )));
                    }
                    (Some(_), _) => self.u64_field(d, "device_free", at)?,
                    (None, Some(_)) => self.u64_field(d, "addr", at)?,
                };
                (0, Some(free))
            }
            Action::Snapshot | Action::Annotate => {
                (self.get(d, "addr").and_then(as_u64).unwrap_or(0), None)
            }
            _ => (self.u64_field(d, "addr", at)?, None),
        };
        let size = match action {
            Action::Annotate => self.get(d, "size").and_then(as_u64).unwrap_or(0),
            _ => self.u64_field(d, "size", at)?,
        };
        let stream = match self.get(d, "stream") {
            Some(_) => StreamId(self.u64_field(d, "stream", at)?),
            None => StreamId(0),
        };
        Ok(TraceEntry {
            action,
            addr,
            size,
            stream,
            device_free,
            call_site: self.call_site(self.get(d, "frames")),
        })
    }

    fn segment(&self, value: PyValue, at: &str) -> Result<RecordedSegment, TraceError> {
        let d = self.dict(value, at)?;
        let device = self.u64_field(d, "device", at)?;
        let device = i32::try_from(device)
            .ok()
            .filter(|&ordinal| ordinal <= MAX_DEVICE)
            .ok_or_else(|| {
                self.bad(format!(
                    "{at}: device ordinal {device} is out of range: PyTorch numbers devices 0 \
                     to {MAX_DEVICE} (c10::DeviceIndex is an 8-bit integer)"
                ))
            })?;
        let address = self.u64_field(d, "address", at)?;
        let total_size = self.u64_field(d, "total_size", at)?;
        let stream = StreamId(self.get(d, "stream").and_then(as_u64).unwrap_or(0));
        let pool = match self.get(d, "segment_type") {
            None if total_size == SMALL_BUFFER => PoolKind::Small,
            None => PoolKind::Large,
            Some(v) => match self.p.as_str(v) {
                Some("small") => PoolKind::Small,
                Some("large") => PoolKind::Large,
                _ => {
                    return Err(self.bad(format!(
                        "{at}: 'segment_type' must be \"small\" or \"large\", found {}",
                        self.describe(v)
                    )));
                }
            },
        };
        let private_pool = self.pool_id(d, at)?;
        let is_expandable = self.get(d, "is_expandable") == Some(PyValue::Bool(true));
        let raw_blocks = self.list(self.field(d, "blocks", at)?, &format!("{at}.blocks"))?;
        let mut blocks = Vec::with_capacity(raw_blocks.len());
        let mut next = address;
        for (i, &b) in raw_blocks.iter().enumerate() {
            let bat = format!("{at}.blocks[{i}]");
            let bd = self.dict(b, &bat)?;
            let size = self.u64_field(bd, "size", &bat)?;
            let block_address = match self.get(bd, "address") {
                Some(_) => self.u64_field(bd, "address", &bat)?,
                None => next,
            };
            let requested_size = match self.get(bd, "requested_size") {
                Some(_) => self.u64_field(bd, "requested_size", &bat)?,
                None => self
                    .history_request(bd, block_address, size)
                    .unwrap_or(size),
            };
            let state = match self.str_field(bd, "state", &bat)? {
                "active_allocated" => BlockState::Allocated,
                "active_pending_free" | "active_awaiting_free" => BlockState::PendingFree,
                "inactive" => BlockState::Inactive,
                other => {
                    return Err(self.bad(format!(
                        "{bat}: unknown block state '{other}' (known: active_allocated, \
                         active_pending_free, inactive)"
                    )));
                }
            };
            next = block_address.saturating_add(size);
            blocks.push(RecordedBlock {
                address: block_address,
                size,
                requested_size,
                state,
            });
        }
        Ok(RecordedSegment {
            device: DeviceId(device),
            address,
            total_size,
            stream,
            pool,
            private_pool,
            is_expandable,
            blocks,
        })
    }

    /// The request a block of a PyTorch 1.13 file holds, which names no `requested_size`: the
    /// `real_size` of the first (latest) entry of its `history`, the allocations recorded in
    /// the block, as PyTorch's own viewers read it (`_memory_viz._block_extra_legacy`,
    /// MemoryViz.js). `None` (the block's size is taken) when the block has no history (it was
    /// allocated while no stack was recorded), or when that entry does not describe an
    /// allocation at the block's start that fits it.
    fn history_request(&self, block: &Dict, address: u64, size: u64) -> Option<u64> {
        let history = self.p.as_list(self.get(block, "history")?)?;
        let latest = self.p.as_dict(*history.first()?)?;
        let at = as_u64(self.get(latest, "addr")?)?;
        let real_size = as_u64(self.get(latest, "real_size")?)?;
        (at == address && real_size <= size).then_some(real_size)
    }

    /// A segment's `segment_pool_id`: `None` for the default pools ((0, 0), or no such field
    /// in files from before PyTorch named pools), else the private pool's id.
    fn pool_id(&self, d: &Dict, at: &str) -> Result<Option<(u64, u64)>, TraceError> {
        let value = match self.get(d, "segment_pool_id") {
            None | Some(PyValue::None) => return Ok(None),
            Some(value) => value,
        };
        let int = |v| match v {
            PyValue::Int(n) => u64::try_from(n).ok(),
            _ => None,
        };
        let pair = match self.p.as_list(value) {
            Some(&[a, b]) => int(a).zip(int(b)),
            _ => None,
        };
        match pair {
            Some((0, 0)) => Ok(None),
            Some(id) => Ok(Some(id)),
            None => Err(self.bad(format!(
                "{at}: 'segment_pool_id' must be a pair of non-negative integers ((0, 0) for the \
                 default pools), found {}",
                self.describe(value)
            ))),
        }
    }

    /// `allocator_settings`: each setting from its field, or where the file has none (or
    /// None), from the recorded string, which alone names the others (see
    /// [`RecordedSettings`]). A field holding what PyTorch cannot have written is refused,
    /// naming the field, the value and what is allowed, rather than read as something else.
    fn settings(&self, value: PyValue) -> Result<RecordedSettings, TraceError> {
        let at = "allocator_settings";
        let d = self.dict(value, at)?;
        let field = |name| self.get(d, name).filter(|&v| v != PyValue::None);
        let conf = match field("PYTORCH_CUDA_ALLOC_CONF") {
            Some(v) => Some(
                self.p
                    .as_str(v)
                    .ok_or_else(|| {
                        self.bad_setting(
                            "PYTORCH_CUDA_ALLOC_CONF",
                            v,
                            "a string (the settings PyTorch last read)",
                        )
                    })?
                    .to_owned(),
            ),
            None => None,
        };
        let (conf_settings, conf_warnings) = self.conf_settings(conf.as_deref());
        let from_conf = conf_settings.clone().unwrap_or_default();
        let max_split_size = match field("max_split_size") {
            Some(v) => self.max_split_size(v)?,
            None => from_conf
                .has_max_split_size()
                .then_some(from_conf.max_split_size),
        };
        let garbage_collection_threshold = match field("garbage_collection_threshold") {
            Some(v) => self.garbage_collection_threshold(v)?,
            None => from_conf.garbage_collection_threshold,
        };
        let expandable_segments = match field("expandable_segments") {
            Some(PyValue::Bool(on)) => on,
            Some(v) => return Err(self.bad_setting("expandable_segments", v, "True or False")),
            None => from_conf.expandable_segments,
        };
        let roundup_power2_divisions = match field("roundup_power2_divisions") {
            Some(v) => self.roundup_table(v)?,
            None => from_conf.roundup_power2_divisions,
        };
        Ok(RecordedSettings {
            conf,
            max_split_size,
            garbage_collection_threshold,
            expandable_segments,
            roundup_power2_divisions,
            conf_settings,
            conf_warnings,
        })
    }

    /// The settings the recorded `PYTORCH_CUDA_ALLOC_CONF` string sets, read as the library
    /// reads that variable, and the warnings it earns. A string that cannot be read is left
    /// out, with a warning: it must not make the file unreadable, and the fields still name
    /// the settings PyTorch records in them.
    fn conf_settings(&self, conf: Option<&str>) -> (Option<Settings>, Vec<String>) {
        let Some(text) = conf else {
            return (None, Vec::new());
        };
        let source = self.source;
        match Config::parse_pytorch_conf(text) {
            Ok(config) => {
                let warnings = config
                    .unsupported_key_warnings()
                    .into_iter()
                    .map(|w| format!("{source}: allocator_settings: recorded {w}"))
                    .collect();
                (Some(config.settings), warnings)
            }
            Err(e) => {
                let warning = format!(
                    "{source}: allocator_settings: recorded {e}; the string is left out, so \
                     the settings are those of the other fields (max_split_size, \
                     garbage_collection_threshold, expandable_segments, \
                     roundup_power2_divisions) and the defaults for the rest \
                     (per_process_memory_fraction, max_non_split_rounding_mb): give --conf \
                     with the program's settings if they differ"
                );
                (None, vec![warning])
            }
        }
    }

    /// The error for `allocator_settings.{name}` holding `value`.
    fn bad_setting(&self, name: &str, value: PyValue, allowed: &str) -> TraceError {
        self.bad(format!(
            "allocator_settings.{name}: found {}; allowed: {allowed}",
            self.describe(value)
        ))
    }

    /// `max_split_size` in bytes, `None` when unlimited. PyTorch writes the `size_t` setting
    /// as a signed 64-bit integer: -1 for unlimited (SIZE_MAX), and a negative value too for
    /// the largest settings (`max_split_size_mb` is clamped to the whole MiB below 2^64), which
    /// are read as unlimited as well (`to_settings` does the same with the clamp).
    fn max_split_size(&self, value: PyValue) -> Result<Option<u64>, TraceError> {
        match value {
            PyValue::Int(bytes) if (i128::from(i64::MIN)..0).contains(&bytes) => Ok(None),
            PyValue::Int(bytes) if u64::try_from(bytes).is_ok() => Ok(Some(bytes as u64)),
            _ => Err(self.bad_setting(
                "max_split_size",
                value,
                "a whole number of bytes below 2^64, or -1 (unlimited; any negative 64-bit \
                 integer is read so)",
            )),
        }
    }

    /// `garbage_collection_threshold`: PyTorch writes a float, 0.0 (off) or what its
    /// parser accepts, greater than 0.0 and less than 1.0.
    fn garbage_collection_threshold(&self, value: PyValue) -> Result<f64, TraceError> {
        match as_f64(value) {
            Some(v) if (0.0..1.0).contains(&v) => Ok(v),
            _ => Err(self.bad_setting(
                "garbage_collection_threshold",
                value,
                "a number from 0.0 (off) up to but not including 1.0",
            )),
        }
    }

    /// `roundup_power2_divisions`: divisions per interval, keyed by the interval's start in
    /// MiB, "1", "2", …, "32768" as PyTorch writes them (an integer key is read the same); each
    /// 0 (off) or a power of 2, as PyTorch's parser allows. A key the dict lacks is 0.
    fn roundup_table(&self, value: PyValue) -> Result<[u64; ROUNDUP_INTERVALS], TraceError> {
        let name = "roundup_power2_divisions";
        let last_start = 1u64 << (ROUNDUP_INTERVALS - 1);
        let Some(entries) = self.p.as_dict(value) else {
            return Err(self.bad_setting(
                name,
                value,
                &format!(
                    "a dict of divisions keyed by each interval's start in MiB (\"1\", \"2\", \
                     \"4\", …, \"{last_start}\")"
                ),
            ));
        };
        let mut table = [0; ROUNDUP_INTERVALS];
        for &(k, v) in entries {
            let start_mib = match k {
                PyValue::Int(i) => u64::try_from(i).ok(),
                _ => self
                    .p
                    .as_str(k)
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok()),
            };
            let Some(start_mib) = start_mib.filter(|&m| m.is_power_of_two() && m <= last_start)
            else {
                return Err(self.bad(format!(
                    "allocator_settings.{name}: found key {}; allowed: each interval's start \
                     in MiB, a power of 2 from \"1\" to \"{last_start}\"",
                    self.describe(k)
                )));
            };
            let divisions = match v {
                PyValue::Int(d) => u64::try_from(d)
                    .ok()
                    .filter(|&d| d == 0 || d.is_power_of_two()),
                _ => None,
            };
            let Some(divisions) = divisions else {
                let key = match self.p.as_str(k) {
                    Some(text) => format!("{text:?}"),
                    None => start_mib.to_string(),
                };
                return Err(self.bad_setting(
                    &format!("{name}[{key}]"),
                    v,
                    "0 (off) or a power of 2 (1, 2, 4, 8, …)",
                ));
            };
            table[start_mib.trailing_zeros() as usize] = divisions;
        }
        Ok(table)
    }

    /// Classify an entry's stack frames (see [`CallSite`]).
    fn call_site(&self, frames: Option<PyValue>) -> CallSite {
        let Some(frames) = frames
            .and_then(|f| self.p.as_list(f))
            .filter(|f| !f.is_empty())
        else {
            return CallSite::Unrecorded;
        };
        let names = || {
            frames.iter().filter_map(|&f| {
                let d = self.p.as_dict(f)?;
                self.p.as_str(self.get(d, "name")?)
            })
        };
        if names().any(|n| n.contains("emptyCache") || n.contains("empty_cache")) {
            CallSite::EmptyCache
        } else if names().any(|n| n.contains("malloc")) {
            CallSite::Malloc
        } else {
            CallSite::Other
        }
    }
}

#[cfg(test)]
mod tests;
