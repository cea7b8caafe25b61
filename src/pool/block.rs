//! Blocks: contiguous pieces of a segment, linked to their address neighbours, stored in the
//! `BlockTable` and named by their slot there, so the pool holds no pointers.

use super::block_table::Moved;
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

/// What taking a free block needs of it besides its size and address — its next neighbour and
/// whether it is split — carried in its free-index entry, so that a malloc does not wait to read
/// the block before handing it out. Both stay as they are while the block is free (its
/// neighbours are not free: they would have merged), except for the ids a table rebuild moves.
/// Packed in a `u32`, the entry's spare bytes: ids are below 2^31 (a table of 2^31 slots would
/// be 128 GiB). Kept for blocks of native segments only: the search of expandable segments,
/// whose unmapped neighbours change while a block is free, reads the block. The default: no
/// next neighbour, not split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextLink(u32);

impl NextLink {
    const SPLIT: u32 = 1 << 31;

    pub fn new(next: BlockId, split: bool) -> Self {
        debug_assert!(next < Self::SPLIT, "block id {next} fits in 31 bits");
        Self(next | if split { Self::SPLIT } else { 0 })
    }

    pub fn of(block: &Block) -> Self {
        Self::new(block.next, block.is_split())
    }

    #[inline]
    pub fn next(self) -> BlockId {
        self.0 & !Self::SPLIT
    }

    #[inline]
    pub fn is_split(self) -> bool {
        self.0 & Self::SPLIT != 0
    }

    /// The same link after a table rebuild moved the blocks.
    pub fn moved(self, moved: &Moved) -> Self {
        Self::new(moved.id(self.next()), self.is_split())
    }
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
