//! CUDA graph captures the program has begun, so that the pools make no call that would end
//! one.
//!
//! While a stream captures, a `cudaDeviceSynchronize` from any thread ends the capture as
//! invalidated (`cudaErrorStreamCaptureUnsupported`, whatever the capture's mode), and so may
//! the runtime's other calls that wait for the device or query its events (`cudaFree`,
//! `cudaEventQuery`). PyTorch under `LD_PRELOAD` meets this: its caching allocator calls
//! `cudaMalloc` during `torch.cuda.graph` captures (with the capture rules relaxed for that
//! call), and a pool that synchronized there to reuse frees still pending, or gave cached
//! memory back to retry, would make the capture fail where the runtime's own `cudaMalloc`
//! succeeds. So the interposed `cudaStreamBeginCapture` (and its `ToGraph` and per-thread
//! forms) notes the stream here; while any noted stream is still capturing, the backend answers
//! that a capture is underway and the pool only obtains new memory (`Backend::capture_underway`).
//!
//! A capture's end is not interposed: the runtime is asked instead (`cudaStreamIsCapturing`,
//! which captures allow), and only when the pool would make such a call, so a stream whose
//! capture ended is forgotten then. A stream is forgotten before it is destroyed (the
//! interposed `cudaStreamDestroy`, or its device's `cudaDeviceReset`), since the runtime does
//! not check the handle it is asked about: a destroyed stream's may crash it, or name a newer
//! stream. The noted streams are atomics in a fixed table (no lock to be held across a
//! `fork`); a capture begun while the table is full is not noted (a warning says so once), as
//! when it was begun through the driver API.
//!
//! A request of the C API or of PyTorch's pluggable allocator made during a capture runs with the
//! calling thread's capture mode relaxed (`RelaxedMode`), as PyTorch's allocator relaxes it
//! around its own `cudaMalloc` (`cudaMallocMaybeCapturing`): a request that no cached block
//! serves takes new memory with `cudaMalloc`, which a capture in the global or thread-local mode
//! refuses from a thread that has not relaxed it, ending the capture. Whether a capture survives
//! would then depend on what the cache holds. The pool makes no call during a capture that the
//! relaxed mode would let through and that harms it (no synchronization, free or event query).
//! The interposed `cudaMalloc` keeps the program's mode: that call is the program's own.
//!
//! Without a lock, three narrow races stay open between threads: a request of another thread
//! between a capture's start and its noting does not see it; a thread that found a noted
//! stream not capturing and forgets it may forget a new capture of the same stream, noted in
//! that slot meanwhile (after another thread had forgotten the old one); and a query already
//! made about a stream when another thread destroys it is not waited for. And a capture of a
//! per-thread default stream is noted as `cudaStreamPerThread`, which the runtime reads as the
//! asking thread's own stream: another thread's query finds that one not capturing and forgets
//! the note.

use super::runtime::{self, CudaError, Runtime, STREAM_LEGACY, STREAM_PER_THREAD, codes};
use super::unread_error;
use crate::pool::DeviceId;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Streams that may be capturing: far more than programs run at once.
const SLOTS: usize = 64;

/// Each slot: a stream handle (never 0: the legacy stream does not capture), or 0 for none.
static STREAMS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// Slots in use: 0 is the common case, one load.
static NOTED: AtomicUsize = AtomicUsize::new(0);
static WARNED_FULL: AtomicBool = AtomicBool::new(false);

/// `cudaStreamCaptureStatusNone`.
const STATUS_NONE: i32 = 0;
/// `cudaStreamCaptureModeRelaxed`.
const MODE_RELAXED: c_int = 2;

/// The calling thread's capture mode relaxed while this lives, when a capture is underway; the
/// mode it had is restored on drop. Nothing changes when no capture is underway or the runtime
/// lacks `cudaThreadExchangeStreamCaptureMode`.
pub struct RelaxedMode {
    rt: &'static Runtime,
    previous: Option<c_int>,
}

impl RelaxedMode {
    /// The error the program has not read is kept first (`unread_error`), before the library's
    /// own calls of the request may replace it.
    pub fn enter(rt: &'static Runtime) -> Self {
        let previous = if underway(rt) {
            unread_error::keep_unread(rt);
            exchange_mode(rt, MODE_RELAXED)
        } else {
            None
        };
        Self { rt, previous }
    }
}

impl Drop for RelaxedMode {
    /// No error is kept here: the program's was kept on entering, and what the runtime holds
    /// now is the failure of one of the request's own calls, which the program is not to read
    /// (the request reports it by its answer).
    fn drop(&mut self) {
        if let Some(mode) = self.previous {
            exchange_mode(self.rt, mode);
        }
    }
}

/// Set the calling thread's capture mode to `mode`; the mode it had, or `None` when the runtime
/// cannot (no such function, or a failure, cleared).
#[cold]
#[inline(never)]
fn exchange_mode(rt: &Runtime, mode: c_int) -> Option<c_int> {
    let exchange = rt.thread_exchange_stream_capture_mode?;
    let mut mode = mode;
    // SAFETY: `mode` is a valid in/out pointer holding a `cudaStreamCaptureMode` value: the
    // relaxed mode's, or one the runtime handed out before.
    let code: CudaError = unsafe { exchange(&mut mode) };
    if code != codes::SUCCESS {
        runtime::clear_last_error(rt);
        return None;
    }
    Some(mode)
}

/// The program began a capture of `stream` (the handle it passed, or `cudaStreamPerThread` for
/// the per-thread default stream). Returns false when the table was full and it was not noted.
pub fn begun(rt: &Runtime, stream: usize) -> bool {
    if stream == 0 {
        return true;
    }
    if note(stream) {
        return true;
    }
    forget_ended(rt);
    note(stream) || {
        if !WARNED_FULL.swap(true, Ordering::Relaxed) {
            log_event!(
                warn,
                "more than {SLOTS} CUDA graph captures at once: a capture on stream {stream:#x} \
                 is not followed, and a device synchronization by cachealloc during it would \
                 end it"
            );
        }
        false
    }
}

/// Put `stream` in a free slot, then forget its older notes: a stream captured again before
/// any query found its last capture ended (a loop of captures on one stream, with no request
/// between them) takes one slot, not one per capture. The new note is made before the old ones
/// go, so that a thread that found an old one not capturing, and forgets it, cannot forget this
/// capture. The count goes up first, so that it is never below the slots taken (a slot emptied
/// by `forget_ended` is counted down after it was counted up).
fn note(stream: usize) -> bool {
    NOTED.fetch_add(1, Ordering::AcqRel);
    let Some(taken) = STREAMS.iter().position(|slot| {
        slot.compare_exchange(0, stream, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        NOTED.fetch_sub(1, Ordering::AcqRel);
        return false;
    };
    for (i, slot) in STREAMS.iter().enumerate() {
        if i != taken {
            forget(slot, stream);
        }
    }
    true
}

/// Empty `slot` if it still holds `stream`, counting it down; whether it did.
fn forget(slot: &AtomicUsize, stream: usize) -> bool {
    let forgotten = slot
        .compare_exchange(stream, 0, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok();
    if forgotten {
        NOTED.fetch_sub(1, Ordering::AcqRel);
    }
    forgotten
}

/// The program is about to destroy `stream`: it is forgotten, so that no query names its
/// handle once the runtime has let it go. Returns whether it was noted (to be noted again
/// should the runtime refuse to destroy it). The default streams, which no program destroys,
/// are left alone.
pub fn destroying(stream: usize) -> bool {
    if NOTED.load(Ordering::Acquire) == 0 || matches!(stream, 0 | STREAM_LEGACY | STREAM_PER_THREAD)
    {
        return false;
    }
    let mut noted = false;
    for slot in &STREAMS {
        noted |= forget(slot, stream);
    }
    noted
}

/// `device` is about to be reset, which destroys its streams: the noted ones are forgotten
/// (found with `cudaStreamGetDevice`; where the runtime lacks it, or cannot say, every noted
/// stream, as any may be the device's), so that no query names them afterwards. The
/// per-thread default stream's handle, which a reset does not invalidate, stays.
pub fn resetting(rt: &Runtime, device: DeviceId) {
    if NOTED.load(Ordering::Acquire) == 0 {
        return;
    }
    for slot in &STREAMS {
        let stream = slot.load(Ordering::Acquire);
        if matches!(stream, 0 | STREAM_PER_THREAD) {
            continue;
        }
        if matches!(noted_stream_device(rt, stream), Some(other) if other != device) {
            continue;
        }
        forget(slot, stream);
    }
}

/// The device of a noted `stream` (alive: a destroyed stream was forgotten first, by
/// `destroying`), or `None` when the runtime cannot say; a failed query leaves the program's
/// last error as it was.
fn noted_stream_device(rt: &Runtime, stream: usize) -> Option<DeviceId> {
    unread_error::keep_unread(rt);
    runtime::stream_device(rt, stream)
}

/// Whether a capture the program began may still be going on: the runtime is asked about each
/// noted stream, and those no longer capturing are forgotten. One load when none is noted.
#[inline]
pub fn underway(rt: &Runtime) -> bool {
    NOTED.load(Ordering::Acquire) != 0 && forget_ended(rt)
}

/// Forget the noted streams that no longer capture; whether any still does.
#[cold]
#[inline(never)]
fn forget_ended(rt: &Runtime) -> bool {
    let mut capturing = false;
    for slot in &STREAMS {
        let stream = slot.load(Ordering::Acquire);
        if stream == 0 {
            continue;
        }
        if is_capturing(rt, stream) {
            capturing = true;
        } else {
            forget(slot, stream);
        }
    }
    capturing
}

/// Whether `stream` captures now, by the runtime. A stream it cannot answer for (an error)
/// does not. The query is the library's own call: its failure would replace the program's
/// unread error, so that error is kept first (`unread_error`) and the failure cleared.
pub fn is_capturing(rt: &Runtime, stream: usize) -> bool {
    unread_error::keep_unread(rt);
    let mut status: i32 = STATUS_NONE;
    // SAFETY: `status` is a valid out-pointer for the call; the stream handle is one the
    // program passed to cudaStreamBeginCapture, forgotten (`destroying`) before the program's
    // cudaStreamDestroy of it reaches the runtime, or one that cudaStreamDestroy is about to
    // destroy (`CudaBackend::stream_destroying`, before it is forwarded). Only a query that
    // another thread read the slot for before then can name a destroyed stream: one of the
    // races the module comment leaves open, as it does a stream destroyed through the driver
    // API.
    let code: CudaError = unsafe { (rt.stream_is_capturing)(stream as *mut c_void, &mut status) };
    if code != codes::SUCCESS {
        runtime::clear_last_error(rt);
        return false;
    }
    status != STATUS_NONE
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The table is the process's: one test at a time uses it.
    static TABLE: Mutex<()> = Mutex::new(());

    /// Slots are taken and given back without losing count, and a full table refuses.
    #[test]
    fn the_table_counts_what_it_holds() {
        let _table = TABLE.lock().unwrap();
        let base = 0x7000_0000usize;
        let taken: Vec<usize> = (1..=SLOTS).map(|i| base + i).collect();
        for &stream in &taken {
            assert!(note(stream));
        }
        assert!(!note(base), "a full table takes no more");
        assert_eq!(NOTED.load(Ordering::Acquire), SLOTS);
        for slot in &STREAMS {
            let stream = slot.swap(0, Ordering::AcqRel);
            assert!(taken.contains(&stream));
            NOTED.fetch_sub(1, Ordering::AcqRel);
        }
        assert_eq!(NOTED.load(Ordering::Acquire), 0);
    }

    /// A stream noted again (captured again before its last capture was found ended) keeps
    /// one slot: the new one, taken before the old one is given back.
    #[test]
    fn a_stream_noted_again_keeps_one_slot() {
        let _table = TABLE.lock().unwrap();
        let (stream, other) = (0x7100_0000usize, 0x7200_0000usize);
        assert!(note(stream));
        assert!(note(other));
        for _ in 0..2 * SLOTS {
            assert!(note(stream));
        }
        let held: Vec<usize> = STREAMS
            .iter()
            .map(|slot| slot.load(Ordering::Acquire))
            .filter(|&s| s != 0)
            .collect();
        assert_eq!(held.len(), 2, "{held:x?}");
        assert!(held.contains(&stream) && held.contains(&other));
        assert_eq!(NOTED.load(Ordering::Acquire), 2);
        assert!(destroying(stream) && destroying(other));
        assert_eq!(NOTED.load(Ordering::Acquire), 0);
    }
}
