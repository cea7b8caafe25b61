//! Our own trace format, written by the shim with `CACHEALLOC_CONF=trace:PATH` (and for a
//! synthetic workload by `cachealloc synth --save PATH`, see `save`) and read back by
//! `cachealloc replay PATH`.
//!
//! JSON lines, one file per process (all devices), UTF-8:
//!
//! ```text
//! {"format":"cachealloc-trace","version":7,"pid":4242,"devices":[0],"settings":"","free_sync":"device"}
//! {"t_us":17,"device":0,"action":"segment_alloc","addr":140737286160384,"size":20971520,"stream":0}
//! {"t_us":18,"device":0,"action":"alloc","addr":140737286160384,"size":4000000,"stream":0}
//! {"t_us":40,"device":0,"action":"free_requested","addr":140737286160384,"size":4000000,"stream":0,"waits":"device"}
//! {"t_us":95,"device":0,"action":"oom","addr":0,"size":2147483648,"stream":0,"device_free":1048576,"requested":2000000000}
//! ```
//!
//! - The **header** (first line) names the format and its version, the recording process, the
//!   devices that had a pool when the file was started (a device whose pool is created later
//!   appears by its events), the pool settings in `CACHEALLOC_CONF` syntax (only the keys that
//!   differ from the defaults; `""` = defaults) and the `free_sync` policy.
//! - Every further line is one **event**: `action` in PyTorch's trace vocabulary (`alloc`,
//!   `free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `segment_map`,
//!   `segment_unmap` (expandable segments), `oom`, `empty_cache`)
//!   plus `device_reset` (the program called `cudaDeviceReset`: the pool and its segments are
//!   gone without `segment_free`s), and for expandable segments `range_reserve` (an address
//!   range reserved for a pool and stream, before its first `segment_map`; it also carries
//!   `page`, the size of the pages its pool maps) and `range_release` (a range with nothing
//!   mapped given back, after its last `segment_unmap`), `device_memory` (written when a
//!   device's pool is created: `size` is the device's total memory, as `cudaMemGetInfo`
//!   reports it), `retry` (a counted retry: the pool returned every cached segment it could
//!   and asks the device once more; `size` is the rounded request, and its `segment_alloc`,
//!   `segment_map`s or `oom` follow), and `memory_fraction` (the program set the pool's memory
//!   fraction as it ran, with `cachealloc_set_memory_fraction` or PyTorch's
//!   `set_per_process_memory_fraction` through the pluggable allocator; it carries `fraction`;
//!   one line per call, also for a call made while the device has no pool, whose next pool
//!   starts with it), and `capture` (a CUDA graph capture was underway where that changed what
//!   the pool did: right before the lines of a request that no cached block served, which then
//!   only asked the device for new memory — its `segment_alloc`, `segment_map`s (perhaps after
//!   a `range_reserve`) or `oom` follow, then its `alloc`; `size` is the rounded request — or
//!   right before an `empty_cache` line, which then did nothing: no wait, no `segment_free`;
//!   `size` 0. A request a cached block served has none: it is served alike during a capture),
//!   `sync_before_growth` (a request that no free block served made the pool synchronize the
//!   device before growing, while frees waited for it: the `free_completed`s of that
//!   synchronization follow, then the request's lines; `size` is the rounded request) and
//!   `device_synchronize` (the program's `cudaDeviceSynchronize` returned, or the library
//!   synchronized the device before a capture began, with the device's pool not busy in
//!   another thread: every free made before it that waited for the device's work is complete,
//!   and the `free_completed`s of those still waiting follow; a free waiting for another
//!   device's stream stays pending).
//!   `size` is the requested size for
//!   `alloc` and the frees, the segment, page run or range size for segment and range events,
//!   the rounded request for `oom` (as in PyTorch's trace; it also carries `device_free`, the
//!   free device bytes at the failure, and `requested`, what the program asked for, which a
//!   replay asks for again), 0 for the markers; `addr` is 0 where there is no address. `t_us` is
//!   monotonic, in microseconds since recording began (a saved replay numbers its events
//!   instead).
//! - A `free_requested` line names what its free waits for before its block is reusable
//!   (`waits`, `crate::pool::FreeWaits`): `device` (the library's `cudaFree` under
//!   `free_sync:device` or `event`: while it waits, a request that no free block serves makes the
//!   pool synchronize the device before it grows), `streams` (events on the streams that used
//!   the block: the free of a block recorded as used on other streams —
//!   `cachealloc_record_stream`, the pluggable allocator's `record_stream` — through the C API
//!   or the pluggable allocator, or through `cudaFree` under `free_sync:event` or `none`; and
//!   every `cudaFreeAsync` of pool memory: the pool grows rather than synchronize for it) or
//!   `device_then_streams` (`cudaFree` of such a block under `free_sync:device`: the device,
//!   then the events of streams its synchronization may not cover; the pool synchronizes
//!   before growing for it). A free that waits for nothing has no `waits`, and its
//!   `free_completed` is the next line of its device. A free's completion is its
//!   `free_completed` line, wherever what it waited for was done: after a `device_synchronize`
//!   or `sync_before_growth` line, in an out-of-memory retry (before its releases and `retry`
//!   line) or `empty_cache()` (before its line), or where a poll found its events complete
//!   (before the lines of the request that polled).
//! - An `empty_cache` line comes after the frees its wait completed and before the
//!   `segment_free`s it caused (none when a `capture` line marks it); `segment_free`s without
//!   it are the OOM ladder's own releases.
//! - A `capture` line holds for the next request (`alloc` or `oom`, of its stream and rounded
//!   size) or `empty_cache` of its device: a replay runs that one with the simulated device
//!   capturing, so that it grows without synchronizing or giving memory back (or does
//!   nothing), as the recorded pool did. One that another line follows first (other than the
//!   request's `segment_alloc`, `range_reserve` and `segment_map`s) marks nothing: its request
//!   failed with another error than out of memory, and left no line.
//!   A replay under other settings follows the lines as they are: a request that missed during
//!   a capture is replayed capturing (which changes nothing where it now hits), but one that
//!   hit during a capture has no line, and should it miss in the replay it is replayed as if
//!   no capture was underway.
//!
//! Version 2 added the range and `device_memory` lines; a version 1 file (without them) is still
//! read, and a faithful replay then infers the ranges from the page maps
//! (`crate::trace::ranges`) and the device's memory from them and its failures. Version 3 added
//! the `retry` lines; without them the retries are counted from the releases (`convert`).
//! Version 4 added the `end` line, version 5 the `memory_fraction` line, version 6 the
//! `capture` line: an older file's requests replay as if no capture was underway (a version 5
//! file whose pool already grew without waiting during captures may depart there, and shows
//! no `empty_cache` made during one). Version 7 added `waits`, and the `sync_before_growth` and
//! `device_synchronize` lines: in an older file under `free_sync:device` or `event`, what a
//! free that did not complete at once waited for is inferred from the lines (`device_sync`),
//! and its completion is replayed where the recording made it, whatever the replay's pool
//! does. An `oom` line's `requested` came later, without a new
//! version (a reader that does not know it ignores it): a replay of a file without it asks
//! again for the rounded request.
//!
//! The recording begins with each pool, so a trace starts from an empty device: a replay
//! needs no rebuilt start state (see `convert`).

pub mod buffer;
#[cfg(test)]
mod capture_tests;
pub mod convert;
mod device_sync;
#[cfg(test)]
mod growth_sync_tests;
pub mod read;
mod retry_sync;
pub mod save;
#[cfg(test)]
mod sync_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod written;

use crate::config::Config;
use crate::config::options::{Carrier, OPTIONS, OptionSpec};
use crate::pool::{FreeWaits, PoolEvent, Settings, StreamId};
use serde::{Deserialize, Serialize};

/// The `format` value of the header.
pub const FORMAT_NAME: &str = "cachealloc-trace";
/// The version this build writes.
pub const FORMAT_VERSION: u32 = 7;
/// The versions this build reads: version 1 lacks the range lines, versions 1 and 2 the
/// `retry` lines, versions 1 to 3 the `end` line, versions 1 to 4 the `memory_fraction`
/// line, versions 1 to 5 the `capture` line, and versions 1 to 6 the `waits` of
/// `free_requested` and the `sync_before_growth` and `device_synchronize` lines.
pub const READABLE_VERSIONS: [u32; 7] = [1, 2, 3, 4, 5, 6, 7];
/// The first version whose files mark every counted retry with a `retry` line.
pub const RETRIES_MARKED_FROM: u32 = 3;
/// The first version whose `free_requested` lines name what their free waits for (`waits`):
/// one without it waits for nothing.
pub const WAITS_NAMED_FROM: u32 = 7;
/// The first version whose files end with an `end` line once the recording is complete: one
/// without it stopped early (the process was killed, or is still running).
pub const ENDED_FROM: u32 = 4;

/// The first line of a trace file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub version: u32,
    pub pid: u32,
    /// Devices with a pool when the file was started (ordinals).
    pub devices: Vec<i32>,
    /// Pool settings in `CACHEALLOC_CONF` syntax; keys at their default are left out.
    pub settings: String,
    /// The `free_sync` policy of the recording.
    pub free_sync: String,
    /// The device's capacity in bytes, where the file knows it: a saved replay of a limited
    /// simulated device (`synth --save`) writes it; a program's recording leaves it out, and a
    /// faithful replay infers the capacity from the recording's failures instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// Where the simulated driver placed new segments (`top-down` or `bottom-up`): written by a
    /// saved replay, whose faithful replay then places what its recorded addresses do not
    /// cover the same way; a program's recording leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
}

impl Header {
    pub fn new(pid: u32, devices: Vec<i32>, settings: String, free_sync: &str) -> Self {
        Self {
            format: FORMAT_NAME.to_string(),
            version: FORMAT_VERSION,
            pid,
            devices,
            settings,
            free_sync: free_sync.to_string(),
            capacity: None,
            placement: None,
        }
    }
}

/// What an event line records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    /// Expandable segments: pages mapped into, and unmapped from, a reserved range.
    SegmentMap,
    SegmentUnmap,
    /// Expandable segments: an address range reserved, and one given back.
    RangeReserve,
    RangeRelease,
    /// The device's total memory, when its pool was created.
    DeviceMemory,
    /// A counted retry (version 3): the pool returned every cached segment it could and asks
    /// the device once more; its `segment_alloc` (or `segment_map`s) or `oom` follows.
    Retry,
    Oom,
    /// A CUDA graph capture was underway at the next request (`alloc` or `oom`), which no
    /// cached block served, or at the next `empty_cache` (version 6): a replay runs it
    /// capturing. `size`: the rounded request, 0 before an `empty_cache`.
    Capture,
    /// The pool synchronized the device before growing, for a request (`size`: rounded) that no
    /// free block served while frees waited for the device (version 7); the `free_completed`s
    /// of that synchronization follow.
    SyncBeforeGrowth,
    /// The program synchronized the device (`cudaDeviceSynchronize`, version 7): the
    /// `free_completed`s of the frees it completed follow.
    DeviceSynchronize,
    EmptyCache,
    DeviceReset,
    /// The program set the memory fraction of the device's pool (version 5: the C API's
    /// `cachealloc_set_memory_fraction`, PyTorch's `set_per_process_memory_fraction` through
    /// the pluggable allocator); `fraction` carries it.
    MemoryFraction,
    /// The last line of a complete recording (version 4): written at exit (`device` 0, no
    /// memory).
    End,
}

impl Action {
    /// The action's name in a trace file.
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// One event line.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Microseconds since recording began (monotonic); in a saved replay, the event's number.
    pub t_us: u64,
    pub device: i32,
    pub action: Action,
    /// Block or segment address; 0 for `oom` and the markers.
    pub addr: u64,
    /// Bytes (see the module docs for what they count per action).
    pub size: u64,
    pub stream: u64,
    /// Free device bytes at an `oom` (only there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
    /// The page size of a `range_reserve`'s pool (only there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<u64>,
    /// What the program asked for at an `oom` (only there; files written before it was added
    /// lack it, and a replay then asks for `size`, the rounded request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<u64>,
    /// The memory fraction a `memory_fraction` line sets (only there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// What a `free_requested`'s free waits for (version 7; only there, and left out where it
    /// waits for nothing: its `free_completed` is the next line of its device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits: Option<FreeWaits>,
}

impl Event {
    /// The line for a pool event of `device` at `t_us`.
    pub fn from_pool(event: &PoolEvent, device: i32, t_us: u64) -> Self {
        let (action, addr, size, stream, device_free, page) = match *event {
            PoolEvent::Alloc { ptr, size, stream } => {
                (Action::Alloc, ptr.addr(), size, stream, None, None)
            }
            PoolEvent::FreeRequested {
                ptr, size, stream, ..
            } => (Action::FreeRequested, ptr.addr(), size, stream, None, None),
            PoolEvent::FreeCompleted { ptr, size, stream } => {
                (Action::FreeCompleted, ptr.addr(), size, stream, None, None)
            }
            PoolEvent::SegmentAlloc { ptr, size, stream } => {
                (Action::SegmentAlloc, ptr.addr(), size, stream, None, None)
            }
            PoolEvent::SegmentFree { ptr, size, stream } => {
                (Action::SegmentFree, ptr.addr(), size, stream, None, None)
            }
            PoolEvent::RangeReserve {
                ptr,
                size,
                page,
                stream,
            } => (
                Action::RangeReserve,
                ptr.addr(),
                size,
                stream,
                None,
                Some(page),
            ),
            PoolEvent::RangeRelease { ptr, size, stream } => {
                (Action::RangeRelease, ptr.addr(), size, stream, None, None)
            }
            PoolEvent::SegmentMap { ptr, size, stream } => {
                (Action::SegmentMap, ptr.addr(), size, stream, None, None)
            }
            PoolEvent::SegmentUnmap { ptr, size, stream } => {
                (Action::SegmentUnmap, ptr.addr(), size, stream, None, None)
            }
            PoolEvent::Retry { size, stream } => (Action::Retry, 0, size, stream, None, None),
            PoolEvent::Capture { size, stream } => (Action::Capture, 0, size, stream, None, None),
            PoolEvent::SyncBeforeGrowth { size, stream } => {
                (Action::SyncBeforeGrowth, 0, size, stream, None, None)
            }
            PoolEvent::Oom {
                size,
                stream,
                device_free,
                ..
            } => (Action::Oom, 0, size, stream, Some(device_free), None),
            PoolEvent::EmptyCache => (Action::EmptyCache, 0, 0, StreamId(0), None, None),
            PoolEvent::DeviceSynchronize => {
                (Action::DeviceSynchronize, 0, 0, StreamId(0), None, None)
            }
            PoolEvent::MemoryFraction { .. } => {
                (Action::MemoryFraction, 0, 0, StreamId(0), None, None)
            }
        };
        Event {
            t_us,
            device,
            action,
            addr,
            size,
            stream: stream.0,
            device_free,
            page,
            requested: match *event {
                PoolEvent::Oom { requested, .. } => Some(requested),
                _ => None,
            },
            fraction: match *event {
                PoolEvent::MemoryFraction { fraction } => Some(fraction),
                _ => None,
            },
            waits: match *event {
                PoolEvent::FreeRequested { waits, .. } if waits != FreeWaits::Nothing => {
                    Some(waits)
                }
                _ => None,
            },
        }
    }

    /// The `end` line of a complete recording.
    pub fn end(t_us: u64) -> Self {
        Self::plain(t_us, 0, Action::End, 0, 0)
    }

    /// A `device_reset` marker.
    pub fn device_reset(device: i32, t_us: u64) -> Self {
        Self::plain(t_us, device, Action::DeviceReset, 0, 0)
    }

    /// The `device_memory` line of a device with `total` bytes.
    pub fn device_memory(device: i32, total: u64, t_us: u64) -> Self {
        Self::plain(t_us, device, Action::DeviceMemory, 0, total)
    }

    /// A `memory_fraction` line of `device`.
    pub fn memory_fraction(device: i32, fraction: f64, t_us: u64) -> Self {
        Event {
            fraction: Some(fraction),
            ..Self::plain(t_us, device, Action::MemoryFraction, 0, 0)
        }
    }

    /// A line of `device` at `t_us` on stream 0 with none of the fields only some actions
    /// carry (a marker's `addr` is 0).
    pub(crate) fn plain(t_us: u64, device: i32, action: Action, addr: u64, size: u64) -> Self {
        Event {
            t_us,
            device,
            action,
            addr,
            size,
            stream: 0,
            device_free: None,
            page: None,
            requested: None,
            fraction: None,
            waits: None,
        }
    }
}

/// `settings` in `CACHEALLOC_CONF` syntax, naming only the pool keys that differ from the
/// defaults (`""` for all defaults); parses back to the same settings.
pub fn settings_text(settings: &Settings) -> String {
    shared_settings_text(settings, |_| true)
        .collect::<Vec<_>>()
        .join(",")
}

/// The pool key `name` of `settings` as `CACHEALLOC_CONF` says it
/// (`roundup_power2_divisions:[64:2,256:1,>:4]`), or `None` when it is the default.
pub fn setting_text(settings: &Settings, name: &str) -> Option<String> {
    shared_settings_text(settings, |o| o.name == name).next()
}

/// `key:value` for each pool key of `settings` that `chosen` takes and that differs from its
/// default, in the options table's order.
fn shared_settings_text(
    settings: &Settings,
    chosen: impl Fn(&OptionSpec) -> bool,
) -> impl Iterator<Item = String> {
    let config = Config {
        settings: settings.clone(),
        ..Config::default()
    };
    OPTIONS
        .iter()
        .filter(move |o| o.carrier == Carrier::Shared && chosen(o))
        .filter_map(move |o| {
            let value = o.current(&config);
            (value != o.default_text()).then(|| format!("{}:{value}", o.name))
        })
}

/// Append the header line to `out`.
pub fn write_header(out: &mut Vec<u8>, header: &Header) {
    serde_json::to_writer(&mut *out, header).expect("plain data serializes");
    out.push(b'\n');
}

/// Append one line per event to `out`.
pub fn write_events(out: &mut Vec<u8>, events: &[Event]) {
    for event in events {
        serde_json::to_writer(&mut *out, event).expect("plain data serializes");
        out.push(b'\n');
    }
}

/// True when `first_line` looks like the header of our format (a JSON object naming a
/// `format`); the reader then checks it fully. PyTorch snapshots are pickles and never start
/// with `{`.
pub fn looks_like_header(first_line: &[u8]) -> bool {
    let text = String::from_utf8_lossy(first_line);
    let text = text.trim_start_matches('\u{feff}').trim_start();
    text.starts_with('{') && text.contains("\"format\"")
}
