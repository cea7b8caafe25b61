//! The out-of-memory report: built from a stats snapshot at the moment the miss ladder gave
//! up, so that an OOM explains itself (true exhaustion or fragmentation, and what to change).

use super::types::{DeviceId, StreamId};

/// Everything known about one failed allocation. Filled by the pool; explained by `hint()` and
/// rendered by `Display`.
#[derive(Clone, Debug, PartialEq)]
pub struct OomReport {
    pub device: DeviceId,
    pub stream: StreamId,
    /// Bytes the program asked for.
    pub requested: u64,
    /// The block size after rounding.
    pub rounded: u64,
    /// The segment size the pool tried to obtain from the device.
    pub alloc_size: u64,
    /// Device capacity and free bytes (`cudaMemGetInfo`) after every cache flush.
    pub device_total: u64,
    pub device_free: u64,
    /// `allocated_bytes.all.current`.
    pub allocated: u64,
    /// `reserved_bytes.all.current`.
    pub reserved: u64,
    /// Limit from `per_process_memory_fraction`, when set.
    pub allowed_maximum: Option<u64>,
    /// Sizes of the free cached blocks on this device, largest first (at most 16).
    pub largest_free_blocks: Vec<u64>,
    /// The `max_split_size` in force (`u64::MAX` = unlimited).
    pub max_split_size: u64,
}
