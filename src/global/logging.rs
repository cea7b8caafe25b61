//! The stderr log of the library: a `tracing` subscriber with the `CACHEALLOC_LOG` filter
//! (`warn` by default), installed at the first interposed call — never in a process that does
//! not call CUDA.

use tracing_subscriber::EnvFilter;

/// Install the subscriber with `filter` (an EnvFilter string, already validated by `config`).
/// A subscriber installed earlier by the host program is left in place.
pub fn install(filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .try_init();
}
