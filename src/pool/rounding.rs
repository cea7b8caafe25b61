//! Size rounding, pool choice and segment sizing — PyTorch's `round_size`, `get_pool` and
//! `get_allocation_size`.

use super::settings::Settings;
use super::types::PoolKind;

/// All sizes are rounded to a multiple of this.
pub const MIN_BLOCK_SIZE: u64 = 512; // 512 B
/// Largest rounded size served by the small pool.
pub const SMALL_SIZE: u64 = 1 << 20; // 1 MiB
/// Segment size of the small pool.
pub const SMALL_BUFFER: u64 = 2 << 20; // 2 MiB
/// Requests below this (in the large pool) get a `LARGE_BUFFER` segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20; // 10 MiB
/// Large segments at or above `MIN_LARGE_ALLOC` are rounded to a multiple of this.
pub const ROUND_LARGE: u64 = 2 << 20; // 2 MiB
/// Segment size for large-pool requests below `MIN_LARGE_ALLOC`.
pub const LARGE_BUFFER: u64 = 20 << 20; // 20 MiB
/// Number of power-of-two intervals in the `roundup_power2_divisions` table (1 MiB … 32 GiB+).
pub const ROUNDUP_INTERVALS: usize = 16;
/// Requests of this size or more are refused outright ("more than 1EB").
pub const MAX_REQUEST: u64 = 1 << 60; // 1 EiB

/// Divisions that apply to `size` (index = floor(log2(size)) - 20, clamped to 0..=15).
pub fn roundup_divisions(settings: &Settings, size: u64) -> u64 {
    let log2 = 63 - size.max(1).leading_zeros() as i64;
    let index = (log2 - 20).clamp(0, ROUNDUP_INTERVALS as i64 - 1) as usize;
    settings.roundup_power2_divisions[index]
}

/// Round `size` up to the next of `divisions` equal steps between two powers of two.
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> divisions.trailing_zeros();
    if step == 0 {
        return floor << 1;
    }
    let f = size & !(step - 1);
    if f == size { size } else { f + step }
}

/// The block size a request of `size` bytes occupies.
pub fn round_size(settings: &Settings, size: u64) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = roundup_divisions(settings, size);
    // Note: PyTorch multiplies in `size_t`, which wraps for divisions of 2^55 or more (powers of
    // two its parser accepts, as `config` does); the wrapped product decides as it does there.
    if divisions > 1 && size > MIN_BLOCK_SIZE.wrapping_mul(divisions) {
        return next_division(size, divisions);
    }
    round_to_block(size)
}

/// `round_size` when no `roundup_power2_divisions` apply: up to a multiple of 512 B, at least
/// 512 B.
#[inline]
pub fn round_to_block(size: u64) -> u64 {
    size.max(1).div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
}

/// The pool that serves a rounded size.
pub fn pool_for(rounded: u64) -> PoolKind {
    if rounded <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// The size of the segment to request from the device for a rounded size.
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn with_divisions(d: u64) -> Settings {
        Settings {
            roundup_power2_divisions: [d; ROUNDUP_INTERVALS],
            ..Settings::default()
        }
    }

    #[test]
    fn default_rounding_is_512_bytes() {
        let s = Settings::default();
        assert_eq!(round_size(&s, 0), 512);
        assert_eq!(round_size(&s, 1), 512);
        assert_eq!(round_size(&s, 512), 512);
        assert_eq!(round_size(&s, 513), 1024);
        assert_eq!(round_size(&s, 100 * MIB + 1), 100 * MIB + 512);
    }

    #[test]
    fn power2_divisions_match_the_reference_examples() {
        let s = with_divisions(4);
        assert_eq!(round_size(&s, 1200), 1536);
        assert_eq!(round_size(&s, 5000), 5120);
        assert_eq!(round_size(&s, 1_500_000), 1_572_864);
        assert_eq!(round_size(&s, 100 * MIB + 1), 112 * MIB);
        assert_eq!(round_size(&s, 64 * MIB), 64 * MIB);
    }

    #[test]
    fn segment_sizes_follow_the_three_bands() {
        assert_eq!(segment_size(512), 2 * MIB);
        assert_eq!(segment_size(MIB), 2 * MIB);
        assert_eq!(segment_size(MIB + 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB - 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB), 10 * MIB);
        assert_eq!(segment_size(10 * MIB + 512), 12 * MIB);
    }

    /// Divisions of 2^55 or more are powers of two the options accept, as PyTorch does; its
    /// `kMinBlockSize * divisions` then wraps around 2^64, so whether a size is rounded to
    /// divisions depends on the wrapped product. Each row: divisions, request, PyTorch's size.
    #[test]
    fn huge_divisions_round_as_pytorch_with_its_wrapped_product() {
        let cases = [
            // 512 * 2^54 = 2^63: no size reaches it, so 512-byte rounding.
            (1 << 54, 3 * MIB + 1, 3 * MIB + 512),
            // 512 * 2^55 wraps to 0: every size is above it, and a step of
            // floor >> 55 = 0 sends it to the next power of two.
            (1 << 55, 3 * MIB + 1, 4 * MIB),
            (1 << 63, 3 * MIB + 1, 4 * MIB),
            (1 << 63, 513, 1024),
            // A power of two stays as it is.
            (1 << 63, 2 * MIB, 2 * MIB),
        ];
        for (divisions, size, want) in cases {
            assert_eq!(
                round_size(&with_divisions(divisions), size),
                want,
                "divisions {divisions}, size {size}"
            );
        }
    }

    /// Table index 15 covers every size from 32 GiB up (PyTorch clamps `log2(size) - 20` to
    /// 0..=15), however large: 64 GiB and 1 TiB round by that entry too.
    #[test]
    fn sizes_of_32_gib_and_more_round_by_the_last_interval() {
        const GIB: u64 = 1 << 30;
        let mut s = with_divisions(0);
        s.roundup_power2_divisions[ROUNDUP_INTERVALS - 1] = 8;
        assert_eq!(round_size(&s, 16 * GIB + 1), 16 * GIB + 512);
        assert_eq!(round_size(&s, 32 * GIB + 1), 36 * GIB);
        assert_eq!(round_size(&s, 64 * GIB + 1), 72 * GIB);
        assert_eq!(round_size(&s, 1024 * GIB + 1), 1152 * GIB);
    }

    /// No request occupies less than 512 B, whatever the divisions: the 512-byte floor comes
    /// before them, as in PyTorch, also for huge divisions whose wrapped `512 * divisions` would
    /// hand a tiny size to `next_division` (which leaves 1 B, a power of two, as 1 B).
    #[test]
    fn sizes_below_512_bytes_take_512_under_any_divisions() {
        for divisions in [0, 1, 4, 1 << 55, 1 << 63] {
            let s = with_divisions(divisions);
            for size in [0, 1, 2, 300, 511] {
                assert_eq!(
                    round_size(&s, size),
                    512,
                    "divisions {divisions}, size {size}"
                );
            }
        }
    }

    #[test]
    fn pool_boundary_is_inclusive_at_one_mib() {
        assert_eq!(pool_for(MIB), PoolKind::Small);
        assert_eq!(pool_for(MIB + 512), PoolKind::Large);
    }
}
