//! The statistics report at exit (`stats:text` or `stats:json`, to stderr or `stats_file`, where
//! `%p` becomes the process id; to stderr when that file cannot be written): one entry per
//! device that had a pool.
//!
//! The `stats_file` is claimed at the first call (`file_claim`): held by the process until it
//! ends, so that processes given one path without `%p` each keep their report (one that finds it
//! held writes beside it). A child forked after the claim does not write to the parent's file:
//! it claims its own at exit, as a process that could not claim one earlier does (beside the
//! parent's, when the path has no `%p`).
//!
//! Registered with `atexit` at the first call when `stats` or `trace` is on; the handler also
//! writes the rest of the `trace` recording (`trace_file::flush_at_exit`). It makes no CUDA
//! call (the runtime may already be torn down), waits no more than a while for a lock that
//! another thread holds (`exit_wait`), and never unwinds into libc.

use super::file_claim::{self, Claimed, HeldFile};
use super::init::active_config;
use super::pools;
use super::raw_stderr;
use super::trace_file;
use crate::config::{Config, StatsOutput};
use crate::pool::{DeviceId, DeviceStats, format_size};
use crate::report::{memory_summary, stats_json};
use std::io::Write;
use std::sync::{Mutex, Once, TryLockError};

static REGISTERED: Once = Once::new();

/// The `stats_file` claimed at the first call: the process that claimed it, the file, its name.
static STATS_FILE: Mutex<Option<(u32, HeldFile, String)>> = Mutex::new(None);

/// Register the exit handler and claim the `stats_file` (once per process).
pub fn register(config: &Config) {
    REGISTERED.call_once(|| {
        claim_stats_file(config);
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

/// Claim the `stats_file`, if the report goes to one. A file that cannot be claimed now is
/// said so at once and claimed again at exit, where a failure sends the report to stderr.
fn claim_stats_file(config: &Config) {
    if config.stats == StatsOutput::Off {
        return;
    }
    let pid = std::process::id();
    let Some(path) = config.stats_path(pid) else {
        return;
    };
    match claim(&path, pid) {
        Ok((file, path)) => {
            *STATS_FILE.lock().unwrap_or_else(|p| p.into_inner()) = Some((pid, file, path));
        }
        // Said now rather than only at exit, which may be hours away.
        Err(e) => {
            raw_stderr::write(&format!(
                "cachealloc: cannot open the statistics file {path}: {e}; it is tried again at \
                 exit, and if it still fails the statistics go to stderr\n"
            ));
        }
    }
}

/// The statistics file `path` for process `pid`, or the one beside it (said on stderr) when
/// another process holds it.
fn claim(path: &str, pid: u32) -> std::io::Result<(HeldFile, String)> {
    let Claimed {
        file,
        path,
        diverted_from,
        held_here,
    } = file_claim::claim(path, pid)?;
    if let (Some(asked), true) = (&diverted_from, held_here) {
        raw_stderr::write(&format!(
            "cachealloc: {asked} is this process's trace file (the trace path names it another \
             way); the statistics go to {path} instead: give them different files\n"
        ));
    } else if let Some(asked) = diverted_from {
        raw_stderr::write(&format!(
            "cachealloc: another process holds the statistics file {asked}; this one writes its \
             statistics to {path} (put %p in the stats_file path for one file per process)\n"
        ));
    }
    Ok((file, path))
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
    let Some(asked) = config.stats_path(pid) else {
        raw_stderr::write(&text);
        return;
    };
    let mut claimed = match STATS_FILE.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    };
    // The file claimed at the first call; a forked child's claim is its parent's, so it claims
    // its own now.
    let own = claimed
        .as_deref_mut()
        .and_then(Option::as_mut)
        .filter(|(owner, _, _)| *owner == pid)
        .map(|(_, file, path)| (file, path.clone()));
    let written = match own {
        Some((file, path)) => file.write_all(text.as_bytes()).map_err(|e| (path, e)),
        None => claim(&asked, pid)
            .map_err(|e| (asked.clone(), e))
            .and_then(|(mut file, path)| file.write_all(text.as_bytes()).map_err(|e| (path, e))),
    };
    if let Err((path, e)) = written {
        // Not lost: the report goes to stderr instead, as without `stats_file`.
        raw_stderr::write(&format!(
            "cachealloc: cannot write statistics to {path}: {e}; here they are instead:\n{text}"
        ));
    }
}

/// `memory_summary` of each device, one after another.
pub fn render_text(stats: &[(DeviceId, DeviceStats)]) -> String {
    if stats.is_empty() {
        return "cachealloc: no device memory was allocated through cachealloc\n".to_string();
    }
    stats
        .iter()
        .map(|(device, s)| memory_summary(s, *device, false) + &pending_at_exit(s))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A line under the summary when frees were still waiting at exit: their blocks count as active
/// memory (as in PyTorch, for a free waiting on a stream's events), not as allocated, and a
/// reader would otherwise take them for a leak.
fn pending_at_exit(s: &DeviceStats) -> String {
    let pending = s.active_bytes.all.current - s.allocated_bytes.all.current;
    if pending <= 0 {
        return String::new();
    }
    format!(
        "Frees still waiting for the device at exit hold {} of the active memory (free_sync: \
         no device synchronization after them): not a leak.\n",
        format_size(pending as u64)
    )
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
