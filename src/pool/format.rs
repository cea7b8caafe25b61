//! PyTorch's `format_size`, the size text of every OOM message.
//!
//! It lives in the core (not in `crate::report`) because the OOM report in `oom/` renders
//! itself and the core may not depend on the layers above it; `crate::report::format`
//! re-exports it next to the `memory_summary` formatters.

/// `c10::CachingAllocator::format_size`: bytes up to 1024, then KiB up to 1 MiB, MiB up to
/// 1 GiB, GiB beyond (no TiB), always two decimals. The bounds are inclusive, so 1024 is
/// "1024 bytes" and 1 GiB is "1024.00 MiB".
pub fn format_size(size: u64) -> String {
    const KIB: u64 = 1 << 10; // 1 KiB
    const MIB: u64 = 1 << 20; // 1 MiB
    const GIB: u64 = 1 << 30; // 1 GiB
    // `{:.2}` rounds the exact binary value half to even, as glibc's `std::fixed` stream does.
    if size <= KIB {
        format!("{size} bytes")
    } else if size <= MIB {
        format!("{:.2} KiB", size as f64 / KIB as f64)
    } else if size <= GIB {
        format!("{:.2} MiB", size as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", size as f64 / GIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_pytorch_examples() {
        // The examples of the reference, §7.1.
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(2097152), "2.00 MiB");
        assert_eq!(format_size(1 << 30), "1024.00 MiB");
    }

    #[test]
    fn unit_boundaries_and_rounding() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1 << 20), "1024.00 KiB");
        assert_eq!(format_size((1 << 20) + 1), "1.00 MiB");
        assert_eq!(format_size((1 << 30) + 1), "1.00 GiB");
        assert_eq!(format_size(80 << 30), "80.00 GiB");
        assert_eq!(format_size(1 << 40), "1024.00 GiB");
        // 1152 / 1024 = 1.125 exactly: half to even, as the C++ stream prints it.
        assert_eq!(format_size(1152), "1.12 KiB");
        assert_eq!(format_size(1664), "1.62 KiB"); // 1.625
        assert_eq!(format_size(1536), "1.50 KiB");
    }
}
