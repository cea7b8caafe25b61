//! The `--device` argument: a CUDA device ordinal.

/// Parse a device ordinal: a whole number from 0 (CUDA numbers devices 0, 1, 2, ...).
pub fn parse_device(text: &str) -> Result<i32, String> {
    let allowed = || {
        format!(
            "not a device ordinal: expected a whole number from 0 to {} (0, 1, 2, ...)",
            i32::MAX
        )
    };
    text.trim()
        .parse::<i32>()
        .ok()
        .filter(|&n| n >= 0)
        .ok_or_else(allowed)
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
        let huge = "99999999999999999999";
        for text in ["-1", "abc", "", "1.5", "0x1", "2147483648", huge] {
            let err = parse_device(text).unwrap_err();
            assert_eq!(
                err,
                "not a device ordinal: expected a whole number from 0 to 2147483647 (0, 1, 2, ...)",
                "{text:?}"
            );
        }
    }
}
