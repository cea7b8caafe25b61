//! Hand-made recordings for the unit tests of the snapshot reader and converters, and
//! workload operations for those of replay and the generators.

use super::recording::{
    Action, BlockState, CallSite, DeviceRecording, RecordedBlock, RecordedSegment, TraceEntry,
};
use super::workload::{AllocId, Op};
use crate::pool::{DeviceId, PoolKind, StreamId};

pub const MIB: u64 = 1 << 20;
/// Base address of the hand-made segments.
pub const BASE: u64 = 0x7f00_0000_0000;

/// An allocation of `size` bytes on the default stream, at no recorded address.
pub fn alloc(id: AllocId, size: u64) -> Op {
    Op::Alloc {
        id,
        size,
        stream: StreamId(0),
        recorded_addr: None,
    }
}

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

/// Two 100 MiB segments, each with 60 MiB allocated at its front and 40 MiB free behind (the
/// second with 5 bytes less requested), and a small segment with 1 KiB allocated.
pub fn split_state() -> DeviceRecording {
    recording(
        vec![],
        vec![
            segment(
                BASE,
                2 * MIB,
                &[(0, 1024, 1000, true), (1024, 2 * MIB - 1024, 0, false)],
            ),
            segment(
                BASE + 0x1000_0000,
                100 * MIB,
                &[
                    (0, 60 * MIB, 60 * MIB, true),
                    (60 * MIB, 40 * MIB, 0, false),
                ],
            ),
            segment(
                BASE + 0x2000_0000,
                100 * MIB,
                &[
                    (0, 60 * MIB, 60 * MIB - 5, true),
                    (60 * MIB, 40 * MIB, 0, false),
                ],
            ),
        ],
    )
}
