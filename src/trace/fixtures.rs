//! Hand-made recordings for the unit tests of the snapshot reader and converters.

use super::recording::{
    Action, BlockState, CallSite, DeviceRecording, RecordedBlock, RecordedSegment, TraceEntry,
};
use crate::pool::{DeviceId, PoolKind, StreamId};

pub const MIB: u64 = 1 << 20;
/// Base address of the hand-made segments.
pub const BASE: u64 = 0x7f00_0000_0000;

pub fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
    TraceEntry {
        action,
        addr,
        size,
        stream: StreamId(0),
        device_free: None,
        call_site: CallSite::Unrecorded,
    }
}

pub fn at(action: Action, addr: u64, size: u64, call_site: CallSite) -> TraceEntry {
    TraceEntry {
        call_site,
        ..entry(action, addr, size)
    }
}

pub fn oom(size: u64, device_free: u64) -> TraceEntry {
    TraceEntry {
        device_free: Some(device_free),
        ..entry(Action::Oom, 0, size)
    }
}

/// A segment from `(offset from addr, size, requested, allocated)` blocks.
pub fn segment(addr: u64, size: u64, blocks: &[(u64, u64, u64, bool)]) -> RecordedSegment {
    RecordedSegment {
        device: DeviceId(0),
        address: addr,
        total_size: size,
        stream: StreamId(0),
        pool: if size == 2 * MIB {
            PoolKind::Small
        } else {
            PoolKind::Large
        },
        private_pool: None,
        is_expandable: false,
        blocks: blocks
            .iter()
            .map(|&(offset, size, requested, allocated)| RecordedBlock {
                address: addr + offset,
                size,
                requested_size: requested,
                state: if allocated {
                    BlockState::Allocated
                } else {
                    BlockState::Inactive
                },
            })
            .collect(),
    }
}

pub fn recording(entries: Vec<TraceEntry>, segments: Vec<RecordedSegment>) -> DeviceRecording {
    DeviceRecording {
        source: "test.pickle".into(),
        device: DeviceId(0),
        entries,
        segments,
        settings: None,
    }
}
