//! `SegmentMap`: the segments obtained from the device, start address → size — which segment
//! holds an address (every `cudaFree` through the shim asks, to find the owning device), and
//! the bookkeeping of each new or released segment.
//!
//! A vector sorted by start address, highest first. The driver hands out new segments mostly
//! top-down, below the ones already there, so a new segment is usually appended; a lookup is a
//! binary search over contiguous memory. An insert or removal elsewhere moves the entries
//! after it, which is never more than a small fraction of the `cudaMalloc` or `cudaFree` that
//! comes with it.

/// Segments: (start, size), sorted by start, descending.
#[derive(Debug, Default, Clone)]
pub struct SegmentMap {
    by_start_desc: Vec<(u64, u64)>,
}

impl SegmentMap {
    pub fn len(&self) -> usize {
        self.by_start_desc.len()
    }

    /// Position of the first segment starting at or below `addr`.
    fn first_at_or_below(&self, addr: u64) -> usize {
        self.by_start_desc
            .partition_point(|&(start, _)| start > addr)
    }

    /// Record a segment; its start must not be in the map.
    pub fn insert(&mut self, start: u64, size: u64) {
        // The usual case first: a segment below all the others (top-down placement).
        if self.by_start_desc.last().is_none_or(|&(s, _)| s > start) {
            self.by_start_desc.push((start, size));
            return;
        }
        let at = self.first_at_or_below(start);
        debug_assert!(self.by_start_desc.get(at).is_none_or(|&(s, _)| s != start));
        self.by_start_desc.insert(at, (start, size));
    }

    /// Forget the segment starting at `start`; its size, if it was there.
    pub fn remove(&mut self, start: u64) -> Option<u64> {
        let at = self.first_at_or_below(start);
        match self.by_start_desc.get(at) {
            Some(&(s, size)) if s == start => {
                self.by_start_desc.remove(at);
                Some(size)
            }
            _ => None,
        }
    }

    /// The size of the segment starting exactly at `start`.
    pub fn get(&self, start: u64) -> Option<u64> {
        match self.by_start_desc.get(self.first_at_or_below(start)) {
            Some(&(s, size)) if s == start => Some(size),
            _ => None,
        }
    }

    /// The segment with the highest start at or below `addr`: (start, size).
    pub fn at_or_below(&self, addr: u64) -> Option<(u64, u64)> {
        self.by_start_desc
            .get(self.first_at_or_below(addr))
            .copied()
    }

    /// (start, size) of every segment, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_start_desc.iter().rev().copied()
    }

    /// Whether `[start, start + size)` shares an address with a segment (true when it would
    /// run past the end of the address space): the segment with the highest start below its
    /// end reaches past its start.
    pub fn overlaps(&self, start: u64, size: u64) -> bool {
        let Some(end) = start.checked_add(size) else {
            return true;
        };
        end.checked_sub(1)
            .and_then(|last| self.at_or_below(last))
            .is_some_and(|(s, z)| s + z > start)
    }

    /// The segment `addr` lies inside: (start, size).
    pub fn containing(&self, addr: u64) -> Option<(u64, u64)> {
        self.at_or_below(addr)
            .filter(|&(start, size)| addr - start < size)
    }

    /// Whether `addr` lies inside a segment.
    pub fn contains(&self, addr: u64) -> bool {
        self.containing(addr).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn behaves_as_an_ordered_map_in_any_insertion_order() {
        let mut map = SegmentMap::default();
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Top-down mostly (as the driver places segments), sometimes anywhere.
            let start = if i % 4 == 0 {
                (x % 4096 + 1) << 21
            } else {
                (4097 - (i % 4096)) << 21
            };
            let size = ((x >> 32) % 3 + 1) << 20;
            match model.remove(&start) {
                Some(was) => assert_eq!(map.remove(start), Some(was), "remove {start:#x}"),
                None => {
                    map.insert(start, size);
                    model.insert(start, size);
                }
            }
            assert_eq!(map.len(), model.len());
            let probe = (x >> 8) % (4100 << 21);
            assert_eq!(map.get(probe), model.get(&probe).copied());
            let below = model.range(..=probe).next_back().map(|(&s, &z)| (s, z));
            assert_eq!(map.at_or_below(probe), below, "at_or_below {probe:#x}");
            assert_eq!(
                map.contains(probe),
                below.is_some_and(|(s, z)| probe < s + z)
            );
            let len = (x >> 40) % (3 << 21) + 1;
            let overlapping = model.range(..probe + len).next_back();
            assert_eq!(
                map.overlaps(probe, len),
                overlapping.is_some_and(|(&s, &z)| s + z > probe),
                "overlaps {probe:#x} + {len:#x}"
            );
        }
        assert_eq!(map.remove(1), None);
        assert!(
            map.overlaps(u64::MAX, 2),
            "past the end of the address space"
        );
        assert!(
            map.iter().eq(model.into_iter()),
            "iterates in address order"
        );
    }
}
