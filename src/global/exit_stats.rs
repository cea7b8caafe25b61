//! The statistics report at exit (`stats:text` or `stats:json`, to stderr or `stats_file`, where
//! `%p` becomes the process id; to stderr when that file cannot be written): one entry per
//! device that had a pool, and a line (in JSON an entry of `skipped`) for each device left out
//! because another thread held its pool's lock for longer than the handler waits.
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
//!
//! The handler is registered before the `stats_file` is claimed, and the claim is made under
//! the file's lock: another thread may call `exit` while the first call is still being made,
//! and its handler then waits for the claim and writes the report to the file. Claimed first, a
//! file could be left empty, with no handler yet to write it. The handler reads the settings
//! saved at its registration, not the mode, which is only set once that first call has finished.

use super::exit_wait::{EXIT_LOCK_WAIT, lock_at_exit};
use super::file_claim::{self, Claimed, HeldFile};
use super::pools;
use super::raw_stderr;
use super::trace_file;
use crate::config::{Config, StatsOutput, expand_pid};
use crate::pool::{DeviceId, DeviceStats, format_size};
use crate::report::{memory_summary, stats_json};
use std::io::Write;
use std::sync::{Mutex, Once, OnceLock};

static REGISTERED: Once = Once::new();

/// The `stats_file` claimed at the first call: the process that claimed it, the file, its name.
static STATS_FILE: Mutex<Option<(u32, HeldFile, String)>> = Mutex::new(None);

/// The report's settings, saved before the handler is registered.
static SETTINGS: OnceLock<Settings> = OnceLock::new();

struct Settings {
    format: StatsOutput,
    /// `stats_file`, `%p` unexpanded; `None` = stderr.
    file: Option<String>,
}

impl Settings {
    /// The statistics file of process `pid` (`%p` expanded); `None` = stderr.
    fn path(&self, pid: u32) -> Option<String> {
        self.file.as_deref().map(|t| expand_pid(t, pid))
    }
}

/// Register the exit handler, then claim the `stats_file` (once per process).
pub fn register(config: &Config) {
    REGISTERED.call_once(|| {
        let settings = SETTINGS.get_or_init(|| Settings {
            format: config.stats,
            file: config.stats_file.clone(),
        });
        // Held from before the registration to the end of the claim (see the module comment).
        let mut claimed = STATS_FILE.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: `at_exit` is an `extern "C" fn()` that lives as long as the library (a
        // preloaded or linked library is never unloaded before exit handlers run; glibc runs
        // those of a dlopen'ed one, as PyTorch's pluggable allocator, when it is closed).
        let rc = unsafe { libc::atexit(at_exit) };
        if rc != 0 {
            drop(claimed);
            log_event!(warn, "could not register the exit-time statistics report");
            // No file is claimed: nothing would write it.
            return;
        }
        let notice = claim_stats_file(settings, &mut claimed);
        // Said once the claim is done: a write to stderr may wait (a full pipe).
        drop(claimed);
        if let Some(notice) = notice {
            raw_stderr::write(&notice);
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

/// Claim the `stats_file` into `slot`, if the report goes to one; the notice to print, if any. A
/// file that cannot be claimed now is said so at once and claimed again at exit, where a
/// failure sends the report to stderr.
fn claim_stats_file(
    settings: &Settings,
    slot: &mut Option<(u32, HeldFile, String)>,
) -> Option<String> {
    if settings.format == StatsOutput::Off {
        return None;
    }
    let pid = std::process::id();
    let path = settings.path(pid)?;
    match claim(&path, pid) {
        Ok((file, path, notice)) => {
            *slot = Some((pid, file, path));
            notice
        }
        // Said now rather than only at exit, which may be hours away.
        Err(e) => Some(format!(
            "cachealloc: cannot open the statistics file {path}: {e}; it is tried again at \
             exit, and if it still fails the statistics go to stderr\n"
        )),
    }
}

/// The statistics file `path` for process `pid`, or the one beside it when another process
/// holds it, with the notice that says so.
fn claim(path: &str, pid: u32) -> std::io::Result<(HeldFile, String, Option<String>)> {
    let Claimed {
        file,
        path,
        diverted_from,
        held_here,
    } = file_claim::claim(path, pid)?;
    let notice = match (diverted_from, held_here) {
        (Some(asked), true) => Some(format!(
            "cachealloc: {asked} is this process's trace file (the trace path names it another \
             way); the statistics go to {path} instead: give them different files\n"
        )),
        (Some(asked), false) => Some(format!(
            "cachealloc: another process holds the statistics file {asked}; this one writes its \
             statistics to {path} (put %p in the stats_file path for one file per process)\n"
        )),
        (None, _) => None,
    };
    Ok((file, path, notice))
}

fn write_report() {
    let Some(settings) = SETTINGS.get() else {
        return;
    };
    // Chosen before the snapshot, which may wait for busy pools: for nothing when no report is
    // asked.
    let render = match settings.format {
        StatsOutput::Off => return,
        StatsOutput::Text => render_text,
        StatsOutput::Json => render_json,
    };
    let snapshot = pools::stats_snapshot();
    let text = render(&snapshot.devices, &snapshot.busy);
    let pid = std::process::id();
    let Some(asked) = settings.path(pid) else {
        raw_stderr::write(&text);
        return;
    };
    // A claim still being made by the first call is waited for, a while.
    let mut claimed = lock_at_exit(&STATS_FILE);
    // The file claimed at the first call; a forked child's claim is its parent's, so it claims
    // its own now.
    let own = claimed
        .as_deref_mut()
        .and_then(Option::as_mut)
        .filter(|(owner, _, _)| *owner == pid)
        .map(|(_, file, path)| (file, path.clone()));
    let written = match own {
        Some((file, path)) => file.write_all(text.as_bytes()).map_err(|e| (path, e)),
        None => claim(&asked, pid).map_err(|e| (asked.clone(), e)).and_then(
            |(mut file, path, notice)| {
                if let Some(notice) = notice {
                    raw_stderr::write(&notice);
                }
                file.write_all(text.as_bytes()).map_err(|e| (path, e))
            },
        ),
    };
    if let Err((path, e)) = written {
        // Not lost: the report goes to stderr instead, as without `stats_file`.
        raw_stderr::write(&format!(
            "cachealloc: cannot write statistics to {path}: {e}; here they are instead:\n{text}"
        ));
    }
}

/// Why a device in `busy` is left out of the report.
fn busy_reason() -> String {
    format!(
        "another thread held its pool for more than {} s at exit",
        EXIT_LOCK_WAIT.as_secs()
    )
}

/// `memory_summary` of each device, one after another, then a line for each device of `busy`
/// (whose pool lock stayed held at exit: left out).
pub fn render_text(stats: &[(DeviceId, DeviceStats)], busy: &[DeviceId]) -> String {
    if stats.is_empty() && busy.is_empty() {
        return "cachealloc: no device memory was allocated through cachealloc\n".to_string();
    }
    let summaries = stats
        .iter()
        .map(|(device, s)| memory_summary(s, *device, false) + &pending_at_exit(s))
        .collect::<Vec<_>>()
        .join("\n");
    let left_out: String = busy
        .iter()
        .map(|device| {
            format!(
                "cachealloc: device {} is left out of this report: {}\n",
                device.0,
                busy_reason()
            )
        })
        .collect();
    summaries + &left_out
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
        "Frees still waiting at exit for the work that may use their blocks hold {} of the \
         active memory (no device synchronization after them, under free_sync, or streams of \
         record_stream not done): not a leak.\n",
        format_size(pending as u64)
    )
}

/// `{"pid": …, "devices": [{"device": 0, "stats": {…memory_stats keys…}}, …], "skipped":
/// [{"device": 1, "reason": "…"}, …]}` on one line; `skipped` lists the devices of `busy` (whose
/// pool lock stayed held at exit: left out), and is empty when none was.
pub fn render_json(stats: &[(DeviceId, DeviceStats)], busy: &[DeviceId]) -> String {
    let devices: Vec<serde_json::Value> = stats
        .iter()
        .map(|(device, s)| serde_json::json!({ "device": device.0, "stats": stats_json(s) }))
        .collect();
    let skipped: Vec<serde_json::Value> = busy
        .iter()
        .map(|device| serde_json::json!({ "device": device.0, "reason": busy_reason() }))
        .collect();
    let doc = serde_json::json!({
        "pid": std::process::id(),
        "devices": devices,
        "skipped": skipped,
    });
    format!("{doc}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report whose every device was left out names them, and does not say that no memory was
    /// allocated; in JSON, `skipped` is there, empty, when no device was left out.
    #[test]
    fn a_report_with_every_device_left_out_names_them() {
        assert_eq!(
            render_text(&[], &[DeviceId(1)]),
            "cachealloc: device 1 is left out of this report: another thread held its pool for \
             more than 1 s at exit\n"
        );
        let doc: serde_json::Value = serde_json::from_str(&render_json(&[], &[])).unwrap();
        assert_eq!(doc["skipped"], serde_json::json!([]), "{doc}");
    }
}
