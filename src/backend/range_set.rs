//! A set of disjoint address ranges, touching ones merged: the simulated device's free address
//! space, and its mapped pages of expandable segments.

use std::collections::BTreeMap;

/// Disjoint ranges, start → end; no two touch.
#[derive(Clone, Debug, Default)]
pub struct RangeSet(BTreeMap<u64, u64>);

impl RangeSet {
    /// The set holding `[start, end)`.
    pub fn of(start: u64, end: u64) -> Self {
        let mut set = Self::default();
        set.insert(start, end);
        set
    }

    /// The ranges as `(start, end)`, in address order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        self.0.iter().map(|(&s, &e)| (s, e))
    }

    /// Whether any byte of `[start, end)` is in the set.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.0
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
    }

    /// Whether every byte of `[start, end)` (not empty) is in the set.
    pub fn covers(&self, start: u64, end: u64) -> bool {
        start < end
            && self
                .0
                .range(..=start)
                .next_back()
                .is_some_and(|(_, &e)| e >= end)
    }

    /// Add `[start, end)`, which holds nothing of the set, merged with the ranges it touches.
    pub fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
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
    }

    /// Take `[start, end)` out: the parts of ranges inside it go, the parts outside stay.
    pub fn remove(&mut self, start: u64, end: u64) {
        // Each pass removes one overlapping range and puts back only the parts outside
        // `[start, end)`, which the next lookup stops at.
        while let Some((&s, e)) = self.0.range_mut(..end).next_back() {
            let e_old = *e;
            if e_old <= start {
                break;
            }
            let below = s < start;
            if below {
                // Keep the part below in place (the usual case for the free address space: a
                // top-down placement takes the top of a range).
                *e = start;
            } else {
                self.0.remove(&s);
            }
            if end < e_old {
                self.0.insert(end, e_old);
            }
            if below {
                // Every range further down ends below `s`: none overlaps.
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_what_touches_and_splits_what_is_taken_out() {
        let mut set = RangeSet::default();
        set.insert(100, 200);
        set.insert(200, 300);
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            [(100, 300)],
            "touching ranges merge"
        );
        assert!(set.overlaps(250, 260) && set.overlaps(50, 101) && !set.overlaps(300, 400));
        set.remove(150, 250);
        assert_eq!(set.iter().collect::<Vec<_>>(), [(100, 150), (250, 300)]);
        assert!(!set.covers(140, 160), "partly taken out");
        assert!(set.covers(100, 150) && set.covers(250, 300) && !set.covers(120, 120));
        set.remove(0, u64::MAX);
        assert!(!set.overlaps(0, u64::MAX));
        assert_eq!(RangeSet::of(5, 9).iter().collect::<Vec<_>>(), [(5, 9)]);
    }
}
