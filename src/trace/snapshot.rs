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
mod tests {
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
        let with_entry =
            |entry: &str| format!("{{\"segments\": [], \"device_traces\": [[{entry}]]}}");
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
}
