//! The meaning of values: each function takes the value as written and returns the typed value,
//! or the sentence that says what is allowed (`ConfigError` adds variable, key and value).
//!
//! Shared keys follow PyTorch's `AcceleratorAllocatorConfig` / `CUDAAllocatorConfig` checks with
//! the same accepted set, numbers read as PyTorch reads them (`numbers`). A number that is not
//! written plainly (`128MB`, `-1`) adds a note to `notes` saying what it was read as; the caller
//! turns notes into warnings.

use super::numbers::{self, NumberError};
use super::syntax::Value;
use crate::pool::rounding::{LARGE_BUFFER, ROUNDUP_INTERVALS};

/// One MB in PyTorch's sense (`kMB`).
pub const MB: u64 = 1 << 20; // 1 MiB
/// Smallest `max_split_size_mb` / `max_non_split_rounding_mb` PyTorch accepts (`kLargeBuffer / kMB`).
pub const MIN_SPLIT_SIZE_MB: u64 = LARGE_BUFFER / MB; // 20 MB

/// What a list given to a single-value option is told (`OptionSpec::apply` refuses such a list,
/// with what the option allows, before the option reads it).
pub const NOT_A_LIST: &str = "expects a single value, not a list";

/// The single token of a scalar option, or `NOT_A_LIST` for a list.
pub fn scalar(value: &Value) -> Result<&str, String> {
    match value {
        Value::Scalar { text, .. } => Ok(text),
        Value::List(_) => Err(NOT_A_LIST.to_string()),
    }
}

/// The note for a number read from text that is not the number written plainly.
fn read_as(text: &str, value: impl std::fmt::Display, wraps: bool) -> String {
    let wrap = if wraps {
        ", a '-' wrapping around 2^64"
    } else {
        ""
    };
    format!(
        "'{text}' is read as {value}, as PyTorch reads it (the number at the start of the \
         text{wrap})"
    )
}

/// A whole number as PyTorch's `std::stoull` reads it (`what` completes "expected ...").
fn whole_number(text: &str, what: &str, notes: &mut Vec<String>) -> Result<u64, String> {
    match numbers::whole(text) {
        Ok(read) => {
            if !read.plain {
                let wraps = read.value != 0 && text.starts_with('-');
                notes.push(read_as(text, read.value, wraps));
            }
            Ok(read.value)
        }
        Err(NumberError::OutOfRange) => Err(format!("out of range; expected {what} below 2^64")),
        Err(_) => Err(format!("not a whole number; expected {what}")),
    }
}

/// A size in MiB (PyTorch's "MB") that must be at least 20, returned in bytes. Values above what fits in bytes
/// are clamped to `u64::MAX / MB` MB, as PyTorch clamps to `SIZE_MAX / kMB`.
pub fn size_mb_at_least_20(value: &Value, notes: &mut Vec<String>) -> Result<u64, String> {
    let allowed = format!("an integer >= {MIN_SPLIT_SIZE_MB} (MiB)");
    let mb = whole_number(scalar(value)?, &allowed, notes)?;
    if mb < MIN_SPLIT_SIZE_MB {
        return Err(format!("too small, must be {allowed}"));
    }
    Ok(mb.min(u64::MAX / MB) * MB)
}

/// A number as PyTorch's `std::stod` reads it.
fn number(text: &str, allowed: &str, notes: &mut Vec<String>) -> Result<f64, String> {
    match numbers::fraction(text) {
        Ok(read) => {
            if !read.plain {
                notes.push(read_as(text, read.value, false));
            }
            Ok(read.value)
        }
        Err(NumberError::Hexadecimal) => Err(format!(
            "hexadecimal numbers are not read; expected a decimal number {allowed}"
        )),
        Err(NumberError::OutOfRange) => Err(format!(
            "out of a double's range; expected a number {allowed}"
        )),
        Err(_) => Err(format!("not a number; expected a number {allowed}")),
    }
}

/// `garbage_collection_threshold`: 0 < v < 1.
pub fn open_fraction(value: &Value, notes: &mut Vec<String>) -> Result<f64, String> {
    let allowed = "greater than 0.0 and less than 1.0";
    let v = number(scalar(value)?, allowed, notes)?;
    if v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(format!("must be {allowed}"))
    }
}

/// `per_process_memory_fraction`: 0 ≤ v ≤ 1.
pub fn closed_fraction(value: &Value, notes: &mut Vec<String>) -> Result<f64, String> {
    let allowed = "in [0.0, 1.0]";
    let v = number(scalar(value)?, allowed, notes)?;
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
/// drops it (as PyTorch's does), so the file would silently land elsewhere. So is a byte that
/// is not UTF-8, which `Config::from_env` reads as U+FFFD: the file would get another name.
pub fn path(value: &Value) -> Result<String, String> {
    if let Value::Scalar {
        text,
        written: Some(_),
    } = value
    {
        return Err(format!(
            "a path cannot contain whitespace (the syntax drops it, so it would read as \
             '{text}'); allowed: a path without whitespace, ',', ':', '[' or ']'"
        ));
    }
    let text = scalar(value)?;
    if text.contains(char::REPLACEMENT_CHARACTER) {
        return Err(format!(
            "a path must be valid UTF-8 (a byte that is not is read as '{}', so the file would \
             be '{text}'); allowed: a UTF-8 path without whitespace, ',', ':', '[' or ']'",
            char::REPLACEMENT_CHARACTER
        ));
    }
    Ok(text.to_string())
}

/// `roundup_power2_divisions`, applied onto `table` exactly as PyTorch's
/// `parseRoundUpPower2Divisions` does (it also starts from the table as it stands):
/// - scalar `N`: N must be a power of 2 (0 is rejected); every interval gets N;
/// - list `[B:V,...,>:V]`: `B` a power-of-2 size in MB whose index is `log2(B)` clamped to 0..=15
///   (entry `B` covers sizes `[B MB, 2B MB)`); `V` is 0 (off) or a power of 2; the first numeric
///   entry also fills every lower index; `>` fills `last_index + 1 ..= 15`, where `last_index` is
///   the index of the latest numeric entry (0 before any). This is the newest PyTorch's
///   `c10/core/AllocatorConfig.cpp`; 2.9 and older (`c10/cuda/CUDAAllocatorConfig.cpp`) filled
///   from `last_index` itself, so their `>` overwrote the latest numeric entry (the options
///   table says so).
pub fn apply_roundup_divisions(
    table: &mut [u64; ROUNDUP_INTERVALS],
    value: &Value,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let items = match value {
        Value::Scalar { text, .. } => {
            let allowed = "a power of 2 (1, 2, 4, 8, ...) or a list [MB:divisions,...,>:divisions]";
            let n = whole_number(text, allowed, notes)?;
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
        let v = whole_number(divisions, divisions_allowed, notes)
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
        let mb = whole_number(interval, interval_allowed, notes)
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
            written: None,
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
        apply_roundup_divisions(&mut table, value, &mut Vec::new()).map(|()| table)
    }

    #[test]
    fn sizes_in_mb_are_stored_in_bytes_and_clamped_like_pytorch() {
        assert_eq!(size_mb_at_least_20(&s("20"), &mut Vec::new()), Ok(20 * MB));
        assert_eq!(
            size_mb_at_least_20(&s("512"), &mut Vec::new()),
            Ok(512 * MB)
        );
        let huge = size_mb_at_least_20(&s("18446744073709551615"), &mut Vec::new()).unwrap();
        assert_eq!(huge, (u64::MAX / MB) * MB);
        assert!(size_mb_at_least_20(&s("19"), &mut Vec::new()).is_err());
    }

    /// Numbers not written plainly are read as PyTorch reads them, with a note.
    #[test]
    fn numbers_are_read_as_pytorch_reads_them_with_a_note() {
        let mut notes = Vec::new();
        assert_eq!(size_mb_at_least_20(&s("128MB"), &mut notes), Ok(128 * MB));
        assert_eq!(
            size_mb_at_least_20(&s("-1"), &mut notes),
            Ok((u64::MAX / MB) * MB)
        );
        assert_eq!(open_fraction(&s("0.5x"), &mut notes), Ok(0.5));
        assert_eq!(
            notes,
            [
                "'128MB' is read as 128, as PyTorch reads it (the number at the start of the \
                 text)",
                "'-1' is read as 18446744073709551615, as PyTorch reads it (the number at the \
                 start of the text, a '-' wrapping around 2^64)",
                "'0.5x' is read as 0.5, as PyTorch reads it (the number at the start of the \
                 text)",
            ]
        );
        let mut quiet = Vec::new();
        assert_eq!(size_mb_at_least_20(&s("128"), &mut quiet), Ok(128 * MB));
        assert!(quiet.is_empty());
        let mut zero = Vec::new();
        assert!(size_mb_at_least_20(&s("-0"), &mut zero).is_err());
        assert_eq!(zero.len(), 1, "{zero:?}");
        assert!(!zero[0].contains("wrapping"), "0 does not wrap: {zero:?}");
        let mut table = [0; ROUNDUP_INTERVALS];
        let mut noted = Vec::new();
        apply_roundup_divisions(&mut table, &s("4.5"), &mut noted).unwrap();
        assert_eq!(table, [4; ROUNDUP_INTERVALS]);
        assert_eq!(noted.len(), 1, "{noted:?}");
    }

    #[test]
    fn fractions_respect_open_and_closed_bounds() {
        assert_eq!(open_fraction(&s("0.5"), &mut Vec::new()), Ok(0.5));
        assert_eq!(open_fraction(&s(".25"), &mut Vec::new()), Ok(0.25));
        // Anything strictly between the bounds, however close to them (PyTorch's check).
        for inside in ["0.001", "1e-300", "0.999"] {
            let want = inside.parse::<f64>().unwrap();
            assert_eq!(
                open_fraction(&s(inside), &mut Vec::new()),
                Ok(want),
                "{inside}"
            );
        }
        for bad in ["0", "1", "1.0", "-0.1", "NaN", "inf"] {
            assert!(open_fraction(&s(bad), &mut Vec::new()).is_err(), "{bad}");
        }
        assert_eq!(closed_fraction(&s("0"), &mut Vec::new()), Ok(0.0));
        assert_eq!(closed_fraction(&s("1"), &mut Vec::new()), Ok(1.0));
        for bad in ["1.01", "-0.0001", "NaN"] {
            assert!(closed_fraction(&s(bad), &mut Vec::new()).is_err(), "{bad}");
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
        apply_roundup_divisions(&mut table, &list(&[("1024", "4")]), &mut Vec::new()).unwrap();
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
