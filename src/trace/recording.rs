//! The model of a recorded PyTorch memory snapshot: per device, the trace entries in order and
//! the end-state segments with their blocks, plus the allocator settings when the file has them.
//!
//! Only what replay needs is kept. Stack frames, which make up most of a snapshot file, are
//! reduced to a [`CallSite`]: whether the entry was recorded inside `empty_cache()`, inside
//! `malloc`, elsewhere, or without a stack. That is enough to tell explicit `empty_cache()`
//! calls from the OOM ladder's own releases (see `bursts`).

use crate::pool::rounding::ROUNDUP_INTERVALS;
use crate::pool::{DeviceId, PoolKind, Settings, StreamId};

/// The `action` of a trace entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The program got a block; `size` is the requested (unrounded) size.
    Alloc,
    /// The program freed a block; `size` is its requested size.
    FreeRequested,
    /// The block went back to the pool (after its stream events completed).
    FreeCompleted,
    /// A cudaMalloc of a whole segment.
    SegmentAlloc,
    /// A cudaFree of a whole segment.
    SegmentFree,
    /// Expandable segments: pages mapped into a reserved range.
    SegmentMap,
    /// Expandable segments: pages unmapped.
    SegmentUnmap,
    /// A marker written when the snapshot was taken; `size` = total active bytes.
    Snapshot,
    /// A request failed with out-of-memory; `size` = rounded request, `device_free` set.
    Oom,
    /// A user annotation; no effect on memory. `annotate` (newest PyTorch: metadata attached to
    /// a live allocation) or `user_defined` (PyTorch nightlies of mid-2024: a `record_function`
    /// range's start or end, written into every device's trace before they moved to the
    /// snapshot's `external_annotations`).
    Annotate,
}

impl Action {
    /// Parse the snapshot's action string.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "snapshot" => Action::Snapshot,
            "oom" => Action::Oom,
            "annotate" | "user_defined" => Action::Annotate,
            _ => return None,
        })
    }

    /// The action strings this reader understands (for error messages).
    pub const KNOWN: &'static str = "alloc, free_requested, free_completed, segment_alloc, \
         segment_free, segment_map, segment_unmap, snapshot, oom, annotate, user_defined";
}

/// Where in the allocator an entry was recorded, read from its stack frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallSite {
    /// A frame names `emptyCache` / `empty_cache`: an explicit `torch.cuda.empty_cache()`.
    EmptyCache,
    /// A frame names `malloc` (and none names empty_cache): inside an allocation.
    Malloc,
    /// Frames were recorded but name neither.
    Other,
    /// The entry has no frames (older PyTorch, or stacks not recorded).
    Unrecorded,
}

/// One entry of a device trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEntry {
    pub action: Action,
    /// Block or segment address; 0 for `oom` and `snapshot`.
    pub addr: u64,
    /// Bytes (see [`Action`] for what the size means per action).
    pub size: u64,
    pub stream: StreamId,
    /// Free device bytes reported by cudaMemGetInfo (`oom` entries only).
    pub device_free: Option<u64>,
    pub call_site: CallSite,
}

/// State of a block in the end-state `segments`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// `active_allocated`: held by the program.
    Allocated,
    /// `active_pending_free`: freed, waiting for stream events.
    PendingFree,
    /// `inactive`: free in the pool.
    Inactive,
}

impl BlockState {
    /// True when the block is not available to the pool (allocated or pending free).
    pub fn is_occupied(self) -> bool {
        !matches!(self, BlockState::Inactive)
    }
}

/// One block of an end-state segment.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedBlock {
    pub address: u64,
    /// Block size (rounded, including any unsplit tail).
    pub size: u64,
    /// Requested size of the allocation held (0 when free).
    pub requested_size: u64,
    pub state: BlockState,
}

/// One segment of the end state (one cudaMalloc, or one mapped range when expandable).
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedSegment {
    pub device: DeviceId,
    pub address: u64,
    pub total_size: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    /// The private memory pool it belongs to (`segment_pool_id` other than (0, 0): a CUDA
    /// graph's or a `torch.cuda.MemPool`'s, whose blocks serve the requests made in that graph's
    /// capture or under that pool); `None` for the default pools.
    pub private_pool: Option<(u64, u64)>,
    pub is_expandable: bool,
    pub blocks: Vec<RecordedBlock>,
}

/// The snapshot's `allocator_settings` (present in files from PyTorch ~2.2 on).
///
/// Note: PyTorch records some settings as fields of their own (the four below `conf`) and the
/// others only in the `PYTORCH_CUDA_ALLOC_CONF` string it last read (`conf`):
/// `per_process_memory_fraction` and `max_non_split_rounding_mb` are known from the string
/// alone. Where both name a setting, the field says what was in force.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RecordedSettings {
    /// The `PYTORCH_CUDA_ALLOC_CONF` string in effect.
    pub conf: Option<String>,
    /// `None` when unlimited (the file says -1).
    pub max_split_size: Option<u64>,
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    /// Divisions per power-of-two interval (index 0 = below 2 MiB … 15 = 32 GiB and up).
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// The settings `conf` sets, read as cachealloc reads `PYTORCH_CUDA_ALLOC_CONF`, for those
    /// the fields do not carry; `None` when the file has no string or it cannot be read.
    pub conf_settings: Option<Settings>,
    /// What reading `conf` earned, each naming the file: why the string cannot be read, or a
    /// key in it that cachealloc does not follow.
    pub conf_warnings: Vec<String>,
}

impl RecordedSettings {
    /// The settings a recording that names none is taken to have run with (`--conf` given to
    /// its faithful replay): `settings`, as if recorded.
    pub fn assumed(settings: &Settings) -> RecordedSettings {
        RecordedSettings {
            conf: None,
            max_split_size: settings
                .has_max_split_size()
                .then_some(settings.max_split_size),
            garbage_collection_threshold: settings.garbage_collection_threshold,
            expandable_segments: settings.expandable_segments,
            roundup_power2_divisions: settings.roundup_power2_divisions,
            conf_settings: Some(settings.clone()),
            conf_warnings: Vec::new(),
        }
    }

    /// The pool settings the recording ran with: the fields', and the string's for the rest.
    pub fn to_settings(&self) -> Settings {
        Settings {
            max_split_size: self
                .max_split_size
                .map_or(u64::MAX, crate::pool::max_split_size_from_bytes),
            roundup_power2_divisions: self.roundup_power2_divisions,
            garbage_collection_threshold: self.garbage_collection_threshold,
            expandable_segments: self.expandable_segments,
            ..self.conf_settings.clone().unwrap_or_default()
        }
    }
}

/// Everything recorded about one device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceRecording {
    /// The file this came from (for names and error messages).
    pub source: String,
    pub device: DeviceId,
    pub entries: Vec<TraceEntry>,
    /// End-state segments of this device, in address order.
    pub segments: Vec<RecordedSegment>,
    /// The file's allocator settings, when present.
    pub settings: Option<RecordedSettings>,
}

impl DeviceRecording {
    /// True when the recording used expandable segments (settings, segment flags or map/unmap
    /// entries say so).
    pub fn is_expandable(&self) -> bool {
        self.settings
            .as_ref()
            .is_some_and(|s| s.expandable_segments)
            || self.segments.iter().any(|s| s.is_expandable)
            || self
                .entries
                .iter()
                .any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap))
    }

    /// True when the recording holds both kinds of segment: native ones (`segment_alloc` or
    /// `segment_free` entries, or segments at the end that are not expandable) and expandable
    /// ones (`segment_map` or `segment_unmap` entries, or expandable segments at the end). The
    /// setting changed while it ran, or PyTorch kept private pools on native segments (as
    /// versions whose `alloc_block` leaves out pools owned by a CUDA graph did); a replay runs
    /// with one kind throughout.
    pub fn mixes_segment_kinds(&self) -> bool {
        let native = self.segments.iter().any(|s| !s.is_expandable)
            || self
                .entries
                .iter()
                .any(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentFree));
        let expandable = self.segments.iter().any(|s| s.is_expandable)
            || self
                .entries
                .iter()
                .any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap));
        native && expandable
    }

    /// True when the trace allocates or frees blocks (not only snapshot markers, segment
    /// entries or annotations): what a replay needs.
    pub fn has_block_events(&self) -> bool {
        self.entries.iter().any(|e| {
            matches!(
                e.action,
                Action::Alloc | Action::FreeRequested | Action::FreeCompleted | Action::Oom
            )
        })
    }

    /// Bytes reserved at the end of the recording (sum of end-state segment sizes).
    pub fn end_reserved_bytes(&self) -> u64 {
        // Saturating: a damaged file's sizes must not wrap around.
        self.segments
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.total_size))
    }

    /// A short name: file and device.
    pub fn name(&self) -> String {
        format!("{} (device {})", self.source, self.device.0)
    }
}

/// A whole snapshot file: one recording per device.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedSnapshot {
    pub source: String,
    /// Indexed by device ordinal; devices without entries or segments are present but empty.
    pub devices: Vec<DeviceRecording>,
    pub settings: Option<RecordedSettings>,
    /// The file is `torch.cuda.memory_snapshot()`'s list of segments: a state with no trace
    /// and no settings.
    pub segments_only: bool,
    /// The file holds pinned host memory (`host_segments`, `host_traces`), which is not read.
    pub host_memory: bool,
}

impl RecordedSnapshot {
    /// Devices whose trace has at least one entry.
    pub fn traced_devices(&self) -> impl Iterator<Item = &DeviceRecording> {
        self.devices.iter().filter(|d| !d.entries.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::fixtures::{BASE, MIB, entry, oom, recording, segment};

    /// The settings' flag, a segment's or a map/unmap entry each say the recording used
    /// expandable segments.
    #[test]
    fn each_sign_of_expandable_segments_is_enough() {
        let mut by_settings = recording(vec![], vec![]);
        assert!(!by_settings.is_expandable());
        by_settings.settings = Some(RecordedSettings {
            expandable_segments: true,
            ..RecordedSettings::default()
        });
        assert!(by_settings.is_expandable());
        for action in [Action::SegmentMap, Action::SegmentUnmap] {
            assert!(recording(vec![entry(action, BASE, 20 * MIB)], vec![]).is_expandable());
        }
    }

    /// Settings taken as a recording's give back the same settings, every key kept.
    #[test]
    fn assumed_settings_are_the_settings_given() {
        for conf in [
            "",
            "max_split_size_mb:40",
            "max_split_size_mb:64,max_non_split_rounding_mb:32",
            "roundup_power2_divisions:[256:1,512:2,>:4]",
            "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
            "expandable_segments:True",
        ] {
            let settings = crate::config::Config::parse_conf_str(conf)
                .unwrap()
                .settings;
            assert_eq!(
                RecordedSettings::assumed(&settings).to_settings(),
                settings,
                "{conf}"
            );
        }
    }

    /// Native and expandable segments together, in the trace or at the end, are told; either
    /// kind alone is not.
    #[test]
    fn native_and_expandable_segments_together_are_told() {
        let native = entry(Action::SegmentAlloc, BASE, 20 * MIB);
        let mapped = entry(Action::SegmentMap, BASE + 100 * MIB, 20 * MIB);
        assert!(!recording(vec![native.clone()], vec![]).mixes_segment_kinds());
        assert!(!recording(vec![mapped.clone()], vec![]).mixes_segment_kinds());
        assert!(recording(vec![native.clone(), mapped.clone()], vec![]).mixes_segment_kinds());
        let fixed = segment(BASE, 20 * MIB, &[(0, 20 * MIB, 0, false)]);
        let grown = RecordedSegment {
            address: BASE + 100 * MIB,
            is_expandable: true,
            ..fixed.clone()
        };
        let mut end = recording(vec![], vec![fixed, grown]);
        assert!(end.mixes_segment_kinds());
        end.segments.pop();
        assert!(!end.mixes_segment_kinds());
        end.entries.push(mapped);
        assert!(end.mixes_segment_kinds());
    }

    /// The recorded fields are the settings replayed, over what the string says.
    #[test]
    fn the_recorded_fields_are_the_settings_replayed() {
        let mut divisions = [0; ROUNDUP_INTERVALS];
        divisions[3] = 4;
        let recorded = RecordedSettings {
            max_split_size: Some(64 * MIB),
            garbage_collection_threshold: 0.6,
            expandable_segments: true,
            roundup_power2_divisions: divisions,
            conf_settings: Some(Settings {
                per_process_memory_fraction: 0.5,
                ..Settings::default()
            }),
            ..RecordedSettings::default()
        };
        let settings = recorded.to_settings();
        assert_eq!(settings.max_split_size, 64 * MIB);
        assert_eq!(settings.garbage_collection_threshold, 0.6);
        assert!(settings.expandable_segments);
        assert_eq!(settings.roundup_power2_divisions, divisions);
        assert_eq!(settings.per_process_memory_fraction, 0.5);
    }

    /// A trace whose only request failed still has something to replay (the request, probed
    /// at the recorded capacity): a replay without `--device` takes its device over one whose
    /// trace holds only markers and segment entries.
    #[test]
    fn a_failed_request_alone_is_a_block_event() {
        assert!(recording(vec![oom(64 * MIB, 0)], vec![]).has_block_events());
        let markers = recording(
            vec![
                entry(Action::Snapshot, 0, 0),
                entry(Action::SegmentAlloc, BASE, 20 * MIB),
            ],
            vec![],
        );
        assert!(!markers.has_block_events());
    }
}
