//! `cachealloc state`: the memory state a PyTorch snapshot records, and whether a request of a
//! given size would be served in it. For the snapshots a replay cannot use (no allocation
//! trace: `_snapshot()` in an out-of-memory handler), and for the end state of any other.

use crate::outcome::{OomReportJson, counted};
use crate::size;
use cachealloc::config::{Config, render_conf};
use cachealloc::pool::rounding::{LARGE_BUFFER, MAX_REQUEST, SMALL_BUFFER};
use cachealloc::pool::{DeviceId, Error, PoolKind, Settings, StreamId, format_size};
use cachealloc::trace::TraceError;
use cachealloc::trace::memory_state::{FreeBlock, PoolMemory, StreamMemory};
use cachealloc::trace::recording::Action;
use cachealloc::trace::{
    DeviceRecording, MemoryState, RecordedSnapshot, ReplayConfig, RequestOutcome, RequestTrial,
    end_state, pending_frees, read_snapshot, try_request,
};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// How many of the largest free cached blocks the readable report lists.
const LISTED_IN_TEXT: usize = 5;

#[derive(clap::Args)]
pub struct StateArgs {
    /// The snapshot: a pickle written by torch.cuda.memory._dump_snapshot (some are named
    /// .json), with or without an allocation trace.
    snapshot: PathBuf,
    /// Which device's state to report (default: the first device with memory reserved).
    #[arg(long, value_parser = crate::device_arg::parse_device, allow_hyphen_values = true)]
    device: Option<i32>,
    /// Try a request of SIZE bytes in this state: whether a free cached block serves it, or a
    /// new segment, or why it runs out of memory. Same forms as replay's --capacity (1.24GiB,
    /// 512MiB, bytes). PyTorch's "Tried to allocate SIZE" names the segment it tried to obtain:
    /// the request rounded up to 2 MiB above 10 MiB, but 2.00 MiB for any request up to 1 MiB
    /// and 20.00 MiB for one of 1-10 MiB (give the tensor's size there, when known).
    #[arg(long, value_parser = parse_request, allow_hyphen_values = true)]
    request: Option<GivenSize>,
    /// The stream of the request, as the snapshot numbers streams (0 is the default stream;
    /// decimal or 0x hex). Default: the snapshot's only stream, else 0 when it has memory on
    /// the default stream.
    #[arg(long, value_parser = parse_stream, allow_hyphen_values = true, requires = "request")]
    stream: Option<u64>,
    /// Memory the device had free beyond what the pool reserved (PyTorch's message: "of which
    /// SIZE is free"). Default 0: the device was full, as at an out-of-memory error.
    #[arg(long, value_parser = parse_device_free, allow_hyphen_values = true, requires = "request")]
    device_free: Option<GivenSize>,
    /// The device's total memory (PyTorch's message: "a total capacity of SIZE"), for the
    /// report's memory held outside the pool and for per_process_memory_fraction. Default:
    /// what the pool reserved plus --device-free (so no memory is held outside the pool).
    #[arg(long, value_parser = size::parse_device_memory, allow_hyphen_values = true, requires = "request")]
    device_memory: Option<u64>,
    /// The allocator settings the program ran with, in PYTORCH_CUDA_ALLOC_CONF syntax, in place
    /// of the snapshot's (older snapshots name none: then the defaults).
    #[arg(long)]
    conf: Option<String>,
    /// Print one JSON object instead of the readable report.
    #[arg(long)]
    json: bool,
}

/// A size as given: its bytes, and whether it was written without a unit (copied from
/// PyTorch's message with its unit left off, perhaps), which a note points out.
#[derive(Clone, Copy, Debug)]
struct GivenSize {
    bytes: u64,
    unitless: bool,
}

impl GivenSize {
    fn of(text: &str, bytes: u64) -> Self {
        GivenSize {
            bytes,
            unitless: text.trim().bytes().all(|c| c.is_ascii_digit() || c == b'.'),
        }
    }

    /// Note, for `option`, a number below 1 MiB written without a unit: read as bytes.
    fn note_unitless(self, option: &str) {
        if self.unitless && self.bytes > 0 && self.bytes < 1 << 20 {
            eprintln!(
                "cachealloc: note: {option} {} is read as {} bytes (a number without a unit is \
                 bytes: for mebibytes write {}MiB)",
                self.bytes, self.bytes, self.bytes
            );
        }
    }
}

/// `--device-free`: any size, 0 included.
fn parse_device_free(text: &str) -> Result<GivenSize, String> {
    Ok(GivenSize::of(text, size::parse_size(text)?))
}

/// A request size: bytes, at least one and less than the 1 EB PyTorch refuses outright.
fn parse_request(text: &str) -> Result<GivenSize, String> {
    match size::parse_size(text)? {
        0 => Err(format!(
            "invalid request {text:?}: a request of 0 bytes allocates nothing"
        )),
        bytes if bytes >= MAX_REQUEST => Err(format!(
            "invalid request {text:?}: PyTorch refuses a request of 1 EB ({MAX_REQUEST} bytes) or \
             more before its pool sees it"
        )),
        bytes => Ok(GivenSize::of(text, bytes)),
    }
}

/// A stream id: decimal or 0x hex, as the snapshot and the out-of-memory report print them.
fn parse_stream(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse::<u64>(),
    };
    parsed.map_err(|_| {
        format!("invalid stream {text:?}: expected a stream id, decimal or 0x hex (0 is the default stream)")
    })
}

pub fn run(args: StateArgs) -> Result<String, String> {
    let path = args.snapshot.display().to_string();
    if crate::recorded::is_recorded_trace(&args.snapshot) {
        return Err(format!(
            "{path}: a trace cachealloc recorded, which begins with the process: replay it \
             (cachealloc replay {}); state reads PyTorch memory snapshots",
            cachealloc::config::shell_word(&path)
        ));
    }
    let snapshot = read_snapshot(&args.snapshot).map_err(|e| e.to_string())?;
    let rec = pick_device(&snapshot.devices, args.device, &path)?;
    let (settings, settings_text) = settings(rec, args.conf.as_deref())?;
    let memory = MemoryState::of(rec);
    if let Some(request) = args.request {
        request.note_unitless("--request");
    }
    let request = match args.request {
        Some(GivenSize { bytes: size, .. }) => Some(request(
            rec,
            &memory,
            &args,
            (settings, &settings_text),
            size,
            &path,
        )?),
        None => None,
    };
    let mut report = StateJson::new(&path, rec, &memory, settings_text, request);
    // Plain replay needs allocations (a trace of frees alone is refused).
    let allocates = rec
        .entries
        .iter()
        .any(|e| matches!(e.action, Action::Alloc | Action::Oom));
    report.replay_command = allocates.then(|| replay_command(&snapshot, rec, &path));
    report.replayable = allocates;
    Ok(if args.json {
        serde_json::to_string(&report).expect("plain data serializes") + "\n"
    } else {
        report.to_text()
    })
}

/// The device to report: `--device`, else the first with memory reserved.
fn pick_device<'a>(
    devices: &'a [DeviceRecording],
    device: Option<i32>,
    path: &str,
) -> Result<&'a DeviceRecording, String> {
    let with_memory: Vec<&DeviceRecording> =
        devices.iter().filter(|d| !d.segments.is_empty()).collect();
    let listed = || {
        let ids: Vec<String> = with_memory.iter().map(|d| d.device.0.to_string()).collect();
        match ids.as_slice() {
            [] => "no device has".to_string(),
            [one] => format!("device {one} has"),
            _ => format!("devices {} have", ids.join(", ")),
        }
    };
    match device {
        Some(d) => with_memory
            .iter()
            .find(|r| r.device.0 == d)
            .copied()
            .ok_or_else(|| {
                format!(
                    "{path}: device {d} has no memory reserved in this snapshot ({} memory \
                     reserved)",
                    listed()
                )
            }),
        None => with_memory.first().copied().ok_or_else(|| {
            format!(
                "{path}: the snapshot holds no segments: no device had memory reserved when it \
                 was taken"
            )
        }),
    }
}

/// The settings the request is tried under, and how the report names them.
fn settings(rec: &DeviceRecording, conf: Option<&str>) -> Result<(Settings, String), String> {
    if let Some(conf) = conf {
        let config = crate::parse_conf(conf)?;
        let text = if conf.trim().is_empty() {
            "defaults (from --conf)".to_string()
        } else {
            format!("{conf} (from --conf)")
        };
        return Ok((config.settings, text));
    }
    match &rec.settings {
        Some(recorded) => {
            let settings = recorded.to_settings();
            let conf = render_conf(&Config {
                settings: settings.clone(),
                ..Config::default()
            });
            let text = if conf.is_empty() {
                "as recorded: defaults".to_string()
            } else {
                format!("as recorded: {conf}")
            };
            Ok((settings, text))
        }
        None => Ok((
            Settings::default(),
            "defaults (the snapshot names none; give --conf with the program's)".to_string(),
        )),
    }
}

fn request(
    rec: &DeviceRecording,
    memory: &MemoryState,
    args: &StateArgs,
    (settings, settings_text): (Settings, &str),
    size: u64,
    path: &str,
) -> Result<RequestJson, String> {
    let reserved = memory.total().reserved;
    if let Some(free) = args.device_free {
        free.note_unitless("--device-free");
    }
    let device_free = args.device_free.map_or(0, |free| free.bytes);
    let capacity = reserved.checked_add(device_free).ok_or_else(|| {
        format!("--device-free: {device_free} bytes beyond the {reserved} reserved is too large")
    })?;
    if let Some(total) = args.device_memory
        && total < capacity
    {
        return Err(format!(
            "--device-memory {} ({total} bytes) is less than the memory the snapshot reserves \
             plus --device-free: {} ({capacity} bytes)",
            format_size(total),
            format_size(capacity)
        ));
    }
    let total = args.device_memory.unwrap_or(capacity);
    if let Some(allowed) = settings.allowed_maximum(total)
        && allowed < reserved
    {
        return Err(format!(
            "{path}: the snapshot reserves {} ({reserved} bytes), more than \
             per_process_memory_fraction:{} allows of the device's {}: {} ({allowed} bytes); \
             this state cannot exist under the settings {settings_text}{}",
            format_size(reserved),
            settings.per_process_memory_fraction,
            format_size(total),
            format_size(allowed),
            if args.device_memory.is_none() {
                " (the device's total memory, not given, was taken as the reserved memory plus \
                 --device-free: give --device-memory)"
            } else {
                ""
            }
        ));
    }
    let stream = request_stream(memory, args.stream, path)?;
    if rec.segments.iter().any(|s| s.is_expandable) {
        return Err(format!(
            "{path}: device {}: its segments are expandable (pages mapped into reserved \
             ranges): a request is not tried in such a state yet (the report without --request \
             works)",
            rec.device.0
        ));
    }
    if size == SMALL_BUFFER || size == LARGE_BUFFER {
        eprintln!(
            "cachealloc: note: PyTorch's \"Tried to allocate {}\" names the segment it tried to \
             obtain, for any request {}: the trial requests {} itself; give the tensor's size, \
             when known",
            format_size(size),
            if size == SMALL_BUFFER {
                "up to 1 MiB"
            } else {
                "of 1-10 MiB"
            },
            format_size(size)
        );
    }
    let state = end_state(rec).map_err(|e| match e {
        TraceError::Inconsistent { path, detail } => format!("{path}: {detail}"),
        e => e.to_string(),
    })?;
    let config = ReplayConfig {
        settings,
        device: DeviceId(rec.device.0),
        capacity: Some(capacity),
        device_total: args.device_memory,
        ..ReplayConfig::default()
    };
    let trial =
        try_request(&state, &pending_frees(rec), &config, size, stream).map_err(|e| match e {
            Error::SeedForbiddenBySettings(why) => {
                let advice = if args.conf.is_some() {
                    "--conf names the settings the program ran with, under which it reached this \
                     state; to see how other settings would have done, record the allocation \
                     history (torch.cuda.memory._record_memory_history) and replay it with them"
                } else {
                    "were they changed while the program ran? give --conf with the ones in force \
                 when the snapshot was taken"
                };
                format!(
                    "{path}: the snapshot's state cannot exist under the settings {settings_text}: \
                 {why}; {advice}"
                )
            }
            e => format!("{path}: {e}"),
        })?;
    let mut json = RequestJson::new(trial, device_free, config.total());
    json.device_memory_given = args.device_memory.is_some();
    Ok(json)
}

/// The stream a request is tried on: `--stream`, else the snapshot's only stream, else the
/// default stream when it holds memory. A stream that holds none is noted (nothing is cached
/// for it).
fn request_stream(
    memory: &MemoryState,
    given: Option<u64>,
    path: &str,
) -> Result<StreamId, String> {
    let streams: Vec<String> = memory
        .streams
        .iter()
        .map(|s| format!("{:#x}", s.stream.0))
        .collect();
    let holds = |id: u64| memory.streams.iter().any(|s| s.stream.0 == id);
    match given {
        Some(id) => {
            if !holds(id) {
                eprintln!(
                    "cachealloc: note: stream {id:#x} holds no memory in this snapshot (its streams: \
                     {}): nothing is cached for it",
                    streams.join(", ")
                );
            }
            Ok(StreamId(id))
        }
        None => match memory.streams.as_slice() {
            [only] => Ok(only.stream),
            _ if holds(0) => Ok(StreamId(0)),
            _ => Err(format!(
                "{path}: the snapshot's memory is on streams {}, none of them the default stream: \
                 give the request's --stream",
                streams.join(", ")
            )),
        },
    }
}

/// The command that replays `rec`'s trace: with `--device` unless replay picks that device
/// itself (the first whose trace allocates or frees).
fn replay_command(snapshot: &RecordedSnapshot, rec: &DeviceRecording, path: &str) -> String {
    let default = snapshot
        .traced_devices()
        .find(|r| r.has_block_events())
        .map(|r| r.device);
    let device = if default == Some(rec.device) {
        String::new()
    } else {
        format!(" --device {}", rec.device.0)
    };
    format!(
        "cachealloc replay {}{device}",
        cachealloc::config::shell_word(path)
    )
}

/// One pool's (or both pools') figures.
#[derive(Serialize)]
struct PoolJson {
    segments: usize,
    reserved_bytes: u64,
    allocated_bytes: u64,
    requested_bytes: u64,
    pending_free_bytes: u64,
    free_bytes: u64,
    free_blocks: usize,
    largest_free_block_bytes: u64,
    /// Wholly free segments (returned to the device when a request finds no room, or by
    /// empty_cache()) and their bytes; the rest of the free bytes lie in segments that also
    /// hold allocations.
    free_segments: usize,
    free_segment_bytes: u64,
}

impl From<PoolMemory> for PoolJson {
    fn from(p: PoolMemory) -> Self {
        PoolJson {
            segments: p.segments,
            reserved_bytes: p.reserved,
            allocated_bytes: p.allocated,
            requested_bytes: p.requested,
            pending_free_bytes: p.pending_free,
            free_bytes: p.free,
            free_blocks: p.free_blocks,
            largest_free_block_bytes: p.largest_free_block,
            free_segments: p.free_segments,
            free_segment_bytes: p.free_segment_bytes,
        }
    }
}

#[derive(Serialize)]
struct PoolsJson {
    small: PoolJson,
    large: PoolJson,
    all: PoolJson,
}

#[derive(Serialize)]
struct StreamJson {
    stream: u64,
    reserved_bytes: u64,
    free_bytes: u64,
    largest_free_block_bytes: u64,
}

impl From<&StreamMemory> for StreamJson {
    fn from(s: &StreamMemory) -> Self {
        StreamJson {
            stream: s.stream.0,
            reserved_bytes: s.reserved,
            free_bytes: s.free,
            largest_free_block_bytes: s.largest_free_block,
        }
    }
}

#[derive(Serialize)]
struct FreeBlockJson {
    address: u64,
    size: u64,
    pool: &'static str,
    stream: u64,
}

impl From<&FreeBlock> for FreeBlockJson {
    fn from(b: &FreeBlock) -> Self {
        FreeBlockJson {
            address: b.addr,
            size: b.size,
            pool: pool_name(b.pool),
            stream: b.stream.0,
        }
    }
}

fn pool_name(pool: PoolKind) -> &'static str {
    match pool {
        PoolKind::Small => "small",
        PoolKind::Large => "large",
    }
}

/// A request tried in the state.
#[derive(Serialize)]
struct RequestJson {
    requested_bytes: u64,
    rounded_bytes: u64,
    pool: &'static str,
    stream: u64,
    /// What the device had free beyond the reserved memory, and its total.
    device_free_bytes: u64,
    device_memory_bytes: Option<u64>,
    /// The device's total memory was given (`--device-memory`); else it is taken as the
    /// reserved memory plus the free, with nothing held outside the pool.
    device_memory_given: bool,
    /// `cached` (a free cached block serves it), `new_segment` (the device supplies one) or
    /// `out_of_memory`.
    outcome: &'static str,
    /// The cached block that serves it.
    block_address: Option<u64>,
    block_bytes: Option<u64>,
    /// The new segment, and the cached segments returned to the device first.
    segment_bytes: Option<u64>,
    released_segments: Option<u64>,
    oom: Option<OomReportJson>,
    /// Whether an allocator setting may avoid the out-of-memory error (then a recorded trace's
    /// replay finds which).
    settings_may_help: Option<bool>,
}

impl RequestJson {
    fn new(trial: RequestTrial, device_free: u64, device_memory: Option<u64>) -> Self {
        let mut json = RequestJson {
            requested_bytes: trial.requested,
            rounded_bytes: trial.rounded,
            pool: pool_name(trial.pool),
            stream: trial.stream.0,
            device_free_bytes: device_free,
            device_memory_bytes: device_memory,
            device_memory_given: false,
            outcome: "",
            block_address: None,
            block_bytes: None,
            segment_bytes: None,
            released_segments: None,
            oom: None,
            settings_may_help: None,
        };
        match trial.outcome {
            RequestOutcome::Cached {
                block_addr,
                block_size,
            } => {
                json.outcome = "cached";
                json.block_address = Some(block_addr);
                json.block_bytes = Some(block_size);
            }
            RequestOutcome::NewSegment {
                segment,
                released_segments,
            } => {
                json.outcome = "new_segment";
                json.segment_bytes = Some(segment);
                json.released_segments = Some(released_segments);
            }
            RequestOutcome::OutOfMemory(report) => {
                json.outcome = "out_of_memory";
                json.settings_may_help = Some(report.hint().settings_may_help());
                json.oom = Some(OomReportJson::from(&*report));
            }
        }
        json
    }

    fn to_text(&self) -> String {
        let mut out = format!(
            "Trying a request of {} on stream {:#x} (a {} block of the {} pool) through \
             cachealloc's pool, which follows PyTorch's policy, with {} free on the device beyond \
             the reserved memory: ",
            format_size(self.requested_bytes),
            self.stream,
            format_size(self.rounded_bytes),
            self.pool,
            format_size(self.device_free_bytes)
        );
        match self.outcome {
            "cached" => {
                out += &format!(
                    "served from the free cached block of {} at {:#x}.\n",
                    format_size(self.block_bytes.unwrap_or(0)),
                    self.block_address.unwrap_or(0)
                );
                out += FITS_HERE;
            }
            "new_segment" => {
                out += &format!(
                    "served by a new segment of {} from the device",
                    format_size(self.segment_bytes.unwrap_or(0))
                );
                match self.released_segments.unwrap_or(0) {
                    0 => out += ".\n",
                    n => {
                        out += &format!(
                            ", after returning {} to it.\n",
                            counted(n, "free cached segment")
                        )
                    }
                }
                out += FITS_HERE;
            }
            _ => {
                out += "out of memory.\n";
                if let Some(oom) = &self.oom {
                    out += oom.text.trim_end();
                    out += "\n";
                    if !self.device_memory_given
                        && matches!(oom.kind, "exhausted" | "segment_too_large")
                    {
                        out += "The device's total memory was not given: it is taken as the \
                                reserved memory plus --device-free, with nothing held outside the \
                                pool. Give --device-memory (PyTorch's \"total capacity of SIZE\") \
                                to tell memory held by other processes or CUDA contexts apart.\n";
                    }
                }
                if self
                    .oom
                    .as_ref()
                    .is_some_and(|oom| oom.kind == "fragmentation")
                {
                    out += "Which setting avoids this depends on the requests that led to this \
                            state, which a snapshot without an allocation trace does not hold: \
                            call torch.cuda.memory._record_memory_history() before the run, dump \
                            the snapshot at the error, and `cachealloc replay` it to find the \
                            values that fit.\n";
                }
            }
        }
        out
    }
}

/// After a request that fits: why a program may still have run out of memory in this state.
const FITS_HERE: &str = "In this state the request fits. If the program ran out of memory here, \
                         the snapshot was taken after memory was freed (an exception handler runs \
                         after the failing frame's tensors are released), or the device had less \
                         free memory than --device-free says, or the request was another size.\n";

/// The report, in the shape of the `--json` output.
#[derive(Serialize)]
struct StateJson {
    snapshot: String,
    device: i32,
    settings: String,
    /// Entries of the device's allocation trace.
    trace_entries: usize,
    /// The trace allocates: `cachealloc replay` can replay it.
    replayable: bool,
    /// The command that replays the device's trace, when it has one to replay.
    replay_command: Option<String>,
    /// The segments are expandable (pages mapped into reserved ranges): free pages are
    /// unmapped when a request finds no room, so pieces of free memory matter less.
    expandable_segments: bool,
    pools: PoolsJson,
    streams: Vec<StreamJson>,
    /// The largest free cached blocks, largest first.
    largest_free_blocks: Vec<FreeBlockJson>,
    request: Option<RequestJson>,
}

impl StateJson {
    fn new(
        path: &str,
        rec: &DeviceRecording,
        memory: &MemoryState,
        settings: String,
        request: Option<RequestJson>,
    ) -> Self {
        StateJson {
            snapshot: path.to_string(),
            device: rec.device.0,
            settings,
            trace_entries: rec.entries.len(),
            replayable: false,
            replay_command: None,
            expandable_segments: rec.segments.iter().any(|s| s.is_expandable),
            pools: PoolsJson {
                small: memory.small.into(),
                large: memory.large.into(),
                all: memory.total().into(),
            },
            streams: memory.streams.iter().map(StreamJson::from).collect(),
            largest_free_blocks: memory
                .largest_free_blocks
                .iter()
                .map(FreeBlockJson::from)
                .collect(),
            request,
        }
    }

    fn to_text(&self) -> String {
        let mut out = format!(
            "{}, device {}: the memory state when the snapshot was taken",
            self.snapshot, self.device
        );
        out += &match &self.replay_command {
            Some(command) => format!(" (its trace can be replayed: {command})\n"),
            None => " (it holds no allocation trace to replay)\n".to_string(),
        };
        out += &format!("Settings: {}\n\n", self.settings);
        out += &format!(
            "{:<11}{:>9}{:>14}{:>14}{:>14}{:>14}{:>8}{:>14}\n",
            "",
            "segments",
            "reserved",
            "allocated",
            "requested",
            "free cached",
            "blocks",
            "largest free"
        );
        for (name, p) in [
            ("large pool", &self.pools.large),
            ("small pool", &self.pools.small),
            ("both", &self.pools.all),
        ] {
            out += &format!(
                "{:<11}{:>9}{:>14}{:>14}{:>14}{:>14}{:>8}{:>14}\n",
                name,
                p.segments,
                format_size(p.reserved_bytes),
                format_size(p.allocated_bytes),
                format_size(p.requested_bytes),
                format_size(p.free_bytes),
                p.free_blocks,
                format_size(p.largest_free_block_bytes)
            );
        }
        out += "\n";
        let all = &self.pools.all;
        if all.pending_free_bytes > 0 {
            out += &format!(
                "Of the allocated memory, {} is freed but pending: blocks that other streams \
                 still use (record_stream), cached once their work completes (a request's trial \
                 takes that work as not done until the pool synchronizes, which it does before \
                 returning segments to the device).\n",
                format_size(all.pending_free_bytes)
            );
        }
        if !self.largest_free_blocks.is_empty() {
            let one_stream = self.streams.len() == 1;
            let listed: Vec<String> = self
                .largest_free_blocks
                .iter()
                .take(LISTED_IN_TEXT)
                .map(|b| {
                    let stream = if one_stream {
                        String::new()
                    } else {
                        format!(", stream {:#x}", b.stream)
                    };
                    format!(
                        "{} at {:#x} ({}{stream})",
                        format_size(b.size),
                        b.address,
                        b.pool,
                    )
                })
                .collect();
            out += &format!("Largest free cached blocks: {}", listed.join(", "));
            let more = all.free_blocks.saturating_sub(listed.len());
            if more > 0 {
                out += &format!(" (and {more} more)");
            }
            out += ".\n";
        }
        if self.streams.len() > 1 {
            let listed: Vec<String> = self
                .streams
                .iter()
                .map(|s| {
                    format!(
                        "{:#x}: {} reserved, {} free cached",
                        s.stream,
                        format_size(s.reserved_bytes),
                        format_size(s.free_bytes)
                    )
                })
                .collect();
            out += &format!(
                "Streams (a cached block is reused only on its own): {}.\n",
                listed.join("; ")
            );
        }
        out += &self.free_memory_sentence();
        match &self.request {
            Some(request) => {
                out += "\n";
                out += &request.to_text();
            }
            None if self.expandable_segments => {}
            None => {
                out += "Try a request in this state: --request SIZE --device-free SIZE \
                        --device-memory SIZE, from PyTorch's message \"Tried to allocate SIZE. \
                        GPU 0 has a total capacity of SIZE of which SIZE is free\" (its first \
                        size is the segment it tried to obtain: see cachealloc state --help).\n"
            }
        }
        out
    }

    /// What the free cached memory amounts to: how much of it the allocator can return to the
    /// device, and how much lies in pieces beside allocations.
    fn free_memory_sentence(&self) -> String {
        let all = &self.pools.all;
        if all.free_bytes == 0 {
            return "Every reserved byte is allocated: nothing is cached free.\n".to_string();
        }
        if self.expandable_segments {
            return format!(
                "{} of the {} mapped ({}) is cached free, in {}. The segments are expandable: \
                 when a request finds no room the free pages are unmapped, and a request maps \
                 pages into its stream's range, so the free memory's pieces matter less than \
                 with native segments.\n",
                format_size(all.free_bytes),
                format_size(all.reserved_bytes),
                percent(all.free_bytes, all.reserved_bytes),
                counted(all.free_blocks as u64, "block")
            );
        }
        let mut out = format!(
            "{} of the {} reserved ({}) is cached free, in {}",
            format_size(all.free_bytes),
            format_size(all.reserved_bytes),
            percent(all.free_bytes, all.reserved_bytes),
            counted(all.free_blocks as u64, "block")
        );
        let in_pieces = all.free_bytes.saturating_sub(all.free_segment_bytes);
        if all.free_segments > 0 && in_pieces == 0 {
            out += &format!(
                ", all of it in {} wholly free, which the allocator returns to the device when a \
                 request finds no room (as empty_cache() does)",
                counted(all.free_segments as u64, "segment")
            );
        } else if all.free_segments > 0 {
            out += &format!(
                ": {} in {} wholly free, which the allocator returns to the device when a request \
                 finds no room (as empty_cache() does), and {} in pieces of segments that also \
                 hold allocations",
                format_size(all.free_segment_bytes),
                counted(all.free_segments as u64, "segment"),
                format_size(in_pieces)
            );
        }
        out += ".\n";
        let large = &self.pools.large;
        if large.free_blocks > 0 {
            out += &format!(
                "The large pool's largest free block is {} ({} of its free memory): a larger \
                 request needs a new segment from the device.\n",
                format_size(large.largest_free_block_bytes),
                percent(large.largest_free_block_bytes, large.free_bytes)
            );
        }
        out
    }
}

/// `part` as a percentage of `whole`, one decimal ("under 0.1%" rather than "0.0%").
fn percent(part: u64, whole: u64) -> String {
    let p = 100.0 * part as f64 / whole.max(1) as f64;
    if part > 0 && p < 0.1 {
        "under 0.1%".to_string()
    } else {
        format!("{p:.1}%")
    }
}

/// Where `cachealloc state` is the command to use: the path, quoted for a shell.
pub fn state_command(path: &Path) -> String {
    format!(
        "cachealloc state {}",
        cachealloc::config::shell_word(&path.display().to_string())
    )
}
