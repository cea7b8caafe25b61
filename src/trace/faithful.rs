//! Faithful replay of a recording: the rebuilt start state installed at its real addresses, the
//! recording's capacity and settings, and the driver's segment addresses, so that the replay can
//! be compared figure for figure (and address for address) with what PyTorch did.

use super::figures::RecordedFigures;
use super::ranges::{RangeChange, range_hints};
use super::recording::{Action, DeviceRecording};
use super::replay::{ReplayConfig, ReplayOutcome, StartLayout, replay};
use super::start_state::StartState;
use crate::pool::{SegmentSeed, Settings};

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
                blocks: s.block_seeds(),
            })
            .collect();
        let ids = self
            .segments
            .iter()
            .map(|s| s.blocks.iter().map(|b| b.id).collect())
            .collect();
        StartLayout {
            segments,
            ids,
            ranges: self.ranges.iter().map(|r| r.layout()).collect(),
            range_ids: self
                .ranges
                .iter()
                .flat_map(|r| &r.runs)
                .flat_map(|run| &run.blocks)
                .filter_map(|b| Some((b.addr, b.id?)))
                .collect(),
        }
    }
}

impl DeviceRecording {
    /// The settings a faithful replay runs with: the recorded ones (the defaults when the file
    /// names none), with expandable segments on when the recording used them (a snapshot of an
    /// older PyTorch names no settings: only its `segment_map` entries show them).
    pub fn replay_settings(&self) -> Settings {
        let mut settings = self
            .settings
            .as_ref()
            .map(|s| s.to_settings())
            .unwrap_or_default();
        settings.expandable_segments |= self.is_expandable();
        settings
    }

    /// The entries that map and unmap pages of expandable segments, in trace order: where
    /// the driver reserved their ranges (`ranges::range_hints`).
    pub fn range_changes(&self) -> Vec<RangeChange> {
        self.entries
            .iter()
            .filter_map(|e| match e.action {
                Action::SegmentMap => Some(RangeChange::Map {
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream,
                }),
                Action::SegmentUnmap => Some(RangeChange::Unmap {
                    addr: e.addr,
                    size: e.size,
                }),
                _ => None,
            })
            .collect()
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

impl ReplayConfig {
    /// Place segments and the ranges of expandable segments where the recording's driver did:
    /// `segment_addresses` (`(size, address)` of each `segment_alloc`) as hints, and the ranges
    /// that `range_changes` show. The simulated device reports `device_memory` when the
    /// recording (or the user) says it, else the memory the ranges imply for this replay's
    /// capacity (so the capacity is set first).
    pub fn follow_recorded_addresses(
        &mut self,
        segment_addresses: Vec<(u64, u64)>,
        range_changes: &[RangeChange],
        device_memory: Option<u64>,
    ) {
        self.address_hints = segment_addresses;
        let ranges = range_hints(range_changes, device_memory.or(self.capacity));
        self.reservation_hints = ranges.addresses();
        self.device_total = device_memory.or(ranges.device_total);
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

/// Replay `rec` faithfully. `config.settings` is used as given (callers start from the
/// recording's settings); a capacity in `config` overrides the one inferred from the trace, and
/// a device memory (`device_total`) the one the recording implies, for the ranges of expandable
/// segments there at the start too.
pub fn replay_faithful(
    rec: &DeviceRecording,
    config: &ReplayConfig,
) -> Result<FaithfulOutcome, String> {
    let faithful = rec
        .faithful_on(config.device_total)
        .map_err(|e| e.to_string())?;
    let mut config = config.clone();
    config.capacity = config.capacity.or(faithful.capacity);
    let memory = config.device_total;
    config.follow_recorded_addresses(rec.segment_addresses(), &faithful.range_changes, memory);
    let layout = faithful.start.layout();
    let outcome = replay(&faithful.workload, &config, Some(&layout))
        .map_err(|e| format!("{}: {e}", rec.source))?;
    Ok(FaithfulOutcome {
        outcome,
        recorded: rec.figures(),
        capacity: config.capacity,
    })
}
