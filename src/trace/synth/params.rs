//! Parsing of `key=value` overrides in a synthetic-workload spec.

use super::SynthError;
use std::num::{IntErrorKind, ParseIntError};

/// A whole number, with `_` allowed as a digit separator (`1_000_000`).
pub(super) fn whole(key: &str, value: &str) -> Result<u64, SynthError> {
    parse_whole(value).map_err(|kind| {
        let what = match kind {
            IntErrorKind::PosOverflow => "is too large".to_string(),
            _ => format!("is not a whole number{}", unit_of(key)),
        };
        SynthError(format!(
            "synthetic workload parameter {key}={value:?} {what}"
        ))
    })
}

fn parse_whole(value: &str) -> Result<u64, IntErrorKind> {
    value
        .replace('_', "")
        .parse()
        .map_err(|e: ParseIntError| *e.kind())
}

/// What a whole-number parameter counts, where a user might write another unit.
fn unit_of(key: &str) -> &'static str {
    match key {
        "min" | "max" => " of bytes (without a unit: 1024, not 1KiB)",
        "budget_gib" => " of GiB",
        _ => "",
    }
}

/// A fraction in `[0, 1]`.
pub(super) fn fraction(key: &str, value: &str) -> Result<f64, SynthError> {
    match value.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(SynthError(format!(
            "synthetic workload parameter {key}={value:?} must be a number from 0 to 1"
        ))),
    }
}

/// `LO-HI` or a single value `N` (meaning `N-N`). A refusal quotes the whole value (a half of
/// `-5` or `5-` is empty).
pub(super) fn range(key: &str, value: &str) -> Result<(u64, u64), SynthError> {
    let parsed = match value.split_once('-') {
        Some((lo, hi)) => parse_whole(lo.trim()).and_then(|lo| Ok((lo, parse_whole(hi.trim())?))),
        None => parse_whole(value).map(|v| (v, v)),
    };
    parsed.map_err(|kind| {
        let what = match kind {
            IntErrorKind::PosOverflow => "holds a number too large",
            _ => "is not LO-HI (two whole numbers, such as 128-1024) or one whole number",
        };
        SynthError(format!(
            "synthetic workload parameter {key}={value:?} {what}"
        ))
    })
}

/// A gibibyte count as bytes, refusing values that overflow.
pub(super) fn gib(key: &str, value: &str) -> Result<u64, SynthError> {
    whole(key, value)?.checked_mul(1 << 30).ok_or_else(|| {
        SynthError(format!(
            "synthetic workload parameter {key}={value:?} is too large"
        ))
    })
}

/// `key` is none of `kind`'s parameters, which `described` lists (`described()`).
pub(super) fn unknown(kind: &str, key: &str, described: &[(&str, String)]) -> SynthError {
    let allowed: Vec<&str> = described.iter().map(|&(key, _)| key).collect();
    SynthError(format!(
        "unknown {kind} parameter {key:?}; allowed: {}",
        allowed.join(", ")
    ))
}

/// `Err` naming `what` when `ok` is false.
pub(super) fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), SynthError> {
    if ok { Ok(()) } else { Err(SynthError(what())) }
}
