//! `AddressMap`: live allocations by address — the map every malloc inserts into and every
//! free removes from.
//!
//! A `hashbrown::HashTable` of (address, block) with the Fx hash: the same table as
//! `FxHashMap`, but a malloc inserts with `insert_unique` — the pool never hands out an
//! address that is still live, so the search for an existing key that `HashMap::insert` does
//! first (a probe and, on these keys, a mispredicted branch per insert) is skipped.

use super::block::BlockId;
use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;
use std::hash::BuildHasher;

#[inline]
fn hash(addr: u64) -> u64 {
    FxBuildHasher.hash_one(addr)
}

/// Live allocations: address → block.
#[derive(Debug, Clone, Default)]
pub struct AddressMap {
    table: HashTable<(u64, BlockId)>,
}

impl AddressMap {
    pub fn len(&self) -> usize {
        self.table.len()
    }

    #[inline]
    pub fn get(&self, addr: u64) -> Option<BlockId> {
        self.table
            .find(hash(addr), |e| e.0 == addr)
            .map(|&(_, id)| id)
    }

    /// Record a new live allocation; `addr` must not be in the map (the pool hands out each
    /// address once until it is freed — `validate()` checks the map against the blocks).
    #[inline]
    pub fn insert(&mut self, addr: u64, id: BlockId) {
        debug_assert!(self.get(addr).is_none(), "{addr:#x} is already live");
        self.table
            .insert_unique(hash(addr), (addr, id), |e| hash(e.0));
    }

    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<BlockId> {
        self.table
            .find_entry(hash(addr), |e| e.0 == addr)
            .ok()
            .map(|entry| entry.remove().0.1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.table.iter().copied()
    }
}
