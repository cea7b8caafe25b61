//! The `--seed` argument of `synth`: the generator's seed.

/// Parse a seed: a whole number from 0 to 2^64 − 1.
pub fn parse_seed(text: &str) -> Result<u64, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("not a seed: expected a whole number from 0 to {}", u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::parse_seed;

    #[test]
    fn seeds_are_whole_numbers_and_the_error_says_so() {
        assert_eq!(parse_seed("7"), Ok(7));
        assert_eq!(parse_seed("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_seed(" 7 "), Ok(7));
        for text in ["-1", "abc", "", "1.5", "18446744073709551616"] {
            assert_eq!(
                parse_seed(text),
                Err("not a seed: expected a whole number from 0 to 18446744073709551615".into()),
                "{text:?}"
            );
        }
    }
}
