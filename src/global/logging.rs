//! The stderr log of the library: a `tracing` subscriber with the `CACHEALLOC_LOG` filter
//! (`warn` by default), installed at the first interposed call — never in a process that does
//! not call CUDA.
//!
//! Events are emitted through `emit` (the `log_event!` macro): at process exit, once the
//! thread's thread-local storage is destroyed (glibc runs thread-local destructors before
//! `atexit` handlers and C++ static destructors, which may still call CUDA), the subscriber's
//! formatter panics on its per-thread buffer. Such an event is dropped instead, so that a CUDA
//! call made at exit is served as at any other time.
//!
//! Lines go to file descriptor 2 directly (`raw_stderr`), not through Rust's `Stderr` and its
//! lock. The formatter builds each line in a buffer of its own and hands it over whole.

use super::panics;
use super::raw_stderr::RawStderr;
use crate::config::is_log_level;
use tracing_subscriber::EnvFilter;

/// Run `event` (a `tracing` macro call); a panic inside it drops the event.
pub fn emit(event: impl FnOnce()) {
    let _ = panics::catch(event);
}

/// `filter`, with `warn` as the default level when it names none: `cachealloc::device=debug`
/// alone would otherwise turn every other line off, warnings and out-of-memory reports too.
fn with_default_level(filter: &str) -> String {
    // A directive that is a level alone sets the default level.
    let has_default = filter.split(',').any(|d| is_log_level(d.trim()));
    if has_default || filter.trim().is_empty() {
        filter.to_string()
    } else {
        format!("warn,{filter}")
    }
}

/// Install the subscriber with `filter` (an EnvFilter string, already validated by `config`).
/// A subscriber installed earlier by the host program is left in place.
pub fn install(filter: &str) {
    let filter =
        EnvFilter::try_new(with_default_level(filter)).unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| RawStderr)
        .with_ansi(false)
        .without_time()
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_without_a_level_keeps_warnings() {
        assert_eq!(
            with_default_level("cachealloc::device=debug"),
            "warn,cachealloc::device=debug"
        );
        assert_eq!(with_default_level("debug"), "debug");
        assert_eq!(
            with_default_level("error,cachealloc=info"),
            "error,cachealloc=info"
        );
        assert_eq!(with_default_level("Info"), "Info");
        assert_eq!(
            with_default_level("4,cachealloc=trace"),
            "4,cachealloc=trace"
        );
    }

    /// A panic inside an event is dropped with the event.
    #[test]
    fn a_panicking_event_is_dropped() {
        emit(|| panic!("formatter gone"));
    }
}
