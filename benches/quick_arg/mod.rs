//! The command line of the benchmarks that take one option, `--quick` (shim_overhead,
//! recorded_frees): `--help` prints their usage instead of starting the full run, and an
//! argument they do not take is refused, not ignored.

/// What the command line asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuickArg {
    /// Run; `true` for the short run.
    Run {
        quick: bool,
    },
    Help,
}

/// Parse the arguments after the program's name (cargo bench adds `--bench`, taken and
/// ignored).
pub fn parse(args: &[String]) -> Result<QuickArg, String> {
    let mut quick = false;
    let mut help = false;
    for arg in args {
        match arg.as_str() {
            "--bench" => {}
            "--quick" => quick = true,
            "--help" | "-h" => help = true,
            other => {
                return Err(format!(
                    "unknown option {other:?}; allowed: --quick, --help"
                ));
            }
        }
    }
    Ok(if help {
        QuickArg::Help
    } else {
        QuickArg::Run { quick }
    })
}

/// Whether the process's command line asks for the short run; prints `usage` and exits for
/// `--help` (0) or a refused argument (2, the message after the benchmark's `name`).
pub fn quick_or_exit(name: &str, usage: &str) -> bool {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse(&args) {
        Ok(QuickArg::Run { quick }) => quick,
        Ok(QuickArg::Help) => {
            print!("{usage}");
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("{name}: {e}\n\n{usage}");
            std::process::exit(2)
        }
    }
}
