//! A small deterministic random number generator for the synthetic workloads.
//!
//! SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014):
//! one 64-bit word of state, passes BigCrush, and its output for a seed never changes between
//! releases — which a crate RNG does not promise. A generated workload is named by its generator
//! and seed, so the same name must always mean the same operations.

/// SplitMix64: same seed, same sequence, on every platform and release.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// Golden-ratio increment of SplitMix64.
    const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`), by Lemire's multiply-shift (bias below 2^-64 · n).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0, "below(0) has no value to return");
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi` (`lo <= hi`).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.below(span),
            None => self.next_u64(),
        }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_splitmix64_sequence() {
        // First outputs of the reference C implementation for seed 1234567.
        let mut rng = SplitMix64::new(1234567);
        let expected = [
            6457827717110365317u64,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ];
        for value in expected {
            assert_eq!(rng.next_u64(), value);
        }
    }

    #[test]
    fn ranges_stay_inside_their_bounds() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..10_000 {
            assert!(rng.below(3) < 3);
            let v = rng.between(10, 12);
            assert!((10..=12).contains(&v));
            let f = rng.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
        // The full range does not overflow.
        rng.between(0, u64::MAX);
    }

    #[test]
    fn below_reaches_every_value() {
        let mut rng = SplitMix64::new(99);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            seen[rng.below(5) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
