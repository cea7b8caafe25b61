//! The meaning of values: each function takes the value as written and returns the typed value,
//! or the sentence that says what is allowed (`ConfigError` adds variable, key and value).
//!
//! Shared keys follow PyTorch's `AcceleratorAllocatorConfig` / `CUDAAllocatorConfig` checks with
//! the same accepted set. Note: PyTorch reads integers with `std::stoull` and numbers with
//! `std::stod`, which also accept text such as `20abc` or `-1` (wrapping to a huge value); we
//! accept only plain decimal digits and plain numbers, and say so.

use super::syntax::Value;
use crate::pool::rounding::{LARGE_BUFFER, ROUNDUP_INTERVALS};

/// One MB in PyTorch's sense (`kMB`).
pub const MB: u64 = 1 << 20; // 1 MiB
/// Smallest `max_split_size_mb` / `max_non_split_rounding_mb` PyTorch accepts (`kLargeBuffer / kMB`).
pub const MIN_SPLIT_SIZE_MB: u64 = LARGE_BUFFER / MB; // 20 MB

/// What `scalar` says about a list (`OptionSpec::apply` adds what the option allows).
pub const NOT_A_LIST: &str = "expects a single value, not a list";

/// The single token of a scalar option, or `NOT_A_LIST` for a list.
pub fn scalar(value: &Value) -> Result<&str, String> {
    match value {
        Value::Scalar { text, .. } => Ok(text),
        Value::List(_) => Err(NOT_A_LIST.to_string()),
    }
}

/// A non-negative decimal integer (`what` completes "expected ...").
fn whole_number(text: &str, what: &str) -> Result<u64, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("not a whole number; expected {what}"));
    }
    text.parse::<u64>()
        .map_err(|_| format!("out of range; expected {what} below 2^64"))
}

/// A size in MB that must be at least 20 MB, returned in bytes. Values above what fits in bytes
/// are clamped to `u64::MAX / MB` MB, as PyTorch clamps to `SIZE_MAX / kMB`.
pub fn size_mb_at_least_20(value: &Value) -> Result<u64, String> {
    let allowed = format!("an integer >= {MIN_SPLIT_SIZE_MB} (MB)");
    let mb = whole_number(scalar(value)?, &allowed)?;
    if mb < MIN_SPLIT_SIZE_MB {
        return Err(format!("too small, must be {allowed}"));
    }
    Ok(mb.min(u64::MAX / MB) * MB)
}

fn number(text: &str, allowed: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .map_err(|_| format!("not a number; expected a number {allowed}"))
}

/// `garbage_collection_threshold`: 0 < v < 1.
pub fn open_fraction(value: &Value) -> Result<f64, String> {
    let allowed = "greater than 0.0 and less than 1.0";
    let v = number(scalar(value)?, allowed)?;
    if v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(format!("must be {allowed}"))
    }
}

/// `per_process_memory_fraction`: 0 ≤ v ≤ 1.
pub fn closed_fraction(value: &Value) -> Result<f64, String> {
    let allowed = "in [0.0, 1.0]";
    let v = number(scalar(value)?, allowed)?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be {allowed}"))
    }
}

/// Exactly `True` or `False`, case-sensitive (PyTorch's `ConfigTokenizer::toBool`).
pub fn boolean(value: &Value) -> Result<bool, String> {
    match scalar(value)? {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err("must be exactly True or False (case-sensitive)".to_string()),
    }
}

/// One of a fixed set of words.
pub fn choice<T: Copy>(value: &Value, choices: &[(&str, T)]) -> Result<T, String> {
    let text = scalar(value)?;
    choices
        .iter()
        .find(|(name, _)| *name == text)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            format!("must be one of {}", names.join(", "))
        })
}

/// A path; `%p` is expanded later (see `path`). Whitespace inside it is refused: the syntax
/// drops it (as PyTorch's does), so the file would silently land elsewhere.
pub fn path(value: &Value) -> Result<String, String> {
    if let Value::Scalar { text, spaced: true } = value {
        return Err(format!(
            "a path cannot contain whitespace (the syntax drops it, so it would read as \
             '{text}'); allowed: a path without whitespace, ',', ':', '[' or ']'"
        ));
    }
    scalar(value).map(str::to_string)
}

/// `roundup_power2_divisions`, applied onto `table` exactly as PyTorch's
/// `parseRoundUpPower2Divisions` does (it also starts from the table as it stands):
/// - scalar `N`: N must be a power of 2 (0 is rejected); every interval gets N;
/// - list `[B:V,...,>:V]`: `B` a power-of-2 size in MB whose index is `log2(B)` clamped to 0..=15
///   (entry `B` covers sizes `[B MB, 2B MB)`); `V` is 0 (off) or a power of 2; the first numeric
///   entry also fills every lower index; `>` fills `last_index + 1 ..= 15`, where `last_index` is
///   the index of the latest numeric entry (0 before any).
pub fn apply_roundup_divisions(
    table: &mut [u64; ROUNDUP_INTERVALS],
    value: &Value,
) -> Result<(), String> {
    let items = match value {
        Value::Scalar { text, .. } => {
            let allowed = "a power of 2 (1, 2, 4, 8, ...) or a list [MB:divisions,...,>:divisions]";
            let n = whole_number(text, allowed)?;
            if !n.is_power_of_two() {
                return Err(
                    "divisions must be a power of 2 (1, 2, 4, 8, ...); to round no size to \
                     divisions, leave the key out"
                        .to_string(),
                );
            }
            table.fill(n);
            return Ok(());
        }
        Value::List(items) => items,
    };
    let mut last_index = 0usize;
    let mut first_value = true;
    for (interval, divisions) in items {
        let divisions_allowed = "0 (off) or a power of 2";
        let v = whole_number(divisions, divisions_allowed)
            .map_err(|why| format!("divisions '{divisions}' for interval '{interval}': {why}"))?;
        if v != 0 && !v.is_power_of_two() {
            return Err(format!(
                "divisions {v} for interval '{interval}' must be {divisions_allowed}"
            ));
        }
        if interval == ">" {
            for slot in table.iter_mut().skip(last_index + 1) {
                *slot = v;
            }
            continue;
        }
        let interval_allowed = "a power-of-2 size in MB (1, 2, 4, ...) or '>'";
        let mb = whole_number(interval, interval_allowed)
            .map_err(|why| format!("interval '{interval}': {why}"))?;
        if !mb.is_power_of_two() {
            return Err(format!("interval {mb} must be {interval_allowed}"));
        }
        let index = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
        if first_value {
            table[..index].fill(v);
            first_value = false;
        }
        table[index] = v;
        last_index = index;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> Value {
        Value::Scalar {
            text: text.to_string(),
            spaced: false,
        }
    }

    fn list(items: &[(&str, &str)]) -> Value {
        Value::List(
            items
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        )
    }

    fn roundup(value: &Value) -> Result<[u64; ROUNDUP_INTERVALS], String> {
        let mut table = [0; ROUNDUP_INTERVALS];
        apply_roundup_divisions(&mut table, value).map(|()| table)
    }

    #[test]
    fn sizes_in_mb_are_stored_in_bytes_and_clamped_like_pytorch() {
        assert_eq!(size_mb_at_least_20(&s("20")), Ok(20 * MB));
        assert_eq!(size_mb_at_least_20(&s("512")), Ok(512 * MB));
        let huge = size_mb_at_least_20(&s("18446744073709551615")).unwrap();
        assert_eq!(huge, (u64::MAX / MB) * MB);
        assert!(size_mb_at_least_20(&s("19")).is_err());
    }

    #[test]
    fn fractions_respect_open_and_closed_bounds() {
        assert_eq!(open_fraction(&s("0.5")), Ok(0.5));
        assert_eq!(open_fraction(&s(".25")), Ok(0.25));
        for bad in ["0", "1", "1.0", "-0.1", "NaN", "inf"] {
            assert!(open_fraction(&s(bad)).is_err(), "{bad}");
        }
        assert_eq!(closed_fraction(&s("0")), Ok(0.0));
        assert_eq!(closed_fraction(&s("1")), Ok(1.0));
        for bad in ["1.01", "-0.0001", "NaN"] {
            assert!(closed_fraction(&s(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn booleans_are_case_sensitive() {
        assert_eq!(boolean(&s("True")), Ok(true));
        assert_eq!(boolean(&s("False")), Ok(false));
        for bad in ["true", "TRUE", "1", "yes"] {
            assert!(boolean(&s(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn scalar_divisions_fill_every_interval() {
        assert_eq!(roundup(&s("4")), Ok([4; ROUNDUP_INTERVALS]));
        assert_eq!(roundup(&s("1")), Ok([1; ROUNDUP_INTERVALS]));
        assert!(roundup(&s("0")).is_err());
        assert!(roundup(&s("3")).is_err());
    }

    #[test]
    fn list_divisions_follow_pytorch_index_semantics() {
        // The reference example: <512 MB: 1, [512 MB, 1 GB): 2, [1 GB, 2 GB): 4, >= 2 GB: 8.
        let t = roundup(&list(&[
            ("256", "1"),
            ("512", "2"),
            ("1024", "4"),
            (">", "8"),
        ]))
        .unwrap();
        let mut want = [8; ROUNDUP_INTERVALS];
        want[..=8].fill(1); // index 8 = [256 MB, 512 MB)
        want[9] = 2;
        want[10] = 4;
        assert_eq!(t, want);
    }

    #[test]
    fn list_entries_not_mentioned_keep_their_value_and_gt_starts_after_the_last_entry() {
        // Index 9 is never written: it keeps the table's previous value (0 after a reset).
        let t = roundup(&list(&[("256", "1"), ("1024", "4")])).unwrap();
        let mut want = [0; ROUNDUP_INTERVALS];
        want[..=8].fill(1);
        want[10] = 4;
        assert_eq!(t, want);
        // `>` first: last_index is 0, so index 0 keeps its value.
        let t = roundup(&list(&[(">", "2")])).unwrap();
        let mut want = [2; ROUNDUP_INTERVALS];
        want[0] = 0;
        assert_eq!(t, want);
        // `>` does not count as the first entry, and a later entry overwrites it.
        let t = roundup(&list(&[(">", "2"), ("4", "8")])).unwrap();
        let mut want = [2; ROUNDUP_INTERVALS];
        want[..=2].fill(8);
        assert_eq!(t, want);
    }

    #[test]
    fn list_intervals_clamp_to_the_table_and_zero_disables() {
        let t = roundup(&list(&[("1", "0"), ("65536", "16")])).unwrap();
        let mut want = [0; ROUNDUP_INTERVALS];
        want[15] = 16; // 64 GB → log2 16, clamped to 15
        assert_eq!(t, want);
        assert_eq!(roundup(&list(&[])), Ok([0; ROUNDUP_INTERVALS]));
    }

    #[test]
    fn lists_apply_on_top_of_the_current_table() {
        let mut table = [1; ROUNDUP_INTERVALS];
        apply_roundup_divisions(&mut table, &list(&[("1024", "4")])).unwrap();
        // First entry fills indices 0..=10; 11..=15 keep the previous 1.
        let mut want = [1; ROUNDUP_INTERVALS];
        want[..=10].fill(4);
        assert_eq!(table, want);
    }

    #[test]
    fn choices_list_what_is_allowed() {
        let choices = [("a", 1), ("b", 2)];
        assert_eq!(choice(&s("b"), &choices), Ok(2));
        assert_eq!(
            choice(&s("B"), &choices),
            Err("must be one of a, b".to_string())
        );
        assert_eq!(choice(&list(&[]), &choices), Err(NOT_A_LIST.to_string()));
    }
}
