//! `BlockTable`: every block of the pool, stored at a slot found from its start address.
//!
//! A free names its allocation by address only. Were blocks stored in an arena with a separate
//! address → block map, a free would wait on memory three times in a row: the map, the block,
//! its neighbours. Here the table is an open-addressing hash table whose slots are the blocks
//! themselves (one cache line each): the slot a lookup probes first is the block, so a free
//! waits twice, like an allocator that is handed its node. A block's id is its slot, and
//! neighbours link by id, so reaching a neighbour needs no hashing.
//!
//! A block keeps its slot for as long as it lives — its start address never changes: a split
//! keeps the front, a merge keeps the lowest block — so ids held by the free indexes and the
//! pending queue stay valid. Only a rebuild moves blocks; it happens when the pool asks for
//! room (`make_room`) at the start of a malloc or of a segment's adoption, when no id is held
//! on the way, and it returns the old → new ids for the holders to follow.
//!
//! Linear probing (passing over the sentinel in slot 0); a removed block leaves a tombstone
//! only when a probe could pass through its slot to a later block (the next slot is taken),
//! and a removal that empties a slot also empties the tombstones just before it, so
//! tombstones stay few. Which slots are empty, taken or tombstones is also kept in a byte per
//! slot (`SlotMarks`): an insert finds its slot and a removal inspects the slots around its
//! own there, without reading table slots (cache lines) that hold nothing the operation needs.

use super::block::{Block, BlockId, BlockState, NIL};
use super::slot_marks::SlotMarks;
use super::types::{PoolKind, StreamId};

/// Address of an empty slot (no block starts at address 0).
const EMPTY: u64 = 0;
/// Address of a slot whose block was removed while a probe could pass through it.
const TOMBSTONE: u64 = u64::MAX - 1;
/// Address of the sentinel in slot `NIL`: never looked up, never taken by an insert.
const SENTINEL_ADDR: u64 = u64::MAX;
/// Slots of a new table (a power of two).
const INITIAL_SLOTS: usize = 16;
/// `clear` keeps a table of up to this many slots (4 MiB) as it is, and replaces a larger one
/// with one this size.
const KEPT_SLOTS: usize = 1 << 16;

/// The block in slot `NIL`: never free, linked to nothing, part of no segment.
const SENTINEL: Block = Block {
    addr: SENTINEL_ADDR,
    size: 0,
    requested: 0,
    stream: StreamId(0),
    pool: PoolKind::Small,
    prev: NIL,
    next: NIL,
    state: BlockState::Allocated,
    gc_count_base: 0,
    expandable: false,
};

const VACANT: Block = Block {
    addr: EMPTY,
    ..SENTINEL
};

/// Old id → new id after a rebuild (`NIL` for slots that held no block).
pub struct Moved(Vec<BlockId>);

impl Moved {
    #[inline]
    pub fn id(&self, old: BlockId) -> BlockId {
        self.0[old as usize]
    }
}

/// The pool's blocks, by start address.
#[derive(Debug)]
pub struct BlockTable {
    slots: Vec<Block>,
    /// Which slots hold blocks and which are tombstones, so that inserts and removals read
    /// no slot but their own.
    marks: SlotMarks,
    /// 64 − log2(number of slots): a hash's top bits pick the home slot.
    shift: u32,
    /// `max_taken` of the number of slots (kept: `has_room` runs on every malloc).
    max_taken: usize,
    len: usize,
    tombstones: usize,
}

impl Default for BlockTable {
    fn default() -> Self {
        Self::with_slots(INITIAL_SLOTS)
    }
}

/// Tables up to this many slots keep at most a quarter of them taken (by blocks and
/// tombstones): a lookup then finds its block in the first slot it reads nearly always. Half
/// full cost 3-4% more time per operation on two benchmark rows before the slot marks; with
/// them, log-uniform showed no difference but the small real traces leaned slower (ftcourse
/// 1.45x against 1.38x and 1.40x against 1.29x in two sets of alternating runs), and
/// callgrind's simulated mispredictions rose (longer lookups). With the room a rebuild leaves
/// for tombstones, that is 4-16 slots (256-1024 bytes, and 4-16 bytes of marks) per block;
/// larger tables fill up to half, so that a program with millions of small blocks pays
/// 128-512 bytes.
const SPARSE_UP_TO_SLOTS: usize = 1 << 20;

/// How many slots of a table of `slots` may be taken.
#[inline]
fn max_taken(slots: usize) -> usize {
    if slots <= SPARSE_UP_TO_SLOTS {
        slots / 4
    } else {
        slots / 2
    }
}

/// Whether a slot's address is that of a block (not empty, a tombstone or the sentinel).
#[inline]
fn holds_block(addr: u64) -> bool {
    addr != EMPTY && addr < TOMBSTONE
}

impl BlockTable {
    fn with_slots(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two() && slots >= INITIAL_SLOTS);
        let mut table = Self {
            slots: vec![VACANT; slots],
            marks: SlotMarks::new(slots),
            shift: 64 - slots.trailing_zeros(),
            max_taken: max_taken(slots),
            len: 0,
            tombstones: 0,
        };
        table.slots[NIL as usize] = SENTINEL;
        table.marks.hold(NIL as usize);
        table
    }

    /// The first slot probed for `addr`: the top bits of a multiplicative (Fibonacci) hash.
    #[inline]
    fn home(&self, addr: u64) -> usize {
        (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    #[inline]
    fn next_slot(&self, slot: usize) -> usize {
        (slot + 1) & (self.slots.len() - 1)
    }

    /// The block starting at `addr`, if there is one.
    #[inline]
    pub fn find(&self, addr: u64) -> Option<BlockId> {
        if !holds_block(addr) {
            return None;
        }
        let mut slot = self.home(addr);
        loop {
            let here = self.slots[slot].addr;
            if here == addr {
                return Some(slot as BlockId);
            }
            if here == EMPTY {
                return None;
            }
            slot = self.next_slot(slot);
        }
    }

    /// Whether `n` inserts fit without a rebuild.
    #[inline]
    pub fn has_room(&self, n: usize) -> bool {
        self.len + self.tombstones + n <= self.max_taken
    }

    /// Rebuild so that `n` inserts fit, with blocks taking at most half of what may be taken
    /// (the rest is for tombstones before the next rebuild), in a larger table when they
    /// need it; returns where each block went.
    #[cold]
    #[inline(never)]
    pub fn make_room(&mut self, n: usize) -> Moved {
        let mut slots = self.slots.len();
        while 2 * (self.len + n + 1) > max_taken(slots) {
            slots *= 2;
        }
        let old = std::mem::replace(self, Self::with_slots(slots));
        let mut moved = vec![NIL; old.slots.len()];
        for (id, block) in old.iter() {
            moved[id as usize] = self.insert(*block);
        }
        for (_, block) in self.iter_mut() {
            block.prev = moved[block.prev as usize];
            block.next = moved[block.next as usize];
        }
        Moved(moved)
    }

    /// Store a block at a slot found from its address; the table must have room (`has_room`)
    /// and no block may start at that address.
    #[inline]
    pub fn insert(&mut self, block: Block) -> BlockId {
        debug_assert!(
            holds_block(block.addr),
            "{:#x} is a block address",
            block.addr
        );
        debug_assert!(
            self.find(block.addr).is_none(),
            "{:#x} stored twice",
            block.addr
        );
        debug_assert!(self.has_room(1), "the pool made room first");
        let slot = self.marks.first_open(self.home(block.addr));
        self.tombstones -= usize::from(self.marks.hold(slot));
        self.slots[slot] = block;
        self.len += 1;
        slot as BlockId
    }

    /// Remove block `id`. Its slot is emptied, with the tombstones just before it, when no
    /// probe needs to pass through it (the next slot is empty); else it becomes a tombstone.
    #[inline(always)]
    pub fn remove(&mut self, id: BlockId) {
        debug_assert!(id != NIL, "the sentinel is never removed");
        debug_assert!(
            holds_block(self.slots[id as usize].addr),
            "block {id} removed twice"
        );
        self.len -= 1;
        let mut slot = id as usize;
        if !self.marks.is_empty(self.after(slot)) {
            self.slots[slot].addr = TOMBSTONE;
            self.marks.bury(slot);
            self.tombstones += 1;
            return;
        }
        self.slots[slot].addr = EMPTY;
        self.marks.clear(slot);
        loop {
            slot = self.before(slot);
            if !self.marks.is_tomb(slot) {
                break;
            }
            self.slots[slot].addr = EMPTY;
            self.marks.clear(slot);
            self.tombstones -= 1;
        }
    }

    /// The slot a probe reads after `slot` that can end it: probes pass over the sentinel.
    #[inline]
    fn after(&self, slot: usize) -> usize {
        let next = self.next_slot(slot);
        next + usize::from(next == NIL as usize)
    }

    /// The slot whose `after` is `slot` (`slot` is not the sentinel's).
    #[inline]
    fn before(&self, slot: usize) -> usize {
        let mask = self.slots.len() - 1;
        let prev = (slot + mask) & mask;
        if prev == NIL as usize { mask } else { prev }
    }

    /// Live blocks with their ids, in slot order (for the cold paths).
    pub fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, b)| holds_block(b.addr))
            .map(|(i, b)| (i as BlockId, b))
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (BlockId, &mut Block)> + '_ {
        self.slots
            .iter_mut()
            .enumerate()
            .filter(|(_, b)| holds_block(b.addr))
            .map(|(i, b)| (i as BlockId, b))
    }

    #[inline]
    pub fn get(&self, id: BlockId) -> &Block {
        &self.slots[id as usize]
    }

    #[inline]
    pub fn get_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.slots[id as usize]
    }

    /// Forget every block, keeping the storage up to `KEPT_SLOTS` slots (a pool emptied
    /// between the steps of a job refills to about the same size; the memory of a rare peak
    /// goes back).
    pub fn clear(&mut self) {
        if self.slots.len() > KEPT_SLOTS {
            *self = Self::with_slots(KEPT_SLOTS);
            return;
        }
        self.slots.fill(VACANT);
        self.slots[NIL as usize] = SENTINEL;
        self.marks.clear_all();
        self.marks.hold(NIL as usize);
        self.len = 0;
        self.tombstones = 0;
    }

    /// Number of live blocks.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots left as tombstones (the sentinel is not one).
    #[cfg(test)]
    fn tombstones(&self) -> usize {
        self.tombstones
    }

    /// `Err` naming the first slot that a lookup of its own address would not find, a
    /// miscount, more slots taken than allowed, or a changed sentinel (for `validate()`).
    pub fn check(&self) -> Result<(), String> {
        let sentinel = self.slots[NIL as usize];
        if sentinel.addr != SENTINEL_ADDR || sentinel.state == BlockState::Free {
            return Err("block table's sentinel was overwritten".into());
        }
        if !self.has_room(0) {
            return Err(format!(
                "block table has {} blocks and {} tombstones in {} slots, over its limit",
                self.len,
                self.tombstones,
                self.slots.len()
            ));
        }
        for (slot, b) in self.slots.iter().enumerate() {
            let marked = (self.marks.is_held(slot), self.marks.is_tomb(slot));
            let expected = (b.addr != EMPTY && b.addr != TOMBSTONE, b.addr == TOMBSTONE);
            if marked != expected {
                return Err(format!(
                    "block table slot {slot} is marked (held, tombstone) = {marked:?}, holds {:#x}",
                    b.addr
                ));
            }
        }
        for (id, b) in self.iter() {
            if self.find(b.addr) != Some(id) {
                return Err(format!("block {:#x} is not found at its slot", b.addr));
            }
        }
        let listed = self.iter().count();
        let tombs = self.slots.iter().filter(|b| b.addr == TOMBSTONE).count();
        if listed != self.len || tombs != self.tombstones {
            return Err(format!(
                "block table counts {} blocks and {} tombstones, holds {listed} and {tombs}",
                self.len, self.tombstones
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn free_block(addr: u64) -> Block {
        Block {
            addr,
            size: 512,
            state: BlockState::Free,
            ..SENTINEL
        }
    }

    #[test]
    fn finds_every_block_by_address_through_inserts_removals_and_rebuilds() {
        let mut table = BlockTable::default();
        // address → id, as the table reports them.
        let mut model: HashMap<u64, BlockId> = HashMap::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rebuilds = 0;
        for i in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Clustered, 512-aligned addresses (as segments hand them out).
            let addr = 0x7f00_0000_0000 + ((x % 6000) << 9);
            if let Some(id) = model.remove(&addr) {
                assert_eq!(table.get(id).addr, addr);
                table.remove(id);
            } else if i % 5 != 0 {
                if !table.has_room(1) {
                    let moved = table.make_room(1);
                    for id in model.values_mut() {
                        *id = moved.id(*id);
                    }
                    rebuilds += 1;
                }
                model.insert(addr, table.insert(free_block(addr)));
            }
            assert_eq!(table.find(addr), model.get(&addr).copied(), "step {i}");
            assert_eq!(table.len(), model.len());
            if i % 1000 == 0 {
                table.check().expect("consistent");
            }
        }
        table.check().expect("consistent");
        for (&addr, &id) in &model {
            assert_eq!(table.find(addr), Some(id));
        }
        assert!(rebuilds > 0, "the table grew");
        assert!(table.tombstones() < table.len(), "tombstones stay few");
    }

    #[test]
    fn the_sentinel_is_never_found_listed_or_free_and_markers_are_not_addresses() {
        let mut table = BlockTable::default();
        assert!(table.is_empty());
        assert_ne!(table.get(NIL).state, BlockState::Free);
        let a = table.insert(free_block(512));
        assert!(a != NIL && table.find(512) == Some(a));
        for marker in [EMPTY, TOMBSTONE, SENTINEL_ADDR] {
            assert_eq!(table.find(marker), None, "{marker:#x}");
        }
        table.remove(a);
        assert_eq!(table.find(512), None);
        assert!(table.iter().all(|(id, _)| id != NIL));
        table.insert(free_block(1024));
        table.clear();
        assert!(table.is_empty() && table.iter().next().is_none());
        assert_ne!(table.get(NIL).state, BlockState::Free);
    }

    #[test]
    fn removals_around_the_table_end_and_the_sentinel_leave_no_tombstones_behind() {
        let fresh = BlockTable::default();
        let last = INITIAL_SLOTS - 1;
        // Two addresses whose probes start in the last slot: the second wraps past the
        // sentinel in slot 0 to slot 1.
        let mut homed_last = (1..)
            .map(|k: u64| k << 9)
            .filter(|&a| fresh.home(a) == last);
        let (a, b) = (homed_last.next().unwrap(), homed_last.next().unwrap());
        for order in [[a, b], [b, a]] {
            let mut table = BlockTable::default();
            let ida = table.insert(free_block(a));
            let idb = table.insert(free_block(b));
            assert_eq!(
                (ida, idb),
                (last as BlockId, 1),
                "b wrapped past the sentinel"
            );
            for addr in order {
                table.remove(table.find(addr).unwrap());
                table.check().expect("consistent");
                assert_eq!(table.find(addr), None);
            }
            assert_eq!(
                table.tombstones(),
                0,
                "removing {order:#x?} left tombstones"
            );
            assert!(table.has_room(INITIAL_SLOTS / 4));
        }
        // A lone block in the last slot: the slot after it (past the sentinel) is empty.
        let mut table = BlockTable::default();
        let id = table.insert(free_block(a));
        table.remove(id);
        assert_eq!(table.tombstones(), 0);
    }

    #[test]
    fn clearing_keeps_a_small_table_and_gives_back_a_large_one() {
        let mut table = BlockTable::default();
        table.make_room(KEPT_SLOTS);
        assert!(table.slots.len() > KEPT_SLOTS);
        table.insert(free_block(512));
        table.clear();
        assert_eq!(table.slots.len(), KEPT_SLOTS);
        assert!(table.is_empty() && table.find(512).is_none());
        table.insert(free_block(512));
        table.clear();
        assert_eq!(table.slots.len(), KEPT_SLOTS, "kept");
        table.check().expect("consistent");
    }

    #[test]
    fn a_rebuild_relinks_neighbours_to_their_new_slots() {
        let mut table = BlockTable::default();
        let a = table.insert(free_block(4096));
        let b = table.insert(Block {
            prev: a,
            ..free_block(4608)
        });
        table.get_mut(a).next = b;
        let moved = table.make_room(100);
        let (a, b) = (moved.id(a), moved.id(b));
        assert_eq!(table.find(4096), Some(a));
        assert_eq!(table.find(4608), Some(b));
        assert_eq!((table.get(a).next, table.get(b).prev), (b, a));
        assert!(table.has_room(100));
    }
}
