//! The policy knobs the pool reads. `config` parses them from the environment; the core only
//! sees this plain struct.

use super::error::Error;
use super::rounding::{LARGE_BUFFER, ROUNDUP_INTERVALS};

/// Allocator policy settings (the allocator keys of `PYTORCH_CUDA_ALLOC_CONF`).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Blocks of at least this many bytes are never split; `u64::MAX` = unlimited (default).
    pub max_split_size: u64,
    /// An oversize cached block may serve a request only if it exceeds the request by less than this.
    pub max_non_split_rounding: u64,
    /// Per power-of-two interval (index 0 = below 2 MiB … 15 = 32 GiB and up): divisions, 0 = off.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// Fraction of the allowed maximum above which cached unsplit blocks are reclaimed; 0 = off.
    pub garbage_collection_threshold: f64,
    /// Fraction of device memory this allocator may reserve (1.0 = no limit).
    pub per_process_memory_fraction: f64,
    /// Grow segments with the driver's virtual-memory API instead of one cudaMalloc each.
    pub expandable_segments: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            per_process_memory_fraction: 1.0,
            expandable_segments: false,
        }
    }
}

/// `max_split_size` for a limit of `bytes`: PyTorch's largest, `max_split_size_mb` clamped to
/// whole MiB below 2^64 (where `-1` wraps to), is more than any block can be, so it is unlimited.
pub fn max_split_size_from_bytes(bytes: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    if bytes >= u64::MAX / MIB * MIB {
        u64::MAX
    } else {
        bytes
    }
}

/// `fraction` as a memory fraction, which PyTorch's `setMemoryFraction` takes within [0, 1]
/// (NaN is not).
pub fn check_fraction(fraction: f64) -> Result<(), Error> {
    if (0.0..=1.0).contains(&fraction) {
        Ok(())
    } else {
        Err(Error::InvalidFraction(fraction))
    }
}

/// PyTorch's allowed maximum under a memory fraction of `fraction` on a device of `total`
/// bytes: that share of it, or `None` (no limit) for a fraction of 1.
pub fn allowed_maximum(fraction: f64, total: u64) -> Option<u64> {
    (fraction < 1.0).then_some((fraction * total as f64) as u64)
}

/// Whether garbage collection runs: PyTorch collects cached blocks past `threshold` of the
/// allowed maximum, which exists only while a memory fraction below 1 is set (`set_fraction`).
pub fn collects_garbage(threshold: f64, fraction: f64) -> bool {
    threshold > 0.0 && fraction < 1.0
}

impl Settings {
    /// Whether `roundup_power2_divisions` rounds any size past the 512-byte rounding: a
    /// division of 0 or 1 leaves sizes as they are.
    pub fn rounds_by_divisions(&self) -> bool {
        self.roundup_power2_divisions.iter().any(|&d| d > 1)
    }

    /// True when `max_split_size` was set by the user.
    pub fn has_max_split_size(&self) -> bool {
        self.max_split_size != u64::MAX
    }

    /// PyTorch's allowed maximum on a device of `total` bytes: `per_process_memory_fraction` of
    /// it, or `None` (no limit) for a fraction of 1.
    pub fn allowed_maximum(&self, total: u64) -> Option<u64> {
        allowed_maximum(self.per_process_memory_fraction, total)
    }

    /// Whether garbage collection runs under these settings (see [`collects_garbage`]).
    pub fn collects_garbage(&self) -> bool {
        collects_garbage(
            self.garbage_collection_threshold,
            self.per_process_memory_fraction,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const TIB: u64 = 1 << 40;

    /// Only PyTorch's clamp of `max_split_size_mb` (whole MiB below 2^64, where `-1` goes) is
    /// unlimited; any smaller limit, however large, stays a limit.
    #[test]
    fn only_the_clamped_largest_max_split_size_is_unlimited() {
        for bytes in [20 * MIB, TIB, 1 << 50, u64::MAX / MIB * MIB - MIB] {
            assert_eq!(max_split_size_from_bytes(bytes), bytes, "{bytes}");
        }
        for bytes in [u64::MAX / MIB * MIB, u64::MAX] {
            assert_eq!(max_split_size_from_bytes(bytes), u64::MAX, "{bytes}");
        }
    }

    /// A memory fraction of 1 sets no limit (PyTorch's `set_fraction` only for `fraction < 1`);
    /// any smaller one limits to that share of the device.
    #[test]
    fn a_fraction_of_one_sets_no_limit() {
        assert_eq!(allowed_maximum(1.0, 80 * 1024 * MIB), None);
        assert_eq!(allowed_maximum(0.5, 80 * 1024 * MIB), Some(40 * 1024 * MIB));
        assert_eq!(allowed_maximum(0.0, 80 * 1024 * MIB), Some(0));
    }

    /// Garbage collection runs only with both a threshold above 0 and a fraction below 1 (the
    /// allowed maximum it is a share of exists only then).
    #[test]
    fn garbage_collection_needs_a_threshold_and_a_fraction_below_one() {
        assert!(collects_garbage(0.5, 0.5));
        assert!(!collects_garbage(0.0, 0.5), "no threshold");
        assert!(!collects_garbage(0.5, 1.0), "no limit");
        assert!(!collects_garbage(0.0, 1.0));
    }
}
