//! Blocks: contiguous pieces of a segment, linked to their address neighbours, stored in an
//! arena and named by index so the pool holds no pointers.

use super::types::{PoolKind, StreamId};

/// Index of a block in the arena.
pub type BlockId = u32;

/// "No neighbour": the id of the arena's sentinel, a block that is never free, so that a
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
        // NIL is 0: one test for both links.
        (self.prev | self.next) != NIL
    }

    pub fn end(&self) -> u64 {
        self.addr + self.size
    }
}

/// Storage for blocks; ids of removed blocks are reused. Slot `NIL` holds the sentinel.
#[derive(Debug)]
pub struct BlockArena {
    slots: Vec<Block>,
    /// Ids of removed blocks, reused by the next inserts.
    vacant: Vec<BlockId>,
}

/// The block in slot `NIL`: never free, linked to nothing, part of no segment.
const SENTINEL: Block = Block {
    addr: 0,
    size: 0,
    requested: 0,
    stream: StreamId(0),
    pool: PoolKind::Small,
    prev: NIL,
    next: NIL,
    state: BlockState::Allocated,
    gc_count_base: 0,
};

impl Default for BlockArena {
    fn default() -> Self {
        Self {
            slots: vec![SENTINEL],
            vacant: Vec::new(),
        }
    }
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
        debug_assert!(id != NIL, "the sentinel is never removed");
        debug_assert!(!self.vacant.contains(&id), "block {id} removed twice");
        self.vacant.push(id);
    }

    /// Live blocks with their ids, in id order (for the cold paths: it marks the vacant ids
    /// first).
    pub fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> + '_ {
        let mut live = vec![true; self.slots.len()];
        live[NIL as usize] = false;
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

    /// Forget every block, keeping the storage (ids restart after the sentinel's).
    pub fn clear(&mut self) {
        self.slots.truncate(1);
        self.slots[NIL as usize] = SENTINEL;
        self.vacant.clear();
    }

    /// Number of live blocks.
    pub fn len(&self) -> usize {
        self.slots.len() - 1 - self.vacant.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_block(addr: u64) -> Block {
        Block {
            addr,
            size: 512,
            state: BlockState::Free,
            ..SENTINEL
        }
    }

    #[test]
    fn the_sentinel_is_never_handed_out_listed_or_free() {
        let mut arena = BlockArena::default();
        assert!(arena.is_empty());
        assert_ne!(arena.get(NIL).state, BlockState::Free);
        let a = arena.insert(free_block(512));
        let b = arena.insert(free_block(1024));
        assert!(a != NIL && b != NIL && a != b);
        arena.remove(a);
        assert_eq!(arena.insert(free_block(2048)), a, "a removed id is reused");
        assert_eq!(arena.len(), 2);
        assert!(arena.iter().all(|(id, _)| id != NIL));
        arena.clear();
        assert!(arena.is_empty() && arena.iter().next().is_none());
        assert_ne!(arena.insert(free_block(512)), NIL);
        assert_ne!(arena.get(NIL).state, BlockState::Free);
    }
}
