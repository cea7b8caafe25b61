//! Built-in synthetic workloads, deterministic from a seed.
//!
//! Two generators produce the same `Workload` model the trace readers produce, so replay, sweep
//! and the benchmarks run them unchanged:
//! - `transformer`: training steps of a decoder-only transformer whose sequence length changes
//!   every step. Weights and optimizer state stay; activations, gradients and temporaries come
//!   and go per step in the order a framework allocates them. Large activation sizes follow the
//!   sequence length (attention scores grow with its square) while bias, norm and scalar tensors
//!   stay small, which is the mix that fragments a caching pool.
//! - `loguniform`: the benchmark trace — sizes log-uniform over 512 B … 256 MiB, random frees,
//!   and a cap on live bytes.
//!
//! A spec is written `KIND` or `KIND:key=value,key=value` (for example
//! `transformer:layers=24,seq=512-4096`); `SynthSpec::from_str` parses it and names every bad
//! key or value together with what is allowed.

mod loguniform;
mod params;
mod transformer;

pub use loguniform::LogUniformParams;
pub use transformer::{TransformerParams, TransformerWorkload};

use super::workload::Workload;
use std::fmt;
use std::str::FromStr;

/// The most operations a synthetic workload may have: ten times the benchmark's log-uniform
/// trace, about half a gigabyte of operations in memory.
pub const MAX_OPS: u64 = 10_000_000;

/// Which built-in workload to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthKind {
    Transformer,
    LogUniform,
}

impl SynthKind {
    pub const ALL: [SynthKind; 2] = [SynthKind::Transformer, SynthKind::LogUniform];

    pub fn name(self) -> &'static str {
        match self {
            SynthKind::Transformer => "transformer",
            SynthKind::LogUniform => "loguniform",
        }
    }
}

impl fmt::Display for SynthKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SynthKind {
    type Err = SynthError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SynthKind::ALL
            .into_iter()
            .find(|kind| kind.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                SynthError(format!(
                    "unknown synthetic workload {s:?}; allowed: transformer, loguniform"
                ))
            })
    }
}

/// What each generator's parameters set, with their defaults: the command line's help for a
/// spec.
pub fn parameters_help() -> String {
    let kinds = [
        (
            SynthKind::Transformer,
            "training steps of a decoder-only transformer, GPT-2 small by default",
            TransformerParams::described(),
        ),
        (
            SynthKind::LogUniform,
            "the benchmark's trace: sizes drawn log-uniformly from min to max, random frees",
            LogUniformParams::described(),
        ),
    ];
    let mut text = String::from(
        "The workload: transformer or loguniform, optionally with parameters \
         (KIND:key=value,...), e.g. \"transformer:layers=24,seq=512-4096\" or \
         \"loguniform:ops=100000,budget_gib=4\". Values are whole numbers (`_` may separate \
         digits), except free_p; defaults in parentheses.",
    );
    for (kind, what, params) in kinds {
        text.push_str(&format!("\n\n{kind}: {what}"));
        for (key, described) in params {
            text.push_str(&format!("\n  {key}: {described}"));
        }
    }
    text
}

/// A generator with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum SynthSpec {
    Transformer(TransformerParams),
    LogUniform(LogUniformParams),
}

impl SynthSpec {
    /// The generator `kind` with its default parameters.
    pub fn new(kind: SynthKind) -> Self {
        match kind {
            SynthKind::Transformer => SynthSpec::Transformer(TransformerParams::default()),
            SynthKind::LogUniform => SynthSpec::LogUniform(LogUniformParams::default()),
        }
    }

    pub fn kind(&self) -> SynthKind {
        match self {
            SynthSpec::Transformer(_) => SynthKind::Transformer,
            SynthSpec::LogUniform(_) => SynthKind::LogUniform,
        }
    }

    /// Check the parameters; generation assumes they passed.
    pub fn validate(&self) -> Result<(), SynthError> {
        match self {
            SynthSpec::Transformer(p) => p.validate(),
            SynthSpec::LogUniform(p) => p.validate(),
        }
    }

    /// The workload for `seed`: the same spec and seed always give the same operations.
    pub fn generate(&self, seed: u64) -> Result<Workload, SynthError> {
        self.validate()?;
        Ok(match self {
            SynthSpec::Transformer(p) => transformer::generate(p, seed).workload,
            SynthSpec::LogUniform(p) => loguniform::generate(p, seed),
        })
    }
}

impl FromStr for SynthSpec {
    type Err = SynthError;

    /// `KIND` or `KIND:key=value,...`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, overrides) = match s.split_once(':') {
            Some((kind, rest)) => (kind, Some(rest)),
            None => (s, None),
        };
        let mut spec = SynthSpec::new(kind.parse()?);
        let mut given: Vec<(&str, &str)> = Vec::new();
        for pair in overrides.into_iter().flat_map(|o| o.split(',')) {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').ok_or_else(|| {
                SynthError(format!(
                    "synthetic workload parameter {pair:?} is not key=value"
                ))
            })?;
            let (key, value) = (key.trim(), value.trim());
            if let Some((_, first)) = given.iter().find(|(k, _)| *k == key) {
                return Err(SynthError(format!(
                    "synthetic workload parameter {key} is given twice ({key}={first}, then \
                     {key}={value}); give it once"
                )));
            }
            given.push((key, value));
            match &mut spec {
                SynthSpec::Transformer(p) => p.set(key, value)?,
                SynthSpec::LogUniform(p) => p.set(key, value)?,
            }
        }
        spec.validate()?;
        Ok(spec)
    }
}

/// A bad synthetic-workload spec: the message names what was wrong and what is allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthError(pub String);

impl fmt::Display for SynthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SynthError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::StreamId;
    use crate::trace::workload::Op;

    #[test]
    fn kinds_parse_by_name() {
        assert_eq!("transformer".parse(), Ok(SynthKind::Transformer));
        assert_eq!("loguniform".parse(), Ok(SynthKind::LogUniform));
        assert_eq!("LogUniform".parse(), Ok(SynthKind::LogUniform));
        let err = "gpt".parse::<SynthKind>().unwrap_err();
        assert!(err.0.contains("\"gpt\"") && err.0.contains("transformer, loguniform"));
    }

    #[test]
    fn specs_take_parameter_overrides() {
        let spec: SynthSpec = "transformer:layers=2,seq=64-128,steps=3".parse().unwrap();
        let SynthSpec::Transformer(p) = &spec else {
            panic!("wrong kind: {spec:?}");
        };
        assert_eq!((p.layers, p.seq_min, p.seq_max, p.steps), (2, 64, 128, 3));

        let spec: SynthSpec = "loguniform:ops=1000,budget_gib=2".parse().unwrap();
        let SynthSpec::LogUniform(p) = &spec else {
            panic!("wrong kind: {spec:?}");
        };
        assert_eq!((p.ops, p.budget), (1000, 2 << 30));
    }

    #[test]
    fn bad_specs_name_the_problem() {
        let err = |s: &str| s.parse::<SynthSpec>().unwrap_err().0;
        assert!(err("transformer:depth=3").contains("depth"));
        assert!(
            err("transformer:depth=3")
                .ends_with("allowed: layers, hidden, heads, vocab, batch, seq, steps, dtype_bytes")
        );
        assert!(err("loguniform:x=1").ends_with("allowed: ops, min, max, free_p, budget_gib"));
        assert!(err("transformer:layers=x").contains("\"x\""));
        assert!(err("transformer:seq=900-100").contains("seq"));
        // A range's refusal quotes what was typed, not its empty half, and says what is allowed.
        for seq in ["-5", "5-", "5-6-7", "many"] {
            assert_eq!(
                err(&format!("transformer:seq={seq}")),
                format!(
                    "synthetic workload parameter seq=\"{seq}\" is not LO-HI (two whole \
                     numbers, such as 128-1024) or one whole number"
                )
            );
        }
        assert!(
            err("transformer:seq=1-99999999999999999999")
                .ends_with("seq=\"1-99999999999999999999\" holds a number too large")
        );
        assert!(err("transformer:layers").contains("key=value"));
        assert!(err("loguniform:free_p=1.5").contains("free_p"));
        assert!(err("loguniform:min=4096,max=512").contains("min"));
        // Every request must fit the budget of live requested bytes alone.
        assert_eq!(
            err("loguniform:budget_gib=1,min=2147483648,max=4294967296,ops=1000"),
            "loguniform min=2147483648 is more than budget_gib=1 (1073741824 bytes) of live \
             requests: no request would fit; give min and max of at most 1073741824, or a larger \
             budget_gib"
        );
        assert_eq!(
            err("loguniform:budget_gib=1,max=1073741825"),
            "loguniform max=1073741825 is more than budget_gib=1 (1073741824 bytes) of live \
             requests: a request that large would not fit; give max of at most 1073741824, or a \
             larger budget_gib"
        );
        assert!(err("loguniform:ops=99999999999").contains("at most 10000000"));
        assert!(err("loguniform:ops=99999999999999999999").ends_with("is too large"));
        assert!(err("loguniform:min=1KiB").contains("is not a whole number of bytes"));
        assert!(err("loguniform:budget_gib=0.5").ends_with("is not a whole number of GiB"));
        assert!(
            err("loguniform:max=18446744073709551615,ops=1000")
                .contains("max=18446744073709551615 is a request the pool refuses")
        );
        assert_eq!(
            err("transformer:layers=2,layers=3"),
            "synthetic workload parameter layers is given twice (layers=2, then layers=3); give \
             it once"
        );
    }

    #[test]
    fn the_help_describes_every_parameter_with_its_default() {
        let help = parameters_help();
        let kinds = [
            ("transformer", TransformerParams::described()),
            ("loguniform", LogUniformParams::described()),
        ];
        for (kind, described) in kinds {
            for (key, _) in described {
                assert!(
                    help.contains(&format!("\n  {key}: ")),
                    "{key} missing:\n{help}"
                );
                // A key the help lists is one the spec takes (its value may still be refused).
                let parsed = format!("{kind}:{key}=1").parse::<SynthSpec>();
                assert!(
                    parsed
                        .as_ref()
                        .err()
                        .is_none_or(|e| !e.0.contains("unknown")),
                    "{kind} {key}: {parsed:?}"
                );
            }
        }
        assert!(help.contains("seq: each step's sequence length in tokens, drawn from LO-HI"));
        assert!(
            help.contains("(128-1024)") && help.contains("(1000000)"),
            "{help}"
        );
    }

    #[test]
    fn generate_refuses_invalid_parameters() {
        let spec = SynthSpec::Transformer(TransformerParams {
            layers: 0,
            ..TransformerParams::default()
        });
        assert!(spec.generate(1).is_err());
        // A library caller's parameters are checked too, not only a parsed spec's.
        let spec = SynthSpec::LogUniform(LogUniformParams {
            free_probability: 1.5,
            ..LogUniformParams::default()
        });
        assert_eq!(
            spec.generate(1).unwrap_err().0,
            "loguniform free_p=1.5 must be from 0 to 1"
        );
    }

    /// Every key sets its own parameter; the spec may carry spaces around its parts, an empty
    /// pair, and `_` between digits, and one sequence length means every step has it.
    #[test]
    fn every_key_sets_its_parameter() {
        let spec: SynthSpec = "transformer:layers=3,hidden=96,heads=6,vocab=500,batch=5,\
                               seq=40-80,steps=7,dtype_bytes=4"
            .parse()
            .unwrap();
        let expected = TransformerParams {
            layers: 3,
            hidden: 96,
            heads: 6,
            vocab: 500,
            batch: 5,
            seq_min: 40,
            seq_max: 80,
            steps: 7,
            dtype_bytes: 4,
        };
        assert_eq!(spec, SynthSpec::Transformer(expected));
        assert_eq!(spec.kind(), SynthKind::Transformer);
        let spaced = " transformer : layers = 3 , hidden=96,heads=6,vocab=500,batch=5, \
                      seq = 40 - 80 ,, ,steps=7,dtype_bytes=4,";
        assert_eq!(spaced.parse(), Ok(spec));

        let spec: SynthSpec = "loguniform:ops=1_000,min=1000,max=5000,free_p=0.5,budget_gib=3"
            .parse()
            .unwrap();
        let expected = LogUniformParams {
            ops: 1000,
            min_size: 1000,
            max_size: 5000,
            free_probability: 0.5,
            budget: 3 << 30,
        };
        assert_eq!(spec, SynthSpec::LogUniform(expected));
        assert_eq!(spec.kind(), SynthKind::LogUniform);

        let SynthSpec::Transformer(p) = "transformer:seq=512".parse().unwrap() else {
            unreachable!()
        };
        assert_eq!((p.seq_min, p.seq_max), (512, 512));
    }

    /// The documented ranges hold to their ends: a value at an end is taken, the first one past
    /// it is refused with a message naming it and what is allowed.
    #[test]
    fn parameter_ranges_hold_to_their_ends() {
        let ok = |s: &str| {
            s.parse::<SynthSpec>()
                .unwrap_or_else(|e| panic!("{s} refused: {e}"))
        };
        let err = |s: &str| s.parse::<SynthSpec>().unwrap_err().0;
        for spec in [
            "loguniform:free_p=0",
            "loguniform:free_p=1",
            "loguniform:min=1,max=1",
            "loguniform:min=4096,max=4096",
            "loguniform:budget_gib=1,min=1073741824,max=1073741824",
            "loguniform:ops=10_000_000",
            // The largest request the pool takes: 1 EiB less a byte (a budget of 1 EiB).
            "loguniform:max=1152921504606846975,budget_gib=1073741824",
            "transformer:seq=1",
            "transformer:seq=300-300",
        ] {
            ok(spec);
        }
        for dtype in [1, 2, 4, 8] {
            ok(&format!("transformer:dtype_bytes={dtype}"));
        }
        let refused = [
            (
                "loguniform:max=1152921504606846976,budget_gib=1073741824",
                "loguniform max=1152921504606846976 is a request the pool refuses: give less \
                 than 1152921504606846976 bytes (1 EiB)",
            ),
            (
                "loguniform:budget_gib=0",
                "loguniform budget_gib=0 must be at least 1",
            ),
            (
                "loguniform:min=0",
                "loguniform sizes min=0 max=268435456: need 1 <= min <= max",
            ),
            (
                "loguniform:ops=10_000_001",
                "loguniform ops=10000001 is more than a synthetic workload may have (at most \
                 10000000)",
            ),
            (
                "loguniform:free_p=1.01",
                "synthetic workload parameter free_p=\"1.01\" must be a number from 0 to 1",
            ),
            (
                "loguniform:free_p=-0.01",
                "synthetic workload parameter free_p=\"-0.01\" must be a number from 0 to 1",
            ),
            // 2^34 GiB is 2^64 bytes.
            (
                "loguniform:budget_gib=17179869184",
                "synthetic workload parameter budget_gib=\"17179869184\" is too large",
            ),
            (
                "loguniform:max=1KiB",
                "synthetic workload parameter max=\"1KiB\" is not a whole number of bytes \
                 (without a unit: 1024, not 1KiB)",
            ),
            (
                "transformer:seq=0",
                "transformer seq=0-0: need 1 <= min <= max",
            ),
            (
                "transformer:seq=0-64",
                "transformer seq=0-64: need 1 <= min <= max",
            ),
        ];
        for (spec, message) in refused {
            assert_eq!(err(spec), message, "{spec}");
        }
        for dtype in [0, 3, 16] {
            assert_eq!(
                err(&format!("transformer:dtype_bytes={dtype}")),
                format!("transformer dtype_bytes={dtype} must be 1, 2, 4 or 8")
            );
        }
        for key in ["layers", "hidden", "heads", "vocab", "batch"] {
            assert_eq!(
                err(&format!("transformer:{key}=0")),
                format!("transformer {key} must be at least 1")
            );
        }
        for key in ["layers", "steps"] {
            assert_eq!(
                err(&format!("transformer:{key}=4294967296")),
                format!("transformer parameter {key}=4294967296 is too large (at most 4294967295)")
            );
        }
    }

    /// The help gives each parameter's default as the spec writes it.
    #[test]
    fn the_help_gives_each_default() {
        let help = parameters_help();
        let defaults = [
            ("layers", "12"),
            ("hidden", "768"),
            ("heads", "12"),
            ("vocab", "50257"),
            ("batch", "4"),
            ("seq", "128-1024"),
            ("steps", "32"),
            ("dtype_bytes", "2: bf16/fp16"),
            ("ops", "1000000"),
            ("min", "512"),
            ("max", "268435456"),
            ("free_p", "0.3"),
            ("budget_gib", "40"),
        ];
        for (key, default) in defaults {
            let line = help
                .lines()
                .find(|line| line.starts_with(&format!("  {key}: ")))
                .unwrap_or_else(|| panic!("no line for {key}:\n{help}"));
            assert!(line.ends_with(&format!("({default})")), "{line}");
        }
    }

    /// One FNV-1a digest of every operation's fields.
    fn digest(w: &Workload) -> u64 {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        let mut mix = |value: u64| {
            for byte in value.to_le_bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
            }
        };
        for op in &w.ops {
            match *op {
                Op::Alloc {
                    id,
                    size,
                    stream,
                    recorded_addr,
                } => {
                    assert_eq!((stream, recorded_addr), (StreamId(0), None), "{op:?}");
                    [0, id.into(), size].into_iter().for_each(&mut mix);
                }
                Op::Free { id } => [1, id.into()].into_iter().for_each(&mut mix),
                _ => panic!("a generator made {op:?}"),
            }
        }
        hash
    }

    /// A generated workload is named by its spec and seed (the benchmark table's synthetic rows
    /// are the defaults at seeds 42 and 1, README's `synth` figures the transformer's at seed
    /// 1): the same name must keep meaning the same operations, on every platform and release.
    #[test]
    fn a_spec_and_seed_always_mean_the_same_operations() {
        let pinned = [
            ("loguniform", 42, 1_000_000, 0xcf1d_3613_96e8_9af0),
            ("transformer", 1, 51_324, 0xb33b_6b32_1be7_4345),
            (
                "loguniform:ops=5000,min=1,max=65536,free_p=0.4,budget_gib=1",
                7,
                5000,
                0xf2b3_1f6f_95f6_adc9,
            ),
            (
                "transformer:layers=2,hidden=64,heads=4,vocab=1000,batch=2,seq=16-256,steps=3,\
                 dtype_bytes=4",
                9,
                1014,
                0x9fb0_fe7b_fd45_9e23,
            ),
        ];
        for (spec, seed, ops, pinned_digest) in pinned {
            let w = spec.parse::<SynthSpec>().unwrap().generate(seed).unwrap();
            assert_eq!(
                (w.ops.len(), digest(&w)),
                (ops, pinned_digest),
                "{spec} at seed {seed}: {:#x}",
                digest(&w)
            );
        }
    }
}
