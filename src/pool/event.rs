//! Events are data: what the pool did, for trace recording and tests. With no sink installed an
//! event costs one branch.

use super::types::{DevicePtr, StreamId};
use serde::{Deserialize, Serialize};

/// One thing the pool did, in PyTorch's trace vocabulary (and the reservation and release of
/// expandable segments' ranges, which PyTorch's traces leave out).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PoolEvent {
    /// An allocation handed out: `size` is the requested size.
    Alloc {
        ptr: DevicePtr,
        size: u64,
        stream: StreamId,
    },
    /// The program freed an allocation; its block is reusable once what `waits` names is done
    /// (its `FreeCompleted` follows at once where that is nothing).
    FreeRequested {
        ptr: DevicePtr,
        size: u64,
        stream: StreamId,
        waits: FreeWaits,
    },
    /// The block went back to its pool.
    FreeCompleted {
        ptr: DevicePtr,
        size: u64,
        stream: StreamId,
    },
    /// A segment was obtained from the device.
    SegmentAlloc {
        ptr: DevicePtr,
        size: u64,
        stream: StreamId,
    },
    /// A segment was returned to the device.
    SegmentFree {
        ptr: DevicePtr,
        size: u64,
        stream: StreamId,
    },
    /// Expandable segments: an address range was reserved for a pool and stream (`size`
    /// bytes, mapped in pages of `page` bytes as requests need them).
    RangeReserve {
        ptr: DevicePtr,
        size: u64,
        page: u64,
        stream: StreamId,
    },
    /// Expandable segments: a range with nothing mapped any more was given back.
    RangeRelease {
        ptr: DevicePtr,
        size: u64,
        stream: StreamId,
    },
    /// Expandable segments: pages were mapped into a reserved range.
    SegmentMap {
        ptr: DevicePtr,
        size: u64,
        stream: StreamId,
    },
    /// Expandable segments: pages were unmapped.
    SegmentUnmap {
        ptr: DevicePtr,
        size: u64,
        stream: StreamId,
    },
    /// A counted retry (`num_alloc_retries`): after returning every cached segment it could
    /// (`release_cached_blocks`), the pool asks the device once more for the request of `size`
    /// bytes (rounded); its `SegmentAlloc` (with expandable segments, its `SegmentMap`s, perhaps
    /// after a `RangeReserve`) or its `Oom` follows — or nothing, after a device error other
    /// than out of memory.
    Retry { size: u64, stream: StreamId },
    /// An allocation failed after the whole ladder: `size` is the rounded request (as in
    /// PyTorch's trace), `requested` what the program asked for.
    Oom {
        size: u64,
        requested: u64,
        stream: StreamId,
        device_free: u64,
    },
    /// A CUDA graph capture is underway (`Backend::capture_underway`) where it changes what
    /// the pool does: at a request that no cached block serves, which then only asks the
    /// device for new memory (its `SegmentAlloc`, with expandable segments its `SegmentMap`s,
    /// or its `Oom` follows: `size` is the rounded request), or at `empty_cache()`, which then
    /// does nothing (its `EmptyCache` follows; `size` 0). Never at a request a cached block
    /// serves, which is served the same way during a capture.
    Capture { size: u64, stream: StreamId },
    /// A request of `size` bytes (rounded) that no free block served made the pool synchronize
    /// the device before growing, while frees waited for it (`FreeWaits::device_first`): the
    /// `FreeCompleted`s of that synchronization follow, then the request's search again (and,
    /// if that fails, its growth).
    SyncBeforeGrowth { size: u64, stream: StreamId },
    /// The program synchronized the device (`device_synchronized`): every free made before it
    /// that waited for the device's work is complete; the `FreeCompleted`s of those still
    /// waiting follow (not of a free waiting for another device's stream).
    DeviceSynchronize,
    /// `empty_cache()` was called; the `SegmentFree`s it causes follow.
    EmptyCache,
    /// The program set the pool's memory fraction (`set_memory_fraction`): from here on it may
    /// reserve `fraction` of the device's memory (1 = no limit).
    MemoryFraction { fraction: f64 },
}

/// What a free waits for before its block is reusable (`PoolEvent::FreeRequested`): which
/// synchronizations complete it, and whether the pool synchronizes for it before growing. A
/// synchronization of the device completes a free of every kind (it covers the device's
/// streams).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FreeWaits {
    /// Nothing: the block is back at once (`free`).
    Nothing,
    /// The device's work issued before the free (`free_deferred`: the library's `cudaFree`
    /// under `free_sync:device` or `event`): while such a free waits, a request that no free
    /// block serves makes the pool synchronize the device before it grows.
    Device,
    /// Events on the streams that used the block (`free_after_streams`: a free recorded as used
    /// on other streams, `cudaFreeAsync`): the pool grows rather than synchronize for it; an
    /// out-of-memory retry or `empty_cache()` still does.
    Streams,
    /// The device's work, then events on streams its synchronization may not cover (another
    /// device's; `free_deferred_after_streams`): the pool synchronizes before growing for it,
    /// as for `Device`.
    DeviceThenStreams,
}

impl FreeWaits {
    /// Whether the pool synchronizes the device before it grows while such a free waits.
    pub fn device_first(self) -> bool {
        matches!(self, FreeWaits::Device | FreeWaits::DeviceThenStreams)
    }
}

/// Receives pool events (a recorder, a ring buffer, a test probe).
pub trait EventSink: Send {
    fn record(&mut self, event: &PoolEvent);
}

impl<F: FnMut(&PoolEvent) + Send> EventSink for F {
    fn record(&mut self, event: &PoolEvent) {
        self(event)
    }
}
