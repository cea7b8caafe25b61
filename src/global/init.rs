//! The library's mode, decided once at the first interposed (or C API) call.
//!
//! Nothing runs at load time: no constructor parses or prints (two only register handlers:
//! `fork`'s, and `unreached`'s, which reads the variables at exit in a process that no call
//! reached, and the maps only where they ask for a report or trace). At the first call:
//! - `CACHEALLOC_DISABLE=1` → `PassThrough`: every call goes to the real runtime.
//! - a configuration error → `ConfigFailed`: the error is printed once on stderr, naming the
//!   variable, the key and what is allowed. The program must not silently run with other
//!   settings than it asked for, so from then on every interposed `cudaMalloc` (and
//!   `cachealloc_malloc`) answers `cudaErrorInitializationError` (3); `cudaFree` and the other
//!   interposed calls still forward, so memory obtained elsewhere can be released.
//! - otherwise → `Active`: the log subscriber is installed, the `trace` recording started, and,
//!   when `stats` or `trace` is on, the exit hook registered. A child forked once pools exist sees
//!   `PassThrough` (`fork`).

use super::exit_stats;
use super::fork;
use super::logging;
use super::raw_stderr;
use super::trace_file;
use crate::config::{Config, StatsOutput};
use std::sync::OnceLock;

/// What the library does with the calls it receives.
#[derive(Debug)]
pub enum Mode {
    /// Serve allocations from the pools with this configuration.
    Active(Box<Config>),
    /// `CACHEALLOC_DISABLE=1`: forward everything.
    PassThrough,
    /// The configuration was invalid: allocations fail with code 3, the rest forwards.
    ConfigFailed,
}

static MODE: OnceLock<Mode> = OnceLock::new();
/// The mode of a child forked after cachealloc became active (see `fork`).
static FORKED_CHILD_MODE: Mode = Mode::PassThrough;

/// The mode, deciding it on first use (after that, two loads and branches, inlined).
#[inline]
pub fn mode() -> &'static Mode {
    if fork::in_forked_child() {
        return &FORKED_CHILD_MODE;
    }
    match MODE.get() {
        Some(mode) => mode,
        None => first_mode(),
    }
}

/// The first decision: children forked while it runs step aside (see `fork`).
#[cold]
#[inline(never)]
fn first_mode() -> &'static Mode {
    let _deciding = fork::Deciding::begin();
    MODE.get_or_init(decide)
}

/// Whether a call has reached the library: its mode is decided, or being decided now (a thread
/// may call `exit` while another makes the first call, whose exit handler `exit_stats` has
/// registered already).
pub fn reached() -> bool {
    MODE.get().is_some() || fork::deciding()
}

/// The configuration when active.
pub fn active_config() -> Option<&'static Config> {
    match mode() {
        Mode::Active(config) => Some(config.as_ref()),
        _ => None,
    }
}

fn decide() -> Mode {
    match Config::from_env() {
        Ok(config) if config.disabled => Mode::PassThrough,
        Ok(config) => {
            logging::install(&config.log_filter);
            fork::report_if_unwatched();
            for warning in config.unread_warnings() {
                log_event!(warn, "{warning}");
            }
            for warning in config.unsupported_key_warnings() {
                log_event!(warn, "{warning}");
            }
            for warning in config.value_warnings() {
                log_event!(warn, "{warning}");
            }
            for warning in config.library_warnings() {
                log_event!(warn, "{warning}");
            }
            for key in config.ignored_keys() {
                log_event!(
                    debug,
                    "{}: ignoring PyTorch-only key '{key}'",
                    config.source.name()
                );
            }
            log_event!(
                debug,
                "cachealloc active: settings from {}, free_sync:{}",
                config.source.name(),
                config.free_sync.name()
            );
            trace_file::start(&config);
            if config.stats != StatsOutput::Off || config.trace.is_some() {
                exit_stats::register(&config);
            }
            Mode::Active(Box::new(config))
        }
        Err(error) => {
            raw_stderr::write(&format!(
                "cachealloc: configuration error: {error}. Every cudaMalloc fails with \
                 cudaErrorInitializationError (3) until this is fixed; set CACHEALLOC_DISABLE=1 \
                 to run without cachealloc.\n"
            ));
            Mode::ConfigFailed
        }
    }
}
