//! What `cachealloc state --request` prints about the request's trial: its outcome, the calls
//! the pool made to the device on the way, and the expandable segments' ranges it assumed; as
//! part of the state's JSON object or in words.

use crate::outcome::{OomReportJson, counted};
use cachealloc::pool::format_size;
use cachealloc::trace::expandable_state::SeedRange;
use cachealloc::trace::{DeviceCall, RequestOutcome, RequestTrial};
use serde::Serialize;

/// How many of the ranges the trial assumed the readable report lists.
const LISTED_RANGES: usize = 4;

/// What became of the request (`RequestOutcome` without its figures).
#[derive(Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Outcome {
    /// A cached block serves it.
    Cached,
    /// The device supplies a new segment.
    NewSegment,
    /// Pages are mapped into an expandable segment.
    MappedPages,
    OutOfMemory,
}

/// A call the pool made to the device (`DeviceCall`).
#[derive(Clone, Copy, Serialize)]
#[serde(tag = "call", rename_all = "snake_case")]
enum CallJson {
    /// Cached segments returned (cudaFree).
    Release { segments: u64, bytes: u64 },
    /// Free cached pages unmapped.
    Unmap { bytes: u64 },
    /// An address range reserved for an expandable segment.
    ReserveRange { address: u64, bytes: u64 },
    /// Pages mapped.
    Map { bytes: u64 },
    /// A segment obtained (cudaMalloc).
    Allocate { bytes: u64 },
}

impl From<&DeviceCall> for CallJson {
    fn from(c: &DeviceCall) -> Self {
        match *c {
            DeviceCall::Release { segments, bytes } => CallJson::Release { segments, bytes },
            DeviceCall::Unmap { bytes } => CallJson::Unmap { bytes },
            DeviceCall::ReserveRange { addr, size } => CallJson::ReserveRange {
                address: addr,
                bytes: size,
            },
            DeviceCall::Map { bytes } => CallJson::Map { bytes },
            DeviceCall::Allocate { bytes } => CallJson::Allocate { bytes },
        }
    }
}

impl CallJson {
    /// The call in words, as the pool made it.
    fn to_text(self) -> String {
        match self {
            CallJson::Release { segments, bytes } => format!(
                "returned {} ({}) to the device",
                counted(segments, "free cached segment"),
                format_size(bytes)
            ),
            CallJson::Unmap { bytes } => {
                format!("unmapped {} of free cached pages", format_size(bytes))
            }
            CallJson::ReserveRange { address, bytes } => {
                format!("reserved a range of {} at {address:#x}", format_size(bytes))
            }
            CallJson::Map { bytes } => format!("mapped {} of pages", format_size(bytes)),
            CallJson::Allocate { bytes } => {
                format!("obtained a segment of {}", format_size(bytes))
            }
        }
    }
}

/// `calls` in words, in order.
fn calls_text(calls: &[CallJson]) -> String {
    let listed: Vec<String> = calls.iter().map(|c| c.to_text()).collect();
    listed.join(", then ")
}

/// An expandable segment's reserved range as the trial takes it (a snapshot does not record
/// it: see `cachealloc::trace::expandable_state`).
#[derive(Serialize)]
struct RangeJson {
    address: u64,
    size: u64,
    pool: &'static str,
    stream: u64,
    mapped_bytes: u64,
    /// It ends short of 1⅛ of the device's memory, where another segment begins.
    cut_short: bool,
}

impl From<&SeedRange> for RangeJson {
    fn from(r: &SeedRange) -> Self {
        RangeJson {
            address: r.addr,
            size: r.size,
            pool: r.pool.name(),
            stream: r.stream.0,
            mapped_bytes: r.mapped_bytes(),
            cut_short: r.cut_short,
        }
    }
}

/// A request tried in the state.
#[derive(Serialize)]
pub(crate) struct RequestJson {
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
    /// `cached` (a cached block serves it), `new_segment` (the device supplies one),
    /// `mapped_pages` (it is served in an expandable segment after pages were mapped) or
    /// `out_of_memory`.
    outcome: Outcome,
    /// The cached block that serves it, and whether its free was pending in the state (it
    /// completed when the pool synchronized).
    block_address: Option<u64>,
    block_bytes: Option<u64>,
    block_was_pending: Option<bool>,
    /// The new segment, and the cached segments returned to the device first: of those, how
    /// many were wholly free only once the pending frees completed (the pool synchronizes
    /// before it returns segments).
    segment_bytes: Option<u64>,
    released_segments: Option<u64>,
    released_once_pending: Option<u64>,
    /// Pages mapped: where the request is served, the bytes of pages mapped and unmapped for
    /// it in all, and the range it lies in (reserved for it when `new_range`).
    served_address: Option<u64>,
    mapped_bytes: Option<u64>,
    unmapped_bytes: Option<u64>,
    range_address: Option<u64>,
    range_bytes: Option<u64>,
    new_range: Option<bool>,
    /// The calls the pool made to the device for the request, in order (consecutive calls of
    /// one kind together), and whether it retried after returning cached memory.
    device_calls: Vec<CallJson>,
    retried: bool,
    /// The reserved ranges the trial takes the expandable segments to have (a snapshot
    /// records only their mapped pages), in address order; empty without expandable segments.
    inferred_ranges: Vec<RangeJson>,
    oom: Option<OomReportJson>,
    /// Whether an allocator setting may avoid the out-of-memory error (then a recorded trace's
    /// replay finds which).
    settings_may_help: Option<bool>,
}

impl RequestJson {
    pub(crate) fn new(
        trial: RequestTrial,
        ranges: &[SeedRange],
        device_free: u64,
        device_memory: Option<u64>,
        device_memory_given: bool,
        wholly_free_segments: usize,
    ) -> Self {
        let outcome = match trial.outcome {
            RequestOutcome::Cached { .. } => Outcome::Cached,
            RequestOutcome::NewSegment { .. } => Outcome::NewSegment,
            RequestOutcome::Mapped { .. } => Outcome::MappedPages,
            RequestOutcome::OutOfMemory(_) => Outcome::OutOfMemory,
        };
        let mut json = RequestJson {
            requested_bytes: trial.requested,
            rounded_bytes: trial.rounded,
            pool: trial.pool.name(),
            stream: trial.stream.0,
            device_free_bytes: device_free,
            device_memory_bytes: device_memory,
            device_memory_given,
            outcome,
            block_address: None,
            block_bytes: None,
            block_was_pending: None,
            segment_bytes: None,
            released_segments: None,
            released_once_pending: None,
            served_address: None,
            mapped_bytes: None,
            unmapped_bytes: None,
            range_address: None,
            range_bytes: None,
            new_range: None,
            device_calls: trial.calls.iter().map(CallJson::from).collect(),
            retried: trial.retried,
            inferred_ranges: ranges.iter().map(RangeJson::from).collect(),
            oom: None,
            settings_may_help: None,
        };
        match trial.outcome {
            RequestOutcome::Cached {
                block_addr,
                block_size,
                was_pending,
            } => {
                json.block_address = Some(block_addr);
                json.block_bytes = Some(block_size);
                json.block_was_pending = Some(was_pending);
            }
            RequestOutcome::NewSegment {
                segment,
                released_segments,
            } => {
                json.segment_bytes = Some(segment);
                json.released_segments = Some(released_segments);
                json.released_once_pending =
                    Some(released_segments.saturating_sub(wholly_free_segments as u64));
            }
            RequestOutcome::Mapped {
                addr,
                range,
                range_size,
                new_range,
                mapped,
                unmapped,
            } => {
                json.served_address = Some(addr);
                json.mapped_bytes = Some(mapped);
                json.unmapped_bytes = Some(unmapped);
                json.range_address = Some(range);
                json.range_bytes = Some(range_size);
                json.new_range = Some(new_range);
            }
            RequestOutcome::OutOfMemory(report) => {
                json.settings_may_help = Some(report.hint().settings_may_help());
                json.oom = Some(OomReportJson::from(&*report));
            }
        }
        json
    }

    /// The request's outcome in words; `private` is what the private pools reserve and hold
    /// free, which the trial counts as allocated.
    pub(crate) fn to_text(&self, private: Option<(u64, u64)>) -> String {
        let mut out = format!(
            "Trying a request of {} on stream {:#x} (a block of {} in the {} pool) through \
             cachealloc's pool, which follows PyTorch's policy, with {} free on the device beyond \
             the reserved memory: ",
            format_size(self.requested_bytes),
            self.stream,
            format_size(self.rounded_bytes),
            self.pool,
            format_size(self.device_free_bytes)
        );
        if self.outcome == Outcome::OutOfMemory {
            out += &self.out_of_memory_text(private);
        } else {
            out += &self.served_text();
            out += ".\n";
            out += FITS_HERE;
        }
        out += &self.ranges_sentence();
        out
    }

    /// How the request was served, with the device calls on the way.
    fn served_text(&self) -> String {
        // The calls that the outcome's own words tell; any others are listed.
        let calls: Vec<CallJson> = self
            .device_calls
            .iter()
            .copied()
            .filter(|c| !matches!(c, CallJson::ReserveRange { .. }))
            .collect();
        let (served, told) = match self.outcome {
            Outcome::Cached => {
                let (addr, size) = (
                    self.block_address.unwrap_or(0),
                    format_size(self.block_bytes.unwrap_or(0)),
                );
                let served = if self.block_was_pending == Some(true) {
                    format!(
                        "served from the block of {size} at {addr:#x}, whose free was pending \
                         (it completed when the pool synchronized, before returning memory to \
                         the device)"
                    )
                } else {
                    format!("served from the free cached block of {size} at {addr:#x}")
                };
                (served, calls.is_empty())
            }
            Outcome::NewSegment => {
                let served = format!(
                    "served by a new segment of {} from the device",
                    format_size(self.segment_bytes.unwrap_or(0))
                );
                let told = matches!(
                    calls.as_slice(),
                    [CallJson::Allocate { .. }]
                        | [CallJson::Release { .. }, CallJson::Allocate { .. }]
                );
                let once_pending = match self.released_once_pending.unwrap_or(0) {
                    0 => String::new(),
                    n => format!(
                        ", {n} of them wholly free only once the pending frees completed (the \
                         pool synchronizes first)"
                    ),
                };
                let served = match self.released_segments.unwrap_or(0) {
                    n if n > 0 && told => format!(
                        "{served}, after returning {} to it{once_pending}",
                        counted(n, "free cached segment")
                    ),
                    _ => served,
                };
                (served, told)
            }
            Outcome::MappedPages => {
                let range = if self.new_range == Some(true) {
                    format!(
                        "a range of {} reserved for it at {:#x}",
                        format_size(self.range_bytes.unwrap_or(0)),
                        self.range_address.unwrap_or(0)
                    )
                } else {
                    format!(
                        "the expandable segment at {:#x}",
                        self.range_address.unwrap_or(0)
                    )
                };
                let at = self.served_address.unwrap_or(0);
                match calls.as_slice() {
                    [CallJson::Map { bytes }] => (
                        format!(
                            "served at {at:#x} by mapping {} of pages into {range}",
                            format_size(*bytes)
                        ),
                        true,
                    ),
                    [CallJson::Unmap { bytes: unmapped }, CallJson::Map { bytes }] => (
                        format!(
                            "served at {at:#x} by mapping {} of pages into {range}, after \
                             unmapping {} of free cached pages (a retry)",
                            format_size(*bytes),
                            format_size(*unmapped)
                        ),
                        true,
                    ),
                    _ => (format!("served at {at:#x} in {range}"), false),
                }
            }
            Outcome::OutOfMemory => (String::new(), true),
        };
        if told {
            return served;
        }
        format!(
            "{served}, after these calls to the device: {}{}",
            calls_text(&calls),
            if self.retried {
                " (a retry, after giving memory back)"
            } else {
                ""
            }
        )
    }

    /// The out-of-memory report, with what the state adds to it.
    fn out_of_memory_text(&self, private: Option<(u64, u64)>) -> String {
        let mut out = "out of memory.\n".to_string();
        let Some(oom) = &self.oom else {
            return out;
        };
        out += oom.text.trim_end();
        out += "\n";
        if !self.device_calls.is_empty() {
            out += &format!(
                "On the way the pool {}{}.\n",
                calls_text(&self.device_calls),
                if self.retried { " and retried" } else { "" }
            );
        }
        if let Some((reserved, free)) = private {
            out += &format!(
                "Of the memory counted allocated above, {} is the private pools' ({} of it cached \
                 free there, which PyTorch's message calls \"allocated in private pools\"): it \
                 goes back to the device only when their CUDA graphs or MemPools are deleted, \
                 which no allocator setting does.\n",
                format_size(reserved),
                format_size(free)
            );
        }
        if !self.device_memory_given
            && matches!(oom.kind, "exhausted" | "padding" | "segment_too_large")
        {
            out += "The device's total memory was not given: it is taken as the reserved memory \
                    plus --device-free, with nothing held outside the pool. Give --device-memory \
                    (PyTorch's \"total capacity of SIZE\") to tell memory held by other processes \
                    or CUDA contexts apart.\n";
        }
        if oom.kind == "fragmentation" {
            out += "Which setting avoids this depends on the requests that led to this state, \
                    which a snapshot without an allocation trace does not hold: call \
                    torch.cuda.memory._record_memory_history() before the run, dump the snapshot \
                    at the error, and `cachealloc replay` it to find the values that fit.\n";
        }
        out
    }

    /// The reserved ranges the trial took the expandable segments to have.
    fn ranges_sentence(&self) -> String {
        if self.inferred_ranges.is_empty() {
            return String::new();
        }
        let listed: Vec<String> = self
            .inferred_ranges
            .iter()
            .take(LISTED_RANGES)
            .map(|r| {
                format!(
                    "{} at {:#x} ({} pool, stream {:#x}, {} mapped{})",
                    format_size(r.size),
                    r.address,
                    r.pool,
                    r.stream,
                    format_size(r.mapped_bytes),
                    if r.cut_short {
                        ", cut short where another segment begins"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        let more = self.inferred_ranges.len() - listed.len();
        let memory = format_size(self.device_memory_bytes.unwrap_or(0));
        let memory = if self.device_memory_given {
            memory
        } else {
            format!(
                "{memory}: the reserved memory plus --device-free, as --device-memory was not given"
            )
        };
        format!(
            "A snapshot records the pages mapped in expandable segments, not the address ranges \
             reserved for them. The trial took the runs of each pool and stream to lie in a range \
             that begins at the lowest of them and is 1⅛ of the device's memory long \
             ({memory}), as PyTorch reserves them (a run beyond it begins another range). The \
             ranges: {}{}. \
             Where the request lands in them, and so which free block it grows, may differ from \
             the program's.\n",
            listed.join("; "),
            if more > 0 {
                format!(" (and {more} more)")
            } else {
                String::new()
            }
        )
    }
}

/// After a request that fits: why a program may still have run out of memory in this state.
const FITS_HERE: &str = "In this state the request fits. If the program ran out of memory here, \
                         the snapshot was taken after memory was freed (an exception handler runs \
                         after the failing frame's tensors are released), or the device had less \
                         free memory than --device-free says, or the request was another size.\n";
