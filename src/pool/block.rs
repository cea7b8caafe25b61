//! Blocks: contiguous pieces of a segment, linked to their address neighbours, stored in the
//! `BlockTable` and named by their slot there, so the pool holds no pointers.

use super::types::{PoolKind, StreamId};

/// A block's slot in the `BlockTable`.
pub type BlockId = u32;

/// "No neighbour": the id of the table's sentinel, a block that is never free, so that a
/// neighbour test is one test of the state (and writes to a missing neighbour's links land
/// harmlessly in the sentinel).
pub const NIL: BlockId = 0;

/// What a block is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Cached in its pool's free index, ready for reuse.
    Free,
    /// Handed to the program.
    Allocated,
    /// Freed by the program, waiting for device work issued before the free to finish.
    Pending,
    /// A stretch of an expandable segment's address range with no memory mapped behind it
    /// (in its pool's unmapped set, never in a free index).
    Unmapped,
}

/// A piece of a segment. Aligned to a cache line so that reading one block touches one line.
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    /// Bytes the program asked for (0 for a free block).
    pub requested: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub prev: BlockId,
    pub next: BlockId,
    pub state: BlockState,
    /// Value of the pool's free-block search counter when the block was last cached (GC age).
    pub gc_count_base: u64,
    /// Part of an expandable segment (an address range whose pages are mapped on demand).
    pub expandable: bool,
}

impl Block {
    /// A block with an address neighbour in the same segment (the segment has been split).
    pub fn is_split(&self) -> bool {
        // NIL is 0: one test for both links.
        (self.prev | self.next) != NIL
    }

    pub fn end(&self) -> u64 {
        self.addr + self.size
    }
}
