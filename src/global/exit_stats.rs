//! The statistics report at exit (`stats:text` or `stats:json`, to stderr or `stats_file`, where
//! `%p` becomes the process id; to stderr when that file cannot be written): one entry per
//! device that had a pool.
//!
//! Registered with `atexit` at the first call when `stats` or `trace` is on; the handler also
//! writes the rest of the `trace` recording (`trace_file::flush_at_exit`). It makes no CUDA
//! call (the runtime may already be torn down), takes no lock that another thread holds, and
//! never unwinds into libc.

use super::init::active_config;
use super::pools;
use super::trace_file;
use crate::config::StatsOutput;
use crate::pool::{DeviceId, DeviceStats};
use crate::report::{memory_summary, stats_json};
use std::io::Write;
use std::sync::Once;

static REGISTERED: Once = Once::new();

/// Register the exit handler (once per process).
pub fn register() {
    REGISTERED.call_once(|| {
        // SAFETY: `at_exit` is an `extern "C" fn()` that lives as long as the library (a
        // preloaded or linked library is never unloaded before exit handlers run).
        let rc = unsafe { libc::atexit(at_exit) };
        if rc != 0 {
            log_event!(warn, "could not register the exit-time statistics report");
        }
    });
}

extern "C" fn at_exit() {
    // A forked child's trace buffer and pools are the parent's: the parent writes them.
    if super::fork::in_forked_child() {
        return;
    }
    // Nothing may unwind into libc's exit; a failure here loses the report, nothing else.
    let _ = std::panic::catch_unwind(trace_file::flush_at_exit);
    let _ = std::panic::catch_unwind(write_report);
}

fn write_report() {
    let Some(config) = active_config() else {
        return;
    };
    let stats = pools::stats_snapshot();
    let text = match config.stats {
        StatsOutput::Off => return,
        StatsOutput::Text => render_text(&stats),
        StatsOutput::Json => render_json(&stats),
    };
    let pid = std::process::id();
    match config.stats_path(pid) {
        Some(path) => {
            if let Err(e) = std::fs::write(&path, &text) {
                // Not lost: the report goes to stderr instead, as without `stats_file`.
                let _ = writeln!(
                    std::io::stderr(),
                    "cachealloc: cannot write statistics to {path}: {e}; here they are instead:"
                );
                let _ = std::io::stderr().write_all(text.as_bytes());
            }
        }
        None => {
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    }
}

/// `memory_summary` of each device, one after another.
pub fn render_text(stats: &[(DeviceId, DeviceStats)]) -> String {
    if stats.is_empty() {
        return "cachealloc: no device memory was allocated through cachealloc\n".to_string();
    }
    stats
        .iter()
        .map(|(device, s)| memory_summary(s, *device, false))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `{"pid": …, "devices": [{"device": 0, "stats": {…memory_stats keys…}}, …]}` on one line.
pub fn render_json(stats: &[(DeviceId, DeviceStats)]) -> String {
    let devices: Vec<serde_json::Value> = stats
        .iter()
        .map(|(device, s)| serde_json::json!({ "device": device.0, "stats": stats_json(s) }))
        .collect();
    let doc = serde_json::json!({ "pid": std::process::id(), "devices": devices });
    format!("{doc}\n")
}
