//! Size and count formatters, exactly as PyTorch prints them.
//!
//! `format_size` (OOM messages) lives in the core for the OOM report and is re-exported here.
//! The two table formatters are `_format_size` and `_format_count` of `torch.cuda.memory_summary`
//! (torch/cuda/memory.py): the unit is chosen from a *reference* value — the `all` row of the
//! same column — so the pool rows below it share its unit, and values are floored, not rounded.

pub use crate::pool::format::format_size;

/// Units of the summary's size columns.
const SIZE_UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
/// A size column moves to the next unit once its reference value reaches this.
const SIZE_STEP_AT: f64 = 768.0 * 1024.0; // bytes (in the current unit)
/// Units of the summary's count columns.
const COUNT_UNITS: [&str; 3] = [" ", "K", "M"];
/// A count column moves to the next unit once its reference value reaches this.
const COUNT_STEP_AT: f64 = 750.0 * 1000.0;

/// `_format_size(sz, pref_sz)`: `"{sz:6d} {unit}"`, ten characters for values below a million.
pub fn summary_size(size: i64, reference: i64) -> String {
    let (value, unit) = scale(size, reference, &SIZE_UNITS, 1024, SIZE_STEP_AT);
    format!("{value:6} {unit}")
}

/// `_format_count(cnt, pref_cnt)`: `"{cnt:7d} {unit} "`, ten characters as well.
pub fn summary_count(count: i64, reference: i64) -> String {
    let (value, unit) = scale(count, reference, &COUNT_UNITS, 1000, COUNT_STEP_AT);
    format!("{value:7} {unit} ")
}

/// Step `value` up one unit (floor division by `base`) per step of `reference`, as long as the
/// reference is at least `step_at` and a larger unit exists.
fn scale(
    mut value: i64,
    reference: i64,
    units: &[&'static str],
    base: i64,
    step_at: f64,
) -> (i64, &'static str) {
    let mut reference = reference as f64;
    let mut unit = units[0];
    for &next in &units[1..] {
        if reference < step_at {
            break;
        }
        unit = next;
        value = value.div_euclid(base); // Python's `//` floors
        reference /= base as f64;
    }
    (value, unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_step_up_at_768_of_a_unit_and_floor() {
        assert_eq!(summary_size(0, 0), "     0 B  ");
        assert_eq!(summary_size(786_431, 786_431), "786431 B  ");
        assert_eq!(summary_size(786_432, 786_432), "   768 KiB");
        assert_eq!(summary_size(2047, 786_432), "     1 KiB");
        assert_eq!(summary_size(5 << 30, 5 << 30), "  5120 MiB");
        assert_eq!(summary_size(768 << 30, 768 << 30), "   768 GiB");
        assert_eq!(summary_size(1 << 62, 1 << 62), "  4096 PiB");
    }

    #[test]
    fn pool_rows_use_the_reference_unit() {
        // A small-pool value shown in the all-row's MiB even though it is under 1 MiB.
        assert_eq!(summary_size(512 << 10, 1 << 30), "     0 MiB");
        assert_eq!(summary_size(1 << 30, 1 << 30), "  1024 MiB");
        // Below 768 MiB the unit stays KiB, so 100 MiB fills the column.
        assert_eq!(summary_size(100 << 20, 100 << 20), "102400 KiB");
    }

    #[test]
    fn counts_step_up_at_750_thousand() {
        assert_eq!(summary_count(0, 0), "      0   ");
        assert_eq!(summary_count(749_999, 749_999), " 749999   ");
        assert_eq!(summary_count(750_000, 750_000), "    750 K ");
        assert_eq!(summary_count(1_999, 750_000), "      1 K ");
        assert_eq!(summary_count(2_000_000_000, 2_000_000_000), "   2000 M ");
    }

    #[test]
    fn negative_values_floor_like_python() {
        assert_eq!(summary_size(-1, 1 << 20), "    -1 KiB");
    }
}
