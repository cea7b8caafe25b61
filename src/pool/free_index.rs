//! The free blocks of one (pool, stream): exact best fit ordered by (size, address).
//!
//! PyTorch keeps free blocks in an ordered set keyed by (stream, size, address) and takes the
//! first block not smaller than the request. We split the free blocks into size classes (eight
//! per power of two, like a floating-point number with a 3-bit mantissa) with a bitmap of the
//! non-empty classes; each class is an unordered vector. The best fit is the smallest fitting
//! (size, address) of the request's class, else the smallest of the next non-empty class — the
//! same answer as the ordered set. Classes are short (a few entries on real and synthetic
//! workloads), so a branch-free scan beats keeping them sorted: inserting is a push and removing
//! a swap, with no memory moved and no mispredicted search.
//!
//! Note: a class holding very many free blocks (thousands of equal-size blocks interleaved with
//! live ones) makes each lookup in it linear in its length — microseconds, not the logarithm
//! of an ordered set. The answer stays exact.

use super::block::BlockId;
use std::hint::select_unpredictable;

/// Sizes are multiples of this; classes count in these units.
const UNIT_SHIFT: u32 = 9; // 512 B
/// Classes per power of two (mantissa bits = 3).
const MANTISSA_BITS: u32 = 3;
const CLASSES_PER_OCTAVE: usize = 1 << MANTISSA_BITS;
/// Enough classes for sizes up to 2^60 bytes.
const NUM_CLASSES: usize = 400;
const BITMAP_WORDS: usize = NUM_CLASSES.div_ceil(64);

/// One free block as the index sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeEntry {
    pub size: u64,
    pub addr: u64,
    pub id: BlockId,
}

impl FreeEntry {
    /// The index's order, (size, address), as one number.
    #[inline]
    fn key(&self) -> u128 {
        (u128::from(self.size) << 64) | u128::from(self.addr)
    }
}

#[inline]
fn class_of(size: u64) -> usize {
    // Classes 0..8 are the sizes below 8 units; above, eight classes per power of two. Written
    // without a branch: e = max(exponent, MANTISSA_BITS) makes both cases one formula.
    let units = size >> UNIT_SHIFT;
    let exponent = (63 - (units | 1).leading_zeros()).max(MANTISSA_BITS);
    let shift = exponent - MANTISSA_BITS;
    let class = CLASSES_PER_OCTAVE * shift as usize + (units >> shift) as usize;
    class.min(NUM_CLASSES - 1)
}

/// Free blocks of one pool and stream.
#[derive(Debug)]
pub struct FreeIndex {
    /// A fixed-size array, so that a class number (always below `NUM_CLASSES`) needs no
    /// bounds check.
    classes: Box<[Vec<FreeEntry>; NUM_CLASSES]>,
    bitmap: [u64; BITMAP_WORDS],
    len: usize,
}

impl Default for FreeIndex {
    fn default() -> Self {
        Self {
            classes: Box::new(std::array::from_fn(|_| Vec::new())),
            bitmap: [0; BITMAP_WORDS],
            len: 0,
        }
    }
}

impl FreeIndex {
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn insert(&mut self, entry: FreeEntry) {
        let class = class_of(entry.size);
        self.classes[class].push(entry);
        self.bitmap[class / 64] |= 1 << (class % 64);
        self.len += 1;
    }

    /// Remove the entry with this size and address; false if absent.
    #[inline]
    pub fn remove(&mut self, size: u64, addr: u64) -> bool {
        let class = class_of(size);
        // Addresses of free blocks are distinct: match on the address, then check the size.
        let list = &self.classes[class];
        match list.iter().position(|e| e.addr == addr) {
            Some(pos) if list[pos].size == size => {
                self.take_at(class, pos);
                true
            }
            _ => false,
        }
    }

    /// Remove and return the smallest entry with `size >= min_size` (lowest address among
    /// equals) if `accept` takes it.
    #[inline]
    pub fn take_lower_bound(
        &mut self,
        min_size: u64,
        accept: impl FnOnce(&FreeEntry) -> bool,
    ) -> Option<FreeEntry> {
        let (class, pos) = self.find_lower_bound(min_size)?;
        if !accept(&self.classes[class][pos]) {
            return None;
        }
        Some(self.take_at(class, pos))
    }

    /// The smallest entry with `size >= min_size` (lowest address among equals).
    pub fn lower_bound(&self, min_size: u64) -> Option<FreeEntry> {
        let (class, pos) = self.find_lower_bound(min_size)?;
        Some(self.classes[class][pos])
    }

    /// (class, position) of the lower bound: the smallest fitting entry of the request's class,
    /// else the smallest entry of the next non-empty class (every entry there fits).
    #[inline]
    fn find_lower_bound(&self, min_size: u64) -> Option<(usize, usize)> {
        let class = class_of(min_size);
        if let Some(pos) = smallest_at_least(&self.classes[class], min_size) {
            return Some((class, pos));
        }
        let next = self.next_nonempty(class + 1)?;
        Some((
            next,
            smallest_at_least(&self.classes[next], 0).expect("non-empty class"),
        ))
    }

    #[inline]
    fn take_at(&mut self, class: usize, pos: usize) -> FreeEntry {
        let list = &mut self.classes[class];
        let entry = list.swap_remove(pos);
        if list.is_empty() {
            self.bitmap[class / 64] &= !(1 << (class % 64));
        }
        self.len -= 1;
        entry
    }

    fn next_nonempty(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        if word >= BITMAP_WORDS {
            return None;
        }
        let mut bits = self.bitmap[word] & (!0u64).checked_shl((from % 64) as u32).unwrap_or(0);
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word >= BITMAP_WORDS {
                return None;
            }
            bits = self.bitmap[word];
        }
    }

    /// Entries in (size, address) order (sorts each class: for the cold paths — release, GC,
    /// reports, the invariant walker).
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = FreeEntry> + '_ {
        self.classes.iter().flat_map(|list| {
            let mut sorted = list.clone();
            sorted.sort_unstable_by_key(FreeEntry::key);
            sorted
        })
    }

    /// Entries in descending (size, address) order.
    pub fn iter_desc(&self) -> impl Iterator<Item = FreeEntry> + '_ {
        self.iter().rev()
    }
}

/// Position of the entry with the smallest (size, address) among those with `size >= min_size`
/// (a linear scan: classes are short).
#[inline]
fn smallest_at_least(list: &[FreeEntry], min_size: u64) -> Option<usize> {
    // Branch-free body (the comparisons are data-dependent coin flips), on 64-bit halves so
    // that each select is one conditional move. The start (u64::MAX, u64::MAX) is beaten by
    // every fitting entry: no block is u64::MAX bytes long.
    let (mut best, mut best_size, mut best_addr) = (usize::MAX, u64::MAX, u64::MAX);
    for (i, e) in list.iter().enumerate() {
        let smaller = (e.size < best_size) | ((e.size == best_size) & (e.addr < best_addr));
        let better = (e.size >= min_size) & smaller;
        best = select_unpredictable(better, i, best);
        best_size = select_unpredictable(better, e.size, best_size);
        best_addr = select_unpredictable(better, e.addr, best_addr);
    }
    (best != usize::MAX).then_some(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn classes_are_monotonic() {
        let mut last = 0;
        for units in 1..100_000u64 {
            let c = class_of(units << UNIT_SHIFT);
            assert!(c >= last, "class of {units} units went down");
            last = c;
        }
        assert!(class_of(1 << 60) < NUM_CLASSES);
    }

    #[test]
    fn lower_bound_matches_an_ordered_set() {
        let mut index = FreeIndex::default();
        let mut set = BTreeSet::new();
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for i in 0..5000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let size = ((x % 4096) + 1) * 512 * if x.is_multiple_of(5) { 1024 } else { 1 };
            let addr = (x >> 20) & !511;
            if i % 3 == 2 && !set.is_empty() {
                let (s, a) = *set.iter().nth((x % set.len() as u64) as usize).unwrap();
                set.remove(&(s, a));
                assert!(index.remove(s, a));
            } else if set.insert((size, addr)) {
                index.insert(FreeEntry { size, addr, id: i });
            }
            let probe = ((x >> 7) % 8192 + 1) * 512 * if x.is_multiple_of(7) { 1024 } else { 1 };
            let expect = set.range((probe, 0)..).next().copied();
            assert_eq!(index.lower_bound(probe).map(|e| (e.size, e.addr)), expect);
        }
        assert_eq!(index.len(), set.len());
        let listed: Vec<_> = index.iter().map(|e| (e.size, e.addr)).collect();
        assert_eq!(listed, set.iter().copied().collect::<Vec<_>>());
        assert_eq!(
            index.iter_desc().next().map(|e| (e.size, e.addr)),
            set.iter().next_back().copied()
        );
    }
}
