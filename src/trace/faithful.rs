//! Faithful replay of a recording: the rebuilt start state installed at its real addresses, the
//! recording's capacity and settings, and the driver's segment addresses, so that the replay can
//! be compared figure for figure (and address for address) with what PyTorch did.

use super::figures::RecordedFigures;
use super::recording::{Action, DeviceRecording};
use super::replay::{ReplayConfig, ReplayOutcome, StartLayout, replay};
use super::start_state::StartState;
use crate::pool::rounding::SMALL_BUFFER;
use crate::pool::{BlockSeed, SegmentSeed};

impl StartState {
    /// The layout the replay installs into the pool.
    pub fn layout(&self) -> StartLayout {
        let segments = self
            .segments
            .iter()
            .map(|s| SegmentSeed {
                addr: s.addr,
                size: s.size,
                stream: s.stream,
                pool: s.pool,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| BlockSeed {
                        addr: b.addr,
                        size: b.size,
                        requested: b.requested,
                        allocated: b.allocated,
                    })
                    .collect(),
            })
            .collect();
        let ids = self
            .segments
            .iter()
            .map(|s| s.blocks.iter().map(|b| b.id).collect())
            .collect();
        StartLayout { segments, ids }
    }
}

impl DeviceRecording {
    /// Where the driver reserved the address ranges of expandable segments, in trace order: the
    /// first page mapped for each pool and stream (a range's first map is at its start; the
    /// small pool maps 2 MiB pages one at a time, the large pool 20 MiB ones).
    pub fn reservation_addresses(&self) -> Vec<u64> {
        let mut seen = std::collections::HashSet::new();
        self.entries
            .iter()
            .filter(|e| e.action == Action::SegmentMap)
            .filter(|e| seen.insert((e.size == SMALL_BUFFER, e.stream)))
            .map(|e| e.addr)
            .collect()
    }

    /// The most device memory under which the ranges PyTorch reserves (1⅛ of the device's
    /// memory each) fit between the recorded ones: the closest two reservations, × 8/9. `None`
    /// with fewer than two. A faithful replay without a known capacity sizes its ranges with
    /// it, so that they land where the recording's did.
    pub fn total_from_reservations(&self) -> Option<u64> {
        let mut starts = self.reservation_addresses();
        starts.sort_unstable();
        let gap = starts.windows(2).map(|w| w[1] - w[0]).min()?;
        Some(gap / 9 * 8)
    }

    /// `(size, address)` of every `segment_alloc`, in trace order: where the driver put them.
    pub fn segment_addresses(&self) -> Vec<(u64, u64)> {
        self.entries
            .iter()
            .filter(|e| e.action == Action::SegmentAlloc)
            .map(|e| (e.size, e.addr))
            .collect()
    }
}

/// A faithful replay's result next to the recording's own figures.
#[derive(Clone, Debug)]
pub struct FaithfulOutcome {
    pub outcome: ReplayOutcome,
    pub recorded: RecordedFigures,
    /// The capacity the replay ran with.
    pub capacity: Option<u64>,
}

/// The device memory a faithful replay sizes expandable segments' ranges with: its capacity,
/// but no more than lets the ranges fit between the recorded ones.
pub fn device_total(capacity: Option<u64>, from_reservations: Option<u64>) -> Option<u64> {
    match (capacity, from_reservations) {
        (Some(c), Some(r)) => Some(c.min(r)),
        (c, r) => c.or(r),
    }
}

/// Replay `rec` faithfully. `config.settings` is used as given (callers start from the
/// recording's settings); a capacity in `config` overrides the one inferred from the trace.
pub fn replay_faithful(
    rec: &DeviceRecording,
    config: &ReplayConfig,
) -> Result<FaithfulOutcome, String> {
    let faithful = rec.faithful().map_err(|e| e.to_string())?;
    let mut config = config.clone();
    config.capacity = config.capacity.or(faithful.capacity);
    config.address_hints = rec.segment_addresses();
    config.reservation_hints = rec.reservation_addresses();
    config.device_total = device_total(config.capacity, rec.total_from_reservations());
    let layout = faithful.start.layout();
    let outcome = replay(&faithful.workload, &config, Some(&layout))
        .map_err(|e| format!("{}: {e}", rec.source))?;
    Ok(FaithfulOutcome {
        outcome,
        recorded: rec.figures(),
        capacity: config.capacity,
    })
}
