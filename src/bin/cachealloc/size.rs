//! Byte sizes on the command line: `24GiB`, `512MiB`, `1.5GiB`, `20GB`, plain bytes.

use cachealloc::backend::sim::ADDRESS_SPACE;
use cachealloc::pool::rounding::SMALL_BUFFER;

const UNITS: [(&str, f64); 13] = [
    ("kib", 1024.0),
    ("mib", 1048576.0),
    ("gib", 1073741824.0),
    ("tib", 1099511627776.0),
    ("kb", 1e3),
    ("mb", 1e6),
    ("gb", 1e9),
    ("tb", 1e12),
    ("k", 1024.0),
    ("m", 1048576.0),
    ("g", 1073741824.0),
    ("t", 1099511627776.0),
    ("b", 1.0),
];

/// Parse a size of at most `max` bytes; a larger one, even beyond 64 bits, is `too_large`'s
/// error (which names the bound that matters to the caller).
pub fn parse_up_to(text: &str, max: u64, too_large: impl Fn() -> String) -> Result<u64, String> {
    match parse_bytes(text)? {
        Some(bytes) if bytes <= max => Ok(bytes),
        _ => Err(too_large()),
    }
}

/// Parse a size, `None` when it is 2^64 bytes or more; the error names the input and the
/// accepted forms.
fn parse_bytes(text: &str) -> Result<Option<u64>, String> {
    let bad = || {
        format!(
            "invalid size {text:?}: expected a whole number of bytes or a number with a unit \
             (KiB, MiB, GiB, TiB or K, M, G, T: powers of 1024; KB, MB, GB, TB: powers of \
             1000), e.g. 24GiB or 512MiB"
        )
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    let unit = unit.trim().to_ascii_lowercase();
    let factor = if unit.is_empty() {
        1.0
    } else {
        UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, f)| *f)
            .ok_or_else(bad)?
    };
    if !number.contains('.') && factor == 1.0 {
        // Only digits here: a failure is an overflow.
        return Ok(number.parse::<u64>().ok());
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    let bytes = value * factor;
    if bytes >= u64::MAX as f64 {
        return Ok(None);
    }
    // A fraction of a larger unit is rounded to whole bytes (5.8GiB); bytes come whole.
    if factor == 1.0 && bytes.fract() != 0.0 {
        return Err(format!(
            "invalid size {text:?}: not a whole number of bytes (a fraction needs a larger unit, \
             e.g. 5.8GiB)"
        ));
    }
    Ok(Some(bytes.round() as u64))
}

/// Parse a device capacity: room for at least one segment, and no more than the simulated
/// device's address space (a larger one could not be simulated: the run would show a capacity it
/// does not have).
pub fn parse_capacity(text: &str) -> Result<u64, String> {
    parse_device_size(text, "capacity", "--capacity")
}

/// Parse a device's total memory (`--device-memory`), within the same bounds as a capacity.
pub fn parse_device_memory(text: &str) -> Result<u64, String> {
    parse_device_size(text, "device memory", "--device-memory")
}

/// A size of the simulated device: `what` names it in errors, `option` is the option to omit.
fn parse_device_size(text: &str, what: &str, option: &str) -> Result<u64, String> {
    let too_large = || {
        format!(
            "invalid {what} {text:?}: the simulated device has {ADDRESS_SPACE} bytes of address \
             space (just under 128 TiB: 127TiB fits, 128TiB does not); give at most that, or \
             omit {option} for an unlimited device"
        )
    };
    match parse_up_to(text, ADDRESS_SPACE, too_large)? {
        0 => Err(format!(
            "invalid {what} {text:?}: a device needs more than 0 bytes (omit {option} for an \
             unlimited one)"
        )),
        // The smallest segment the pool obtains from a device (a small-pool segment).
        bytes if bytes < SMALL_BUFFER => {
            // A small number without a unit is most likely a unit left off (24 for 24GiB):
            // say what was read, and the fix.
            let unitless = text.trim().bytes().all(|c| c.is_ascii_digit());
            let hint = if unitless && bytes <= 1024 {
                format!(
                    " (a number without a unit is bytes: for gibibytes write {}GiB)",
                    text.trim()
                )
            } else {
                String::new()
            };
            Err(format!(
                "invalid {what} {text:?}: {bytes} bytes cannot hold a single segment (the \
                 smallest is 2 MiB){hint}"
            ))
        }
        bytes => Ok(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_bytes, parse_capacity, parse_device_memory, parse_up_to};

    #[test]
    fn accepts_binary_decimal_and_plain_sizes() {
        assert_eq!(parse_bytes("24GiB"), Ok(Some(24 << 30)));
        assert_eq!(parse_bytes("512MiB"), Ok(Some(512 << 20)));
        assert_eq!(parse_bytes("1.5 gib"), Ok(Some(3 << 29)));
        assert_eq!(parse_bytes("20GB"), Ok(Some(20_000_000_000)));
        assert_eq!(parse_bytes("4096"), Ok(Some(4096)));
        assert_eq!(parse_bytes("22470.375MiB"), Ok(Some(23_561_895_936)));
    }

    #[test]
    fn every_unit_has_its_power() {
        let units = [
            ("3KiB", 3 << 10),
            ("3K", 3 << 10),
            ("3KB", 3_000),
            ("3MiB", 3 << 20),
            ("3M", 3 << 20),
            ("3MB", 3_000_000),
            ("3GiB", 3 << 30),
            ("3G", 3 << 30),
            ("3GB", 3_000_000_000),
            ("3TiB", 3 << 40),
            ("3T", 3 << 40),
            ("3TB", 3_000_000_000_000),
            ("3B", 3),
            ("3 mb", 3_000_000),
            ("3 Tib", 3 << 40),
        ];
        for (text, bytes) in units {
            assert_eq!(parse_bytes(text), Ok(Some(bytes)), "{text}");
        }
    }

    #[test]
    fn a_fraction_of_a_unit_rounds_to_the_nearest_byte() {
        // PyTorch's "Tried to allocate 1.24 GiB": 1331439861.76 bytes.
        assert_eq!(parse_bytes("1.24GiB"), Ok(Some(1_331_439_862)));
        assert_eq!(parse_bytes("0.0005KiB"), Ok(Some(1)));
        assert_eq!(parse_bytes("0.0004KiB"), Ok(Some(0)));
    }

    #[test]
    fn rejects_junk_with_the_allowed_forms() {
        for bad in ["", "GiB", "12 parsecs", "-1", "-5GiB", "1e99GiB"] {
            let err = parse_bytes(bad).unwrap_err();
            assert!(
                err.contains("expected a whole number of bytes or a number with a unit"),
                "{err}"
            );
        }
        assert_eq!(parse_bytes("24G"), Ok(Some(24 << 30)));
        for fraction in ["0.5B", "1.3"] {
            let err = parse_bytes(fraction).unwrap_err();
            assert!(err.contains("not a whole number of bytes"), "{err}");
        }
        assert_eq!(parse_bytes("5.8GiB"), Ok(Some(6_227_702_579)));
    }

    #[test]
    fn sizes_beyond_u64_are_told_apart_and_bounded_by_the_caller() {
        for huge in [
            "99999999999999999999999",
            "18446744073709551616",
            "16777216TiB",
        ] {
            assert_eq!(parse_bytes(huge), Ok(None), "{huge}");
            assert_eq!(parse_up_to(huge, 10, || "over".into()), Err("over".into()));
        }
        assert_eq!(parse_bytes("18446744073709551615"), Ok(Some(u64::MAX)));
        assert_eq!(parse_up_to("10", 10, || "over".into()), Ok(10));
        assert_eq!(parse_up_to("11", 10, || "over".into()), Err("over".into()));
        let junk = parse_up_to("ten", 10, || "over".into()).unwrap_err();
        assert!(junk.starts_with("invalid size \"ten\": expected"), "{junk}");
    }

    #[test]
    fn a_capacity_holds_a_segment_and_a_unit_left_off_is_named() {
        let err = parse_capacity("24").unwrap_err();
        assert_eq!(
            err,
            "invalid capacity \"24\": 24 bytes cannot hold a single segment (the smallest is \
             2 MiB) (a number without a unit is bytes: for gibibytes write 24GiB)"
        );
        let err = parse_capacity("1MiB").unwrap_err();
        assert!(err.ends_with("(the smallest is 2 MiB)"), "{err}");
        // A byte count meant as one gets no gibibyte hint.
        let err = parse_capacity("1048576").unwrap_err();
        assert!(err.ends_with("(the smallest is 2 MiB)"), "{err}");
        // Up to 1024 a number without a unit is taken for a unit left off; beyond, for bytes.
        let err = parse_capacity("1024").unwrap_err();
        assert!(err.ends_with("for gibibytes write 1024GiB)"), "{err}");
        let err = parse_capacity("1025").unwrap_err();
        assert!(err.ends_with("(the smallest is 2 MiB)"), "{err}");
        // A small size with a unit is what was meant: no hint to add another.
        for with_unit in ["1KiB", "512B", "0.5KiB"] {
            let err = parse_capacity(with_unit).unwrap_err();
            assert!(
                err.ends_with("(the smallest is 2 MiB)"),
                "{with_unit}: {err}"
            );
        }
        assert_eq!(parse_capacity("2MiB"), Ok(2 << 20));
        assert_eq!(parse_capacity("2097152"), Ok(2 << 20));
    }

    #[test]
    fn a_capacity_is_more_than_nothing() {
        assert!(
            parse_capacity("0")
                .unwrap_err()
                .contains("more than 0 bytes")
        );
        assert!(
            parse_capacity("0GiB")
                .unwrap_err()
                .contains("more than 0 bytes")
        );
        assert_eq!(parse_capacity("127TiB"), Ok(127 << 40));
        // Beyond the address space, and beyond what 64 bits hold: the same bound is named.
        for huge in ["200TiB", "99999999999999999999", "20000000TiB"] {
            let refused = parse_capacity(huge).unwrap_err();
            assert!(
                refused.contains("the simulated device has 140733191290880 bytes of address space"),
                "{huge}: {refused}"
            );
        }
    }

    #[test]
    fn a_device_memory_error_names_its_option() {
        assert_eq!(
            parse_device_memory("0").unwrap_err(),
            "invalid device memory \"0\": a device needs more than 0 bytes (omit \
             --device-memory for an unlimited one)"
        );
        let err = parse_device_memory("80").unwrap_err();
        assert!(
            err.starts_with("invalid device memory \"80\": 80 bytes"),
            "{err}"
        );
        assert!(err.ends_with("write 80GiB)"), "{err}");
        let refused = parse_device_memory("200TiB").unwrap_err();
        assert!(
            refused.ends_with("omit --device-memory for an unlimited device"),
            "{refused}"
        );
        assert_eq!(parse_device_memory("80GiB"), Ok(80 << 30));
    }
}
