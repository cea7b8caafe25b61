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
    }
}
