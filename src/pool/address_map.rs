//! `AddressMap`: live allocations by address — the map every malloc inserts into and every
//! free removes from.
//!
//! An open-addressing table with linear probing and backward-shift deletion (no tombstones),
//! kept at most a quarter full. Keys are device addresses, never zero, so zero marks an empty slot.
//! Multiplicative (Fibonacci) hashing spreads the 512-byte-aligned addresses over the table.
//! Compared with a general hash map this needs no existence check before an insert, no
//! control bytes and no group probing: one multiply and, at this load, one or two slots.

use super::block::BlockId;

/// Slots in a new table (a power of two).
const INITIAL_SLOTS: usize = 64;
/// 2^64 / golden ratio: multiplicative hashing's odd multiplier.
const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

/// Live allocations: address → block.
#[derive(Debug, Clone)]
pub struct AddressMap {
    /// (address, block); address 0 = empty slot.
    slots: Vec<(u64, BlockId)>,
    /// 64 - log2(slots.len()): the hash is the top bits of the product.
    shift: u32,
    len: usize,
}

impl Default for AddressMap {
    fn default() -> Self {
        Self {
            slots: vec![(0, 0); INITIAL_SLOTS],
            shift: 64 - INITIAL_SLOTS.trailing_zeros(),
            len: 0,
        }
    }
}

impl AddressMap {
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn home(&self, addr: u64) -> usize {
        (addr.wrapping_mul(FIBONACCI) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Slot holding `addr`, if present.
    #[inline]
    fn find(&self, addr: u64) -> Option<usize> {
        let mut i = self.home(addr);
        loop {
            match self.slots[i].0 {
                0 => return None,
                a if a == addr => return Some(i),
                _ => i = (i + 1) & self.mask(),
            }
        }
    }

    pub fn get(&self, addr: u64) -> Option<BlockId> {
        self.find(addr).map(|i| self.slots[i].1)
    }

    /// Map `addr` (non-zero) to `id`, replacing any previous entry.
    #[inline]
    pub fn insert(&mut self, addr: u64, id: BlockId) {
        debug_assert_ne!(addr, 0, "address 0 marks an empty slot");
        if 4 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mut i = self.home(addr);
        loop {
            let slot = &mut self.slots[i];
            if slot.0 == 0 {
                *slot = (addr, id);
                self.len += 1;
                return;
            }
            if slot.0 == addr {
                slot.1 = id;
                return;
            }
            i = (i + 1) & self.mask();
        }
    }

    /// Remove `addr`; returns its block if it was present.
    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<BlockId> {
        let mut hole = self.find(addr)?;
        let id = self.slots[hole].1;
        self.len -= 1;
        // Backward shift: move later entries of the probe run into the hole when their home
        // does not lie (cyclically) after the hole, so every entry stays reachable.
        let mask = self.mask();
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let (a, _) = self.slots[i];
            if a == 0 {
                break;
            }
            let home = self.home(a);
            if (i.wrapping_sub(home) & mask) >= (i.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[i];
                hole = i;
            }
        }
        self.slots[hole] = (0, 0);
        Some(id)
    }

    /// (address, block) pairs in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.slots.iter().copied().filter(|(a, _)| *a != 0)
    }

    #[cold]
    fn grow(&mut self) {
        let doubled = vec![(0, 0); self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        self.shift -= 1;
        self.len = 0;
        for (addr, id) in old.into_iter().filter(|(a, _)| *a != 0) {
            self.insert(addr, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn agrees_with_a_hash_map_under_churn() {
        let mut map = AddressMap::default();
        let mut reference = HashMap::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct addresses (many collisions and reuses), 512-byte aligned.
            let addr = ((x % 3000) + 1) * 512 + ((x >> 40) % 4) * (1 << 30);
            if x % 5 < 3 {
                map.insert(addr, i);
                reference.insert(addr, i);
            } else {
                assert_eq!(map.remove(addr), reference.remove(&addr));
            }
            let probe = (((x >> 20) % 3000) + 1) * 512;
            assert_eq!(map.get(probe), reference.get(&probe).copied());
        }
        assert_eq!(map.len(), reference.len());
        let mut listed: Vec<_> = map.iter().collect();
        listed.sort_unstable();
        let mut expect: Vec<_> = reference.into_iter().collect();
        expect.sort_unstable();
        assert_eq!(listed, expect);
    }
}
