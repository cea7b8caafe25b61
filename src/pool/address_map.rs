//! `AddressMap`: live allocations by address — the map every malloc inserts into and every
//! free removes from (a thin wrapper naming the operations the pool needs).

use super::block::BlockId;
use rustc_hash::FxHashMap;

/// Live allocations: address → block.
#[derive(Debug, Clone, Default)]
pub struct AddressMap {
    map: FxHashMap<u64, BlockId>,
}

impl AddressMap {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    #[inline]
    pub fn get(&self, addr: u64) -> Option<BlockId> {
        self.map.get(&addr).copied()
    }

    /// Record a new live allocation (its address is not in the map).
    #[inline]
    pub fn insert(&mut self, addr: u64, id: BlockId) {
        self.map.insert(addr, id);
    }

    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<BlockId> {
        self.map.remove(&addr)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.map.iter().map(|(a, id)| (*a, *id))
    }
}
