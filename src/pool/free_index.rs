//! The free blocks of one (pool, stream): exact best fit ordered by (size, address).
//!
//! PyTorch keeps free blocks in an ordered set keyed by (stream, size, address) and takes the
//! first block not smaller than the request. We keep the same order, split into size classes
//! (eight per power of two, like a floating-point number with a 3-bit mantissa) with a bitmap
//! of the non-empty classes. Each class is a vector sorted by (size, address). The best fit is
//! the first fitting entry of the request's class, else the first entry of the next non-empty
//! class — the same answer as the ordered set, found with a binary search in a short vector and
//! a bit scan instead of a tree walk.

use super::block::BlockId;

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
    fn key(&self) -> (u64, u64) {
        (self.size, self.addr)
    }
}

/// Lists up to this long are searched linearly (predictable branches beat a binary search).
const LINEAR_SEARCH_MAX: usize = 16;

/// Index of the first entry of a (size, address)-sorted list for which `before` is false.
#[inline]
fn first_not(list: &[FreeEntry], before: impl Fn(&FreeEntry) -> bool) -> usize {
    if list.len() <= LINEAR_SEARCH_MAX {
        list.iter().position(|e| !before(e)).unwrap_or(list.len())
    } else {
        list.partition_point(before)
    }
}

#[inline]
fn class_of(size: u64) -> usize {
    let units = size >> UNIT_SHIFT;
    if units < CLASSES_PER_OCTAVE as u64 {
        return units as usize;
    }
    let exponent = 63 - units.leading_zeros();
    let mantissa = (units >> (exponent - MANTISSA_BITS)) as usize & (CLASSES_PER_OCTAVE - 1);
    let class = CLASSES_PER_OCTAVE * (exponent - MANTISSA_BITS + 1) as usize + mantissa;
    class.min(NUM_CLASSES - 1)
}

/// Free blocks of one pool and stream.
#[derive(Debug)]
pub struct FreeIndex {
    classes: Vec<Vec<FreeEntry>>,
    bitmap: [u64; BITMAP_WORDS],
    len: usize,
}

impl Default for FreeIndex {
    fn default() -> Self {
        Self {
            classes: vec![Vec::new(); NUM_CLASSES],
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
        let list = &mut self.classes[class];
        let pos = first_not(list, |e| e.key() < entry.key());
        list.insert(pos, entry);
        self.bitmap[class / 64] |= 1 << (class % 64);
        self.len += 1;
    }

    /// Remove the entry with this size and address; false if absent.
    #[inline]
    pub fn remove(&mut self, size: u64, addr: u64) -> bool {
        let class = class_of(size);
        let list = &mut self.classes[class];
        let pos = first_not(list, |e| e.key() < (size, addr));
        if pos == list.len() || list[pos].key() != (size, addr) {
            return false;
        }
        list.remove(pos);
        if list.is_empty() {
            self.bitmap[class / 64] &= !(1 << (class % 64));
        }
        self.len -= 1;
        true
    }

    /// Remove and return the smallest entry with `size >= min_size` if `accept` takes it.
    #[inline]
    pub fn take_lower_bound(
        &mut self,
        min_size: u64,
        accept: impl FnOnce(&FreeEntry) -> bool,
    ) -> Option<FreeEntry> {
        let mut class = class_of(min_size);
        let mut pos = first_not(&self.classes[class], |e| e.size < min_size);
        if pos == self.classes[class].len() {
            class = self.next_nonempty(class + 1)?;
            pos = 0;
        }
        let list = &mut self.classes[class];
        if !accept(&list[pos]) {
            return None;
        }
        let entry = list.remove(pos);
        if list.is_empty() {
            self.bitmap[class / 64] &= !(1 << (class % 64));
        }
        self.len -= 1;
        Some(entry)
    }

    /// The smallest entry with `size >= min_size` (lowest address among equals).
    pub fn lower_bound(&self, min_size: u64) -> Option<FreeEntry> {
        let class = class_of(min_size);
        let list = &self.classes[class];
        let pos = first_not(list, |e| e.size < min_size);
        if let Some(e) = list.get(pos) {
            return Some(*e);
        }
        let next = self.next_nonempty(class + 1)?;
        self.classes[next].first().copied()
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

    /// Entries in (size, address) order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = FreeEntry> + '_ {
        self.classes.iter().flat_map(|list| list.iter().copied())
    }

    /// Entries in descending (size, address) order.
    pub fn iter_desc(&self) -> impl Iterator<Item = FreeEntry> + '_ {
        self.iter().rev()
    }
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
