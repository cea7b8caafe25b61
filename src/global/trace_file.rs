//! The `trace:PATH` recording: one file per process (`%p` = pid), all devices, in the format of
//! `trace::record`.
//!
//! - `start` (at the first call, when the option is set) creates the shared event buffer; no
//!   file yet. Each new pool gets a sink into it (`sink`), which under the pool lock only
//!   timestamps and pushes.
//! - `flush` runs after every pool call, once the pool lock is released: it takes the buffered
//!   events, formats them and hands them to a buffered file writer. The file is created at the
//!   first flush that has events, so a process that never allocates through a pool (or never
//!   calls CUDA) leaves no file. The header lists the devices of that first batch. The
//!   process holds the file's lock while it lives; one that finds it held by another process
//!   records beside it (`file_claim`).
//! - The writer reaches the file when it is created (the header and the first batch), when
//!   its 64 KiB buffer fills, after an `oom` or `device_reset` line (the moments before a
//!   program is likely to give up), and at exit (`flush_at_exit`, from the exit hook). A
//!   process killed by a signal or ending in `_exit` loses the lines still buffered.
//! - At exit the program's other threads may still be allocating. The exit hook first tells
//!   them to leave the file alone (`Phase::Exiting`: their events stay buffered, for the hook to
//!   write), waits for one writing now to finish (`exit_wait`), writes what is buffered and the
//!   `end` line, and ends the recording (`Phase::Ended`): what the program does after that is
//!   not recorded, so no line follows `end`. The buffer's lock, too, is waited for a while only:
//!   the thread holding it may be the very one exiting, from a signal handler that interrupted
//!   its push, and the file is then left with what was written, without its end.
//! - A file that cannot be created or written turns recording off with one message on stderr;
//!   the program runs on.
//!
//! The same buffer feeds the device-call log: when `CACHEALLOC_LOG` enables debug lines for
//! `cachealloc::device` (`debug`, `cachealloc=debug`), the buffer is kept even without
//! `trace:`, and each flush logs the pool's cudaMalloc and cudaFree calls (with expandable
//! segments, its page maps and unmaps and the ranges it reserves and gives back), out-of-memory
//! failures and `empty_cache` calls — formatted there, outside the pool lock like the file's
//! lines.

use super::exit_wait::lock_at_exit;
use super::file_claim::{self, HeldFile};
use super::raw_stderr;
use crate::config::{Config, expand_pid};
use crate::pool::{DeviceId, format_size};
use crate::trace::record::buffer::{DeviceSink, EventBuffer};
use crate::trace::record::{Action, Event, Header, settings_text, write_events, write_header};
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};

/// Bytes the file writer gathers before a write system call.
const WRITE_BUFFER: usize = 64 << 10; // 64 KiB

/// Target of the device-call log lines.
const DEVICE_LOG: &str = "cachealloc::device";

static RECORDER: OnceLock<Recorder> = OnceLock::new();

struct Recorder {
    buffer: Arc<EventBuffer>,
    /// The `trace:` value with `%p` unexpanded (`None`: no `trace:`, the buffer only feeds the
    /// device-call log).
    template: Option<String>,
    /// The file's name, `%p` expanded by the process that creates the file (a child forked
    /// before its parent recorded anything names its own file), or that reports it in an
    /// out-of-memory message (after it made a pool: a child it forks then steps aside).
    path: OnceLock<String>,
    /// The file recorded to, once created: `path`, or the name beside it when another process
    /// held `path` (`file_claim`).
    written_to: OnceLock<String>,
    /// Whether each flush logs the pool's device calls (debug lines for `DEVICE_LOG`).
    log_device_calls: bool,
    settings: String,
    free_sync: &'static str,
    /// A `Phase`: whether the exit hook has begun, or finished, the recording's end.
    phase: AtomicU8,
    file: Mutex<FileState>,
}

/// Where the recording stands with respect to the process's exit.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// Every pool call writes its events.
    Recording,
    /// The exit hook is finishing the file: pool calls leave their events to it.
    Exiting,
    /// The `end` line is written: later events are not recorded.
    Ended,
}

enum FileState {
    /// Nothing recorded yet: no file.
    NotCreated,
    Open(BufWriter<HeldFile>),
    /// Creating or writing failed; recording is off.
    Failed,
}

/// Start recording when `config` asks for it, or when the log shows device calls (once per
/// process; after the log's subscriber is installed).
pub fn start(config: &Config) {
    let template = config.trace.clone();
    let log_device_calls = tracing::enabled!(target: DEVICE_LOG, tracing::Level::DEBUG);
    if template.is_none() && !log_device_calls {
        return;
    }
    let _ = RECORDER.set(Recorder {
        buffer: EventBuffer::new(),
        template,
        path: OnceLock::new(),
        written_to: OnceLock::new(),
        log_device_calls,
        settings: settings_text(&config.settings),
        free_sync: config.free_sync.name(),
        phase: AtomicU8::new(Phase::Recording as u8),
        file: Mutex::new(FileState::NotCreated),
    });
}

/// The file this process records to while recording is on (`None` without `trace:`, or once
/// writing it failed).
pub fn recording_path() -> Option<&'static str> {
    let r = RECORDER.get()?;
    let path = r.file_name()?;
    let file = r.file.lock().unwrap_or_else(|p| p.into_inner());
    (!matches!(*file, FileState::Failed)).then_some(path)
}

/// In a child just forked: whether a thread of the parent held the trace file's lock at the fork
/// (every flush takes it, with or without events). No thread of the child will ever release it.
/// A try-lock released at once (async-signal-safe, as `pools::any_lock_held_at_fork`).
pub fn lock_held_at_fork() -> bool {
    RECORDER
        .get()
        .is_some_and(|r| matches!(r.file.try_lock(), Err(TryLockError::WouldBlock)))
}

/// A sink for the pool of `device` when recording is on.
pub fn sink(device: DeviceId) -> Option<DeviceSink> {
    RECORDER.get().map(|r| r.buffer.sink(device.0))
}

/// Note the total memory of `device`, whose pool is being created.
pub fn note_device_memory(device: DeviceId, total: u64) {
    if let Some(r) = RECORDER.get() {
        r.buffer
            .push_with(|t_us| Event::device_memory(device.0, total, t_us));
    }
}

/// Note that the program set the memory fraction of `device`, which has no pool now to record
/// it (a pool records its own: `DeviceAllocator::set_memory_fraction`).
pub fn note_memory_fraction(device: DeviceId, fraction: f64) {
    if let Some(r) = RECORDER.get() {
        r.buffer
            .push_with(|t_us| Event::memory_fraction(device.0, fraction, t_us));
    }
}

/// Note that the pool of `device` was dropped by `cudaDeviceReset`.
pub fn note_device_reset(device: DeviceId) {
    if let Some(r) = RECORDER.get() {
        r.buffer
            .push_with(|t_us| Event::device_reset(device.0, t_us));
    }
}

/// Write what was recorded since the last flush. Call with no pool lock held. Without a
/// recording this is one load and a branch, inlined into every pool call.
#[inline]
pub fn flush() {
    if let Some(r) = RECORDER.get() {
        r.flush();
    }
}

/// Write everything left, the `end` line, and flush the file (exit hook). Other threads that
/// still allocate leave the file to this from now on; one writing now is waited for, a while
/// (`exit_wait`: if it does not finish, the file is left without its end).
pub fn flush_at_exit() {
    if let Some(r) = RECORDER.get() {
        r.set_phase(Phase::Exiting);
        if let Some(mut file) = lock_at_exit(&r.file) {
            r.write(&mut file, true);
        }
        r.set_phase(Phase::Ended);
    }
}

impl Recorder {
    #[inline(never)]
    fn flush(&self) {
        match self.phase() {
            Phase::Recording => {
                let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
                self.write(&mut file, false);
            }
            // The exit hook writes them.
            Phase::Exiting => {}
            // After the end: logged (when the log shows device calls), not recorded.
            Phase::Ended => self.log(&self.buffer.take()),
        }
    }

    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Recording,
            1 => Phase::Exiting,
            _ => Phase::Ended,
        }
    }

    fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    fn log(&self, events: &[Event]) {
        if self.log_device_calls {
            log_device_calls(events);
        }
    }

    /// The trace file's name, when recording to a file.
    fn path(&self) -> Option<&str> {
        let template = self.template.as_deref()?;
        Some(
            self.path
                .get_or_init(|| expand_pid(template, std::process::id())),
        )
    }

    /// The name of the file recorded to: the one created, else the one it will be created as.
    fn file_name(&self) -> Option<&str> {
        self.written_to
            .get()
            .map(String::as_str)
            .or_else(|| self.path())
    }

    fn write(&self, file: &mut FileState, at_exit: bool) {
        // A pool call that got here as the exit hook began leaves its events to the hook, which
        // writes them before the `end` line (once ended, the next pool call logs them).
        if !at_exit && self.phase() != Phase::Recording {
            return;
        }
        // Taken under the file lock, so batches reach the file in the order they were taken.
        let (events, end) = if at_exit {
            // Waited for a while only: the thread pushing may be the one whose signal handler
            // called `exit`, and never come back. The file then keeps what was written to it,
            // without its end.
            let Some((events, t_us)) = self.buffer.take_with_time(lock_at_exit) else {
                let flushed = match file {
                    FileState::Open(writer) => writer.flush(),
                    _ => Ok(()),
                };
                if let Err(e) = flushed {
                    self.fail(file, "write", &e);
                }
                return;
            };
            (events, Some(Event::end(t_us)))
        } else {
            (self.buffer.take(), None)
        };
        self.log(&events);
        if events.is_empty() && !at_exit {
            return;
        }
        let mut bytes = Vec::new();
        // The header and the first events reach the file at once: a process killed before its
        // first 64 KiB leaves a recording that says so, not an empty file.
        let created = matches!(file, FileState::NotCreated);
        if created {
            // The name is settled here, by the process that records something, and not before:
            // a child forked after its parent's first CUDA call but before its first allocation
            // (whose calls flushed nothing) names its own file.
            if events.is_empty() {
                return;
            }
            let Some(path) = self.path() else {
                return;
            };
            match file_claim::claim(path, std::process::id()) {
                Ok(claimed) => {
                    match &claimed.diverted_from {
                        Some(asked) if claimed.held_here => {
                            raw_stderr::write(&format!(
                                "cachealloc: {asked} is this process's statistics file \
                                 (stats_file names it another way); the trace goes to {} \
                                 instead: give them different files\n",
                                claimed.path
                            ));
                        }
                        Some(asked) => {
                            raw_stderr::write(&format!(
                                "cachealloc: another process is recording to {asked}; this one \
                                 records to {} (put %p in the trace path for one file per \
                                 process)\n",
                                claimed.path
                            ));
                        }
                        None => {}
                    }
                    let _ = self.written_to.set(claimed.path);
                    *file = FileState::Open(BufWriter::with_capacity(WRITE_BUFFER, claimed.file));
                }
                Err(e) => return self.fail(file, "create", &e),
            }
            let mut devices: Vec<i32> = events.iter().map(|e| e.device).collect();
            devices.sort_unstable();
            devices.dedup();
            let header = Header::new(
                std::process::id(),
                devices,
                self.settings.clone(),
                self.free_sync,
            );
            write_header(&mut bytes, &header);
        }
        let FileState::Open(writer) = file else {
            return;
        };
        write_events(&mut bytes, &events);
        // The recording is complete: a file without this line stopped early.
        if let Some(end) = end {
            write_events(&mut bytes, &[end]);
        }
        let urgent = at_exit
            || created
            || events
                .iter()
                .any(|e| matches!(e.action, Action::Oom | Action::DeviceReset));
        let written = writer
            .write_all(&bytes)
            .and_then(|()| if urgent { writer.flush() } else { Ok(()) });
        if let Err(e) = written {
            self.fail(file, "write", &e);
        }
    }

    fn fail(&self, file: &mut FileState, what: &str, error: &std::io::Error) {
        *file = FileState::Failed;
        raw_stderr::write(&format!(
            "cachealloc: cannot {what} the trace file {}: {error}; recording is off\n",
            self.file_name().unwrap_or_default()
        ));
    }
}

/// One debug line per device call among `events` (allocations and frees are not logged).
fn log_device_calls(events: &[Event]) {
    for e in events {
        let d = e.device;
        match e.action {
            Action::SegmentAlloc => log_event!(debug,
                target: DEVICE_LOG,
                "device {d}: cudaMalloc {} at {:#x} (stream {:#x})",
                format_size(e.size),
                e.addr,
                e.stream
            ),
            Action::SegmentFree => log_event!(debug,
                target: DEVICE_LOG,
                "device {d}: cudaFree {} at {:#x}",
                format_size(e.size),
                e.addr
            ),
            Action::SegmentMap => log_event!(debug,
                target: DEVICE_LOG,
                "device {d}: map {} at {:#x} (cuMemCreate + cuMemMap; stream {:#x})",
                format_size(e.size),
                e.addr,
                e.stream
            ),
            Action::SegmentUnmap => log_event!(debug,
                target: DEVICE_LOG,
                "device {d}: unmap {} at {:#x} (cuMemUnmap + cuMemRelease)",
                format_size(e.size),
                e.addr
            ),
            Action::RangeReserve => log_event!(debug,
                target: DEVICE_LOG,
                "device {d}: reserve {} of address space at {:#x} for pages of {} \
                 (cuMemAddressReserve; stream {:#x})",
                format_size(e.size),
                e.addr,
                format_size(e.page.unwrap_or(0)),
                e.stream
            ),
            Action::RangeRelease => log_event!(debug,
                target: DEVICE_LOG,
                "device {d}: release {} of address space at {:#x} (cuMemAddressFree)",
                format_size(e.size),
                e.addr
            ),
            Action::Oom => log_event!(debug,
                target: DEVICE_LOG,
                "device {d}: out of memory: {} requested (rounded), {} free on the device",
                format_size(e.size),
                format_size(e.device_free.unwrap_or(0))
            ),
            Action::EmptyCache => log_event!(debug, target: DEVICE_LOG, "device {d}: empty_cache"),
            _ => {}
        }
    }
}
