//! Whether frees still pending would serve a request once complete: for the out-of-memory
//! report of a request made during a CUDA graph capture, when the pool could not wait for them.
//! During a capture no cached memory goes back to the device, so a completed free helps only
//! through the block it leaves: merged with its free (or also pending) neighbours in its
//! segment, on the request's stream and in its pool, and large enough by the `max_split_size`
//! rules. The bytes the frees hold elsewhere (another pool, another stream, separate segments)
//! would serve nothing until the capture ends.

use super::allocator::{DeviceAllocator, may_serve};
use super::block::{Block, BlockState};
use super::rounding::pool_for;
use super::types::StreamId;
use crate::backend::Backend;

/// A block that is, or once its free completes will be, cached for reuse.
fn reusable(b: &Block) -> bool {
    matches!(b.state, BlockState::Free | BlockState::Pending)
}

impl<B: Backend> DeviceAllocator<B> {
    /// The smallest block that the frees still pending would leave, once complete, that serves
    /// a request of `rounded` bytes on `stream`; `None` when none would. (Fixed segments' and
    /// expandable segments' mapped blocks alike; the pages an expandable segment could map
    /// past such a block are not counted.)
    pub(super) fn pending_fit(&self, stream: StreamId, rounded: u64) -> Option<u64> {
        let (mss, rounding) = (
            self.settings.max_split_size,
            self.settings.max_non_split_rounding,
        );
        let pool = pool_for(rounded);
        let mut best: Option<u64> = None;
        for (_, first) in self.blocks.iter() {
            // Each run of reusable blocks holding a pending one, from its first block.
            if !reusable(first)
                || first.pool != pool
                || first.stream != stream
                || reusable(self.blocks.get(first.prev))
            {
                continue;
            }
            let (mut size, mut pending) = (0u64, false);
            let mut b = first;
            loop {
                size += b.size;
                pending |= b.state == BlockState::Pending;
                let next = self.blocks.get(b.next);
                if !reusable(next) {
                    break;
                }
                b = next;
            }
            if pending && size >= rounded && may_serve(rounded, size, mss, rounding) {
                best = Some(best.map_or(size, |s| s.min(size)));
            }
        }
        best
    }
}
