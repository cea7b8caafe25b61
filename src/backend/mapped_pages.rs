//! The simulated device's mapped pages of expandable segments: a set of disjoint address ranges
//! that refuses to map a page twice or unmap a page not mapped, so that a pool bug shows up as
//! an error instead of a wrong figure.

use std::collections::BTreeMap;

/// Disjoint mapped ranges, start → end; touching ranges are merged.
#[derive(Debug, Default)]
pub struct MappedPages(BTreeMap<u64, u64>);

impl MappedPages {
    /// Whether any byte of `[start, end)` is mapped.
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.0
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
    }

    /// Map `[start, end)`; false (and nothing changed) when part of it is mapped already.
    pub fn map(&mut self, mut start: u64, mut end: u64) -> bool {
        if start >= end || self.overlaps(start, end) {
            return false;
        }
        if let Some((&s, &e)) = self.0.range(..start).next_back()
            && e == start
        {
            self.0.remove(&s);
            start = s;
        }
        if let Some(e) = self.0.remove(&end) {
            end = e;
        }
        self.0.insert(start, end);
        true
    }

    /// Unmap `[start, end)`; false (and nothing changed) when part of it is not mapped.
    pub fn unmap(&mut self, start: u64, end: u64) -> bool {
        let Some((&s, &e)) = self.0.range(..=start).next_back() else {
            return false;
        };
        if start >= end || e < end {
            return false;
        }
        self.0.remove(&s);
        if s < start {
            self.0.insert(s, start);
        }
        if end < e {
            self.0.insert(end, e);
        }
        true
    }

    /// Whether any byte of `[start, end)` is mapped (a reservation must be unmapped entirely
    /// before it is given back).
    pub fn any_in(&self, start: u64, end: u64) -> bool {
        self.overlaps(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_and_unmaps_only_what_is_consistent() {
        let mut pages = MappedPages::default();
        assert!(pages.map(100, 200));
        assert!(pages.map(200, 300), "a touching range is merged");
        assert!(!pages.map(250, 260), "mapped twice");
        assert!(!pages.map(50, 101), "overlaps the start");
        assert!(pages.unmap(150, 250), "the middle of a merged range");
        assert!(!pages.unmap(140, 160), "partly unmapped already");
        assert!(pages.any_in(100, 150) && !pages.any_in(150, 250) && pages.any_in(299, 400));
        assert!(pages.unmap(100, 150) && pages.unmap(250, 300));
        assert!(!pages.any_in(0, u64::MAX));
        assert!(!pages.unmap(100, 150));
    }
}
