//! Cached memory that a CUDA graph capture keeps from a request: free blocks that are whole
//! fixed segments. Outside a capture the miss ladder gives them back to the device
//! (`release_cached_blocks`) and tries again; during one it may not (giving memory back waits
//! for the device, which would end the capture), so they sit cached while the request fails.

use super::allocator::DeviceAllocator;
use super::types::PoolKind;
use crate::backend::Backend;

impl<B: Backend> DeviceAllocator<B> {
    /// Bytes of the free blocks of both pools, any stream, that are whole fixed segments: what
    /// the ladder would give back outside a capture. (The free pages of expandable segments
    /// are not counted.)
    pub(super) fn capture_held(&self) -> u64 {
        [PoolKind::Large, PoolKind::Small]
            .into_iter()
            .flat_map(|pool| self.whole_free_segments(pool))
            .map(|e| e.size)
            .sum()
    }
}
