//! `AddressMap`: live allocations by address — the map every malloc inserts into and every
//! free removes from.
//!
//! A hash table whose buckets are one cache line each, holding four (address, block) pairs:
//! a lookup reads one line (a table with separate control bytes reads two, one after the
//! other — on a free, whose next step needs the block, that is a second wait for memory).
//! The four ways are compared without branches. A bucket that was full when an insert came
//! is marked `overflowed`, and lookups that miss in it go on to the next bucket (linear
//! probing by bucket); the table is rebuilt, clearing the marks, when it grows or when too many
//! buckets carry one. Address 0 marks an empty way: no block starts at address 0.

use super::block::{BlockId, NIL};
use std::hint::select_unpredictable;

const WAYS: usize = 4;
/// Buckets of a new table (a power of two).
const INITIAL_BUCKETS: usize = 16;

/// Four (address, block) pairs in one cache line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Bucket {
    addrs: [u64; WAYS],
    ids: [BlockId; WAYS],
    /// An insert found this bucket full and went on to the next one.
    overflowed: bool,
}

const EMPTY: Bucket = Bucket {
    addrs: [0; WAYS],
    ids: [NIL; WAYS],
    overflowed: false,
};

impl Bucket {
    /// The way holding `addr`, if any (branch-free over the four ways).
    #[inline]
    fn way_of(&self, addr: u64) -> Option<usize> {
        let mut way = WAYS;
        for w in 0..WAYS {
            way = select_unpredictable(self.addrs[w] == addr, w, way);
        }
        (way < WAYS).then_some(way)
    }
}

/// Live allocations: address → block.
#[derive(Debug, Clone)]
pub struct AddressMap {
    buckets: Vec<Bucket>,
    /// 64 − log2(number of buckets): a hash's top bits pick the bucket.
    shift: u32,
    len: usize,
    /// Buckets marked `overflowed`.
    overflowed: usize,
}

impl Default for AddressMap {
    fn default() -> Self {
        Self::with_buckets(INITIAL_BUCKETS)
    }
}

impl AddressMap {
    fn with_buckets(buckets: usize) -> Self {
        debug_assert!(buckets.is_power_of_two());
        Self {
            buckets: vec![EMPTY; buckets],
            shift: 64 - buckets.trailing_zeros(),
            len: 0,
            overflowed: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The home bucket of `addr`: the top bits of a multiplicative (Fibonacci) hash.
    #[inline]
    fn home(&self, addr: u64) -> usize {
        (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    #[inline]
    fn next(&self, bucket: usize) -> usize {
        (bucket + 1) & (self.buckets.len() - 1)
    }

    /// (bucket, way) of `addr`.
    #[inline(always)]
    fn find(&self, addr: u64) -> Option<(usize, usize)> {
        // Callers pass a `DevicePtr`'s address, never 0 (which would match an empty way).
        debug_assert!(addr != 0, "address 0 is never live");
        let mut b = self.home(addr);
        loop {
            let bucket = &self.buckets[b];
            if let Some(way) = bucket.way_of(addr) {
                return Some((b, way));
            }
            if !bucket.overflowed {
                return None;
            }
            b = self.next(b);
        }
    }

    #[inline]
    pub fn get(&self, addr: u64) -> Option<BlockId> {
        let (b, way) = self.find(addr)?;
        Some(self.buckets[b].ids[way])
    }

    /// Record a new live allocation; `addr` must not be in the map (the pool hands out each
    /// address once until it is freed — `validate()` checks the map against the blocks).
    #[inline]
    pub fn insert(&mut self, addr: u64, id: BlockId) {
        debug_assert!(addr != 0, "address 0 marks an empty way");
        debug_assert!(self.get(addr).is_none(), "{addr:#x} is already live");
        // At most half of the ways in use.
        if 2 * (self.len + 1) > WAYS * self.buckets.len() {
            self.rebuild(2 * self.buckets.len());
        }
        let mut b = self.home(addr);
        loop {
            let bucket = &mut self.buckets[b];
            // An empty way holds address 0.
            if let Some(way) = bucket.way_of(0) {
                bucket.addrs[way] = addr;
                bucket.ids[way] = id;
                break;
            }
            if !bucket.overflowed {
                bucket.overflowed = true;
                self.overflowed += 1;
            }
            b = self.next(b);
        }
        self.len += 1;
    }

    #[inline(always)]
    pub fn remove(&mut self, addr: u64) -> Option<BlockId> {
        let (b, way) = self.find(addr)?;
        let bucket = &mut self.buckets[b];
        bucket.addrs[way] = 0;
        self.len -= 1;
        let id = bucket.ids[way];
        if self.overflowed > self.buckets.len() / 8 {
            self.tidy();
        }
        Some(id)
    }

    /// Marks only accumulate: start clean once they would slow too many lookups, in a larger
    /// table if a clean one still has that many full buckets.
    #[cold]
    #[inline(never)]
    fn tidy(&mut self) {
        self.rebuild(self.buckets.len());
        if self.overflowed > self.buckets.len() / 8 {
            self.rebuild(2 * self.buckets.len());
        }
    }

    /// Re-insert every pair into a table of `buckets` buckets, with no overflow marks.
    #[cold]
    #[inline(never)]
    fn rebuild(&mut self, buckets: usize) {
        let old = std::mem::replace(self, Self::with_buckets(buckets));
        for (addr, id) in old.iter() {
            self.insert(addr, id);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, BlockId)> + '_ {
        self.buckets.iter().flat_map(|b| {
            (0..WAYS)
                .filter(|&w| b.addrs[w] != 0)
                .map(|w| (b.addrs[w], b.ids[w]))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn behaves_as_a_map_through_growth_overflow_and_rebuilds() {
        let mut map = AddressMap::default();
        let mut model: HashMap<u64, BlockId> = HashMap::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Clustered, 512-aligned addresses (as segments hand them out), few enough live
            // that inserts and removes both hit.
            let addr = 0x7f00_0000_0000 + ((x % 6000) << 9);
            if let Some(id) = model.remove(&addr) {
                assert_eq!(map.remove(addr), Some(id), "remove {addr:#x}");
            } else if i % 5 != 0 {
                map.insert(addr, i);
                model.insert(addr, i);
            }
            assert_eq!(map.get(addr), model.get(&addr).copied());
            assert_eq!(map.len(), model.len());
        }
        let mut listed: Vec<_> = map.iter().collect();
        listed.sort_unstable();
        let mut expected: Vec<_> = model.into_iter().collect();
        expected.sort_unstable();
        assert_eq!(listed, expected);
        assert!(map.buckets.len() > INITIAL_BUCKETS, "the table grew");
    }

    #[test]
    fn a_full_home_bucket_sends_lookups_on_to_the_next() {
        let mut map = AddressMap::with_buckets(INITIAL_BUCKETS);
        // Addresses with the same home bucket, more than it holds.
        let home = map.home(512);
        let same: Vec<u64> = (1..100_000u64)
            .map(|k| k << 9)
            .filter(|&a| map.home(a) == home)
            .take(WAYS + 2)
            .collect();
        for (i, &a) in same.iter().enumerate() {
            map.insert(a, i as BlockId);
        }
        assert!(map.buckets[home].overflowed);
        for (i, &a) in same.iter().enumerate() {
            assert_eq!(map.get(a), Some(i as BlockId));
        }
        assert_eq!(map.remove(same[0]), Some(0));
        assert_eq!(map.get(same[WAYS + 1]), Some((WAYS + 1) as BlockId));
        assert_eq!(map.get(same[0]), None);
    }
}
