//! Numbers as PyTorch's `ConfigTokenizer` reads them: `toSizeT` is `std::stoull` (base 10) and
//! `toDouble` is `std::stod`. Both read the longest number at the start of the text and ignore
//! the rest, so PyTorch takes `max_split_size_mb:128MB` as 128, `64.5` as 64 and `-1` as
//! 2^64 − 1 (stoull negates in unsigned arithmetic). Shared keys must accept what PyTorch
//! accepts — an existing `PYTORCH_CUDA_ALLOC_CONF` keeps working under the preloaded library —
//! so we read the same numbers, and report whether the text was the number written plainly (the
//! caller then warns with what was read).
//!
//! Where PyTorch would throw (no digits at all, a whole number beyond 2^64) we refuse. One
//! difference is kept on purpose: a hexadecimal floating-point number (`0x1p-1`, which
//! `std::stod` reads) is refused instead of read, since nobody writes a fraction that way by
//! intent.

/// A number read from the start of a token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Read<T> {
    pub value: T,
    /// The token is the number written plainly: digits only (a whole number), or text that is
    /// entirely a number (a fraction).
    pub plain: bool,
}

/// Why a token holds no number PyTorch would read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumberError {
    /// No digits where the number should start (PyTorch throws `std::invalid_argument`).
    NotANumber,
    /// A whole number of 2^64 or more, or a fraction too large or too small for a double
    /// (PyTorch throws `std::out_of_range`).
    OutOfRange,
    /// A hexadecimal number (see the module note).
    Hexadecimal,
}

/// `std::stoull(text)`: an optional sign and the leading decimal digits.
pub fn whole(text: &str) -> Result<Read<u64>, NumberError> {
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let digits = unsigned.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(NumberError::NotANumber);
    }
    let magnitude: u64 = unsigned[..digits]
        .parse()
        .map_err(|_| NumberError::OutOfRange)?;
    Ok(Read {
        value: if negative {
            magnitude.wrapping_neg()
        } else {
            magnitude
        },
        plain: digits == text.len(),
    })
}

/// `std::stod(text)`: the longest number at the start of the text (decimal, with an optional
/// sign, fraction and exponent, or `inf`, `infinity`, `nan`); a number beyond a double's range
/// either way (`1e400`, `1e-400`, a subnormal) is out of range.
pub fn fraction(text: &str) -> Result<Read<f64>, NumberError> {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    if unsigned.starts_with("0x") || unsigned.starts_with("0X") {
        return Err(NumberError::Hexadecimal);
    }
    // Rust's parser accepts exactly such a number as a whole text; the longest prefix it
    // accepts is what strtod consumes.
    let (end, value) = (1..=text.len())
        .rev()
        .filter(|&end| text.is_char_boundary(end))
        .find_map(|end| text[..end].parse::<f64>().ok().map(|value| (end, value)))
        .ok_or(NumberError::NotANumber)?;
    // strtod reports a number beyond a double's range either way (ERANGE), and stod throws.
    let number = text[..end].to_ascii_lowercase();
    let mantissa = number.split('e').next().unwrap_or_default();
    let overflow = value.is_infinite() && !number.contains("inf");
    let nonzero_digit = mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b));
    let underflow = value.is_subnormal() || (value == 0.0 && nonzero_digit);
    if overflow || underflow {
        return Err(NumberError::OutOfRange);
    }
    Ok(Read {
        value,
        plain: end == text.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(value: u64, plain: bool) -> Result<Read<u64>, NumberError> {
        Ok(Read { value, plain })
    }

    #[test]
    fn whole_numbers_read_like_stoull() {
        assert_eq!(whole("128"), read(128, true));
        assert_eq!(whole("128MB"), read(128, false));
        assert_eq!(whole("64.5"), read(64, false));
        assert_eq!(whole("+20"), read(20, false));
        assert_eq!(whole("-1"), read(u64::MAX, false));
        assert_eq!(whole("-0"), read(0, false));
        assert_eq!(whole("0x10"), read(0, false));
        // stoull stops at the first character that is not a digit, '_' included.
        assert_eq!(whole("2_048"), read(2, false));
        assert_eq!(whole("18446744073709551615"), read(u64::MAX, true));
        assert_eq!(whole("18446744073709551616"), Err(NumberError::OutOfRange));
        for text in ["abc", "MB128", "-", "+", ".5", ""] {
            assert_eq!(whole(text), Err(NumberError::NotANumber), "{text:?}");
        }
    }

    #[test]
    fn fractions_read_like_stod() {
        let read = |value: f64, plain: bool| Ok(Read { value, plain });
        assert_eq!(fraction("0.5"), read(0.5, true));
        assert_eq!(fraction(".5"), read(0.5, true));
        assert_eq!(fraction("5e-1"), read(0.5, true));
        assert_eq!(fraction("0.5abc"), read(0.5, false));
        assert_eq!(fraction("1e"), read(1.0, false));
        assert_eq!(fraction("-0.25x"), read(-0.25, false));
        // A character of several bytes after the number ends it like any other.
        assert_eq!(fraction("0.5µs"), read(0.5, false));
        assert_eq!(fraction("inf"), read(f64::INFINITY, true));
        assert!(fraction("nan").unwrap().value.is_nan());
        assert_eq!(fraction("0x1p-1"), Err(NumberError::Hexadecimal));
        assert_eq!(fraction("0e5"), read(0.0, true));
        assert_eq!(fraction("0.000"), read(0.0, true));
        for text in ["1e400", "-1e400", "1e-400", "1e-310"] {
            assert_eq!(fraction(text), Err(NumberError::OutOfRange), "{text:?}");
        }
        for text in ["half", "x", "-", "e5", "."] {
            assert_eq!(fraction(text), Err(NumberError::NotANumber), "{text:?}");
        }
    }
}
