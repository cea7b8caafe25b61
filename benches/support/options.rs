//! The command line of `cargo bench --bench pool_speed`.

use super::Reps;

/// What `--help` prints.
pub const USAGE: &str = "\
Usage: cargo bench --bench pool_speed [-- OPTIONS]

The pool's malloc+free next to offset-allocator replaying the same operations (ns per
operation, their ratio), and the speed of a replay of each workload, already in memory (reading
and converting a recording is not timed). Real traces are read from $CACHEALLOC_TRACES or
../shared/traces/real.

Options:
  --quick               the log-uniform row at 100,000 operations, and fewer pairs of passes
                        per row: at least 3, more until the pool's passes add up to 0.05 s, at
                        most 300 (without it: 7, 0.5 s, 3,000)
  --reps N              exactly N pairs of passes per row (N at least 1)
  --only TEXT           only the rows whose name contains TEXT (log-uniform, sqattn, ...)
  --no-replay           no replay speed (its column reads 0.0)
  --loguniform PARAMS   the log-uniform row's workload, as `cachealloc synth loguniform:PARAMS`
                        takes it (budget_gib=10: live requests kept under 10 GiB)
  --help, -h            print this
";

/// The options as the refusal of an unknown one lists them.
const ALLOWED: &str = "--quick, --reps N, --only TEXT, --no-replay, --loguniform PARAMS, --help";

/// The benchmark's options.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub quick: bool,
    pub reps: Reps,
    pub only: Option<String>,
    pub replay: bool,
    /// Parameters for the log-uniform workload, over the defaults (or `--quick`'s size).
    pub loguniform: Option<String>,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    Run(Options),
    Help,
}

impl Options {
    /// Whether the row `name` is one to run (`--only`).
    pub fn wants(&self, name: &str) -> bool {
        self.only.as_deref().is_none_or(|only| name.contains(only))
    }
}

/// Parse the arguments after the program's name (cargo bench adds `--bench`, taken and
/// ignored).
pub fn parse(args: &[String]) -> Result<Parsed, String> {
    let (mut quick, mut replay, mut help) = (false, true, false);
    let (mut reps, mut only, mut loguniform) = (None, None, None);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let (slot, what) = match arg.as_str() {
            "--bench" => continue,
            "--quick" => {
                quick = true;
                continue;
            }
            "--no-replay" => {
                replay = false;
                continue;
            }
            "--help" | "-h" => {
                help = true;
                continue;
            }
            "--reps" => (&mut reps, "a count of pairs, at least 1"),
            "--only" => (&mut only, "text of the rows' names"),
            "--loguniform" => (
                &mut loguniform,
                "workload parameters, such as budget_gib=10",
            ),
            other => return Err(format!("unknown option {other:?}; allowed: {ALLOWED}")),
        };
        if slot.is_some() {
            return Err(format!("{arg} is given twice; give it once"));
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{arg} needs a value: {what}"))?;
        *slot = Some(value.clone());
    }
    if help {
        return Ok(Parsed::Help);
    }
    let reps = match reps {
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n >= 1 => Reps::Exactly(n),
            Ok(_) => return Err(format!("--reps {v}: a count of pairs, at least 1")),
            Err(_) => return Err(format!("--reps {v:?}: a count of pairs, at least 1")),
        },
        None if quick => Reps::Until {
            min: 3,
            budget: 0.05,
            max: 300,
        },
        None => Reps::Until {
            min: 7,
            budget: 0.5,
            max: 3000,
        },
    };
    Ok(Parsed::Run(Options {
        quick,
        reps,
        only,
        replay,
        loguniform,
    }))
}
