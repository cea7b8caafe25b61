//! How often a repeated error reaches the log. A program that meets an error often tries again
//! (smaller, or in a loop, or ignoring the code), and a line for each failure would bury
//! everything else: the first few of a kind are logged at warn; after them each is logged at
//! debug only, and a line at warn counts them at the next power of two (the 16th, 32nd, …
//! failure), so a run of a million failures prints a few dozen lines.

use std::sync::atomic::{AtomicU64, Ordering};

/// One kind of error, counted over the process.
pub struct Repeats {
    /// What the errors are, for the counting line ("out-of-memory errors").
    pub what: &'static str,
    /// How many are logged at warn before they are counted instead.
    pub shown: u64,
    reported: AtomicU64,
}

/// How the `n`th error of a kind is logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// In full, at warn.
    Full,
    /// In full at debug, and at warn a line counting the failures so far.
    Counted,
    /// In full at debug only.
    Quiet,
}

impl Repeats {
    pub const fn new(what: &'static str, shown: u64) -> Self {
        Repeats {
            what,
            shown,
            reported: AtomicU64::new(0),
        }
    }

    /// The way to log the `n`th error of this kind (`n` from 1).
    pub fn for_nth(&self, n: u64) -> Shown {
        if n <= self.shown {
            Shown::Full
        } else if n.is_power_of_two() {
            Shown::Counted
        } else {
            Shown::Quiet
        }
    }

    /// Count one more error of this kind; its number (from 1) and how to log it.
    pub fn next(&self) -> (u64, Shown) {
        let n = self
            .reported
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        (n, self.for_nth(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_errors_are_shown_then_powers_of_two_are_counted() {
        let ooms = Repeats::new("out-of-memory errors", 3);
        let logs: Vec<Shown> = (1..=17).map(|n| ooms.for_nth(n)).collect();
        let counted: Vec<u64> = (1..=17)
            .filter(|&n| ooms.for_nth(n) == Shown::Counted)
            .collect();
        assert_eq!(logs[..3], [Shown::Full; 3]);
        assert_eq!(counted, [4, 8, 16]);
        // A million failures: 3 in full and 18 counted lines (the 4th to the 524,288th); with
        // the line after the third that says later ones are counted, 22 messages.
        let loud = (1..=1_000_000u64)
            .filter(|&n| ooms.for_nth(n) != Shown::Quiet)
            .count();
        assert_eq!(loud, 3 + 18);
        let refusals = Repeats::new("bad pointers", 10);
        let counted: Vec<u64> = (1..=40)
            .filter(|&n| refusals.for_nth(n) == Shown::Counted)
            .collect();
        assert_eq!(counted, [16, 32]);
    }

    #[test]
    fn each_kind_counts_its_own() {
        let a = Repeats::new("a", 1);
        let b = Repeats::new("b", 1);
        assert_eq!(a.next(), (1, Shown::Full));
        assert_eq!(a.next(), (2, Shown::Counted));
        assert_eq!(b.next(), (1, Shown::Full));
    }
}
