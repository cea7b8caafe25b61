//! Running the `cachealloc` binary as a user would, for the command-line tests.

use cachealloc::config::ConfigSource;
use std::process::{Command, Output};

/// The binary, without the caller's library variables (which configure the preloaded library;
/// a replay only mentions them).
pub fn command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cachealloc"));
    for source in ConfigSource::PRECEDENCE {
        command.env_remove(source.name());
    }
    command
}

/// Run the binary with `args` and `vars` set (and no other library variable from the caller's
/// environment).
pub fn cachealloc_with(args: &[&str], vars: &[(&str, &str)]) -> Output {
    command()
        .args(args)
        .envs(vars.iter().copied())
        .output()
        .expect("binary runs")
}

pub fn cachealloc(args: &[&str]) -> Output {
    cachealloc_with(args, &[])
}

/// The one JSON object a successful `--json` run printed.
pub fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// Run `cachealloc state PATH` with `extra` arguments.
pub fn state(path: &std::path::Path, extra: &[&str]) -> Output {
    let mut args = vec!["state", path.to_str().expect("a UTF-8 temporary path")];
    args.extend_from_slice(extra);
    cachealloc(&args)
}
