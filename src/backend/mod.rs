//! The only seam between the pool and a device.
//!
//! `sim` is a simulated device used by tests, replay and benchmarks. The real CUDA backend lives
//! beside it and is the only place that calls the driver or runtime.

pub mod cuda;
mod range_set;
pub mod sim;

use crate::pool::{DeviceId, DevicePtr, StreamId};
use std::fmt;

/// Free and total device memory, as `cudaMemGetInfo` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemInfo {
    pub free: u64,
    pub total: u64,
}

/// A point in the device's work queue recorded at free time; the block behind it may be reused
/// once the backend reports the fence done. The value is opaque to the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

/// A fence over the work of named streams (`Backend::record_stream_fence`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamFence {
    pub fence: Fence,
    /// Streams the fence could not cover, with what the device answered (a destroyed stream, or
    /// one of another device whose device the runtime cannot name). Their work is not waited
    /// for.
    pub unfenced: Vec<(StreamId, BackendError)>,
}

/// What a backend call can fail with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// The device has no room for the request (`cudaErrorMemoryAllocation`). Recoverable: the
    /// pool frees cached memory and retries. A backend reporting this has already cleared any
    /// sticky error state it caused.
    OutOfMemory,
    /// Any other failure, with the runtime's error code and the call that produced it. Passed
    /// through to the program unchanged.
    Device { code: i32, call: &'static str },
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::OutOfMemory => write!(f, "device out of memory"),
            BackendError::Device { code, call } => {
                write!(f, "{call} failed with CUDA error {code}")
            }
        }
    }
}

impl std::error::Error for BackendError {}

/// A device the pool can obtain segments from.
///
/// Contract, for every implementation:
/// - Calls come from one thread at a time (the pool is behind a lock) and never re-enter the pool.
/// - On `Err`, nothing was allocated or released and no out-parameter was written.
pub trait Backend {
    /// The device this backend allocates on.
    fn device(&self) -> DeviceId;

    /// Obtain a segment of exactly `size` bytes (a multiple of 2 MiB from the pool). The address
    /// is aligned to at least 512 bytes. `Err(OutOfMemory)` when the device is full.
    fn allocate(&mut self, size: u64) -> Result<DevicePtr, BackendError>;

    /// Return a whole segment obtained from `allocate`, with the size it was allocated with.
    /// Precondition: no block of it is in use by the program or by pending device work
    /// (the pool synchronizes first when pending blocks exist). May fail with
    /// `cudaErrorStreamCaptureUnsupported` (900) while a capture is underway
    /// (`capture_underway`), doing nothing, where a release would end the capture.
    fn release(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError>;

    /// Free and total memory of the device, counting memory of other users.
    fn mem_info(&mut self) -> Result<MemInfo, BackendError>;

    /// Record a fence after all work issued so far that may touch a block being freed.
    fn record_fence(&mut self) -> Result<Fence, BackendError>;

    /// Record a fence after all work issued so far on each of `streams` (the streams a block
    /// being freed was recorded as used on, `Tensor.record_stream`), whatever the free policy.
    /// It completes as that work finishes, each stream's part on its own: stream fences may be
    /// done in any order. While a capture is underway (`capture_underway`) the fence may cover
    /// the work issued until the capture is over instead, recorded then (by `poll_fences` or
    /// `synchronize`), and `unfenced` is empty.
    fn record_stream_fence(&mut self, streams: &[StreamId]) -> Result<StreamFence, BackendError>;

    /// Look at the device for stream fences that have completed since the last call and
    /// append them to `done`, each once; until then `fence_done` answers from what was seen.
    /// Fences found done before an `Err` are appended too. Fences done when recorded or
    /// completed by `synchronize` or `wait_stream_fences` are not reported (`fence_done` answers
    /// for them). Never blocks.
    fn poll_fences(&mut self, done: &mut Vec<Fence>) -> Result<(), BackendError>;

    /// Whether the work before `fence` (of either kind) has finished. Never blocks.
    fn fence_done(&mut self, fence: Fence) -> Result<bool, BackendError>;

    /// Wait until all work issued so far on the device has finished; afterwards every fence of
    /// `record_fence` is done, and so is every stream fence whose streams are all of this
    /// device (`fence_done` answers for them). May fail with 900, doing nothing, while a
    /// capture is underway, as `release` may.
    fn synchronize(&mut self) -> Result<(), BackendError>;

    /// After `synchronize`: wait also for the work of every stream fence on other devices'
    /// streams (before memory is given back: the out-of-memory retry, `empty_cache`);
    /// afterwards every stream fence is done.
    fn wait_stream_fences(&mut self) -> Result<(), BackendError>;

    /// Whether a CUDA graph capture that the program began may be underway. The pool then
    /// makes none of the calls that would end it on a real device (a synchronization, a query
    /// of a free's fence, a segment given back) and only obtains new memory. Never blocks.
    fn capture_underway(&mut self) -> bool {
        false
    }

    /// Whether the backend has the calls of expandable segments below (the driver's
    /// virtual-memory API). Without them the pool obtains every segment with `allocate`.
    fn supports_expandable_segments(&self) -> bool {
        false
    }

    /// Expandable segments: reserve `size` bytes of address space with no memory behind it
    /// (`cuMemAddressReserve`), aligned to 2 MiB, to be mapped in pages of `page` bytes
    /// (`size` is a multiple of it; pages count from the range's start). `Err(OutOfMemory)`
    /// when there is no room.
    fn reserve_address_range(&mut self, _size: u64, _page: u64) -> Result<DevicePtr, BackendError> {
        Err(NOT_SUPPORTED)
    }

    /// Put memory behind `[ptr, ptr + size)`, whole pages of a reserved range not mapped yet
    /// (`cuMemCreate` + `cuMemMap` per page, then `cuMemSetAccess`). `Err(OutOfMemory)`, with
    /// nothing mapped, when the device is full.
    fn map_pages(&mut self, _ptr: DevicePtr, _size: u64) -> Result<(), BackendError> {
        Err(NOT_SUPPORTED)
    }

    /// Take the memory from behind `[ptr, ptr + size)`, whole mapped pages, once the work of
    /// `stream` (the segment's) issued so far has finished (`cuMemUnmap` does not wait).
    fn unmap_pages(
        &mut self,
        _ptr: DevicePtr,
        _size: u64,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        Err(NOT_SUPPORTED)
    }

    /// Give back a reserved range with nothing mapped in it (`cuMemAddressFree`).
    fn release_address_range(&mut self, _ptr: DevicePtr, _size: u64) -> Result<(), BackendError> {
        Err(NOT_SUPPORTED)
    }
}

/// What the calls of expandable segments answer on a backend without them
/// (`cudaErrorNotSupported`); the pool never makes them there.
const NOT_SUPPORTED: BackendError = BackendError::Device {
    code: 801,
    call: "expandable segments",
};
