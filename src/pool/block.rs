//! Blocks: contiguous pieces of a segment, linked to their address neighbours, stored in an
//! arena and named by index so the pool holds no pointers.

use super::types::{PoolKind, StreamId};

/// Index of a block in the arena.
pub type BlockId = u32;

/// Sentinel for "no neighbour".
pub const NIL: BlockId = BlockId::MAX;

/// What a block is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Cached in its pool's free index, ready for reuse.
    Free,
    /// Handed to the program.
    Allocated,
    /// Freed by the program, waiting for device work issued before the free to finish.
    Pending,
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
}

impl Block {
    /// A block with an address neighbour in the same segment (the segment has been split).
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    pub fn end(&self) -> u64 {
        self.addr + self.size
    }
}

/// Storage for blocks; ids of removed blocks are reused.
#[derive(Debug, Default)]
pub struct BlockArena {
    slots: Vec<Block>,
    /// Ids of removed blocks, reused by the next inserts.
    vacant: Vec<BlockId>,
}

impl BlockArena {
    #[inline]
    pub fn insert(&mut self, block: Block) -> BlockId {
        if let Some(id) = self.vacant.pop() {
            self.slots[id as usize] = block;
            id
        } else {
            self.slots.push(block);
            (self.slots.len() - 1) as BlockId
        }
    }

    /// Mark `id` reusable. The slot keeps stale contents until reused.
    #[inline]
    pub fn remove(&mut self, id: BlockId) {
        debug_assert!(!self.vacant.contains(&id), "block {id} removed twice");
        self.vacant.push(id);
    }

    /// Live blocks with their ids, in id order (for the cold paths: it marks the vacant ids
    /// first).
    pub fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> + '_ {
        let mut live = vec![true; self.slots.len()];
        for &id in &self.vacant {
            live[id as usize] = false;
        }
        self.slots
            .iter()
            .zip(live)
            .enumerate()
            .filter(|(_, (_, live))| *live)
            .map(|(i, (b, _))| (i as BlockId, b))
    }

    #[inline]
    pub fn get(&self, id: BlockId) -> &Block {
        &self.slots[id as usize]
    }

    #[inline]
    pub fn get_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.slots[id as usize]
    }

    /// Forget every block, keeping the storage (ids restart from 0).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.vacant.clear();
    }

    /// Number of live blocks.
    pub fn len(&self) -> usize {
        self.slots.len() - self.vacant.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
