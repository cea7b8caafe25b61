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
//! A class that grows long (many free blocks of one size, interleaved with live ones: the same
//! tensor shape freed layer after layer) would make each search linear in its length. When a
//! search or a removal meets a class longer than `LONG_CLASS`, the class's entries are filed:
//! into a vector sorted in descending order (the smallest last, so that a search the smallest
//! fits — most do: a long class is mostly one size — reads one entry, and taking it is a pop),
//! and, once the class holds more than `FILED_SORTED_CAP` filed entries, into an ordered map of
//! its own, where every operation is logarithmic (the cap bounds what a removal from the
//! vector moves; the map keeps its smallest entry beside it for the same quick search). Blocks
//! freed afterwards are listed in the class's vector again, so a search of a class with filed
//! entries takes the better of its vector's best and the filed one; listed entries are filed
//! too once they are several (more than `FILED_CLASS_LISTED` when a filed entry is removed,
//! more than `SEARCH_REFILE` when the class is searched), and the filed part is dropped when
//! its last entry is taken. A class that never grew long pays a test of its filed pointer per
//! search and a length check when an entry is taken.

use super::block::{BlockId, NextLink};
use super::block_table::Moved;
use std::collections::BTreeMap;
use std::hint::select_unpredictable;

/// Sizes are multiples of this; classes count in these units.
const UNIT_SHIFT: u32 = 9; // 512 B
/// Classes per power of two (mantissa bits = 3).
const MANTISSA_BITS: u32 = 3;
const CLASSES_PER_OCTAVE: usize = 1 << MANTISSA_BITS;
/// Enough classes for sizes up to 2^60 bytes.
const NUM_CLASSES: usize = 400;
const BITMAP_WORDS: usize = NUM_CLASSES.div_ceil(64);
/// A class whose vector is longer than this when searched is filed.
const LONG_CLASS: usize = 24;
/// A class with filed entries has its listed entries filed too when they are more than this
/// and a filed entry is removed.
const FILED_CLASS_LISTED: usize = 8;
/// ... or more than this and the class is searched (filing them on every search past
/// `FILED_CLASS_LISTED` would move through the sorted vector entries that a take would have
/// found listed: many free blocks of one size churning).
const SEARCH_REFILE: usize = 12;
/// Most entries a filed class keeps in its sorted vector; beyond, they move to an ordered map,
/// so that a removal never moves more than this many entries.
const FILED_SORTED_CAP: usize = 256;

/// One free block as the index sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeEntry {
    pub size: u64,
    pub addr: u64,
    pub id: BlockId,
    /// What taking the block needs of it besides its size and address (native segments).
    pub link: NextLink,
}

impl FreeEntry {
    /// The entry of a block that is not split (a test's block).
    #[cfg(test)]
    fn unsplit(size: u64, addr: u64, id: BlockId) -> Self {
        Self {
            size,
            addr,
            id,
            ..Self::default()
        }
    }

    /// The block's entry after a table rebuild moved the blocks.
    fn moved(self, moved: &Moved) -> Self {
        Self {
            id: moved.id(self.id),
            link: self.link.moved(moved),
            ..self
        }
    }

    /// The index's order, (size, address), as one number.
    #[inline]
    fn key(&self) -> u128 {
        order_key(self.size, self.addr)
    }
}

/// (size, address) as one number, which orders as the index orders blocks.
#[inline]
fn order_key(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
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

/// Entries of a class that grew long, in (size, address) order, never empty.
#[derive(Debug)]
enum Filed {
    /// At most `FILED_SORTED_CAP` entries in descending (size, address) order: the smallest is
    /// last, so that a search it fits reads one entry and taking it is a pop.
    Sorted(Vec<FreeEntry>),
    /// More: an ordered map (size, address) → block, with its smallest entry kept beside it (a
    /// search whose request the smallest fits — most of them, a long class being mostly one
    /// size — reads it instead of searching the map).
    Map {
        map: BTreeMap<(u64, u64), (BlockId, NextLink)>,
        /// The map's first entry.
        min: FreeEntry,
    },
}

impl Filed {
    fn len(&self) -> usize {
        match self {
            Filed::Sorted(v) => v.len(),
            Filed::Map { map, .. } => map.len(),
        }
    }

    /// The smallest entry with `size >= min_size` (lowest address among equals).
    fn lower_bound(&self, min_size: u64) -> Option<FreeEntry> {
        match self {
            Filed::Sorted(v) => {
                let last = *v.last().expect("a filed class is never empty");
                if last.size >= min_size {
                    return Some(last);
                }
                let fitting = v.partition_point(|e| e.size >= min_size);
                fitting.checked_sub(1).map(|i| v[i])
            }
            Filed::Map { map, min } => {
                if min.size >= min_size {
                    Some(*min)
                } else {
                    map.range((min_size, 0)..).next().map(filed_entry)
                }
            }
        }
    }

    /// The smallest entry after `after` (any, when `None`) in (size, address) order.
    fn first_after(&self, after: Option<&FreeEntry>) -> Option<FreeEntry> {
        match self {
            Filed::Sorted(v) => {
                let end = after.map_or(v.len(), |a| entries_above(v, a.key()));
                end.checked_sub(1).map(|i| v[i])
            }
            Filed::Map { map, .. } => {
                let from = match after {
                    Some(e) => std::ops::Bound::Excluded((e.size, e.addr)),
                    None => std::ops::Bound::Unbounded,
                };
                map.range((from, std::ops::Bound::Unbounded))
                    .next()
                    .map(filed_entry)
            }
        }
    }

    /// Remove the entry with this size and address; false if absent. May leave it empty.
    fn remove(&mut self, size: u64, addr: u64) -> bool {
        match self {
            Filed::Sorted(v) => {
                let key = order_key(size, addr);
                if v.last().is_some_and(|e| e.key() == key) {
                    v.pop();
                    return true;
                }
                let pos = entries_above(v, key);
                if v.get(pos).is_some_and(|e| e.key() == key) {
                    v.remove(pos);
                    true
                } else {
                    false
                }
            }
            Filed::Map { map, min } => {
                let key = (size, addr);
                if map.remove(&key).is_none() {
                    return false;
                }
                if key == (min.size, min.addr)
                    && let Some(first) = map.first_key_value()
                {
                    *min = filed_entry(first);
                }
                true
            }
        }
    }

    /// Add these entries (listed ones being filed); past the cap, the vector becomes a map.
    fn extend(&mut self, entries: impl Iterator<Item = FreeEntry>) {
        match self {
            Filed::Sorted(v) => {
                let filed = v.len();
                v.extend(entries);
                if v.len() > FILED_SORTED_CAP {
                    // Into a map, which orders them itself.
                    *self = Filed::of(std::mem::take(v)).expect("not empty");
                } else {
                    merge_filed(v, filed);
                }
            }
            Filed::Map { map, min } => {
                for e in entries {
                    if e.key() < min.key() {
                        *min = e;
                    }
                    let (key, value) = map_item(&e);
                    map.insert(key, value);
                }
            }
        }
    }

    /// A new filed part holding `entries` (`None` when there are none).
    fn of(mut entries: Vec<FreeEntry>) -> Option<Filed> {
        if entries.len() > FILED_SORTED_CAP {
            let map: BTreeMap<_, _> = entries.iter().map(map_item).collect();
            let min = map.first_key_value().map(filed_entry)?;
            return Some(Filed::Map { map, min });
        }
        sort_descending(&mut entries);
        (!entries.is_empty()).then_some(Filed::Sorted(entries))
    }

    /// The entries, in no particular order.
    fn entries(&self) -> impl Iterator<Item = FreeEntry> + '_ {
        let (sorted, map) = match self {
            Filed::Sorted(v) => (Some(v.iter().copied()), None),
            Filed::Map { map, .. } => (None, Some(map.iter().map(filed_entry))),
        };
        sorted
            .into_iter()
            .flatten()
            .chain(map.into_iter().flatten())
    }

    /// Name each entry's block by its new id.
    fn follow_moved_blocks(&mut self, moved: &Moved) {
        match self {
            Filed::Sorted(v) => v.iter_mut().for_each(|e| *e = e.moved(moved)),
            Filed::Map { map, min } => {
                map.values_mut()
                    .for_each(|(id, link)| (*id, *link) = (moved.id(*id), link.moved(moved)));
                *min = min.moved(moved);
            }
        }
    }
}

/// One size class: its listed entries and, once it grew long, its filed ones.
#[derive(Debug, Default)]
struct SizeClass {
    /// The entries not filed, in no order.
    listed: Vec<FreeEntry>,
    /// The filed entries; `None` when there are none (boxed: most classes never have any).
    filed: Option<Box<Filed>>,
}

impl SizeClass {
    fn has_filed(&self) -> bool {
        self.filed.is_some()
    }
}

/// How many entries of a vector in descending (size, address) order come before `key`: where
/// an entry with that key is, or would be inserted.
fn entries_above(v: &[FreeEntry], key: u128) -> usize {
    v.partition_point(|e| e.key() > key)
}

/// Sort into the order of a filed vector: descending (size, address), the smallest last.
fn sort_descending(entries: &mut [FreeEntry]) {
    entries.sort_unstable_by_key(|e| std::cmp::Reverse(e.key()));
}

/// Most entries that `merge_filed` merges through its buffer on the stack; more are sorted with
/// the others (a class's listed entries are filed when they are a dozen or two).
const MERGED_AT_ONCE: usize = 32;

/// Put `v[filed..]` (entries being filed, in no order) into the descending (size, address)
/// order of `v[..filed]`: sorted among themselves, then merged from the back in one pass, so
/// that each entry already filed moves at most once. Inserting them one at a time moved the
/// entries after each insertion point, once per insert: on the log-uniform benchmark, a filing
/// of about ten entries moved about twenty entries per insert, and filing took 1.6 % of the
/// benchmark's time, 0.8 % with the merge (sampled with `perf record -e cpu-clock`).
fn merge_filed(v: &mut [FreeEntry], filed: usize) {
    let added = v.len() - filed;
    if added > MERGED_AT_ONCE {
        sort_descending(v);
        return;
    }
    sort_descending(&mut v[filed..]);
    let mut new = [FreeEntry::default(); MERGED_AT_ONCE];
    new[..added].copy_from_slice(&v[filed..]);
    // Fill `v` from its end with the smaller of the two runs' smallest remaining entries (keys
    // are distinct: free blocks never share an address); the filed entries left when the new
    // ones run out are already in place. (The loop keeps its own `to`: derived as
    // `old_left + new_left - 1` in a `while` loop, log-uniform measured 2-3 % slower.)
    let (mut old_left, mut new_left) = (filed, added);
    for to in (0..v.len()).rev() {
        if new_left == 0 {
            break;
        }
        if old_left > 0 && v[old_left - 1].key() < new[new_left - 1].key() {
            v[to] = v[old_left - 1];
            old_left -= 1;
        } else {
            v[to] = new[new_left - 1];
            new_left -= 1;
        }
    }
}

/// An entry as a class's ordered map holds it: keyed by its order, (size, address).
fn map_item(e: &FreeEntry) -> ((u64, u64), (BlockId, NextLink)) {
    ((e.size, e.addr), (e.id, e.link))
}

/// A filed entry as the index hands it out (an item of a class's ordered map; `map_item`'s
/// inverse).
fn filed_entry((&(size, addr), &(id, link)): (&(u64, u64), &(BlockId, NextLink))) -> FreeEntry {
    FreeEntry {
        size,
        addr,
        id,
        link,
    }
}

/// Where the lower bound of a search was found.
#[derive(Clone, Copy)]
enum Slot {
    /// In a class's listed entries: (class, position).
    Listed(usize, usize),
    /// In a class's filed entries (sorted vector or ordered map): (class, entry).
    Filed(usize, FreeEntry),
}

/// Free blocks of one pool and stream.
#[derive(Debug)]
pub struct FreeIndex {
    /// A fixed-size array, so that a class number (always below `NUM_CLASSES`) needs no
    /// bounds check.
    classes: Box<[SizeClass; NUM_CLASSES]>,
    /// Classes with at least one entry, short or long.
    bitmap: [u64; BITMAP_WORDS],
}

impl Default for FreeIndex {
    fn default() -> Self {
        Self {
            classes: Box::new(std::array::from_fn(|_| SizeClass::default())),
            bitmap: [0; BITMAP_WORDS],
        }
    }
}

impl FreeIndex {
    /// Number of entries (counted, not kept: only the out-of-memory report asks).
    pub fn len(&self) -> usize {
        self.classes
            .iter()
            .map(|c| c.listed.len() + c.filed.as_ref().map_or(0, |f| f.len()))
            .sum()
    }

    #[inline]
    pub fn insert(&mut self, entry: FreeEntry) {
        let class = class_of(entry.size);
        self.classes[class].listed.push(entry);
        self.bitmap[class / 64] |= 1 << (class % 64);
    }

    /// Remove the entry with this size and address; false if absent.
    #[inline]
    pub fn remove(&mut self, size: u64, addr: u64) -> bool {
        let class = class_of(size);
        // Addresses of free blocks are distinct: match on the address, then check the size.
        let list = &self.classes[class].listed;
        match list.iter().position(|e| e.addr == addr) {
            Some(pos) if list[pos].size == size => {
                self.take_at(class, pos);
                true
            }
            None if self.classes[class].has_filed() => self.remove_filed(class, size, addr),
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
        let class = class_of(min_size);
        let size_class = &self.classes[class];
        let listed = size_class.listed.len();
        if listed > SEARCH_REFILE && (listed > LONG_CLASS || size_class.has_filed()) {
            self.file(class);
        }
        match self.find_lower_bound(class, min_size)? {
            Slot::Listed(class, pos) => {
                if !accept(&self.classes[class].listed[pos]) {
                    return None;
                }
                Some(self.take_at(class, pos))
            }
            Slot::Filed(class, entry) => {
                if !accept(&entry) {
                    return None;
                }
                self.remove_filed(class, entry.size, entry.addr);
                Some(entry)
            }
        }
    }

    /// The smallest entry with `size >= min_size` (lowest address among equals).
    pub fn lower_bound(&self, min_size: u64) -> Option<FreeEntry> {
        Some(match self.find_lower_bound(class_of(min_size), min_size)? {
            Slot::Listed(class, pos) => self.classes[class].listed[pos],
            Slot::Filed(_, entry) => entry,
        })
    }

    /// The entry after `entry` in (size, address) order (a cold path: expandable segments).
    pub fn successor(&self, entry: &FreeEntry) -> Option<FreeEntry> {
        let class = class_of(entry.size);
        self.smallest_of_class_after(class, Some(entry))
            .or_else(|| {
                let next = self.next_nonempty(class + 1)?;
                self.smallest_of_class_after(next, None)
            })
    }

    /// The smallest entry of `class`, listed or filed, that comes after `after` (any, when
    /// `None`) in (size, address) order.
    fn smallest_of_class_after(
        &self,
        class: usize,
        after: Option<&FreeEntry>,
    ) -> Option<FreeEntry> {
        let c = &self.classes[class];
        let key = after.map_or(0, FreeEntry::key);
        let listed = c
            .listed
            .iter()
            .filter(|e| after.is_none() || e.key() > key)
            .min_by_key(|e| e.key())
            .copied();
        let filed = c.filed.as_ref().and_then(|f| f.first_after(after));
        listed.into_iter().chain(filed).min_by_key(FreeEntry::key)
    }

    /// The lower bound: the smallest fitting entry of the request's class (`class`, the class
    /// of `min_size`), else the smallest entry of the next non-empty class (every entry there
    /// fits).
    #[inline]
    fn find_lower_bound(&self, class: usize, min_size: u64) -> Option<Slot> {
        let listed = smallest_at_least(&self.classes[class].listed, min_size);
        if self.classes[class].has_filed() {
            if let Some(found) = self.best_with_filed(class, min_size, listed) {
                return Some(found);
            }
        } else if let Some(pos) = listed {
            return Some(Slot::Listed(class, pos));
        }
        let next = self.next_nonempty(class + 1)?;
        let listed = smallest_at_least(&self.classes[next].listed, 0);
        if self.classes[next].has_filed() {
            return self.best_with_filed(next, min_size, listed);
        }
        Some(Slot::Listed(next, listed.expect("non-empty class")))
    }

    /// The better of the listed candidate of a long class and its smallest filed entry not
    /// below `min_size`.
    #[cold]
    #[inline(never)]
    fn best_with_filed(&self, class: usize, min_size: u64, listed: Option<usize>) -> Option<Slot> {
        let filed = self.classes[class]
            .filed
            .as_ref()
            .and_then(|f| f.lower_bound(min_size));
        match (listed, filed) {
            (Some(pos), Some(f)) if self.classes[class].listed[pos].key() > f.key() => {
                Some(Slot::Filed(class, f))
            }
            (Some(pos), _) => Some(Slot::Listed(class, pos)),
            (None, f) => f.map(|f| Slot::Filed(class, f)),
        }
    }

    #[inline]
    fn take_at(&mut self, class: usize, pos: usize) -> FreeEntry {
        let size_class = &mut self.classes[class];
        let entry = size_class.listed.swap_remove(pos);
        if size_class.listed.is_empty() && !size_class.has_filed() {
            self.bitmap[class / 64] &= !(1 << (class % 64));
        }
        if size_class.listed.len() > LONG_CLASS {
            self.file(class);
        }
        entry
    }

    /// Move the listed entries of `class` into its filed part: a scan of it grew long.
    #[cold]
    #[inline(never)]
    fn file(&mut self, class: usize) {
        let size_class = &mut self.classes[class];
        match size_class.filed.as_mut() {
            None => {
                size_class.filed = Filed::of(std::mem::take(&mut size_class.listed)).map(Box::new);
            }
            Some(filed) => filed.extend(size_class.listed.drain(..)),
        }
    }

    /// Remove a filed entry of `class`; false if there is none with this size and address.
    #[cold]
    #[inline(never)]
    fn remove_filed(&mut self, class: usize, size: u64, addr: u64) -> bool {
        let size_class = &mut self.classes[class];
        let Some(filed) = size_class.filed.as_mut() else {
            return false;
        };
        if !filed.remove(size, addr) {
            return false;
        }
        if filed.len() == 0 {
            size_class.filed = None;
            if size_class.listed.is_empty() {
                self.bitmap[class / 64] &= !(1 << (class % 64));
            }
        }
        // Entries listed since the class was filed: file them too once they are several, or
        // searches that keep finding a filed entry would keep scanning them (every search of
        // this class scans its listed entries).
        if self.classes[class].listed.len() > FILED_CLASS_LISTED {
            self.file(class);
        }
        true
    }

    /// The block table was rebuilt: name each entry's block by its new id.
    pub fn follow_moved_blocks(&mut self, moved: &Moved) {
        for class in self.classes.iter_mut() {
            for e in class.listed.iter_mut() {
                *e = e.moved(moved);
            }
            if let Some(filed) = class.filed.as_mut() {
                filed.follow_moved_blocks(moved);
            }
        }
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

    /// Entries in (size, address) order (collected and sorted: for the cold paths — release, GC,
    /// reports, the invariant walker).
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = FreeEntry> + '_ {
        let mut all: Vec<FreeEntry> = self
            .classes
            .iter()
            .flat_map(|c| {
                let filed = c.filed.iter().flat_map(|f| f.entries());
                c.listed.iter().copied().chain(filed)
            })
            .collect();
        all.sort_unstable_by_key(FreeEntry::key);
        all.into_iter()
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
    // that each select is one conditional move. Entries are compared by (excess, address), the
    // excess being `size - min_size` wrapped: a fitting entry's excess is below `!min_size`
    // (no block is u64::MAX bytes long), a smaller entry's wraps above it, so a fitting entry
    // beats every smaller one with no test of its own, and the winner fits if any does. The
    // start (u64::MAX, u64::MAX) is beaten by every entry (no block starts at address
    // u64::MAX), and fails the final test when there is none.
    let (mut best, mut best_excess, mut best_addr) = (usize::MAX, u64::MAX, u64::MAX);
    for (i, e) in list.iter().enumerate() {
        let excess = e.size.wrapping_sub(min_size);
        let better = order_key(excess, e.addr) < order_key(best_excess, best_addr);
        best = select_unpredictable(better, i, best);
        best_excess = select_unpredictable(better, excess, best_excess);
        best_addr = select_unpredictable(better, e.addr, best_addr);
    }
    (best_excess < !min_size).then_some(best)
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

    /// Many free blocks of a few equal sizes (one tensor shape freed layer after layer): the
    /// classes grow long, are filed (sorted vectors, then ordered maps), and every answer stays
    /// exact.
    #[test]
    fn long_classes_are_filed_and_answer_like_an_ordered_set() {
        let mut index = FreeIndex::default();
        let mut set = BTreeSet::new();
        let mut x: u64 = 0x2545f4914f6cdd1d;
        let mut filed_at_some_point = false;
        let (mut sorted_at_some_point, mut map_at_some_point) = (false, false);
        for i in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Three sizes in one class (80) and one in a class above it (82).
            let size = [2 << 20, (2 << 20) + 512, (2 << 20) + 4096, 5 << 19][(x % 4) as usize];
            let addr = ((x >> 8) % 4096) << 21;
            let probe =
                [(2 << 20) - 512, (2 << 20) + 1024, 2 << 20, (5 << 19) + 1][(x >> 60) as usize % 4];
            match (x >> 32) % 8 {
                0..=3 => {
                    // Free blocks never share an address.
                    if !set.iter().any(|&(_, a)| a == addr) {
                        set.insert((size, addr));
                        index.insert(FreeEntry::unsplit(size, addr, i));
                    }
                }
                4 | 5 => {
                    let expect = set.range((probe, 0)..).next().copied();
                    let took = index
                        .take_lower_bound(probe, |_| true)
                        .map(|e| (e.size, e.addr));
                    assert_eq!(took, expect, "take_lower_bound({probe})");
                    if let Some(key) = expect {
                        set.remove(&key);
                    }
                }
                _ => {
                    if let Some(&(s, a)) = set.iter().nth((x >> 12) as usize % set.len().max(1)) {
                        assert!(index.remove(s, a), "remove ({s}, {a:#x})");
                        set.remove(&(s, a));
                    }
                    assert!(!index.remove(size, addr + 512), "removed an absent entry");
                    if let Some(&(s, a)) = set.iter().next() {
                        assert!(!index.remove(s + 512, a), "removed with the wrong size");
                    }
                }
            }
            filed_at_some_point |= index.classes.iter().any(SizeClass::has_filed);
            for filed in index.classes.iter().filter_map(|c| c.filed.as_deref()) {
                match filed {
                    Filed::Sorted(v) => {
                        sorted_at_some_point = true;
                        assert!(!v.is_empty() && v.len() <= FILED_SORTED_CAP);
                        assert!(v.is_sorted_by_key(|e| std::cmp::Reverse(e.key())));
                    }
                    Filed::Map { map, min } => {
                        map_at_some_point = true;
                        let first = map.first_key_value().map(filed_entry);
                        assert_eq!(first, Some(*min), "a filed class's kept smallest entry");
                    }
                }
            }
            let expect = set.range((probe, 0)..).next().copied();
            let found = index.lower_bound(probe);
            assert_eq!(found.map(|e| (e.size, e.addr)), expect);
            if let Some(found) = found {
                // The entry after it, listed or filed, in this class or the next non-empty one.
                let after = set
                    .range((
                        std::ops::Bound::Excluded((found.size, found.addr)),
                        std::ops::Bound::Unbounded,
                    ))
                    .next()
                    .copied();
                assert_eq!(index.successor(&found).map(|e| (e.size, e.addr)), after);
            }
            assert_eq!(index.len(), set.len());
        }
        assert!(filed_at_some_point, "no class grew long enough to be filed");
        assert!(
            sorted_at_some_point && map_at_some_point,
            "a filed kind never held"
        );
        let listed: Vec<_> = index.iter().map(|e| (e.size, e.addr)).collect();
        assert_eq!(listed, set.iter().copied().collect::<Vec<_>>());
        while let Some(e) = index.take_lower_bound(0, |_| true) {
            assert_eq!(Some((e.size, e.addr)), set.pop_first());
        }
        assert!(set.is_empty() && index.len() == 0 && index.bitmap == [0; BITMAP_WORDS]);
    }

    /// Listed entries filed into a class's sorted vector, a few (merged) or many (sorted with
    /// it), leave it holding every entry in descending (size, address) order.
    #[test]
    fn filing_into_a_sorted_vector_keeps_every_entry_in_order() {
        let mut x: u64 = 0x5851_f42d_4c95_7f2d;
        let mut next_entry = |id: u32| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few sizes, so that equal sizes are ordered by address.
            let size = (1 + x % 3) << 20;
            // Random addresses, made distinct by the id in their low bits.
            let addr = ((x >> 24) << 30) | ((u64::from(id) + 1) << 9);
            FreeEntry::unsplit(size, addr, id)
        };
        for (filed, added) in [(1usize, 1usize), (20, 9), (40, 32), (5, 33), (100, 60)] {
            let mut all: Vec<FreeEntry> =
                (0..filed + added).map(|i| next_entry(i as u32)).collect();
            let mut part = Filed::of(all[..filed].to_vec()).expect("not empty");
            part.extend(all[filed..].iter().copied());
            all.sort_unstable_by_key(|e| std::cmp::Reverse(e.key()));
            let Filed::Sorted(v) = part else {
                panic!("{} entries fit the sorted vector", filed + added)
            };
            assert_eq!(v, all, "{filed} filed, {added} added");
        }
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
                index.insert(FreeEntry::unsplit(size, addr, i));
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
