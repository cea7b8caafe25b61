//! `cachealloc state`: the memory state a PyTorch snapshot records, and whether a request of a
//! given size would be served in it. For the snapshots a replay cannot use (no allocation
//! trace: `_snapshot()` in an out-of-memory handler), and for the end state of any other.

use crate::request_report::RequestJson;
use crate::size;
use crate::state_report::StateJson;
use cachealloc::backend::sim::ADDRESS_SPACE;
use cachealloc::pool::rounding::{LARGE_BUFFER, MAX_REQUEST, SMALL_BUFFER};
use cachealloc::pool::{DeviceId, Error, Settings, StreamId, format_size};
use cachealloc::trace::TraceError;
use cachealloc::trace::recording::Action;
use cachealloc::trace::replay::seeded_pool;
use cachealloc::trace::start_state::StartState;
use cachealloc::trace::{
    DeviceRecording, MemoryState, RecordedSnapshot, ReplayConfig, TraceFile, pending_frees,
    trial_state, try_request,
};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct StateArgs {
    /// The snapshot: a pickle written by torch.cuda.memory._dump_snapshot, or the same
    /// snapshot written as JSON, with or without an allocation trace; - reads standard input.
    snapshot: PathBuf,
    /// Which device's state to report (default: the first device with memory reserved).
    #[arg(long, value_parser = crate::device_arg::parse_device, allow_hyphen_values = true)]
    device: Option<i32>,
    /// Try a request of SIZE bytes in this state: whether a free cached block serves it, or a
    /// new segment, or pages mapped into an expandable segment, or why it runs out of memory.
    /// Same forms as replay's --capacity (1.24GiB, 512MiB, bytes). PyTorch's "Tried to allocate
    /// SIZE" names the segment it tried to obtain: the request rounded up to 2 MiB above 10 MiB,
    /// but 2.00 MiB for any request up to 1 MiB and 20.00 MiB for one of 1-10 MiB (give the
    /// tensor's size there, when known).
    #[arg(long, value_name = "SIZE", value_parser = parse_request, allow_hyphen_values = true)]
    request: Option<GivenSize>,
    /// With --request: the request's stream, as the snapshot numbers streams (0 is the default
    /// stream; decimal or 0x hex). Default: the snapshot's only stream, else 0 when it has
    /// memory on the default stream.
    #[arg(
        long,
        value_name = "ID",
        value_parser = parse_stream, allow_hyphen_values = true, requires = "request")]
    stream: Option<u64>,
    /// With --request: memory the device had free beyond what the pool reserved (PyTorch's
    /// message: "of which SIZE is free"). Default 0: the device was full, as at an
    /// out-of-memory error.
    #[arg(
        long,
        value_name = "SIZE",
        value_parser = parse_device_free, allow_hyphen_values = true, requires = "request")]
    device_free: Option<GivenSize>,
    /// With --request: the device's total memory (PyTorch's message: "a total capacity of
    /// SIZE"), for the report's memory held outside the pool, for per_process_memory_fraction,
    /// and for the size of expandable segments' ranges (1⅛ of it). Default: what the pool
    /// reserved plus --device-free (so no memory is held outside the pool).
    #[arg(
        long,
        value_name = "SIZE",
        value_parser = size::parse_device_memory, allow_hyphen_values = true, requires = "request")]
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
            say!(
                "cachealloc: note: {option} {} is read as {} bytes (a number without a unit is \
                 bytes: for mebibytes write {}MiB)",
                self.bytes,
                self.bytes,
                self.bytes
            );
        }
    }
}

/// `--device-free`: any size the simulated device can hold, 0 included.
fn parse_device_free(text: &str) -> Result<GivenSize, String> {
    let bytes = size::parse_up_to(text, ADDRESS_SPACE, || {
        format!(
            "invalid device free memory {text:?}: the simulated device has {ADDRESS_SPACE} bytes \
             of address space ({})",
            format_size(ADDRESS_SPACE)
        )
    })?;
    Ok(GivenSize::of(text, bytes))
}

/// A request size: bytes, at least one and less than the 1 EB PyTorch refuses outright.
fn parse_request(text: &str) -> Result<GivenSize, String> {
    let too_large = || {
        format!(
            "invalid request {text:?}: PyTorch refuses a request of 1 EB ({MAX_REQUEST} bytes) or \
             more before its pool sees it"
        )
    };
    match size::parse_up_to(text, MAX_REQUEST - 1, too_large)? {
        0 => Err(format!(
            "invalid request {text:?}: a request of 0 bytes allocates nothing"
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

pub fn run(mut args: StateArgs) -> Result<String, String> {
    let path = args.snapshot.display().to_string();
    let file = TraceFile::open(&args.snapshot).map_err(|e| e.to_string())?;
    if file.is_recorded_trace() {
        return Err(format!(
            "{path}: a trace cachealloc recorded, which begins with the process: replay it \
             (cachealloc replay {}); state reads PyTorch memory snapshots",
            cachealloc::config::shell_path(&args.snapshot)
        ));
    }
    let snapshot = file.read_snapshot().map_err(|e| e.to_string())?;
    let rec = pick_device(&snapshot.devices, args.device, &path).map_err(|e| {
        if snapshot.host_memory && snapshot.devices.iter().all(|d| d.segments.is_empty()) {
            format!(
                "{e}; it holds host (pinned) memory only, which cachealloc does not read \
                 (_record_memory_history(record_cuda=False) records the host's alone)"
            )
        } else {
            e
        }
    })?;
    let (settings, settings_text) = settings(rec, args.conf.as_deref())?;
    let memory = MemoryState::of(rec);
    if let Some(request) = args.request {
        request.note_unitless("--request");
        note_segment_sized(request.bytes);
    }
    if let Some(free) = args.device_free {
        free.note_unitless("--device-free");
    }
    within_rounding(&mut args, memory.total().reserved);
    let request = match args.request {
        Some(GivenSize { bytes: size, .. }) => Some(request(
            rec,
            &memory,
            &args,
            (settings, &settings_text),
            size,
            &path,
        )?),
        None => {
            let reserved = memory.total().reserved;
            checked_state(rec, &args, (&settings, &settings_text), reserved, &path)?;
            None
        }
    };
    // Plain replay needs allocations (a trace of frees alone is refused).
    let allocates = rec
        .entries
        .iter()
        .any(|e| matches!(e.action, Action::Alloc | Action::Oom));
    let command = allocates.then(|| replay_command(&snapshot, rec, &args.snapshot));
    let report = StateJson::new(&path, rec, &memory, settings_text, request, command);
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
        let config = crate::parse_conf(conf, "state")?;
        let conf = cachealloc::trace::record::settings_text(&config.settings);
        let text = if conf.is_empty() {
            "defaults (from --conf)".to_string()
        } else {
            format!("{conf} (from --conf)")
        };
        return Ok((config.settings, text));
    }
    match &rec.settings {
        Some(recorded) => {
            for warning in &recorded.conf_warnings {
                say!("cachealloc: warning: {warning}");
            }
            let settings = rec.replay_settings();
            let mut text = crate::named_settings("as recorded", &recorded.to_settings());
            if settings.expandable_segments && !recorded.expandable_segments {
                // The program turned them on after it started, as the segments show.
                text += ", with expandable_segments:True, as the segments show";
            }
            Ok((settings, text))
        }
        None if rec.segments.iter().any(|s| s.is_expandable) => Ok((
            rec.replay_settings(),
            "expandable_segments:True, as the segments show, and otherwise the defaults (the \
             snapshot names no settings; give --conf with the program's)"
                .to_string(),
        )),
        None => Ok((
            Settings::default(),
            "defaults (the snapshot names none; give --conf with the program's)".to_string(),
        )),
    }
}

/// Try the request of `size` bytes in `rec`'s state.
fn request(
    rec: &DeviceRecording,
    memory: &MemoryState,
    args: &StateArgs,
    (settings, settings_text): (Settings, &str),
    size: u64,
    path: &str,
) -> Result<RequestJson, String> {
    let device_free = args.device_free.map_or(0, |free| free.bytes);
    let capacity = device_capacity(
        memory.total().reserved,
        device_free,
        args,
        (&settings, settings_text),
    )
    .map_err(|why| format!("{path}: {why}"))?;
    let stream = request_stream(memory, args.stream, path)?;
    let state = file_state(rec, args.device_memory.unwrap_or(capacity))?;
    let config = trial_device(rec, &settings, capacity, args.device_memory);
    // The trial installs the state in its pool: its errors are `checked_state`'s.
    let trial = try_request(&state, &pending_frees(rec), &config, size, stream)
        .map_err(|e| state_error(e, args, settings_text, path))?;
    Ok(RequestJson::new(
        trial,
        &state.ranges,
        device_free,
        config.total(),
        args.device_memory.is_some(),
        memory.small.free_segments + memory.large.free_segments,
    ))
}

/// The device a request is tried on: `capacity` bytes for the pool, `device_memory` in all.
fn trial_device(
    rec: &DeviceRecording,
    settings: &Settings,
    capacity: u64,
    device_memory: Option<u64>,
) -> ReplayConfig {
    ReplayConfig {
        settings: settings.clone(),
        device: DeviceId(rec.device.0),
        capacity: Some(capacity),
        device_total: device_memory,
        ..ReplayConfig::default()
    }
}

/// The state a request is tried in (`trial_state`), on a device of `device_memory` bytes: an
/// error names what in the file is wrong.
fn file_state(rec: &DeviceRecording, device_memory: u64) -> Result<StartState, String> {
    // The library's error says the state "cannot be replayed faithfully", which is replay's
    // word for it: here the file's state is what is wrong.
    trial_state(rec, device_memory).map_err(|e| match e {
        TraceError::Inconsistent { path, detail } => format!("{path}: {detail}"),
        e => e.to_string(),
    })
}

/// Check, without a request, that a pool can hold `rec`'s state under `settings` on a device
/// of `capacity` bytes, as a request's trial does: an error names what in the file, or in the
/// settings, it cannot hold, so that a report is never made of a state that cannot exist.
fn checked_state(
    rec: &DeviceRecording,
    args: &StateArgs,
    (settings, settings_text): (&Settings, &str),
    capacity: u64,
    path: &str,
) -> Result<(), String> {
    let state = file_state(rec, args.device_memory.unwrap_or(capacity))?;
    let config = trial_device(rec, settings, capacity, args.device_memory);
    seeded_pool(&config, Some(&state.layout()))
        .map_err(|e| state_error(e, args, settings_text, path))?;
    Ok(())
}

/// The error of a state the pool cannot hold, saying what to do about the settings when they
/// are what forbids it.
fn state_error(e: Error, args: &StateArgs, settings_text: &str, path: &str) -> String {
    match e {
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
    }
}

/// PyTorch's message prints sizes to two decimals, so a total copied from it may read up to
/// half a unit of its last digit (0.5% of the number) below the memory the snapshot reserves
/// plus the free memory copied with it. `--device-memory` that much short is taken as exactly
/// that memory, with a note; more is refused by `device_capacity`.
fn within_rounding(args: &mut StateArgs, reserved: u64) {
    let held = reserved.saturating_add(args.device_free.map_or(0, |free| free.bytes));
    if let Some(total) = args.device_memory
        && total < held
        && held - total <= total / 200
    {
        say!(
            "cachealloc: note: --device-memory {} is {} less than the memory the snapshot \
             reserves plus --device-free ({}): taken as that, since PyTorch's message rounds \
             sizes to two decimals",
            format_size(total),
            format_size(held - total),
            format_size(held)
        );
        args.device_memory = Some(held);
    }
}

/// The capacity of the trial's device: the `reserved` memory plus `device_free`, within the
/// total `--device-memory` and any `per_process_memory_fraction` of it. `Err` says which
/// limit the state breaks.
fn device_capacity(
    reserved: u64,
    device_free: u64,
    args: &StateArgs,
    (settings, settings_text): (&Settings, &str),
) -> Result<u64, String> {
    let capacity = reserved.saturating_add(device_free);
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
            "the snapshot reserves {} ({reserved} bytes), more than \
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
    Ok(capacity)
}

/// PyTorch's "Tried to allocate 2.00 MiB" (or 20.00 MiB) names a segment: a request of just
/// that size copied from it is likely a smaller request's.
fn note_segment_sized(size: u64) {
    if size == SMALL_BUFFER || size == LARGE_BUFFER {
        say!(
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
    let listed = if streams.is_empty() {
        "the default pools hold no memory".to_string()
    } else {
        format!("their streams: {}", streams.join(", "))
    };
    match given {
        Some(id) => {
            if !holds(id) {
                say!(
                    "cachealloc: note: stream {id:#x} holds no memory of the default pools in this \
                     snapshot ({listed}): nothing is cached for it"
                );
            }
            Ok(StreamId(id))
        }
        None => match memory.streams.as_slice() {
            [only] => Ok(only.stream),
            // Nothing cached anywhere (the memory is the private pools'): the default stream.
            [] => Ok(StreamId(0)),
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
fn replay_command(snapshot: &RecordedSnapshot, rec: &DeviceRecording, path: &Path) -> String {
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
        cachealloc::config::shell_path(path)
    )
}

/// Where `cachealloc state` is the command to use: the path, quoted for a shell.
pub fn state_command(path: &Path) -> String {
    format!("cachealloc state {}", cachealloc::config::shell_path(path))
}

/// The command that reports `rec`'s memory state, one of the snapshot's `devices`: with
/// `--device` unless state picks that device itself (the first with memory reserved).
pub fn state_command_on(path: &Path, rec: &DeviceRecording, devices: &[DeviceRecording]) -> String {
    let default = devices.iter().find(|d| !d.segments.is_empty());
    match default {
        Some(d) if d.device == rec.device => state_command(path),
        _ => format!("{} --device {}", state_command(path), rec.device.0),
    }
}
