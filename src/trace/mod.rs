//! Allocation traces: the workload model, readers for recorded traces, and replay through the
//! pool on the simulated device.
//!
//! Our own format (`record`): the shim's `trace:PATH` recording, JSON lines, read back into a
//! workload per device with its recorded figures.
//!
//! PyTorch memory snapshots: `snapshot` reads the file (through `pickle`, a plain-data decoder
//! that keeps Python's object sharing, or `json_snapshot`, which decodes a snapshot written as
//! JSON into the same values) into a [`RecordedSnapshot`] (model in `recording`);
//! `figures` gives what the recorded run did; `bursts` tells `empty_cache()` calls from the OOM
//! ladder's releases; `capacity` infers the device size; `start_state` rebuilds the pool at
//! trace start (`expandable_start` its expandable segments' runs of mapped pages); `convert`
//! produces the plain and faithful workloads. `memory_state` reports the state a snapshot
//! records (for snapshots with no trace to replay), `expandable_state` places expandable
//! segments' runs in ranges, and `request_trial` tries a request in it.
//!
//! Rules inferred from the recordings (details in each module):
//! - **Frees**: `free_completed` becomes `Op::Free` (`free_requested` only in files without
//!   completions); in the real traces each completion directly follows its request. One that
//!   waited for other streams (`record_stream`) leaves the allocation statistics at its
//!   request (`Op::FreeRequested`), and returns its block at its completion or at a
//!   synchronization of the replay's pool before it (a replay on a smaller device may retry
//!   where the recording did not; see `pool::replayed_frees`); one an out-of-memory retry's
//!   synchronization completed returns its block at the replay's (`Op::FreeAtSync`, see
//!   `retry_sync`).
//! - **Release bursts**: consecutive `segment_free`s. Frames naming `emptyCache` → one
//!   `Op::EmptyCache`; frames naming `malloc` → the OOM ladder's release, not an op. Without
//!   frames, a burst directly followed by `oom` or `segment_alloc` is the ladder's, any other an
//!   `empty_cache()` call.
//! - **Retries**: each `oom` entry is one failed counted retry; each malloc-release burst
//!   directly followed by `segment_alloc` is one successful retry (exact with default settings,
//!   an upper bound with `max_split_size` or a GC threshold).
//! - **Capacity**: reserved at the OOM + its `device_free`; without an OOM,
//!   [peak reserved, smallest reserved-before-burst + retried segment size).
//! - **Unsplit tails**: a large-pool block is split only if more than 1 MiB remains, so a
//!   block rebuilt from a free may own up to 1 MiB past its rounded size; a gap of ≤ 1 MiB
//!   after it (no free large-pool block is that small) belongs to it, found either at once or
//!   when the next block reappears just past it.

pub mod bursts;
pub mod capacity;
pub mod convert;
pub mod error;
mod expandable_start;
pub mod expandable_state;
pub mod faithful;
pub mod figures;
pub mod fit;
#[cfg(test)]
mod fixtures;
pub mod input;
mod json_snapshot;
pub mod memory_state;
pub mod pickle;
pub mod ranges;
pub mod record;
pub mod recording;
pub mod replay;
pub mod request_trial;
pub mod retry_sync;
pub mod rng;
pub mod snapshot;
pub mod start_state;
pub mod synth;
pub mod workload;

pub use capacity::CapacityEstimate;
pub use convert::FaithfulReplay;
pub use error::TraceError;
pub use faithful::{FaithfulOutcome, replay_faithful};
pub use figures::{RecordedFigures, RecordedOom};
pub use input::TraceFile;
pub use memory_state::MemoryState;
pub use recording::{DeviceRecording, RecordedSnapshot};
pub use replay::{OomAt, ReplayConfig, ReplayOutcome, StartLayout, replay, seeded_pool};
pub use request_trial::{
    DeviceCall, RequestOutcome, RequestTrial, pending_frees, trial_state, try_request,
};
pub use snapshot::{parse_snapshot, read_snapshot};
pub use start_state::{SeedBlock, SeedSegment, StartState, end_state};
pub use workload::{AllocId, Op, Workload};
