//! How often an out-of-memory report reaches the log. A program that meets one often tries
//! again (smaller, or in a loop), and a full report for each failure would bury everything else:
//! the first few are printed in full at warn; after them each is printed in full at debug only,
//! and a one-line count at warn marks the 4th, 8th, 16th, … failure, so a run of a million
//! failures prints a few dozen lines.

use std::sync::atomic::{AtomicU64, Ordering};

/// Out-of-memory reports printed in full at warn before they are counted instead.
pub const FULL_REPORTS: u64 = 3;

/// Out-of-memory errors reported by this process so far.
static REPORTED: AtomicU64 = AtomicU64::new(0);

/// How the `n`th out-of-memory error of the process (from 1) is logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OomLog {
    /// The full report, at warn.
    Full,
    /// The full report at debug, and at warn a line counting the failures so far.
    Counted,
    /// The full report at debug only.
    Quiet,
}

impl OomLog {
    /// The way to log the `n`th out-of-memory error (`n` from 1).
    pub fn for_nth(n: u64) -> Self {
        if n <= FULL_REPORTS {
            OomLog::Full
        } else if n.is_power_of_two() {
            OomLog::Counted
        } else {
            OomLog::Quiet
        }
    }

    /// Count one more out-of-memory error of this process; its number (from 1) and how to log it.
    pub fn next() -> (u64, Self) {
        let n = REPORTED.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        (n, Self::for_nth(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reports_are_full_then_powers_of_two_are_counted() {
        let logs: Vec<OomLog> = (1..=17).map(OomLog::for_nth).collect();
        let counted: Vec<u64> = (1..=17)
            .filter(|&n| OomLog::for_nth(n) == OomLog::Counted)
            .collect();
        assert_eq!(logs[..3], [OomLog::Full; 3]);
        assert_eq!(counted, [4, 8, 16]);
        // A million failures: 3 in full and 18 counted lines (the 4th to the 524,288th); with
        // the line after the third that says later ones are counted, 22 messages.
        let loud = (1..=1_000_000u64)
            .filter(|&n| OomLog::for_nth(n) != OomLog::Quiet)
            .count();
        assert_eq!(loud, 3 + 18);
    }
}
