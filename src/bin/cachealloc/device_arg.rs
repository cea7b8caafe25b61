//! The `--device` argument: a CUDA device ordinal.

/// Parse a device ordinal: a whole number from 0 (CUDA numbers devices 0, 1, 2, ...).
pub fn parse_device(text: &str) -> Result<i32, String> {
    let allowed = "not a device ordinal: expected a whole number, 0 or more (0, 1, 2, ...)";
    match text.trim().parse::<i64>() {
        Ok(n) if n >= 0 => i32::try_from(n).map_err(|_| format!("{allowed}, at most {}", i32::MAX)),
        _ => Err(allowed.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_device;

    #[test]
    fn accepts_ordinals() {
        assert_eq!(parse_device("0"), Ok(0));
        assert_eq!(parse_device("7"), Ok(7));
        assert_eq!(parse_device(" 1 "), Ok(1));
    }

    #[test]
    fn rejects_what_is_not_an_ordinal_and_says_what_is() {
        for text in ["-1", "abc", "", "1.5", "0x1", "2147483648"] {
            let err = parse_device(text).unwrap_err();
            assert!(
                err.starts_with("not a device ordinal: expected a whole number, 0 or more"),
                "{text:?}: {err}"
            );
        }
        assert!(
            parse_device("2147483648")
                .unwrap_err()
                .ends_with("at most 2147483647")
        );
    }
}
