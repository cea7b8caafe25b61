//! Warnings that the backend has to give while its pool's lock is held, where nothing is logged
//! or formatted (`global::pools`): each is held, unformatted, in the calling thread's queue,
//! and said by `say_held` once the lock is released. Both arise after a CUDA graph capture,
//! when the events of frees made during it are recorded at the device's next poll: the
//! program's call that polled has nothing to do with those frees, and their own calls have
//! returned.

use super::runtime::CudaError;
use crate::backend::BackendError;
use crate::pool::{DeviceId, StreamId};
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A warning held until the pool's lock is released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The events of frees made during a capture could not be recorded after it.
    DeferredRecordingFailed {
        device: DeviceId,
        error: BackendError,
    },
    /// A stream recorded for such a free refused its event: its work is not waited for.
    StreamRefused { stream: StreamId, code: CudaError },
}

thread_local! {
    static HELD: RefCell<Vec<Notice>> = const { RefCell::new(Vec::new()) };
}

/// Notices held by any thread: `say_held` is one load while there are none.
static ANY_HELD: AtomicUsize = AtomicUsize::new(0);

/// Hold `notice` for the calling thread's next `say_held`.
#[cold]
pub fn hold(notice: Notice) {
    // A thread whose thread-local storage is gone (at exit) drops the notice.
    let held = HELD.try_with(|held| held.borrow_mut().push(notice));
    if held.is_ok() {
        ANY_HELD.fetch_add(1, Ordering::AcqRel);
    }
}

/// Log the calling thread's held notices, oldest first. Call with no pool lock held.
#[inline]
pub fn say_held() {
    if ANY_HELD.load(Ordering::Acquire) != 0 {
        say_held_now();
    }
}

#[cold]
#[inline(never)]
fn say_held_now() {
    let Ok(notices) = HELD.try_with(|held| std::mem::take(&mut *held.borrow_mut())) else {
        return;
    };
    ANY_HELD.fetch_sub(notices.len(), Ordering::AcqRel);
    for notice in notices {
        say(notice);
    }
}

fn say(notice: Notice) {
    match notice {
        Notice::DeferredRecordingFailed { device, error } => log_event!(
            warn,
            "device {}: the events of frees made during a CUDA graph capture could not be \
             recorded ({error}); their blocks are not reused until a later request records them \
             or the pool synchronizes the device",
            device.0
        ),
        Notice::StreamRefused { stream, code } => log_event!(
            warn,
            "a free made during a CUDA graph capture: the work of its recorded stream {:#x} is \
             not waited for before the block is reused (cudaEventRecord after the capture failed \
             with CUDA error {code}: a stream destroyed without cudaStreamDestroy passing through \
             cachealloc, or one of another device with a runtime older than CUDA 12.8, which \
             cannot name its device?)",
            stream.0
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A notice waits in its thread's queue until that thread says it, and is said once.
    #[test]
    fn a_held_notice_is_said_once_by_its_own_thread() {
        let notice = Notice::StreamRefused {
            stream: StreamId(0x51),
            code: 999,
        };
        hold(notice.clone());
        let elsewhere = std::thread::spawn(|| {
            say_held();
            HELD.with(|held| held.borrow().len())
        });
        assert_eq!(elsewhere.join().unwrap(), 0, "another thread holds nothing");
        assert_eq!(HELD.with(|held| held.borrow().clone()), vec![notice]);
        say_held();
        assert!(HELD.with(|held| held.borrow().is_empty()));
    }
}
