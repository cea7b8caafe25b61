//! The `loguniform` workload: the allocator benchmark's synthetic trace.
//!
//! Each step frees a random live allocation with probability `free_probability`, otherwise it
//! allocates a size drawn log-uniformly from `min_size..=max_size` — after first freeing random
//! live allocations while the new one would push live bytes over `budget`. Log-uniform sizes give
//! every power of two the same share of requests, so small-pool and large-pool paths, splitting
//! and oversize segments are all exercised. Frees count as operations: the workload has exactly
//! `ops` operations.

use super::params::{check, fraction, gib, unknown, whole};
use super::{MAX_OPS, SynthError};
use crate::pool::StreamId;
use crate::pool::rounding::MAX_REQUEST;
use crate::trace::rng::SplitMix64;
use crate::trace::workload::{AllocId, Op, Workload};

/// Parameters of the `loguniform` workload.
#[derive(Clone, Debug, PartialEq)]
pub struct LogUniformParams {
    /// Number of operations (allocations and frees).
    pub ops: usize,
    /// Smallest requested size, bytes.
    pub min_size: u64,
    /// Largest requested size, bytes.
    pub max_size: u64,
    /// Probability that a step frees instead of allocating (when something is live).
    pub free_probability: f64,
    /// Live requested bytes are kept at or below this; `max_size` may not exceed it.
    pub budget: u64,
}

impl Default for LogUniformParams {
    fn default() -> Self {
        Self {
            ops: 1_000_000,
            min_size: 512,       // 512 B
            max_size: 256 << 20, // 256 MiB
            free_probability: 0.3,
            budget: 40 << 30, // 40 GiB
        }
    }
}

impl LogUniformParams {
    /// Each parameter's key with what it sets and its default, for the command line's help.
    pub fn described() -> Vec<(&'static str, String)> {
        let d = Self::default();
        vec![
            (
                "ops",
                format!("operations, allocations and frees ({})", d.ops),
            ),
            (
                "min",
                format!("smallest request in bytes, no unit ({})", d.min_size),
            ),
            (
                "max",
                format!("largest request in bytes, no unit ({})", d.max_size),
            ),
            (
                "free_p",
                format!(
                    "chance that an operation frees a random live allocation, from 0 to 1 ({})",
                    d.free_probability
                ),
            ),
            (
                "budget_gib",
                format!(
                    "live requested bytes kept under this many GiB, a whole number ({})",
                    d.budget >> 30
                ),
            ),
        ]
    }

    pub(super) fn set(&mut self, key: &str, value: &str) -> Result<(), SynthError> {
        match key {
            "ops" => self.ops = whole(key, value)? as usize,
            "min" => self.min_size = whole(key, value)?,
            "max" => self.max_size = whole(key, value)?,
            "free_p" => self.free_probability = fraction(key, value)?,
            "budget_gib" => self.budget = gib(key, value)?,
            _ => return Err(unknown("loguniform", key, &Self::described())),
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<(), SynthError> {
        check(self.min_size >= 1 && self.min_size <= self.max_size, || {
            format!(
                "loguniform sizes min={} max={}: need 1 <= min <= max",
                self.min_size, self.max_size
            )
        })?;
        check(self.max_size < MAX_REQUEST, || {
            format!(
                "loguniform max={} is a request the pool refuses: give less than {MAX_REQUEST} \
                 bytes (1 EiB)",
                self.max_size
            )
        })?;
        check((0.0..=1.0).contains(&self.free_probability), || {
            format!(
                "loguniform free_p={} must be from 0 to 1",
                self.free_probability
            )
        })?;
        check(self.ops as u64 <= MAX_OPS, || {
            format!(
                "loguniform ops={} is more than a synthetic workload may have (at most {MAX_OPS})",
                self.ops
            )
        })?;
        check(self.budget > 0, || {
            "loguniform budget_gib=0 must be at least 1".into()
        })?;
        // Every request fits the budget alone, so freeing what is live always makes room for it:
        // a request larger would break the budget, and redrawing it would silently make the
        // sizes stop short of `max`.
        let budget_gib = self.budget >> 30;
        check(self.min_size <= self.budget, || {
            format!(
                "loguniform min={} is more than budget_gib={budget_gib} ({} bytes) of live \
                 requests: no request would fit; give min and max of at most {}, or a larger \
                 budget_gib",
                self.min_size, self.budget, self.budget
            )
        })?;
        check(self.max_size <= self.budget, || {
            format!(
                "loguniform max={} is more than budget_gib={budget_gib} ({} bytes) of live \
                 requests: a request that large would not fit; give max of at most {}, or a \
                 larger budget_gib",
                self.max_size, self.budget, self.budget
            )
        })
    }
}

/// Generate the workload (parameters already validated).
pub(super) fn generate(p: &LogUniformParams, seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let mut workload = Workload::new(format!("synth:loguniform seed={seed}"));
    workload.ops.reserve(p.ops);
    let stream = StreamId(0);
    let log_min = (p.min_size as f64).ln();
    let log_span = (p.max_size as f64).ln() - log_min;
    // Live allocations as (id, size); a random one is removed by swap_remove.
    let mut live: Vec<(AllocId, u64)> = Vec::new();
    let mut live_bytes = 0u64;
    let mut next_id: AllocId = 0;

    let free_random = |rng: &mut SplitMix64, live: &mut Vec<(AllocId, u64)>, w: &mut Workload| {
        let (id, size) = live.swap_remove(rng.below(live.len() as u64) as usize);
        w.ops.push(Op::Free { id });
        size
    };

    while workload.ops.len() < p.ops {
        if !live.is_empty() && rng.chance(p.free_probability) {
            live_bytes -= free_random(&mut rng, &mut live, &mut workload);
            continue;
        }
        let size =
            ((log_min + rng.next_f64() * log_span).exp() as u64).clamp(p.min_size, p.max_size);
        // `validate` keeps `max_size` within the budget, so freeing everything makes room.
        // (Saturating: a budget near 2^64 bytes holds sums that do not fit. The addition below
        // stays within the budget, or adds to nothing.)
        while live_bytes.saturating_add(size) > p.budget
            && !live.is_empty()
            && workload.ops.len() < p.ops
        {
            live_bytes -= free_random(&mut rng, &mut live, &mut workload);
        }
        if workload.ops.len() == p.ops {
            break;
        }
        workload.ops.push(Op::Alloc {
            id: next_id,
            size,
            stream,
            recorded_addr: None,
        });
        live.push((next_id, size));
        live_bytes += size;
        next_id += 1;
    }
    // Generated workloads have no source entries, so ops are pushed directly.
    workload.num_ids = next_id;
    workload
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::fixtures::alloc;
    use crate::trace::synth::{SynthKind, SynthSpec};

    fn small(ops: usize) -> LogUniformParams {
        LogUniformParams {
            ops,
            ..LogUniformParams::default()
        }
    }

    #[test]
    fn requests_near_1_eib_under_a_budget_near_2_pow_64_stay_in_budget() {
        let spec: SynthSpec = "loguniform:min=576460752303423488,max=1152921504606846975,\
                               ops=200,free_p=0,budget_gib=17179869183"
            .parse()
            .unwrap();
        let SynthSpec::LogUniform(p) = &spec else {
            unreachable!()
        };
        let w = spec.generate(7).unwrap();
        let mut live = std::collections::HashMap::new();
        let mut live_bytes = 0u128;
        for op in &w.ops {
            match *op {
                Op::Alloc { id, size, .. } => {
                    live.insert(id, size);
                    live_bytes += u128::from(size);
                }
                Op::Free { id } => live_bytes -= u128::from(live.remove(&id).unwrap()),
                _ => {}
            }
            assert!(
                live_bytes <= u128::from(p.budget),
                "{live_bytes} over the budget"
            );
        }
        assert!(
            live.len() >= 15,
            "the budget holds at least 15 of them, not {}",
            live.len()
        );
    }

    /// Requests up to the whole budget are allowed, and the budget holds: one of them is
    /// made only once everything else live is freed.
    #[test]
    fn requests_as_large_as_the_budget_stay_in_budget() {
        let spec: SynthSpec = "loguniform:budget_gib=1,min=268435456,max=1073741824,ops=3000"
            .parse()
            .unwrap();
        let SynthSpec::LogUniform(p) = &spec else {
            unreachable!()
        };
        let w = spec.generate(11).unwrap();
        let mut live = std::collections::HashMap::new();
        let mut live_bytes = 0u64;
        let mut largest = 0;
        for op in &w.ops {
            match *op {
                Op::Alloc { id, size, .. } => {
                    live.insert(id, size);
                    live_bytes += size;
                    largest = largest.max(size);
                }
                Op::Free { id } => live_bytes -= live.remove(&id).unwrap(),
                _ => {}
            }
            assert!(live_bytes <= p.budget, "{live_bytes} over the budget");
        }
        assert!(
            largest > 1 << 29,
            "sizes reach the budget's half: {largest}"
        );
    }

    #[test]
    fn same_seed_same_ops_different_seed_different_ops() {
        let p = small(5_000);
        assert_eq!(generate(&p, 42), generate(&p, 42));
        assert_ne!(generate(&p, 42).ops, generate(&p, 43).ops);
    }

    #[test]
    fn has_exactly_the_requested_number_of_ops() {
        for ops in [0, 1, 2, 999] {
            let w = generate(&small(ops), 1);
            assert_eq!(w.ops.len(), ops);
            assert!(w.source_index.is_empty());
        }
    }

    #[test]
    fn every_free_names_a_live_id_and_live_bytes_respect_the_budget() {
        let p = LogUniformParams {
            ops: 50_000,
            budget: 4 << 30, // 4 GiB: small enough that the cap binds often
            ..LogUniformParams::default()
        };
        let w = generate(&p, 7);
        let mut live = vec![None; w.num_ids as usize];
        let mut live_bytes = 0u64;
        let mut frees = 0;
        for op in &w.ops {
            match *op {
                Op::Alloc { id, size, .. } => {
                    assert!(live[id as usize].is_none(), "id {id} allocated twice");
                    live[id as usize] = Some(size);
                    live_bytes += size;
                    assert!(
                        live_bytes <= p.budget,
                        "live bytes {live_bytes} over budget"
                    );
                }
                Op::Free { id } => {
                    let size = live[id as usize].take().expect("free of a dead id");
                    live_bytes -= size;
                    frees += 1;
                }
                _ => panic!("unexpected op {op:?}"),
            }
        }
        // About 30% random frees plus budget frees.
        assert!(frees > w.ops.len() / 4, "only {frees} frees");
    }

    #[test]
    fn sizes_are_log_uniform_between_the_bounds() {
        let w = generate(&small(200_000), 3);
        let sizes: Vec<u64> = w
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Alloc { size, .. } => Some(*size),
                _ => None,
            })
            .collect();
        assert!(sizes.iter().all(|&s| (512..=256 << 20).contains(&s)));
        // 512 B .. 256 MiB spans 19 powers of two; each should hold about 1/19 of the sizes.
        let mut per_octave = [0usize; 19];
        for &s in &sizes {
            per_octave[((63 - s.leading_zeros()) - 9) as usize] += 1;
        }
        let expected = sizes.len() as f64 / 19.0;
        for (octave, &count) in per_octave.iter().enumerate() {
            let ratio = count as f64 / expected;
            assert!(
                (0.9..1.1).contains(&ratio),
                "octave 2^{} holds {count}, expected about {expected:.0}",
                octave + 9
            );
        }
    }

    /// The workload as ops alone: `A size` and `F id`.
    fn sequence(spec: &str, seed: u64) -> Vec<Op> {
        spec.parse::<SynthSpec>()
            .unwrap()
            .generate(seed)
            .unwrap()
            .ops
    }

    /// With `min` = `max` every request has that size (the log-uniform draw is not rounded
    /// below it), and the budget is reached exactly but never passed: two 512 MiB requests fill
    /// 1 GiB, each further one first frees one, and the frees count towards `ops`.
    #[test]
    fn the_budget_is_filled_exactly_and_frees_count_as_operations() {
        let ops = sequence(
            "loguniform:ops=7,min=536870912,max=536870912,free_p=0,budget_gib=1",
            1,
        );
        let half = 512 << 20;
        assert_eq!(&ops[..2], &[alloc(0, half), alloc(1, half)]);
        assert!(matches!(ops[2], Op::Free { id: 0 | 1 }), "{ops:?}");
        assert_eq!(ops[3], alloc(2, half));
        assert!(matches!(ops[4], Op::Free { .. }), "{ops:?}");
        assert_eq!(ops[5], alloc(3, half));
        assert!(matches!(ops[6], Op::Free { .. }), "{ops:?}");
        assert_eq!(ops.len(), 7);
        for size in [1, 4096, 1000] {
            let spec = format!("loguniform:ops=100,min={size},max={size}");
            for op in sequence(&spec, 2) {
                if let Op::Alloc { size: got, .. } = op {
                    assert_eq!(got, size, "{spec}");
                }
            }
        }
        // Where the budget needs several frees before a request, the workload still stops at
        // exactly `ops` operations.
        for n in 1..60 {
            let spec =
                format!("loguniform:ops={n},min=268435456,max=1073741824,free_p=0,budget_gib=1");
            let w = spec.parse::<SynthSpec>().unwrap().generate(3).unwrap();
            assert_eq!(w.ops.len(), n, "{spec}");
            assert_eq!(
                w.num_ids as usize,
                w.allocs(),
                "{spec}: ids are 0..allocations"
            );
        }
    }

    /// `free_p` is the chance that an operation frees (while the budget does not bind), and the
    /// allocation it frees is any live one, not the newest or the oldest.
    #[test]
    fn frees_follow_free_p_and_pick_any_live_allocation() {
        let frees = |ops: &[Op]| {
            ops.iter()
                .filter(|op| matches!(op, Op::Free { .. }))
                .count()
        };
        assert_eq!(frees(&sequence("loguniform:ops=2000,free_p=0", 1)), 0);
        let every_other = sequence("loguniform:ops=2000,free_p=1", 1);
        for pair in every_other.chunks(2) {
            let [Op::Alloc { id, .. }, Op::Free { id: freed }] = pair else {
                panic!("not an allocation and its free: {pair:?}");
            };
            assert_eq!(id, freed);
        }
        // About 30% of 20,000 operations: the standard deviation is 0.3%.
        let ops = sequence("loguniform:ops=20000,max=65536", 4);
        let share = frees(&ops) as f64 / ops.len() as f64;
        assert!(
            (0.28..0.32).contains(&share),
            "{share} of the operations free"
        );

        // Where each freed allocation ranks among those live, oldest 0 to newest 1: spread
        // evenly, a quarter of the frees in each quarter.
        let mut live: Vec<AllocId> = Vec::new();
        let mut quarters = [0usize; 4];
        for op in &ops {
            match *op {
                Op::Alloc { id, .. } => live.push(id),
                Op::Free { id } => {
                    let at = live.iter().position(|&l| l == id).unwrap();
                    if live.len() > 1 {
                        let rank = at as f64 / (live.len() - 1) as f64;
                        quarters[((rank * 4.0) as usize).min(3)] += 1;
                    }
                    live.remove(at);
                }
                _ => unreachable!(),
            }
        }
        let total: usize = quarters.iter().sum();
        for count in quarters {
            let share = count as f64 / total as f64;
            assert!((0.2..0.3).contains(&share), "{quarters:?}");
        }
    }

    #[test]
    fn default_is_the_million_op_benchmark_trace() {
        let SynthSpec::LogUniform(p) = SynthSpec::new(SynthKind::LogUniform) else {
            unreachable!()
        };
        assert_eq!(p.ops, 1_000_000);
        assert_eq!(
            (p.min_size, p.max_size, p.budget),
            (512, 256 << 20, 40 << 30)
        );
        assert_eq!(p.free_probability, 0.3);
    }
}
