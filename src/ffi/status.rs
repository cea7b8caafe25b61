//! The one place where errors become `cudaError_t` codes, and the panic boundary every export
//! runs in. Log lines for failures are written here, after every lock has been released.

use crate::backend::BackendError;
use crate::backend::cuda::runtime::{CudaError, codes};
use crate::config::{Config, render_conf, shell_word};
use crate::ffi::repeats::{Repeats, Shown};
use crate::global::{ShimError, init, panics, recording_path};
use crate::pool::{DeviceId, Error, OomReport, format_size};

/// Out-of-memory errors: reports are long, so few are logged in full.
static OUT_OF_MEMORY: Repeats = Repeats::new("out-of-memory errors", 3);
/// Refused calls: a double free or interior pointer, a pointer the C API does not own.
static BAD_POINTERS: Repeats = Repeats::new("bad-pointer errors", 10);
/// Requests over 1 EiB.
static TOO_LARGE: Repeats = Repeats::new("requests too large", 10);
/// Devices the process does not have.
static NO_DEVICE: Repeats = Repeats::new("invalid-device errors", 10);
/// Other arguments refused (a stream use of freed memory, an IPC handle that cannot be made).
static BAD_ARGUMENTS: Repeats = Repeats::new("invalid-argument errors", 10);

/// Failures inside a hook that returns no code, of the kinds `to_code` leaves to the code.
static UNRETURNED: Repeats = Repeats::new("failures of hooks that return no code", 10);

/// Log `err` of an entry point that returns no code (the pluggable allocator's free,
/// record-stream and empty-cache hooks): as `to_code` logs it, except that a runtime error,
/// which `to_code` leaves to the code the program reads, is logged at warn (the first few, then
/// counted): here the log is the only word of it.
pub fn log_unreturned(call: &'static str, err: ShimError) {
    match err {
        e @ (ShimError::Runtime { .. } | ShimError::Pool(Error::Backend(_))) => {
            log_refusal(call, &UNRETURNED, &e)
        }
        e => {
            to_code(call, e);
        }
    }
}

/// The code for `err`, logging what the program should know: at warn, the first few of each
/// kind (an OOM report in full), then counted (`repeats`).
///
/// - out of memory (after the whole retry ladder), or a request over 1 EiB: 2
///   `cudaErrorMemoryAllocation`;
/// - a double free, an interior pointer, a pointer the C API does not own, a bad argument: 1
///   `cudaErrorInvalidValue`;
/// - a real runtime error: its own code, unchanged;
/// - a device the process does not have: 101 `cudaErrorInvalidDevice`;
/// - invalid configuration, no runtime in the process: 3 `cudaErrorInitializationError`;
/// - an internal inconsistency: 999 `cudaErrorUnknown`.
pub fn to_code(call: &'static str, err: ShimError) -> CudaError {
    match err {
        ShimError::Pool(Error::OutOfMemory(report)) => {
            log_oom(call, &report);
            codes::MEMORY_ALLOCATION
        }
        ShimError::Pool(Error::Backend(BackendError::OutOfMemory)) => codes::MEMORY_ALLOCATION,
        ShimError::Pool(e @ Error::RequestTooLarge { .. }) => {
            log_refusal(call, &TOO_LARGE, &e);
            codes::MEMORY_ALLOCATION
        }
        ShimError::Pool(e @ (Error::NotOwned { .. } | Error::InvalidPointer { .. })) => {
            log_refusal(call, &BAD_POINTERS, &e);
            codes::INVALID_VALUE
        }
        ShimError::Pool(e @ Error::InvalidFraction(_)) => {
            log_refusal(call, &BAD_ARGUMENTS, &e);
            codes::INVALID_VALUE
        }
        ShimError::Pool(Error::Backend(BackendError::Device { code, call: inner })) => {
            log_event!(
                debug,
                "{call}: {inner} failed with CUDA error {code}; passed through"
            );
            code
        }
        ShimError::Pool(
            e @ (Error::InvalidSeed(_) | Error::SeedForbiddenBySettings(_) | Error::Invariant(_)),
        ) => {
            log_event!(error, "{call}: {e}");
            codes::UNKNOWN
        }
        ShimError::Runtime { code, call: inner } => {
            log_event!(
                debug,
                "{call}: {inner} failed with CUDA error {code}; passed through"
            );
            code
        }
        ShimError::ConfigInvalid | ShimError::NoRuntime => codes::INITIALIZATION_ERROR,
        e @ (ShimError::InvalidArgument(_) | ShimError::NotExportable { .. }) => {
            log_refusal(call, &BAD_ARGUMENTS, &e);
            codes::INVALID_VALUE
        }
        e @ ShimError::NoSuchDevice { .. } => {
            log_refusal(call, &NO_DEVICE, &e);
            codes::INVALID_DEVICE
        }
        e @ ShimError::PoolBroken(..) => {
            log_event!(error, "{call}: {e}");
            codes::UNKNOWN
        }
    }
}

/// Log an out-of-memory report: in full at warn for the first few of the process, then at
/// debug, with a line at warn counting them now and then.
fn log_oom(call: &'static str, report: &OomReport) {
    // Built only where a line is written: a program that fails in a loop logs most of its
    // reports at debug, which the default filter drops.
    log_repeated(
        call,
        &OUT_OF_MEMORY,
        || oom_text(report),
        || {
            format!(
                "the latest asked for {} on device {}",
                format_size(report.requested),
                report.device.0
            )
        },
    );
}

/// Log a refused call's error, the first few of its kind at warn, then counted.
fn log_refusal(call: &'static str, kind: &Repeats, err: &dyn std::fmt::Display) {
    log_repeated(
        call,
        kind,
        || err.to_string(),
        || format!("the latest: {err}"),
    );
}

/// Log the next error of `kind`: `text` at warn or at debug, and the counting lines at warn.
fn log_repeated(
    call: &'static str,
    kind: &Repeats,
    text: impl Fn() -> String,
    latest: impl Fn() -> String,
) {
    let (n, shown) = kind.next();
    let what = kind.what;
    match shown {
        Shown::Full => {
            log_event!(warn, "{call}: {}", text());
            if n == kind.shown {
                log_event!(
                    warn,
                    "{call}: {n} {what}: later ones are counted here now and then \
                     (CACHEALLOC_LOG=debug logs each one)"
                );
            }
        }
        Shown::Counted => {
            log_event!(debug, "{call}: {}", text());
            log_event!(
                warn,
                "{call}: {n} {what} so far; {} (CACHEALLOC_LOG=debug logs each one)",
                latest()
            );
        }
        Shown::Quiet => log_event!(debug, "{call}: {}", text()),
    }
}

/// Where the OOM report suggests recording a run that is not recorded (`%p` = process id).
const SUGGESTED_TRACE: &str = "/tmp/cachealloc-%p.jsonl";

/// An out-of-memory report in full, as the log and PyTorch's exception give it: the advice
/// replaces the hint's own pointer to a replay, and is left out where no setting can help.
pub(super) fn oom_text(report: &OomReport) -> String {
    if report.hint().settings_may_help() {
        format!("{report:#}\n{}", replay_advice(report.device))
    } else {
        format!("{report:#}")
    }
}

/// The OOM report's last line: how to find the settings that fit this very run — the replay
/// command when the run is being recorded, else how to record it.
fn replay_advice(device: DeviceId) -> String {
    match recording_path() {
        Some(path) => {
            // The replay also tries the run with expandable segments switched.
            let expandable =
                init::active_config().is_some_and(|config| config.settings.expandable_segments);
            format!(
                "This run is recorded to {path}: once it has ended, `cachealloc replay {} \
                 --device {} --faithful` replays it and lists the max_split_size_mb values, if \
                 any, under which the whole run has no out-of-memory error (else the one that \
                 gets furthest past this one){}.",
                shell_word(path),
                device.0,
                if expandable {
                    ", and whether native segments (without expandable segments) avoid them"
                } else {
                    ", and whether expandable segments avoid them"
                }
            )
        }
        None => {
            // The same settings, wherever they came from, plus the recording (in place of a
            // `trace:` whose file could not be written).
            let settings = init::active_config()
                .map(|config| {
                    render_conf(&Config {
                        trace: None,
                        ..config.clone()
                    })
                })
                .unwrap_or_default();
            let trace = format!("trace:{SUGGESTED_TRACE}");
            let conf = if settings.is_empty() {
                trace
            } else {
                format!("{settings},{trace}")
            };
            format!(
                "To replay this run offline and find the settings that fit it, if any, run it \
                 again with CACHEALLOC_CONF={} (%p is the process id) and replay the file with \
                 `cachealloc replay {} --device {} --faithful`.",
                shell_word(&conf),
                SUGGESTED_TRACE.replace("%p", "PID"),
                device.0
            )
        }
    }
}

/// Run `body`; a panic inside becomes `on_panic` and one error line, never an unwind into C.
/// (Inlined into every exported function: the hot ones are a few instructions around `body`.)
#[inline]
pub fn boundary<T>(call: &'static str, on_panic: T, body: impl FnOnce() -> T) -> T {
    match panics::catch(body) {
        Ok(value) => value,
        Err(message) => {
            report_panic(call, &message);
            on_panic
        }
    }
}

#[cold]
#[inline(never)]
fn report_panic(call: &'static str, message: &str) {
    log_event!(error, "{call}: internal error in cachealloc: {message}");
}
